#include "tree/tree_builder.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <numeric>

#include "specula/error.h"

namespace specula {

const std::vector<std::vector<int>> & static_tree_paths() {
    // Wide near the root, a deep spine on the most likely branch: EAGLE-1's tree in miniature,
    // one line per depth.
    // clang-format off
    static const std::vector<std::vector<int>> paths = {
        {0}, {1}, {2}, {3},
        {0, 0}, {0, 1}, {0, 2}, {1, 0}, {1, 1}, {2, 0},
        {0, 0, 0}, {0, 0, 1}, {0, 1, 0}, {1, 0, 0},
        {0, 0, 0, 0}, {0, 0, 0, 1}, {0, 1, 0, 0},
        {0, 0, 0, 0, 0}, {0, 0, 0, 0, 1},
        {0, 0, 0, 0, 0, 0}, {0, 0, 0, 0, 0, 0, 0}, {0, 0, 0, 0, 0, 0, 0, 0},
    };
    // clang-format on
    return paths;
}

std::vector<int> prune_order(const TokenTree & t) {
    std::vector<int> by_logp(t.size());
    std::iota(by_logp.begin(), by_logp.end(), 0);
    std::stable_sort(by_logp.begin(), by_logp.end(), [&](int a, int b) { return t.logp[a] > t.logp[b]; });
    std::vector<int> prev_sibling(t.size(), -1);
    for (int n = TokenTree::kRoot; n < t.size(); ++n) {
        // Siblings drawn from q without replacement enter in the order they were drawn; a one-hot
        // sibling (grafted) was drawn from nothing and is ordered by nothing.
        for (int c = t.first_child_of(n), prev = -1; c >= 0; c = t.next_sibling[c]) {
            if (t.proposed_one_hot(c) && !t.q_of(n).empty()) continue;
            prev_sibling[c] = prev;
            prev = c;
        }
    }
    std::vector<char> in(t.size(), 0);
    std::vector<int> order;
    // Repeatedly admit the best node whose parent and previous sibling are in.
    while (static_cast<int>(order.size()) < t.size()) {
        bool progress = false;
        for (int n : by_logp) {
            if (in[n]) continue;
            const bool parent_in = t.parent[n] == TokenTree::kRoot || in[t.parent[n]];
            const bool sibling_in = prev_sibling[n] < 0 || in[prev_sibling[n]];
            if (parent_in && sibling_in) {
                in[n] = 1;
                order.push_back(n);
                progress = true;
                break;
            }
        }
        if (!progress) break;
    }
    return order;
}

TokenTree prune_tree(const TokenTree & t, int n) {
    const std::vector<int> order = prune_order(t);
    std::vector<char> keep(t.size(), 0);
    for (int i = 0; i < std::min<int>(n, static_cast<int>(order.size())); ++i) keep[order[i]] = 1;
    TokenTree out;
    std::vector<int> new_id(t.size(), -1);
    for (int i = 0; i < t.size(); ++i) {
        if (!keep[i]) continue;
        const int parent = t.parent[i] == TokenTree::kRoot ? TokenTree::kRoot : new_id[t.parent[i]];
        const bool one_hot = static_cast<size_t>(i) < t.one_hot.size() && t.one_hot[i];
        new_id[i] = one_hot ? out.add_one_hot(parent, t.token[i], t.logp[i]) : out.add(parent, t.token[i], t.logp[i]);
    }
    if (!t.q.empty()) {
        out.q.resize(out.size() + 1);
        if (!t.q[0].empty()) out.q[0] = t.q[0];
        for (int i = 0; i < t.size(); ++i) {
            if (keep[i] && static_cast<size_t>(i + 1) < t.q.size() && out.first_child_of(new_id[i]) >= 0) out.q[new_id[i] + 1] = t.q[i + 1];
        }
    }
    return out;
}

TreeGrower::TreeGrower(const TreeBudget & budget) : budget_(budget) {
    if (budget.depth < 1 || budget.max_nodes < 1 || budget.branching < 1) throw Error("tree budget must be positive");
    int root_children = 1;
    if (budget.shape == TreeShape::Dynamic) root_children = std::min(budget.branching, budget.max_nodes);
    if (budget.shape == TreeShape::Static) {
        root_children = 0;
        for (const auto & p : static_tree_paths()) {
            if (p.size() == 1) root_children = std::max(root_children, p[0] + 1);
        }
    }
    frontier_ = {TokenTree::kRoot};
    n_children_ = {root_children};
}

void TreeGrower::add_children(int parent, const Expansion & e) {
    const float base = parent == TokenTree::kRoot ? 0.0f : tree_.logp[parent];
    if (!e.q.empty()) {
        if (tree_.q.size() < static_cast<size_t>(tree_.size() + 1)) tree_.q.resize(tree_.size() + 1);
        tree_.q[parent + 1] = e.q;
    }
    entropy_sum_ += e.entropy;
    ++n_expansions_;
    for (size_t c = 0; c < e.tokens.size(); ++c) {
        tree_.add(parent, e.tokens[c], base + e.logp[c]);
        rank_path_.push_back(parent == TokenTree::kRoot ? std::vector<int>{} : rank_path_[parent]);
        rank_path_.back().push_back(static_cast<int>(c));
    }
}

void TreeGrower::expand(std::span<const Expansion> expansions) {
    if (!growing()) throw Error("TreeGrower: the tree is complete");
    if (expansions.size() != frontier_.size()) throw Error("drafter returned the wrong number of expansions");
    for (size_t i = 0; i < frontier_.size(); ++i) add_children(frontier_[i], expansions[i]);
    frontier_.clear();
    n_children_.clear();
    // The next level with a frontier, if any.
    while (frontier_.empty() && level_ < budget_.depth && plan_level(++level_)) {
    }
}

bool TreeGrower::plan_level(int d) {
    std::vector<int> level;
    for (int n = 0; n < tree_.size(); ++n) {
        if (tree_.depth[n] == d - 1) level.push_back(n);
    }
    if (level.empty()) return false;  // nothing left to grow from
    switch (budget_.shape) {
        case TreeShape::Chain:
            frontier_ = {level.front()};
            n_children_ = {1};
            break;
        case TreeShape::Static: {
            std::map<int, int> want;  // node -> children
            for (const auto & p : static_tree_paths()) {
                if (static_cast<int>(p.size()) != d) continue;
                const std::vector<int> parent_path(p.begin(), p.end() - 1);
                for (int n : level) {
                    if (rank_path_[n] == parent_path) want[n] = std::max(want[n], p.back() + 1);
                }
            }
            for (auto [n, k] : want) frontier_.push_back(n), n_children_.push_back(k);
            break;
        }
        case TreeShape::Dynamic: {
            std::stable_sort(level.begin(), level.end(), [&](int a, int c) { return tree_.logp[a] > tree_.logp[c]; });
            level.resize(std::min<size_t>(level.size(), std::min(budget_.branching, budget_.max_nodes)));
            // A child's log-probability never exceeds its parent's: once max_nodes nodes beat a
            // frontier node, nothing below it can make the final tree, so it is not expanded.
            if (tree_.size() >= budget_.max_nodes) {
                std::vector<float> lp = tree_.logp;
                std::nth_element(lp.begin(), lp.begin() + (budget_.max_nodes - 1), lp.end(), std::greater<float>());
                const float bar = lp[budget_.max_nodes - 1];
                std::erase_if(level, [&](int n) { return tree_.logp[n] <= bar; });
            }
            // Children are no likelier than their parent, and would rank behind it and every
            // likelier node: a node below the bar its children need is not expanded. That bar is
            // the least path probability that pays for a drafter forward, or for a verify row at
            // the children's rank (rank_bar), whichever is higher.
            auto children_bar = [&](int n) {
                float bar = budget_.min_path_prob;
                const size_t rank = 1 + std::count_if(tree_.logp.begin(), tree_.logp.end(), [&](float lp) { return lp > tree_.logp[n]; });
                if (rank < budget_.rank_bar.size()) bar = std::max(bar, budget_.rank_bar[rank]);
                return bar;
            };
            std::erase_if(level, [&](int n) { return tree_.logp[n] < std::log(children_bar(n)); });
            frontier_ = level;
            n_children_.assign(frontier_.size(), std::min(budget_.branching, budget_.max_nodes));
            break;
        }
    }
    return true;
}

BuiltTree TreeGrower::finish() {
    BuiltTree out;
    out.mean_entropy = n_expansions_ ? entropy_sum_ / n_expansions_ : 0.0f;
    out.tree = tree_.size() > budget_.max_nodes ? prune_tree(tree_, budget_.max_nodes) : std::move(tree_);
    return out;
}

}  // namespace specula
