#pragma once
// A model drafter's tree with a deterministic continuation grafted in: the text a grammar forces
// next (a JSON schema's keys, braces and quotes: jump-forward, made a draft the target verifies),
// else prompt lookup's continuation of text that repeats (code, quotes, names, summaries of the
// prompt). The model proposes the rest, and the tree-size policy prunes the union by path
// probability like any tree. At T > 0 the
// chain goes beside the model's sampled children, never merged into them: its first node is
// flagged one-hot (TokenTree::one_hot), which the sampling verifier tries after the model's
// children, so that each child is judged against the proposal it was really drawn from.
// A chain gets the grammar's forced text grafted, not lookup's continuation: that is the round's
// free chain (free_draft), which the cost policy verifies in place of the model's chain where it
// expects more tokens per ms of it.
#include <array>
#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "draft/ngram.h"

namespace specula {

class LookupGraftDrafter : public Drafter {
public:
    // A grafted node's path probability is its parent's times the chance that lookup's token at its
    // depth continues the text when the ones above it did. That chance is learned from how the
    // text went on after each chain (at T = 0 the text is what greedy verification accepts),
    // decayed per chain; untried depths start at kPriorStepProb with the weight of kPriorChains
    // chains. On chat, lookup's continuations rarely hold and its nodes stop being verified; on a
    // document being quoted they mostly hold and its chains are verified deep. These chances are
    // lookup's own, so a chain that leaves the root is divided by the tree policy's calibration
    // (TreeBudget::calibration), which learns how far the model's probabilities are off; below a
    // model's node the graft takes that node's probability as it is.
    static constexpr double kPriorStepProb = 0.5, kPriorChains = 2.0, kDecay = 0.95;
    static constexpr int kMaxDepth = 16;
    // A forced token's chance that the target spells the forced text with it: the grammar allows
    // other spellings (one token or several for the same characters), rarely taken.
    static constexpr double kForcedStepProb = 0.9;
    static constexpr size_t kMaxUnchecked = 64;  // chains waiting for the text to decide them

    // markup: the tokens lookup never proposes (NgramDrafter).
    LookupGraftDrafter(std::unique_ptr<Drafter> model, int ngram_min, int ngram_max,
                       std::shared_ptr<const std::vector<int32_t>> markup = nullptr);
    const char * name() const override { return name_.c_str(); }
    void start(const DraftRequest & request) override;
    const DraftForward * pending() const override { return model_->pending(); }
    void resume() override { model_->resume(); }
    Draft take() override;
    // Lookup's chain alone, for rounds whose policy drafts no model tree: it needs no drafter forward.
    Draft free_draft(const DraftRequest & request) override;
    void accept(const Acceptance & acceptance) override { model_->accept(acceptance); }
    std::vector<int> feature_layers() const override { return model_->feature_layers(); }
    int catch_up(std::span<const int32_t> history) const override { return model_->catch_up(history); }
    void reset() override;
    // The model drafter's state as its own keep_prefix() leaves it; lookup's learned chances start
    // afresh, as on a cold start.
    int keep_prefix(int n_common, int n_prompt) override;
    void copy_state(const Drafter & other) override;
    // Looked up at T = 0 only (lookup_chain).
    bool use_suffix_cache(std::shared_ptr<SuffixCache> cache, const std::string & scope) override {
        return lookup_.use_suffix_cache(std::move(cache), scope);
    }

    // The learned chance that lookup's token at `depth` (1: the first below the root) continues the text.
    double step_prob(int depth) const;

private:
    // Lookup's chain for `request`, up to `depth` tokens, remembered to be checked
    // against the text.
    std::vector<int32_t> lookup_chain(const DraftRequest & request, int depth);
    // The chain grafted for `request` and each of its tokens' log chance: the grammar's forced
    // tokens where it forces any, else lookup's.
    struct Chain {
        std::vector<int32_t> tokens;
        std::vector<float> step_logp;
        bool forced = false;  // the grammar's
    };
    Chain continuation(const DraftRequest & request);
    // Checks the chains proposed so far against the tokens that followed their roots in `history`:
    // each once the text has either left it or gone its whole length. (Checked only as far as the
    // next round's text, a chain's deeper tokens would be seen only after rounds that accepted them,
    // and lookup's deep chances, never seen, would stay at the prior.)
    void learn(std::span<const int32_t> history);
    std::vector<float> chain_logp(size_t length) const;
    void forget_chances();  // the chains waiting to be checked and the learned chances

    std::unique_ptr<Drafter> model_;
    NgramDrafter lookup_;
    std::string name_;
    DraftRequest request_;
    struct ProposedChain {
        size_t root = SIZE_MAX;  // history size when it was proposed
        std::vector<int32_t> tokens;
    };
    std::deque<ProposedChain> unchecked_;
    ProposedChain searched_;  // lookup's continuation at the current root
    // Decayed counts per depth: chains whose text reached the depth with every token above it
    // matched, and those whose token there matched too.
    std::array<double, kMaxDepth> reached_{}, held_{};
};

// Adds `chain` below the root of `tree`: follows children that already hold the chain's tokens
// (raising a followed node's log-probability to the chain's own, root_logp + step_logp[0..i], where
// that is higher) and adds the rest as new nodes, node i step_logp[i] below its parent (a new child
// of the root at root_logp + step_logp[0]). Returns the nodes added.
// `sampled`: the tree is verified by sampling; a node's children drawn from its q are then never
// followed (the chain's token is no draw from q): the chain's first new node is flagged one-hot
// beside them. A draw holding the chain's token gets the rest of the chain below it instead (an
// accepted draw takes the text where the chain goes; a one-hot copy beside it would be refused, as
// the verifier tries it only after that draw's rejection).
int graft_chain(TokenTree & tree, std::span<const int32_t> chain, std::span<const float> step_logp, float root_logp = 0.0f,
                bool sampled = false);

}  // namespace specula
