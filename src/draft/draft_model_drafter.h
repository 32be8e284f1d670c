#pragma once
// A small LM with the target's vocabulary drafts a chain or a tree, one forward per tree level.
// Cascade drafting (chains): prompt lookup's continuation is fed after the root in the first
// forward, and each of its tokens that the draft model ranks first there is taken as drafted,
// without a forward of its own: the draft model's own chain at T = 0, for fewer forwards where
// the text repeats.
#include <algorithm>
#include <memory>
#include <optional>

#include "draft/drafter.h"
#include "draft/ngram.h"
#include "runtime/kv_cache.h"
#include "runtime/forward.h"

namespace specula {

class Model;
struct DraftVocabulary;

class DraftModelDrafter : public Drafter {
public:
    // Alone: its own runner and cache of n_ctx slots.
    DraftModelDrafter(const Model & model, int n_ctx);
    // One of a group (DrafterFactory::make_group): a runner and KV pool shared with the group, so
    // that the group's forwards can run as one.
    DraftModelDrafter(const Model & model, std::shared_ptr<ModelRunner> runner, std::unique_ptr<KvCache> stream);
    const char * name() const override { return "draft-model"; }
    void start(const DraftRequest & request) override;
    const DraftForward * pending() const override { return pending_forward_.get(); }
    void resume() override;
    Draft take() override { return std::move(draft_); }
    void accept(const Acceptance & a) override;
    void reset() override {
        cache_->rollback(0);
        if (lookahead_) lookahead_->reset();
    }
    // Cascade drafting: chains start from prompt lookup's continuation (n-grams of n_min..n_max
    // tokens; markup as NgramDrafter's), checked by the first forward. Lookup reads the sequence's
    // own history, never a server's suffix cache: the draft model's draws at T > 0 follow what it
    // was handed, and a seeded request's text must not depend on other requests.
    void cascade(int ngram_min, int ngram_max, std::shared_ptr<const std::vector<int32_t>> markup);
    // The root is always fed again (start()), so at least one token.
    int catch_up(std::span<const int32_t> history) const override {
        const int L = static_cast<int>(history.size());
        return L - std::min(cache_->size(), L - 1);
    }
    // Its cache's rows of the common prefix are the draft model's own of those tokens; its first
    // draft catches up on the rest of the prompt itself.
    int keep_prefix(int n_common, int) override {
        cache_->rollback(std::min(cache_->size(), n_common));
        if (lookahead_) lookahead_->reset();
        return n_common;
    }
    void copy_state(const Drafter & other) override;

    const KvCache & cache() const { return *cache_; }

private:
    // Lookup's continuation for a chain of `depth` tokens: at most depth - 1 tokens, the last
    // one's row giving the chain's deepest token. Empty for trees and without cascade().
    std::vector<int32_t> lookahead_for(const DraftRequest & request, int depth);
    // The first forward's rows along the lookahead: its tokens the model ranks first become the
    // chain's nodes, then the model's own proposal; the rows of the rest leave the cache.
    void expand_along_lookahead(const DraftVocabulary & vocab);

    std::shared_ptr<ModelRunner> runner_;
    std::unique_ptr<KvCache> cache_;
    ForwardOutput out_;
    std::vector<float> probs_;
    // The draft in progress, between start() and take().
    DraftRequest req_;
    PathStates path_states_;  // the request's processing along the growing tree
    std::optional<TreeGrower> grower_;
    std::vector<int> slot_of_;  // tree node -> cache slot, once fed
    PendingForward pending_forward_;
    Draft draft_;
    std::optional<NgramDrafter> lookahead_;  // set by cascade()
    std::vector<int32_t> lookahead_tokens_;  // fed after the root in the pending first forward
};

}  // namespace specula
