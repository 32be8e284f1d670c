#pragma once
// The generation modes and the one place that says what each is made of:
//   Plain           the target alone, a token per forward;
//   Speculative     a drafter's chains or trees verified by the target (engine/sequence.h),
//                   sized by the drafting rules' round policies (policy/round_policy.h);
//   SpeceeLossy     SpecEE's early exits emitted as they are (engine/specee.h, no verification);
//   SpeceeLossless  SpecEE's early-exited tokens as drafts (draft/early_exit.h), verified in
//                   chains: the tokens up to the first that did not exit.
// The engine, the server's scheduler, `bench spec` and `specula specee-eval` choose a mode and
// build its sequences here, so that a mode's rules (a lossless SpecEE sequence drafts chains and
// sizes no tree) cannot drift apart between them.
#include <functional>
#include <memory>
#include <vector>

#include "engine/sequence.h"
#include "policy/draft_length.h"
#include "policy/tree_size.h"
#include "specula/options.h"
#include "tree/tree_builder.h"

namespace specula {

class Drafter;
class KvCache;

enum class GenerationMode {
    Plain,
    Speculative,
    SpeceeLossy,
    SpeceeLossless
};

// The verify-cost curve the policies price drafts with (engine/verify_cost_probe.h times it):
// ms[b - 1] a target forward of b rows at `depth` tokens of context, row_depth_ms how much more a
// row past the first costs per token deeper.
struct VerifyCostCurve {
    std::vector<double> ms;
    int depth = 0;
    double row_depth_ms = 0.0;
};

// The tree a mode drafts, from the drafting rules' `rules`: chains for SpeceeLossless.
TreeBudget mode_tree(GenerationMode mode, TreeBudget rules);

// The tree-size policy where `tree` is sized per round (a tree shape with max_nodes 0), else
// nullptr. It verifies at most max(k_max, kAutoTreeMaxNodes) nodes: the sizes one sequence
// verifies (the rest of the curve, measured for a server's shared steps, it extrapolates).
std::unique_ptr<TreeSizePolicy> make_tree_size_policy(const TreeBudget & tree, int k_max, const VerifyCostCurve & cost);

// A mode's round policies, fresh (a server slot keeps its own from request to request): the
// draft-length policy `kind` up to k_max tokens, and the tree-size policy of the mode's tree.
struct RoundPolicies {
    std::unique_ptr<DraftLengthPolicy> length;
    std::unique_ptr<TreeSizePolicy> tree_size;
};
RoundPolicies make_round_policies(GenerationMode mode, DraftPolicyKind kind, int k_max, const TreeBudget & rules, const VerifyCostCurve & cost);

// One sequence's parts in a mode that verifies (Speculative, SpeceeLossless; with no drafter
// every round verifies the root alone, as plain decoding): the mode's tree, the caller's drafter
// and policies (the tree-size one only where the mode's tree is sized per round). Throws Error
// for the modes that verify nothing.
SequenceParts sequence_parts(GenerationMode mode, KvCache & cache, Drafter * drafter, const TreeBudget & rules, DraftLengthPolicy * length,
                             TreeSizePolicy * tree_size, std::function<void(const RoundInfo &)> on_round = {});

}  // namespace specula
