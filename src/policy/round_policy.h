#pragma once
// Every policy decision of a speculative round, so that the round itself (engine/sequence.cpp)
// reads draft -> forward -> verify -> commit and decides nothing:
//   plan()        before drafting: the drafter's budget (a chain's length, a tree's depth, nodes
//                 and the path-probability bars its builder expands above), or no model draft and
//                 the free draft (prompt lookup) instead, or nothing at all;
//   size_draft()  once drafted: how many of the draft's nodes to verify, priced against the
//                 verify-cost curve (EAGLE-2's path probabilities, TreeSizePolicy::choose);
//   observe()     after verification: what the target accepted and what the round cost.
// Behind it sit the draft-length policy (chains, DraftLengthPolicy) and the tree-size policy
// (trees sized per round, TreeSizePolicy), both owned by the caller so that what they measured
// of the machine outlives one sequence (a server slot's next request). Without the one its
// shape needs, the shape's fixed budget stands.
//
// Terms, defined here once for every file of src/policy (docs/policies.md links here):
//   round: one draft -> one target forward over [root, draft nodes] -> verify -> commit.
//   step: one target forward; in `specula serve` it carries the rounds (and prompt chunks) of
//     several sequences, so its time is every sequence's.
//   row: one token of a forward's batch; a round alone verifies n draft nodes in n + 1 rows.
//   plain step (plain round): a round that drafts nothing; its forward carries the root's row
//     alone and emits one token.
//   load: the number of sequences decoding in a step.
//   verify-cost curve: the measured ms of a target forward of b rows at one context depth,
//     refitted from every round's timing (VerifyCost, verify_cost.h).
//   plain rate: tokens per ms of the step without this sequence's draft: one token per one-row
//     forward alone, (1 + the others' tokens) per forward of (the others' rows + 1) when shared.
//   StepShare: what the rest of a shared step carries: the other sequences' rows, the tokens they
//     are expected to emit, their number (draft_length.h). All zero for a sequence alone.
//   level: one drafter forward. A tree costs a level per depth, a chain a level per token (fewer
//     under cascade drafting, whose first level may take several of prompt lookup's tokens).
//   path probability: a node's cumulative draft probability, the product along the path from the
//     root: the estimate that the target accepts the whole path (EAGLE-2). Prune order lists a
//     tree's nodes by it, likeliest first, each after its parent and earlier siblings.
//   promised: the verified nodes' summed path probabilities, the tokens the draft expects the
//     target to accept beyond the one every round emits.
//   calibration, gamma: accepted over promised, decayed over the rounds; gamma is it bounded to
//     [0.05, 2], and every promise is scaled by it before it is priced.
//   rank bar: the least path probability a node needs to be worth verifying when k likelier nodes
//     are in the tree (TreeSizePolicy::rank_bars); the dynamic builder expands nothing below it.
//   free draft: a draft that costs no drafter forward (prompt lookup, Drafter::free_draft). Its
//     rate is the bar a model draft must beat; when none does, it is verified alone. A chain
//     round's is the free chain, priced by the draft-length policy (free_chain_length).
//   graft: a deterministic continuation (the text a grammar forces next, else prompt lookup's
//     continuation) added below the root of a model's tree (draft/lookup_graft.h). Its nodes come
//     after the model's (Draft::grafted_from); the policies learn from the model's nodes only.
//   draft, explore, skip: a tree round's plan (TreeSizePolicy::Round): the full budget; one level
//     and one node, now and then in place of a skip, to notice a text turning predictable; no model
//     draft at all (the free draft, or a plain step).
//   probe: a chain's explore: a one-token draft now and then while the cost policy's best length
//     is 0 (DraftLengthPolicy).
//   catch-up: a drafter's first level after rounds it did not draft (or a sequence's first) reads
//     every token emitted since, so that round is not timed as a usual one.
//   gate: the server's choice, per window of steps and load, whether a step's sequences may draft
//     at all (SpeculationGate); a gated round plans no draft.
//   catch-up gate: a request's choice, at its first decoding round, whether its model drafter
//     catches up at all (CatchUpGate); kept out, every round of the request plans no model draft
//     and verifies the free draft, if any, or the root alone.
//   twin: a model made by `specula make-twin`, a small model's function in a bigger shape and
//     weight type, so that a large target is benchmarked with the small model's drafter.
#include <functional>
#include <span>

#include "policy/draft_length.h"
#include "policy/tree_size.h"
#include "specula/report.h"
#include "tree/token_tree.h"
#include "tree/tree_builder.h"

namespace specula {

// Where the sequence stands as a round begins.
struct RoundState {
    int depth = 0;            // tokens in the target's cache: the position of the round's root
    int room = 0;             // draft nodes the cache can still take past the root
    int tokens_left = 0;      // tokens the sequence may still emit past the root's own (-n)
    StepShare step = {};      // what the rest of a shared step carries
    bool may_draft = true;    // false: the server measured plain steps faster at this load
    bool model_draft = true;  // false: the catch-up gate kept the model drafter out of this request
    // A draft within the budget that costs no drafter forward (prompt lookup); its tree, or
    // nullptr / an empty tree for none. Empty function: the sequence has no drafter.
    std::function<const TokenTree *(const TreeBudget &)> free_draft = {};
};

struct RoundPlan {
    TreeBudget budget;            // the drafter's; no depth or no nodes: the drafter is not started
    bool use_free_draft = false;  // no model draft: verify the free draft offered in plan()
    bool drafts() const { return budget.depth > 0 && budget.max_nodes > 0; }
};

// What a verified round gives the policies to learn from.
struct RoundOutcome {
    const TokenTree & tree;         // the verified draft (after size_draft)
    int model_nodes = 0;            // its first nodes the drafter drafted (the rest grafted from lookup)
    std::span<const int> accepted;  // accepted nodes, top-down
    float mean_entropy = 0.0f;      // of the draft distributions used
    double draft_ms = 0.0, verify_ms = 0.0, forward_ms = 0.0;
    int step_rows = 0;             // rows of the step's target forward
    bool verify_only_step = true;  // no prompt chunks in that forward: it prices verify rows
};

class RoundPolicy {
public:
    // shape: the drafting rules' budget (its shape, and its size where no policy sets one).
    RoundPolicy(const TreeBudget & shape, DraftLengthPolicy * length, TreeSizePolicy * tree_size)
        : shape_(shape), length_(length), tree_size_(tree_size) {}

    RoundPlan plan(const RoundState & state);
    // The number of the draft's nodes (in prune order) to verify; its whole size unless the
    // tree-size policy prices it. model_nodes: its first nodes the drafter drafted (the rest
    // grafted); draft_ms: the drafting time, level_ms each drafter level's share of it.
    int size_draft(const TokenTree & tree, int model_nodes, double draft_ms, std::span<const double> level_ms);
    void observe(const RoundOutcome & outcome);

    // The length or node budget the policy asked for this round, before the cache's room and -n.
    int asked() const { return asked_; }
    // What this round's policy chose and why, for observers (strings built only when asked):
    // after size_draft, before observe.
    RoundDecision decision(int drafted_nodes, int verified_nodes) const;

private:
    RoundPlan plan_tree(const RoundState & state, TreeBudget budget);
    const TokenTree * offer_free_draft(const RoundState & state, TreeBudget budget) const;
    // A chain round's free chain, as much of it as the draft-length policy expects to pay (more than
    // the plain step, and than its model chain where the model may draft); no draft when none does.
    RoundPlan plan_free_chain(const RoundState & state, bool model_may_draft);

    TreeBudget shape_;
    DraftLengthPolicy * length_;
    TreeSizePolicy * tree_size_;
    // This round's, from plan() to observe().
    RoundPlan plan_;
    StepShare step_;
    int asked_ = 0;
    bool gated_ = false;     // the step allowed no drafts
    bool kept_out_ = false;  // the catch-up gate kept the model drafter out
    bool skipped_ = false;   // the tree-size policy expected no model draft to pay
    bool sized_ = false;     // size_draft priced the draft
    int sized_nodes_ = 0;
    int free_chain_nodes_ = 0;  // a chain round's free chain, verified in place of a model draft
    double promised_ = 0.0;     // the verified nodes' summed path probabilities
};

}  // namespace specula
