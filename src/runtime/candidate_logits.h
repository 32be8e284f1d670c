#pragma once
// Logits of a few candidate tokens from a residual-stream state: the final norm and only the
// candidates' rows of the LM head, the early-exit probe of SpecEE (docs/specee.md). Reading 4
// rows instead of the whole head is what makes an exit cheap on models whose head dominates
// the bytes read per token (Gemma 3 270M: 72%).
#include <cstdint>
#include <span>
#include <vector>

namespace specula {

class Model;

class CandidateLogits {
public:
    // Copies the final norm's weights; the LM-head rows are read from the model's stored rows
    // (the embedding of a tied head, or an untied head that was not repacked). Throws Error for
    // an untied head that only exists repacked.
    explicit CandidateLogits(const Model & model);

    // hidden: one residual-stream row [n_embd] (the state entering some layer); out[i] = the
    // logit of candidates[i] had the model stopped there (final norm, head row, softcap).
    void compute(std::span<const float> hidden, std::span<const int32_t> candidates, std::span<float> out) const;

private:
    const Model & model_;
    std::vector<float> norm_;
    mutable std::vector<uint8_t> row_bytes_;
    mutable std::vector<float> row_;
    mutable std::vector<float> normed_;
};

}  // namespace specula
