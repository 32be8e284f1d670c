#pragma once
// A model drafter's tree with the prompt-lookup continuation grafted in: text that repeats
// (code, quotes, names, summaries of the prompt) is proposed by lookup, the rest by the model,
// and the tree-size policy prunes the union by path probability like any tree. Greedy
// verification accepts any tree, so the graft happens at temperature 0 only; at T > 0 the model's
// tree goes out as drafted, since lossless tree sampling needs every node drawn from the draft
// distribution of its parent.
#include <memory>

#include "draft/ngram.h"

namespace specula {

class LookupGraftDrafter : public Drafter {
public:
    // Path probability a grafted node adds per step below its parent: a prior for the pruning, which
    // the tree-size policy's calibration (accepted / promised) then scales with the rest.
    static constexpr float kStepProb = 0.5f;

    LookupGraftDrafter(std::unique_ptr<Drafter> model, int ngram_min, int ngram_max);
    const char * name() const override { return name_.c_str(); }
    void start(const DraftRequest & request) override;
    const DraftForward * pending() const override { return model_->pending(); }
    void resume() override { model_->resume(); }
    Draft take() override;
    void accept(const Acceptance & acceptance) override { model_->accept(acceptance); }
    std::vector<int> feature_layers() const override { return model_->feature_layers(); }
    void reset() override { model_->reset(); }

private:
    std::unique_ptr<Drafter> model_;
    NgramDrafter lookup_;
    std::string name_;
    DraftRequest request_;
    bool graft_ = false;
};

// Adds `chain` below the root of `tree`: follows children that already hold the chain's tokens and
// adds the rest as new nodes, each kStepProb below its parent. Returns the nodes added.
int graft_chain(TokenTree & tree, std::span<const int32_t> chain, float step_logp);

}  // namespace specula
