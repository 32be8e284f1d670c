#include "draft/eagle_drafter.h"

#include <algorithm>
#include <cmath>

#include "specula/error.h"
#include "draft/propose.h"

namespace specula {

EagleDrafter::EagleDrafter(const EagleHead & head, int n_ctx, int prompt_window)
    : EagleDrafter(head, std::make_shared<ModelRunner>(head), std::make_unique<KvCache>(head.backend(), head.config().layer, n_ctx),
                   prompt_window) {}

EagleDrafter::EagleDrafter(const EagleHead & head, std::shared_ptr<ModelRunner> runner, std::unique_ptr<KvCache> stream, int prompt_window)
    : head_(head), runner_(std::move(runner)), cache_(std::move(stream)), prompt_window_(prompt_window) {
    if (&runner_->network() != &head) throw Error("EagleDrafter: the runner runs another network");
    if (prompt_window_ < 1) throw Error("EagleDrafter: the prompt window must be at least 1");
}

const char * EagleDrafter::name() const { return head_.config().kind == EagleKind::Eagle3 ? "eagle3" : "eagle1"; }

void EagleDrafter::reset() {
    cache_->rollback(0);
    first_position_ = 0;
    pending_.clear();
    pending_first_ = 0;
}

int EagleDrafter::keep_prefix(int n_common, int n_prompt) {
    const int window_start = std::max(0, n_prompt - 1 - prompt_window_);
    const int width = head_.feature_width();
    const int entries_end = first_position_ + cache_->size();
    // Entry P pairs token P + 1 with the target's features at P: common while P + 1 < n_common.
    const int common_entries_end = std::min(entries_end, n_common - 1);
    // Features pending right after the entries are the target's at P: common while P < n_common.
    int features_end = common_entries_end;
    if (common_entries_end == entries_end && pending_first_ == entries_end) {
        features_end = std::min(pending_first_ + static_cast<int>(pending_.size() / width), n_common);
    }
    if (first_position_ > window_start || features_end <= window_start || cache_->n_layers() != 1) {
        reset();
        return std::min(n_common, window_start);
    }
    // The entries from the window's start on, moved down to slot 0 when the window moved on.
    const int keep_from = window_start - first_position_, keep_to = common_entries_end - first_position_;
    cache_->rollback(std::max(0, keep_to));
    if (keep_to <= keep_from) {
        cache_->rollback(0);
    } else if (keep_from > 0) {
        std::vector<int> kept(keep_to - keep_from);
        for (size_t i = 0; i < kept.size(); ++i) kept[i] = keep_from + static_cast<int>(i);
        cache_->compact(0, kept);
    }
    first_position_ = window_start;
    const int pending_from = std::max(pending_first_, window_start);
    if (features_end > common_entries_end) {
        pending_.resize(static_cast<size_t>(features_end - pending_first_) * width);
        pending_.erase(pending_.begin(), pending_.begin() + static_cast<std::ptrdiff_t>(pending_from - pending_first_) * width);
        pending_first_ = pending_from;
    } else {
        pending_.clear();
        pending_first_ = features_end;
    }
    return features_end;
}

void EagleDrafter::copy_state(const Drafter & other) {
    const auto * from = dynamic_cast<const EagleDrafter *>(&other);
    if (!from || &from->head_ != &head_ || from->cache_->id() != cache_->id()) return reset();
    cache_->copy_from(*from->cache_, from->cache_->size());
    first_position_ = from->first_position_;
    pending_ = from->pending_;
    pending_first_ = from->pending_first_;
}

void EagleDrafter::accept(const Acceptance & a) {
    const int width = head_.feature_width();
    // Entries at and after the first newly verified position were the head's own guesses.
    cache_->rollback(std::clamp(a.first_position - first_position_, 0, cache_->size()));
    const size_t keep_rows = static_cast<size_t>(std::max(0, a.first_position - pending_first_));
    if (pending_.size() > keep_rows * width) pending_.resize(keep_rows * width);
    if (pending_.empty()) pending_first_ = a.first_position;
    if (pending_first_ + static_cast<int>(pending_.size() / width) != a.first_position) {
        throw Error("EAGLE drafter: target features arrived with a gap before position " + std::to_string(a.first_position));
    }
    pending_.insert(pending_.end(), a.features.begin(), a.features.end());
    if (cache_->size() == 0) {  // nothing written yet (a prompt): the entries start at the last prompt_window_ positions
        const int rows = static_cast<int>(pending_.size() / width);
        if (rows > prompt_window_) {
            pending_.erase(pending_.begin(), pending_.begin() + static_cast<std::ptrdiff_t>(rows - prompt_window_) * width);
            pending_first_ += rows - prompt_window_;
        }
        first_position_ = pending_first_;
    }
}

void EagleDrafter::start(const DraftRequest & req) {
    req_ = req;
    draft_ = Draft{};
    const int root_pos = static_cast<int>(req.history.size()) - 1;
    const int pending_rows = static_cast<int>(pending_.size() / head_.feature_width());
    // Entries exist (or are pending) for positions < root_pos; the last one drafts the root's successor.
    if (pending_rows == 0 || pending_first_ + pending_rows != root_pos || first_position_ + cache_->size() != pending_first_) return;

    slot_of_.clear();
    proposer_hidden_.clear();
    committed_ = root_pos;
    TreeBudget budget = req.budget;
    budget.depth = std::min(budget.depth, std::max(1, (cache_->capacity() - (root_pos - first_position_)) / std::max(1, budget.branching)));
    grower_.emplace(budget);
    path_states_.reset(req.processing);
    // The catch-up block: every pending target-feature entry; its last row drafts the root's children.
    ForwardBatch b;
    for (int p = pending_first_; p < root_pos; ++p) {
        b.tokens.push_back(req.history[p + 1]);
        b.positions.push_back(p);
    }
    b.hidden_in = std::move(pending_);
    pending_.clear();
    b.mask = BlockMask::causal(b.n_tokens());
    b.logit_rows = {b.n_tokens() - 1};
    pending_first_ = root_pos;
    pending_forward_.wait_for(*runner_, *cache_, out_, std::move(b));
}

void EagleDrafter::resume() {
    pending_forward_.done();
    TreeGrower & g = *grower_;
    const std::span<const int> frontier = g.frontier();
    const int E = head_.shape().n_embd;
    const DraftVocabulary vocab{head_.d2t(), head_.shape().n_token_vocab};
    std::vector<Expansion> ex;
    if (frontier.size() == 1 && frontier[0] == TokenTree::kRoot) {
        root_hidden_.assign(out_.hidden_out.end() - E, out_.hidden_out.end());
        ex.push_back(propose_children(out_.logits_row(0), g.n_children()[0], req_, probs_, vocab, req_.processing));
    } else {
        if (static_cast<int>(slot_of_.size()) < g.tree().size()) {
            slot_of_.resize(g.tree().size(), -1);
            proposer_hidden_.resize(g.tree().size());
        }
        for (size_t i = 0; i < frontier.size(); ++i) {
            slot_of_[frontier[i]] = pending_forward_.first_slot() + static_cast<int>(i);
            proposer_hidden_[frontier[i]].assign(out_.hidden_out.begin() + i * E, out_.hidden_out.begin() + (i + 1) * E);
            ex.push_back(propose_on_path(path_states_, frontier[i], g.tree().parent, g.tree().token, out_.logits_row(i), g.n_children()[i], req_, probs_, vocab));
        }
    }
    g.expand(ex);
    if (g.growing()) {
        const TokenTree & tree = g.tree();
        ForwardBatch b = frontier_batch(tree, g.frontier(), committed_ - 1, committed_ - first_position_, slot_of_);
        for (const int node : g.frontier()) {  // self-fed: the pre-norm output of the entry that proposed it
            const std::vector<float> & h = tree.parent[node] == TokenTree::kRoot ? root_hidden_ : proposer_hidden_[tree.parent[node]];
            b.hidden_in.insert(b.hidden_in.end(), h.begin(), h.end());
        }
        pending_forward_.wait_for(*runner_, *cache_, out_, std::move(b));
        return;
    }
    BuiltTree built = g.finish();
    grower_.reset();
    draft_.tree = std::move(built.tree);
    draft_.mean_entropy = built.mean_entropy;
    cache_->rollback(committed_ - first_position_);  // drop every self-fed entry
}

}  // namespace specula
