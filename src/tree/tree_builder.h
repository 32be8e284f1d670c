#pragma once
// Builds a draft tree from a drafter's proposals, one level at a time (TreeGrower). Pure: the
// drafter proposes children for each level's frontier nodes (one forward for the whole frontier);
// the shape decides which nodes get expanded and which are kept.
//   chain   - the top child of the last node, `depth` times;
//   static  - a fixed set of child-rank paths (EAGLE-1): the same shape every round;
//   dynamic - EAGLE-2: expand the `branching` best nodes of each depth by cumulative draft
//             log-probability, then keep the `max_nodes` best nodes of the whole tree.
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "specula/options.h"
#include "tree/token_tree.h"

namespace specula {

struct TreeBudget {
    TreeShape shape = TreeShape::Chain;
    int depth = 4;               // levels below the root
    int branching = 4;           // children per expanded node (dynamic), frontier width per depth (dynamic)
    int max_nodes = 4;           // nodes sent to verification
    float min_path_prob = 0.0f;  // dynamic: nodes whose path is less likely than this are not expanded
    // dynamic: [k] the least path probability worth verifying with k likelier nodes in the tree
    // (TreeSizePolicy::rank_bars); a node below the bar of its children's rank is not expanded.
    // Empty, or past its end: no bar.
    std::vector<float> rank_bar = {};
    // What the tree policy will scale every path probability by (its learned accepted / promised):
    // a drafter whose probabilities are calibrated on their own divides theirs by it.
    float calibration = 1.0f;
};

// Children proposed for one frontier node, in proposal order (the order the verifier tries them).
struct Expansion {
    std::vector<int32_t> tokens;
    std::vector<float> logp;  // log-probability, given the node, that verification reaches each child (from the draft)
    std::vector<float> q;     // draft distribution the children were drawn from; empty at T = 0
    float entropy = 0.0f;     // of the draft distribution, nats
};

struct BuiltTree {
    TokenTree tree;
    float mean_entropy = 0.0f;
};

// While growing(), the drafter proposes up to n_children()[i] children for each frontier()[i]
// (TokenTree::kRoot first) and passes them to expand(): a level per call, so that the drafter's
// forward for it can run batched with other sequences' drafters.
class TreeGrower {
public:
    explicit TreeGrower(const TreeBudget & budget);  // throws Error unless depth, nodes and branching are positive
    bool growing() const { return !frontier_.empty(); }
    const TokenTree & tree() const { return tree_; }
    std::span<const int> frontier() const { return frontier_; }      // TokenTree::kRoot first
    std::span<const int> n_children() const { return n_children_; }  // children wanted per frontier node
    void expand(std::span<const Expansion> expansions);              // one per frontier node, in order
    BuiltTree finish();                                              // the tree, pruned to max_nodes

private:
    void add_children(int parent, const Expansion & e);
    bool plan_level(int depth);  // false when no node sits at depth - 1
    TreeBudget budget_;
    TokenTree tree_;
    std::vector<std::vector<int>> rank_path_;  // per node: child ranks from the root
    std::vector<int> frontier_, n_children_;
    int level_ = 1;  // depth of the children the frontier proposes
    float entropy_sum_ = 0.0f;
    int n_expansions_ = 0;
};

// The order in which nodes enter a pruned tree: best cumulative log-probability first, among the
// nodes whose parent and earlier siblings are already in (children are proposals tried in order,
// so a kept set must be a prefix of each proposal list for sampling to stay lossless).
std::vector<int> prune_order(const TokenTree & tree);
// The first n nodes of prune_order(tree), with their draft distributions.
TokenTree prune_tree(const TokenTree & tree, int n);

// The static shape: child-rank paths, e.g. {0, 1} = second child of the first child of the root.
const std::vector<std::vector<int>> & static_tree_paths();

}  // namespace specula
