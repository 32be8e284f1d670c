#include "draft/eagle.h"

#include <algorithm>
#include <cmath>

#include "specula/error.h"
#include "draft/propose.h"

namespace specula {

EagleDrafter::EagleDrafter(const EagleHead & head, int n_ctx)
    : head_(head), runner_(head), cache_(head.backend(), 1, head.shape().n_embd_kv, n_ctx) {}

const char * EagleDrafter::name() const { return head_.config().kind == EagleKind::Eagle3 ? "eagle3" : "eagle1"; }

void EagleDrafter::reset() {
    cache_.rollback(0);
    pending_.clear();
    pending_first_ = 0;
}

void EagleDrafter::accept(const Acceptance & a) {
    const int width = head_.feature_width();
    // Entries at and after the first newly verified position were the head's own guesses.
    cache_.rollback(std::min(cache_.size(), a.first_position));
    const size_t keep_rows = static_cast<size_t>(std::max(0, a.first_position - pending_first_));
    if (pending_.size() > keep_rows * width) pending_.resize(keep_rows * width);
    if (pending_.empty()) pending_first_ = a.first_position;
    if (pending_first_ + static_cast<int>(pending_.size() / width) != a.first_position) {
        throw Error("EAGLE drafter: target features arrived with a gap before position " + std::to_string(a.first_position));
    }
    pending_.insert(pending_.end(), a.features.begin(), a.features.end());
}

Draft EagleDrafter::draft(const DraftRequest & req) {
    Draft d;
    const int L = static_cast<int>(req.history.size());
    const int root_pos = L - 1;
    const int width = head_.feature_width();
    const int E = head_.shape().n_embd;
    const int pending_rows = static_cast<int>(pending_.size() / width);
    // Entries exist (or are pending) for positions < root_pos; the last one drafts the root's successor.
    if (pending_rows == 0 || pending_first_ + pending_rows != root_pos || cache_.size() != pending_first_) return d;

    // Per tree node: the pre-norm output of its own entry; its children are proposed from that
    // entry and are fed that output as their hidden state.
    std::vector<std::vector<float>> proposer_hidden;
    std::vector<int> slot_of;
    std::vector<float> root_hidden;
    const int committed = root_pos;  // cache slots holding target-feature entries after catch-up
    const DraftVocabulary vocab{head_.d2t(), head_.shape().n_token_vocab};

    auto expand = [&](const TokenTree & tree, std::span<const int> frontier, std::span<const int> n_children) {
        std::vector<Expansion> out;
        if (frontier.size() == 1 && frontier[0] == TokenTree::kRoot) {
            ForwardBatch b;
            for (int p = pending_first_; p < root_pos; ++p) {
                b.tokens.push_back(req.history[p + 1]);
                b.positions.push_back(p);
            }
            b.hidden_in = std::move(pending_);
            pending_.clear();
            b.mask = BlockMask::causal(b.n_tokens());
            b.logit_rows = {b.n_tokens() - 1};
            runner_.forward(b, cache_, out_);
            pending_first_ = root_pos;
            root_hidden.assign(out_.hidden_out.end() - E, out_.hidden_out.end());
            out.push_back(propose_children(out_.logits_row(0), n_children[0], req, probs_, vocab));
            return out;
        }
        const int first_slot = cache_.size();
        ForwardBatch b = frontier_batch(tree, frontier, root_pos - 1, committed, slot_of);
        for (const int node : frontier) {  // self-fed: the pre-norm output of the entry that proposed it
            const std::vector<float> & h = tree.parent[node] == TokenTree::kRoot ? root_hidden : proposer_hidden[tree.parent[node]];
            b.hidden_in.insert(b.hidden_in.end(), h.begin(), h.end());
        }
        runner_.forward(b, cache_, out_);
        if (static_cast<int>(slot_of.size()) < tree.size()) {
            slot_of.resize(tree.size(), -1);
            proposer_hidden.resize(tree.size());
        }
        for (size_t i = 0; i < frontier.size(); ++i) {
            slot_of[frontier[i]] = first_slot + static_cast<int>(i);
            proposer_hidden[frontier[i]].assign(out_.hidden_out.begin() + i * E, out_.hidden_out.begin() + (i + 1) * E);
            out.push_back(propose_children(out_.logits_row(i), n_children[i], req, probs_, vocab));
        }
        return out;
    };
    TreeBudget budget = req.budget;
    budget.depth = std::min(budget.depth, std::max(1, (cache_.capacity() - root_pos) / std::max(1, budget.branching)));
    BuiltTree built = build_tree(budget, expand);
    d.tree = std::move(built.tree);
    d.mean_entropy = built.mean_entropy;
    cache_.rollback(committed);  // drop every self-fed entry
    return d;
}

}  // namespace specula
