#include "engine/generation_mode.h"

#include <algorithm>

#include "specula/error.h"

namespace specula {

namespace {
bool sized_per_round(const TreeBudget & tree) { return tree.shape != TreeShape::Chain && tree.max_nodes == 0; }
}  // namespace

TreeBudget mode_tree(GenerationMode mode, TreeBudget rules) {
    if (mode == GenerationMode::SpeceeLossless) rules.shape = TreeShape::Chain;
    return rules;
}

std::unique_ptr<TreeSizePolicy> make_tree_size_policy(const TreeBudget & tree, int k_max, const VerifyCostCurve & cost) {
    if (!sized_per_round(tree)) return nullptr;
    const size_t sizes = std::min(cost.ms.size(), static_cast<size_t>(std::max(k_max + 1, kAutoTreeMaxNodes + 1)));
    return std::make_unique<TreeSizePolicy>(std::vector<double>(cost.ms.begin(), cost.ms.begin() + sizes), cost.depth, cost.row_depth_ms);
}

RoundPolicies make_round_policies(GenerationMode mode, DraftPolicyKind kind, int k_max, const TreeBudget & rules, const VerifyCostCurve & cost) {
    return RoundPolicies{.length = make_draft_policy(kind, k_max, cost.ms, cost.depth, cost.row_depth_ms),
                         .tree_size = make_tree_size_policy(mode_tree(mode, rules), k_max, cost)};
}

SequenceParts sequence_parts(GenerationMode mode, KvCache & cache, Drafter * drafter, const TreeBudget & rules, DraftLengthPolicy * length,
                             TreeSizePolicy * tree_size, std::function<void(const RoundInfo &)> on_round) {
    if (mode == GenerationMode::Plain || mode == GenerationMode::SpeceeLossy) {
        throw Error("sequence_parts: plain and lossy SpecEE decoding verify no drafts");
    }
    const TreeBudget tree = mode_tree(mode, rules);
    return SequenceParts{.cache = cache,
                         .drafter = drafter,
                         .policy = length,
                         .tree = tree,
                         .on_round = std::move(on_round),
                         .verify = {},
                         .tree_size = sized_per_round(tree) ? tree_size : nullptr};
}

}  // namespace specula
