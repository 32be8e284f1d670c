#pragma once
// How many tokens to draft next round. Three policies:
//   fixed     - always k;
//   heuristic - an acceptance + entropy rule: grow k after a round accepting > 80% (or >= 50%
//               with a confident draft, mean entropy < 2 nats), shrink it after one accepting < 30%;
//   cost      - choose k in 0..k_max maximising expected tokens per second, from the measured
//               per-position acceptance and the measured cost of drafting and of verifying k + 1
//               tokens (a draft after free chains also prices its catch-up on the tokens they
//               emitted; in a shared step, extra rows priced as TreeSizePolicy prices them: the
//               curve, or the line through the server's steps if higher); k = 0 (a plain step)
//               when no draft pays, with a one-token probe now and then (less often the more
//               sequences the step holds, never where even a draft accepted whole cannot pay) so
//               that a drafter that starts to agree is noticed.
// The terms (round, step, row, plain step, StepShare, promised, gamma, free draft, explore, skip,
// probe, gate, ...) are those defined at the top of policy/round_policy.h.
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "specula/options.h"

namespace specula {

// What else the target forward of a step carries besides this sequence's block (other sequences'
// rows and the tokens they are expected to emit), so that a policy weighs its draft against the
// whole step: the step's time is everyone's. Zero when the sequence runs alone.
struct StepShare {
    int other_rows = 0;
    double other_tokens = 0.0;
    int other_sequences = 0;
};

// A sequence's share of the coming step, from the previous step (its verify rows and emitted
// tokens, everyone's, and this sequence's part of them) and who is in this one: at least a root
// row and a token per other decoding sequence, so that sequences that just joined, or a first step
// with nothing before it, do not plan as if alone. Prompt chunks are left out: the step does them
// whatever the drafts, and a draft must beat the rate of decoding, not the low rate of a step
// slowed by a prompt (counted in, they would make drafting look cheap in every such step).
StepShare estimate_step_share(int previous_verify_rows, int previous_tokens, int own_rows, int own_tokens, int other_sequences,
                              int other_decoding);

struct RoundObservation {
    int drafted = 0;
    int accepted = 0;
    float mean_entropy = 0.0f;
    double draft_seconds = 0.0;
    double verify_seconds = 0.0;
    int verify_tokens = 0;    // rows of the verify forward (the whole step's when shared)
    bool free_draft = false;  // a free chain (prompt lookup's) verified in place of a model draft
};

class DraftLengthPolicy {
public:
    virtual ~DraftLengthPolicy() = default;
    virtual const char * name() const = 0;
    virtual int next_length() = 0;
    // The same, for a round inside a step shared with other sequences (cost policy; the others
    // ignore the share).
    virtual int next_length_in(const StepShare & step) { return next_length(); }
    // A free chain (prompt lookup's), in place of this round's model draft: how many of its first
    // tokens to verify (path_probs: each token's path probability, top-down) when that beats both
    // the plain step and, unless the model drafter is kept out, the best model draft that this
    // round's next_length_in() weighed; 0 when it does not (cost policy; the others never take one).
    virtual int free_chain_length(std::span<const double> path_probs, const StepShare & step, bool model_may_draft) {
        (void)path_probs, (void)step, (void)model_may_draft;
        return 0;
    }
    virtual void observe(const RoundObservation & round) = 0;
    // Every decoding round's step whose rows were all verify rows: its rows and forward time
    // (VerifyCost::observe_step; cost policy).
    virtual void observe_step(int rows, double forward_ms) {}
    // The context the next round verifies at (tokens in the cache; cost policy).
    virtual void at_depth(int tokens) {}
    // A new sequence starts on this policy (a server slot's next request). What a policy measured
    // of the machine (drafter and verify times) stays: a fresh one drafts blind until it has timed
    // its own rounds. A policy that measures no time starts over, so a seeded sequence's draws
    // depend on its own history only.
    virtual void begin_sequence() {}
};

// verify_cost_ms[b - 1]: measured cost of a target forward of b tokens at `measured_depth` tokens
// of context, row_depth_ms its growth per extra row and token deeper (cost policy only; VerifyCost).
std::unique_ptr<DraftLengthPolicy> make_draft_policy(DraftPolicyKind kind, int k_max, std::vector<double> verify_cost_ms,
                                                     int measured_depth = 0, double row_depth_ms = 0.0);

// Expected tokens emitted by a round drafting k tokens, given P(accept position i | reached i).
double expected_tokens(const std::vector<double> & accept_given_reached, int k);

}  // namespace specula
