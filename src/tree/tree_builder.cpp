#include "tree/tree_builder.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <numeric>

#include "specula/error.h"

namespace specula {

const std::vector<std::vector<int>> & static_tree_paths() {
    // Wide near the root, a deep spine on the most likely branch: EAGLE-1's tree in miniature.
    static const std::vector<std::vector<int>> paths = {
        {0}, {1}, {2}, {3},
        {0, 0}, {0, 1}, {0, 2}, {1, 0}, {1, 1}, {2, 0},
        {0, 0, 0}, {0, 0, 1}, {0, 1, 0}, {1, 0, 0},
        {0, 0, 0, 0}, {0, 0, 0, 1}, {0, 1, 0, 0},
        {0, 0, 0, 0, 0}, {0, 0, 0, 0, 1},
        {0, 0, 0, 0, 0, 0}, {0, 0, 0, 0, 0, 0, 0}, {0, 0, 0, 0, 0, 0, 0, 0},
    };
    return paths;
}

namespace {

struct Builder {
    TokenTree tree;
    std::vector<std::vector<int>> rank_path;  // per node
    float entropy_sum = 0.0f;
    int n_expansions = 0;

    void add_children(int parent, const Expansion & e) {
        const float base = parent == TokenTree::kRoot ? 0.0f : tree.logp[parent];
        if (!e.q.empty()) {
            if (tree.q.size() < static_cast<size_t>(tree.size() + 1)) tree.q.resize(tree.size() + 1);
            tree.q[parent + 1] = e.q;
        }
        entropy_sum += e.entropy;
        ++n_expansions;
        for (size_t c = 0; c < e.tokens.size(); ++c) {
            tree.add(parent, e.tokens[c], base + e.logp[c]);
            rank_path.push_back(parent == TokenTree::kRoot ? std::vector<int>{} : rank_path[parent]);
            rank_path.back().push_back(static_cast<int>(c));
        }
    }

    void expand(const ExpandFn & fn, const std::vector<int> & frontier, const std::vector<int> & n_children) {
        if (frontier.empty()) return;
        const auto ex = fn(tree, frontier, n_children);
        if (ex.size() != frontier.size()) throw Error("drafter returned the wrong number of expansions");
        for (size_t i = 0; i < frontier.size(); ++i) add_children(frontier[i], ex[i]);
    }
};

}  // namespace

std::vector<int> prune_order(const TokenTree & t) {
    std::vector<int> by_logp(t.size());
    std::iota(by_logp.begin(), by_logp.end(), 0);
    std::stable_sort(by_logp.begin(), by_logp.end(), [&](int a, int b) { return t.logp[a] > t.logp[b]; });
    std::vector<int> prev_sibling(t.size(), -1);
    for (int n = TokenTree::kRoot; n < t.size(); ++n) {
        for (int c = t.first_child_of(n), prev = -1; c >= 0; prev = c, c = t.next_sibling[c]) prev_sibling[c] = prev;
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
        new_id[i] = out.add(t.parent[i] == TokenTree::kRoot ? TokenTree::kRoot : new_id[t.parent[i]], t.token[i], t.logp[i]);
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

BuiltTree build_tree(const TreeBudget & budget, const ExpandFn & fn) {
    if (budget.depth < 1 || budget.max_nodes < 1 || budget.branching < 1) throw Error("tree budget must be positive");
    Builder b;
    const auto & paths = static_tree_paths();

    // Root.
    int root_children = 1;
    if (budget.shape == TreeShape::Dynamic) root_children = std::min(budget.branching, budget.max_nodes);
    if (budget.shape == TreeShape::Static) {
        root_children = 0;
        for (const auto & p : paths) {
            if (p.size() == 1) root_children = std::max(root_children, p[0] + 1);
        }
    }
    b.expand(fn, {TokenTree::kRoot}, {root_children});

    for (int d = 2; d <= budget.depth; ++d) {
        std::vector<int> frontier, n_children;
        std::vector<int> level;
        for (int n = 0; n < b.tree.size(); ++n) {
            if (b.tree.depth[n] == d - 1) level.push_back(n);
        }
        if (level.empty()) break;
        switch (budget.shape) {
            case TreeShape::Chain:
                frontier = {level.front()};
                n_children = {1};
                break;
            case TreeShape::Static: {
                std::map<int, int> want;  // node -> children
                for (const auto & p : paths) {
                    if (static_cast<int>(p.size()) != d) continue;
                    const std::vector<int> parent_path(p.begin(), p.end() - 1);
                    for (int n : level) {
                        if (b.rank_path[n] == parent_path) want[n] = std::max(want[n], p.back() + 1);
                    }
                }
                for (auto [n, k] : want) frontier.push_back(n), n_children.push_back(k);
                break;
            }
            case TreeShape::Dynamic: {
                std::stable_sort(level.begin(), level.end(), [&](int a, int c) { return b.tree.logp[a] > b.tree.logp[c]; });
                level.resize(std::min<size_t>(level.size(), std::min(budget.branching, budget.max_nodes)));
                // A child's log-probability never exceeds its parent's: once max_nodes nodes beat a
                // frontier node, nothing below it can make the final tree, so it is not expanded.
                if (b.tree.size() >= budget.max_nodes) {
                    std::vector<float> lp = b.tree.logp;
                    std::nth_element(lp.begin(), lp.begin() + (budget.max_nodes - 1), lp.end(), std::greater<float>());
                    const float bar = lp[budget.max_nodes - 1];
                    std::erase_if(level, [&](int n) { return b.tree.logp[n] <= bar; });
                }
                // Children are no likelier than their parent: below the bar they cannot pay for a forward.
                const float log_min = std::log(budget.min_path_prob);
                std::erase_if(level, [&](int n) { return b.tree.logp[n] < log_min; });
                frontier = level;
                n_children.assign(frontier.size(), std::min(budget.branching, budget.max_nodes));
                break;
            }
        }
        b.expand(fn, frontier, n_children);
    }

    BuiltTree out;
    out.mean_entropy = b.n_expansions ? b.entropy_sum / b.n_expansions : 0.0f;
    out.tree = b.tree.size() > budget.max_nodes ? prune_tree(b.tree, budget.max_nodes) : std::move(b.tree);
    return out;
}

}  // namespace specula
