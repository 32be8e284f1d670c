#pragma once
// Sampling transforms. `processed_probs` turns raw logits into the distribution a token is drawn
// from; speculative verification applies the very same function to draft and target logits, which
// is what makes rejection sampling reproduce the target's processed distribution exactly.
#include <cmath>
#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "specula/sampling.h"

namespace specula {

// Deterministic per seed, identical on every platform (no std::*_distribution). Two kinds of
// draw: uniform() takes the stream's next, and at(position) is keyed by the seed and a token's
// position in the sequence alone. Sampling the token at a position reads at(position), so it
// draws the same token there however many stream draws drafting and verification took before it:
// a seeded request's text does not depend on what was drafted (verify/verify.h).
class Rng {
public:
    explicit Rng(uint64_t seed) : gen_(seed), seed_(seed) {}
    double uniform() { return static_cast<double>(gen_() >> 11) * 0x1.0p-53; }  // [0, 1)
    double at(int64_t position) const;                                          // [0, 1)
private:
    std::mt19937_64 gen_;
    uint64_t seed_;
};

int32_t argmax(std::span<const float> logits);   // the first maximum
float max_value(std::span<const float> values);  // -inf if empty

// Order, as llama.cpp's default chain: top-k on logits; top-p and min-p on softmax(logits);
// then temperature on the survivors. Writes a full-vocabulary distribution (zeros off support).
// Greedy params give a one-hot distribution at the argmax.
void processed_probs(std::span<const float> logits, const SamplingParams & params, std::vector<float> & probs);

// What llama.cpp's "infill" sampler (llama_sampler_init_infill) reads of the vocabulary: with
// SamplingParams::infill set, processed_probs ends with its transform of the truncated
// distribution. When end-of-generation tokens weigh more than a third of the average candidate,
// only they remain; else candidates whose piece begins another's give their probability to the
// more likely of the two, candidates below 0.2 are dropped (end-of-generation tokens are kept),
// and with no text candidate left, `end_token` alone. Candidates are compared pairwise: the
// server lets it follow a top-k of at most kMaxInfillCandidates.
struct InfillVocabulary {
    static constexpr int kMaxInfillCandidates = 1024;
    std::vector<std::string> pieces;      // per token, as streamed (a control token's is empty)
    std::vector<char> end_of_generation;  // per token
    int32_t end_token = -1;               // EOT, else EOS
};
void apply_infill(const InfillVocabulary & vocabulary, std::vector<float> & probs);

// Of softmax(logits) at temperature 1: the log normaliser relative to the max logit, and the
// entropy in nats. -inf logits (tokens a compact draft vocabulary cannot propose) weigh nothing,
// as NaN ones do everywhere in this file (a broken model's: never undefined behaviour).
struct SoftmaxStats {
    float max_logit = 0.0f;
    float log_z = 0.0f;  // log sum exp(logit - max_logit)
    float entropy = 0.0f;
    // -inf for a NaN logit (or a row with none above -inf): trees rank and sort nodes by it.
    float log_prob(float logit) const {
        const float lp = logit - max_logit - log_z;
        return std::isnan(lp) ? -INFINITY : lp;
    }
};
SoftmaxStats softmax_stats(std::span<const float> logits, std::vector<float> & scratch);

// The k highest-scoring ids, best first (ties by id).
std::vector<int32_t> top_k_ids(std::span<const float> scores, int k);

// k distinct ids drawn from `probs` without replacement, in draw order (each draw from what the
// earlier ones left, renormalised).
std::vector<int32_t> sample_without_replacement(std::span<const float> probs, int k, Rng & rng);

// The instruction sets the vocabulary-wide loops (max_value, argmax, softmax_stats,
// processed_probs) are built for; the functions above run the best one this CPU has. Every path
// must give the portable path's bits: the *_on variants run one path, for the tests that compare.
enum class SamplerPath {
    Portable,
    Avx2,
    Avx512
};
std::vector<SamplerPath> sampler_paths();  // the paths this CPU runs: portable first, the best last
const char * sampler_path_name(SamplerPath path);
int32_t argmax_on(SamplerPath path, std::span<const float> logits);
SoftmaxStats softmax_stats_on(SamplerPath path, std::span<const float> logits, std::vector<float> & scratch);
void processed_probs_on(SamplerPath path, std::span<const float> logits, const SamplingParams & params, std::vector<float> & probs);

// Draws from a distribution that sums to ~1 (tolerates rounding): the inverse of its cumulative
// sum, in id order, at the stream's next uniform (sample_from) or at u (sample_at).
int32_t sample_from(std::span<const float> probs, Rng & rng);
int32_t sample_at(std::span<const float> probs, double u);

// The sum of a distribution's entries, in one fixed order whatever the CPU.
double probability_sum(std::span<const float> probs);
// p <- max(p - q, 0) entry by entry (rejection sampling's residual, unnormalised); returns its sum.
double subtract_clamped(std::span<float> p, std::span<const float> q);

}  // namespace specula
