#pragma once
// A small LM with the target's vocabulary drafts a chain or a tree, one forward per tree level.
#include <algorithm>
#include <memory>
#include <optional>

#include "draft/drafter.h"
#include "runtime/kv_cache.h"
#include "runtime/forward.h"

namespace specula {

class Model;

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
    void reset() override { cache_->rollback(0); }
    // The root is always fed again (start()), so at least one token.
    int catch_up(std::span<const int32_t> history) const override {
        const int L = static_cast<int>(history.size());
        return L - std::min(cache_->size(), L - 1);
    }
    // Its cache's rows of the common prefix are the draft model's own of those tokens; its first
    // draft catches up on the rest of the prompt itself.
    int keep_prefix(int n_common, int) override {
        cache_->rollback(std::min(cache_->size(), n_common));
        return n_common;
    }
    void copy_state(const Drafter & other) override;

    const KvCache & cache() const { return *cache_; }

private:
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
};

}  // namespace specula
