#pragma once
// EAGLE-1/2 and EAGLE-3 drafting with a head and its own one-layer KV cache. This is the drafter;
// the head's network (weights and forward) is runtime/eagle_head.h.
//
// The head's cache holds one entry per sequence position P < root, each pairing token t[P+1] with
// the *target's* features at P (never the head's own guesses). Target features arrive through
// accept() after every verify (root + accepted rows) and after the prompt. start() writes them all
// as one block (the catch-up forward pending() names), whose last row drafts the root's
// successors; each resume() grows the tree by a level of self-fed entries (token, the head's
// pre-norm output that proposed it), and the last one drops those again. Keeping self-fed entries
// would poison later drafts: the head would read its own guesses as the target's features.
//
// A long prompt enters the head's cache as its last prompt_window positions only (the entries
// then start at position first_position(), slot 0): the head, trained on short chats, drafts
// from nearby context, and writing every entry of a long prompt cost its first round about as
// much as a tenth of the prompt's own prefill.
#include <memory>
#include <optional>

#include "draft/drafter.h"
#include "runtime/kv_cache.h"
#include "runtime/eagle_head.h"
#include "runtime/forward.h"

namespace specula {

class EagleDrafter : public Drafter {
public:
    static constexpr int kPromptWindow = 512;
    // Alone: its own runner and cache of n_ctx slots.
    EagleDrafter(const EagleHead & head, int n_ctx, int prompt_window = kPromptWindow);
    // One of a group (DrafterFactory::make_group): a runner and KV pool shared with the group.
    EagleDrafter(const EagleHead & head, std::shared_ptr<ModelRunner> runner, std::unique_ptr<KvCache> stream,
                 int prompt_window = kPromptWindow);
    const char * name() const override;
    void start(const DraftRequest & request) override;
    const DraftForward * pending() const override { return pending_forward_.get(); }
    void resume() override;
    Draft take() override { return std::move(draft_); }
    void accept(const Acceptance & a) override;
    void reset() override;
    // A cold start's entries are the prompt's last prompt_window positions. The head's entries of
    // the common prefix within that window are kept (slid down when the window moved on: a
    // one-layer head's K/V rows depend on their own entry only), and the target features pending
    // after them up to the last common token: the target's prefill hands over the rest. A window
    // that starts before what the head kept needs features it never had: reset, and the target
    // prefills from there.
    int keep_prefix(int n_common, int n_prompt) override;
    void copy_state(const Drafter & other) override;
    std::vector<int> feature_layers() const override { return head_.config().target_layers; }

    const KvCache & cache() const { return *cache_; }
    // The position of the entry in cache slot 0 (slot s holds position first_position() + s).
    int first_position() const { return first_position_; }

private:
    const EagleHead & head_;
    std::shared_ptr<ModelRunner> runner_;
    std::unique_ptr<KvCache> cache_;
    int prompt_window_;
    int first_position_ = 0;
    std::vector<float> pending_;  // target features not yet written, positions pending_first_..
    int pending_first_ = 0;
    ForwardOutput out_;
    std::vector<float> probs_;
    // The draft in progress, between start() and take().
    DraftRequest req_;
    PathStates path_states_;  // the request's processing along the growing tree
    std::optional<TreeGrower> grower_;
    int committed_ = 0;  // positions with target-feature entries (= the root's position)
    // Per tree node: its cache slot and the pre-norm output of its own entry; its children are
    // proposed from that entry and are fed that output as their hidden state.
    std::vector<int> slot_of_;
    std::vector<std::vector<float>> proposer_hidden_;
    std::vector<float> root_hidden_;
    PendingForward pending_forward_;
    Draft draft_;
};

}  // namespace specula
