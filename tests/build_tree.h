#pragma once
// The tree builder driven to completion by a function that proposes each level's children, as a
// drafter does with its forwards: the tree tests' way to grow a tree from fake proposals.
#include <functional>
#include <span>
#include <vector>

#include "tree/tree_builder.h"

namespace specula::test {

using ExpandFn = std::function<std::vector<Expansion>(const TokenTree & tree, std::span<const int> frontier,
                                                      std::span<const int> n_children)>;

inline BuiltTree build_tree(const TreeBudget & budget, const ExpandFn & expand) {
    TreeGrower g(budget);
    while (g.growing()) g.expand(expand(g.tree(), g.frontier(), g.n_children()));
    return g.finish();
}

}  // namespace specula::test
