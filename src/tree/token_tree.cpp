#include "tree/token_tree.h"

#include <algorithm>

namespace specula {

int TokenTree::add(int parent_node, int32_t tok, float cumulative_logp) {
    const int id = size();
    token.push_back(tok);
    parent.push_back(parent_node);
    depth.push_back(parent_node == kRoot ? 1 : depth[parent_node] + 1);
    logp.push_back(cumulative_logp);
    first_child.push_back(-1);
    next_sibling.push_back(-1);
    // Append at the end of the parent's child list, keeping insertion order.
    int & head = parent_node == kRoot ? root_first_child : first_child[parent_node];
    if (head < 0) {
        head = id;
    } else {
        int c = head;
        while (next_sibling[c] >= 0) c = next_sibling[c];
        next_sibling[c] = id;
    }
    return id;
}

int TokenTree::add_one_hot(int parent_node, int32_t tok, float cumulative_logp) {
    const int id = add(parent_node, tok, cumulative_logp);
    one_hot.resize(token.size(), 0);
    one_hot[id] = 1;
    return id;
}

bool TokenTree::proposed_one_hot(int node) const {
    if (static_cast<size_t>(node) < one_hot.size() && one_hot[node]) return true;
    return q_of(parent[node]).empty();
}

std::vector<int> TokenTree::children(int node) const {
    std::vector<int> out;
    for (int c = first_child_of(node); c >= 0; c = next_sibling[c]) out.push_back(c);
    return out;
}

std::span<const float> TokenTree::q_of(int node) const {
    const size_t idx = static_cast<size_t>(node + 1);
    if (idx >= q.size()) return {};
    return q[idx];
}

float node_draft_prob(const TokenTree & tree, int node) {
    if (tree.proposed_one_hot(node)) return 1.0f;
    const auto q = tree.q_of(tree.parent[node]);
    const auto t = static_cast<size_t>(tree.token[node]);
    return t < q.size() ? q[t] : 1.0f;
}

std::vector<int> TokenTree::path_to(int node) const {
    std::vector<int> p;
    for (int n = node; n != kRoot; n = parent[n]) p.push_back(n);
    std::reverse(p.begin(), p.end());
    return p;
}

int TokenTree::max_depth() const { return depth.empty() ? 0 : *std::max_element(depth.begin(), depth.end()); }

TokenTree TokenTree::chain(std::span<const int32_t> tokens) {
    TokenTree t;
    int prev = kRoot;
    for (int32_t tok : tokens) prev = t.add(prev, tok, 0.0f);
    return t;
}

}  // namespace specula
