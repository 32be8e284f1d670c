#pragma once
// The draft a drafter hands to the verifier, and nothing else passes between them.
// Nodes are stored flat in creation order (a parent always before its children); the root is the
// last accepted token, which is not a node. A chain is the tree whose nodes each have one child.
#include <cstdint>
#include <span>
#include <vector>

namespace specula {

struct TokenTree {
    static constexpr int kRoot = -1;

    std::vector<int32_t> token;     // [n] drafted token of node i
    std::vector<int> parent;        // [n] parent node, kRoot for depth-1 nodes
    std::vector<int> depth;         // [n] 1 for children of the root
    std::vector<float> logp;        // [n] draft's log-probability that verification reaches i (draft/propose.cpp)
    std::vector<int> first_child;   // [n] -1 if none
    std::vector<int> next_sibling;  // [n] -1 if none
    int root_first_child = -1;
    // Draft distribution each node's children were proposed from, over the full vocabulary:
    // q[0] for the root's children, q[i + 1] for node i's. Empty when the drafter has none
    // (n-gram); the verifier then treats the proposal as deterministic (one-hot).
    std::vector<std::vector<float>> q;
    // [n] or shorter (missing: 0): 1 where the node was proposed deterministically (a grafted
    // lookup token) beside siblings drawn from its parent's q; its proposal is a one-hot, and
    // the verifier tries it after them.
    std::vector<char> one_hot;

    int size() const { return static_cast<int>(token.size()); }
    bool empty() const { return token.empty(); }
    int add(int parent_node, int32_t tok, float cumulative_logp);
    int add_one_hot(int parent_node, int32_t tok, float cumulative_logp);
    // Whether `node` was proposed as a one-hot: flagged so, or its parent has no q.
    bool proposed_one_hot(int node) const;
    // Children of `node` (kRoot for the root) in the order they were added.
    std::vector<int> children(int node) const;
    int first_child_of(int node) const { return node == kRoot ? root_first_child : first_child[node]; }
    std::span<const float> q_of(int node) const;  // distribution over `node`'s children; empty if none
    std::vector<int> path_to(int node) const;     // root-exclusive, top-down
    int max_depth() const;

    static TokenTree chain(std::span<const int32_t> tokens);
};

// Draft probability of a node's own token: q of its parent's distribution, 1 when proposed one-hot.
float node_draft_prob(const TokenTree & tree, int node);

}  // namespace specula
