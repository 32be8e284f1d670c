#pragma once
// How many nodes of a drafted tree to verify this round. A node's cumulative draft probability
// estimates the chance that the target accepts the whole path to it (EAGLE-2's observation), so
// verifying the first n nodes of prune_order is expected to emit 1 + gamma * (their summed
// probabilities) tokens, for draft time + verify(n + 1) ms. The policy picks the n with the most
// tokens per millisecond on the measured verify-cost curve, and learns gamma, the ratio of what
// the target accepted to what the draft's probabilities promised, from the rounds so far.
// The terms (round, step, row, plain step, StepShare, promised, gamma, free draft, explore, skip,
// probe, gate, ...) are those defined at the top of policy/round_policy.h.
#include <algorithm>
#include <array>
#include <span>
#include <vector>

#include "policy/draft_length.h"
#include "policy/verify_cost.h"

namespace specula {

// Largest tree verified when the size is left to the policy (--tree-nodes 0).
inline constexpr int kAutoTreeMaxNodes = 32;

class TreeSizePolicy {
public:
    // verify_cost_ms[b - 1]: measured cost of a target forward of b tokens at `measured_depth`
    // tokens of context; trees are capped at its length - 1 nodes. row_depth_ms: what a row past
    // the first costs more per token of context past that depth (VerifyCost's prior).
    explicit TreeSizePolicy(std::vector<double> verify_cost_ms, int measured_depth = 0, double row_depth_ms = 0.0);
    // The context this round verifies at (tokens in the cache): extra rows cost more deeper in it.
    void at_depth(int tokens) { verify_.at_depth(tokens); }

    int max_nodes() const { return verify_.max_tokens() - 1; }
    // path_probs: cumulative draft probability of each node, in prune order. Returns n >= min_nodes
    // (0: verifying none of them, a plain step, is among the choices).
    // `step`: what the rest of a shared step carries (the step's tokens per second are weighed).
    int choose(std::span<const double> path_probs, double draft_ms, const StepShare & step = {}, int min_nodes = 1);
    // What choose() would pick, and the tokens per ms it expects of it, without recording it.
    struct Choice {
        int nodes = 0;
        double rate = 0.0;
    };
    Choice best_prefix(std::span<const double> path_probs, double draft_ms, const StepShare & step = {}, int min_nodes = 1) const;
    // After verification of the n chosen nodes (a tree `depth` levels deep): the promised sum and
    // what was accepted; step_rows: rows of the verify forward (n_verified + 1 alone).
    void observe(double promised, int accepted, int n_verified, int depth, double verify_ms, int step_rows = -1);
    // A round that drafted nothing: its forward of step_rows rows (1 alone) took verify_ms. The
    // plain forward's cost deep in a context is what drafting there must beat.
    void observe_plain(int step_rows, double verify_ms) { verify_.observe(step_rows, verify_ms); }
    // Every decoding round's step, drafting or not, when all its rows were verify rows: its rows
    // and forward time (VerifyCost::observe_step).
    void observe_step(int rows, double forward_ms);
    // A drafting round's time, how many drafter forwards (tree levels) it took and each level's
    // share of it (empty: unknown). Returns the drafting time to price this round's tree with. A
    // round whose first level catches the drafter up on tokens (a sequence's first round, which
    // reads the whole prompt, or one after skipped rounds) is timed by its later levels only, and
    // priced at what its levels usually cost, since one long prompt's catch-up would price every
    // later draft out. A level only ever costs more than usual (building the graph of a frontier
    // size not seen before, first touching its buffers, the process descheduled), so the level
    // time follows faster observations quickly and slower ones slowly, and a first round gives its
    // fastest later level, not their mean, which its graph builds inflate (docs/policies.md).
    double observe_draft(double draft_ms, int levels, std::span<const double> level_ms = {});
    // Expanding a node of path probability P adds at most gamma * P expected tokens for one more
    // drafter forward; below this P that cannot beat plain decoding's rate, so it is not drafted.
    // In a shared step a drafter forward delays every sequence of the step, so it must beat the
    // step's plain rate: (1 + the others' tokens) per forward of (the others' rows + 1).
    double min_path_prob(const StepShare & step = {}) const;
    // bars[k] (k < max_nodes()): the least path probability a node needs to be verified when k
    // nodes of the tree are likelier. Verifying it as the (k + 1)-th node adds gamma * P expected
    // tokens for its verify row's extra time, which raises the round's tokens per ms only above
    // the rate of the tree chosen last round. The dynamic builder does not expand a node below the
    // bar of the rank its children would take (they are no likelier than it): those levels' drafter
    // forwards would draft nodes that choose() then prunes. Empty before the first choose().
    std::vector<float> rank_bars(const StepShare & step = {}) const;
    // What this round drafts. A draft L levels deep adds L drafter forwards and its rows' verify
    // cost to the step and is expected to add the tokens the acceptance seen at each depth
    // promises; for a full draft (Draft) that must beat the step's plain rate, (1 + the others'
    // tokens) per forward of (the others' rows + 1), at some L. A busy step's plain rate is high,
    // so drafting there must promise more. Acceptance is kept per depth, so the one-node rounds
    // that explore inform the first depth only, not a whole draft's yield; and a round that
    // follows skipped ones is not timed: its first drafter forward catches up on the tokens the
    // skipped rounds emitted, a cost the rounds that draft continuously do not pay.
    // Until rounds have been seen it drafts; every kExploreEvery-th round it would skip (x the
    // sequences in the step: an exploring draft delays them all; less often where a drafter level
    // and a verify row cost more than 2% of the skipped rounds' time) it explores: one drafter level,
    // one node, enough to notice a text that turns predictable (a whole tree's six levels and its
    // rows would cost a busy step most of its time, for a draft the policy expects not to pay).
    // Never, not even to explore, while a draft could not pay if every token of it were accepted:
    // a chain of n tokens for n drafter levels plus n more verify rows, at its best n, against the
    // step's plain rate. A busy step on a CPU is there (a row costs nearly what a token does), and
    // an exploring draft would only slow the step.
    enum class Round {
        Skip,
        Explore,
        Draft
    };
    // free_rate: tokens per ms that a free draft (Drafter::free_draft, no drafter forward) is
    // expected to give this round: a model draft must beat it too, not only the plain rate.
    Round plan_round(const StepShare & step = {}, double free_rate = 0.0);
    double calibration() const { return promised_ > 0 ? accepted_ / promised_ : 1.0; }
    // The calibration as applied to a path probability (bounded).
    double gamma() const { return std::clamp(calibration(), 0.05, 2.0); }
    // A new sequence starts on this policy (a server slot's next request): the drafter's and the
    // verifier's times measured so far are the machine's and stay, and so does the calibration, as
    // the new text's prior; the first drafting round, which catches the drafter up on the prompt,
    // is not timed.
    void begin_sequence() { skipped_ = 0, time_next_draft_ = false; }

private:
    static constexpr int kExploreEvery = 8;
    static constexpr double kExploreShare = 0.02;  // of the plain rounds' time an exploration may cost
    static constexpr int kMaxDepth = 16;           // depths whose acceptance is kept
    // Untried depths start at this acceptance, with the weight of kPriorRounds rounds.
    static constexpr double kPriorAcceptance = 0.8, kPriorRounds = 2.0;
    // Tokens per ms of the step without this sequence's draft: (1 + the others' tokens) per
    // forward of (the others' rows + 1); alone, one token per one-row forward.
    double plain_rate(const StepShare & step) const;
    bool can_pay(const StepShare & step) const;
    Round decide_round(const StepShare & step, double free_rate) const;
    VerifyCost verify_;
    double promised_ = 0.0, accepted_ = 0.0;  // decayed sums
    // Decayed counts of drafting rounds whose tree reached depth d + 1, and of those that accepted
    // a node there.
    std::array<double, kMaxDepth> reached_{}, accepted_at_{};
    double levels_ = 0.0, level_nodes_ = 0.0;  // decayed sums over full drafts: tree depth, verified nodes
    double level_ms_ = 0.0;                    // drafter time per tree level, smoothed
    double chosen_rate_ = 0.0;                 // tokens per ms of the last chosen tree (choose())
    int skipped_ = 0;                          // rounds skipped since the last one that drafted
    Round last_plan_ = Round::Draft;
    bool time_next_draft_ = false;  // false for a round whose drafter catches up (a sequence's first, one after skips)
};

}  // namespace specula
