#include "draft/draft_model.h"

#include <algorithm>
#include <cmath>

#include "specula/error.h"
#include "draft/propose.h"
#include "runtime/model.h"

namespace specula {

DraftModelDrafter::DraftModelDrafter(const Model & model, int n_ctx)
    : model_(model), runner_(model), cache_(model.backend(), model.config(), n_ctx) {}

void DraftModelDrafter::accept(const Acceptance & a) { cache_.rollback(std::min(cache_.size(), a.n_valid)); }

Draft DraftModelDrafter::draft(const DraftRequest & req) {
    const int L = static_cast<int>(req.history.size());
    if (cache_.size() >= L) cache_.rollback(L - 1);  // the root must be fed to get its successors
    std::vector<int> slot_of;  // tree node -> cache slot, once fed

    auto expand = [&](const TokenTree & tree, std::span<const int> frontier, std::span<const int> n_children) {
        std::vector<Expansion> out;
        if (frontier.size() == 1 && frontier[0] == TokenTree::kRoot) {
            // Catch up on every token the cache lacks (the root, plus accepted tokens of a tree round).
            const int n_in = cache_.size();
            runner_.forward(ForwardBatch::causal(req.history.subspan(n_in), n_in, {L - n_in - 1}), cache_, out_);
            out.push_back(propose_children(out_.logits_row(0), n_children[0], req, probs_));
            return out;
        }
        const int first_slot = cache_.size();
        const ForwardBatch b = frontier_batch(tree, frontier, L - 1, L, slot_of);
        runner_.forward(b, cache_, out_);
        if (static_cast<int>(slot_of.size()) < tree.size()) slot_of.resize(tree.size(), -1);
        for (size_t i = 0; i < frontier.size(); ++i) {
            slot_of[frontier[i]] = first_slot + static_cast<int>(i);
            out.push_back(propose_children(out_.logits_row(i), n_children[i], req, probs_));
        }
        return out;
    };

    Draft d;
    TreeBudget budget = req.budget;
    // Each depth needs a cache slot per frontier node; stop at the context's edge.
    budget.depth = std::min(budget.depth, std::max(1, (cache_.capacity() - L) / std::max(1, budget.branching)));
    BuiltTree built = build_tree(budget, expand);
    d.tree = std::move(built.tree);
    d.mean_entropy = built.mean_entropy;
    if (req.budget.shape != TreeShape::Chain) {
        // Tree nodes sit in the cache in drafting order, not path order: keep only the sequence;
        // the accepted path is re-fed with the next catch-up block.
        cache_.rollback(L);
    }
    return d;
}

}  // namespace specula
