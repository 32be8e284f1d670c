#pragma once
// A drafter proposes tokens to follow the sequence; the verifier decides. The drafter never
// touches the target's cache: after each round it is told how much of what it saw still stands.
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "runtime/forward.h"
#include "sample/logits_state.h"
#include "sample/sampler.h"
#include "tree/token_tree.h"
#include "tree/tree_builder.h"

namespace specula {

class SuffixCache;

// What a request's spans point to (the sequence's history, its sampling parameters and Rng) must
// stay put from start() until take().
struct DraftRequest {
    std::span<const int32_t> history;           // every token so far; the last is the root of the draft
    TreeBudget budget;                          // shape and size of the draft (a chain of depth k, or a tree)
    const SamplingParams * sampling = nullptr;  // drafts follow the processed draft distribution
    Rng * rng = nullptr;
    // The request's logit processing after `history` (nullptr: none): model drafters propose only
    // tokens each path's state allows, so that a grammar does not reject most of a draft.
    const LogitsState * processing = nullptr;
    // Drafts are drawn from the draft distribution (T > 0), not taken greedily.
    bool sampled() const { return sampling != nullptr && !sampling->greedy(); }
};

// What verification settled, told to the drafter after every round (and after the prompt).
struct Acceptance {
    int n_valid = 0;  // leading tokens of the sequence that are now final (last root + accepted drafts)
    // Target features for positions first_position.. (one row per position, feature_layers()
    // concatenated), for drafters that ask for them; empty otherwise.
    int first_position = 0;
    std::span<const float> features;
};

struct Draft {
    TokenTree tree;
    float mean_entropy = 0.0f;    // of the draft distributions used (nats); 0 for deterministic drafters
    std::vector<int> exit_layer;  // SpecEE drafts: per node, the layer that decided its token (-1: full depth); else empty
    // Nodes from this index on were grafted (prompt lookup), not drafted by the model; pruning
    // keeps creation order, so they stay a suffix. The tree policy learns the model's acceptance
    // from the model's nodes only: the graft learns its own.
    int grafted_from = -1;  // -1: none
};

// Keeps the first n nodes of prune_order(draft.tree) (none: n = 0), grafted_from following them.
void prune_draft(Draft & draft, int n);

// A forward of a drafter's own network that the drafter waits for. The caller runs it alone or,
// when several drafters wait on the same runner and KV pool (DrafterFactory::make_group), as one
// forward_parts over all of them: batched drafting across the sequences of a step.
struct DraftForward {
    ModelRunner * runner = nullptr;
    BatchPart part;
};

// The forward a stepped drafter waits for, kept here so that the pointers handed out stay valid
// until the caller has run it.
class PendingForward {
public:
    // Waits for `batch` through `runner`, appended to `cache` (first_slot(): where it starts).
    void wait_for(ModelRunner & runner, KvCache & cache, ForwardOutput & out, ForwardBatch batch);
    const DraftForward * get() const { return waiting_ ? &forward_ : nullptr; }
    // The forward ran: stop waiting (throws Error when nothing was pending).
    void done();
    int first_slot() const { return first_slot_; }

private:
    ForwardBatch batch_;
    DraftForward forward_;
    int first_slot_ = 0;
    bool waiting_ = false;
};

class Drafter {
public:
    virtual ~Drafter() = default;
    virtual const char * name() const = 0;
    // Drafting in steps: start(), then while pending() names a forward, run it and call resume();
    // then take() the draft. A drafter without a network has nothing pending.
    virtual void start(const DraftRequest & request) = 0;
    virtual const DraftForward * pending() const { return nullptr; }
    virtual void resume() {}
    virtual Draft take() = 0;
    // A draft that needs no drafter forward (prompt lookup): the tree policy weighs it each round,
    // drafts with the model only where that is expected to pay more, and otherwise verifies it
    // alone (or none of it). Empty when the drafter has none.
    virtual Draft free_draft(const DraftRequest &) { return {}; }
    // After verification: anything the drafter cached past what is final must go.
    virtual void accept(const Acceptance & acceptance) = 0;
    // Tokens of `history` the drafter would read before its first level if a draft started now:
    // a draft model's pass over what its cache lacks (policy/catch_up_gate.h prices it).
    virtual int catch_up(std::span<const int32_t> history) const {
        (void)history;
        return 0;
    }
    // Target layers whose input hidden states the drafter needs (EAGLE); empty for none.
    virtual std::vector<int> feature_layers() const { return {}; }
    // Forget everything (a new sequence starts).
    virtual void reset() = 0;
    // A new sequence of n_prompt prompt tokens starts whose first n_common tokens (< n_prompt) are
    // the first tokens of what this drafter last saw, and whose target cache holds them (a prefix
    // cache). Keeps only state that equals, bit for bit, what a cold start on the new prompt would
    // have built from those tokens, and returns how many leading tokens (<= n_common) the target
    // cache must keep: the target's prefill of the rest hands the drafter the features it lacks.
    // Default: reset, and the whole prompt prefilled again.
    virtual int keep_prefix(int n_common, int n_prompt) {
        (void)n_common, (void)n_prompt;
        reset();
        return 0;
    }
    // Takes `other`'s state (a drafter of the same group, whose sequence has the same tokens so
    // far) as its own: one prompt prefilled for several sequences (a request's n choices). A
    // drafter that cannot copy resets, and keep_prefix() then asks for what it lacks.
    virtual void copy_state(const Drafter & other) {
        (void)other;
        reset();
    }
    // Earlier sequences (a server's) to look up like the prompt, those kept under `scope` (the
    // request's tenant and cache salt); false: this drafter does no lookup.
    virtual bool use_suffix_cache(std::shared_ptr<SuffixCache> cache, const std::string & scope) {
        (void)cache, (void)scope;
        return false;
    }
};

// What run_drafts did: how many forwards it ran, and each level's wall time (its forwards and
// the drafters' resume() after them: proposing children, building the next level's batch).
struct DraftLevels {
    int forwards = 0;
    std::vector<double> level_ms;
};

// Drafts of several drafters (each start()ed), their forwards run together level by level: one
// forward_parts per runner and input kind per level.
DraftLevels run_drafts(std::span<Drafter * const> drafters);

}  // namespace specula
