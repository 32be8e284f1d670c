#include "draft/draft_model_drafter.h"

#include <algorithm>
#include <cmath>

#include "specula/error.h"
#include "draft/propose.h"
#include "runtime/model.h"

namespace specula {

DraftModelDrafter::DraftModelDrafter(const Model & model, int n_ctx)
    : DraftModelDrafter(model, std::make_shared<ModelRunner>(model), std::make_unique<KvCache>(model.backend(), model.config(), n_ctx)) {}

DraftModelDrafter::DraftModelDrafter(const Model & model, std::shared_ptr<ModelRunner> runner, std::unique_ptr<KvCache> stream)
    : runner_(std::move(runner)), cache_(std::move(stream)) {
    if (&runner_->network() != &model) throw Error("DraftModelDrafter: the runner runs another network");
}

void DraftModelDrafter::cascade(int ngram_min, int ngram_max, std::shared_ptr<const std::vector<int32_t>> markup) {
    lookahead_.emplace(ngram_min, ngram_max, std::move(markup));
}

void DraftModelDrafter::copy_state(const Drafter & other) {
    if (lookahead_) lookahead_->reset();
    const auto * from = dynamic_cast<const DraftModelDrafter *>(&other);
    if (!from || from->cache_->id() != cache_->id()) return reset();
    cache_->copy_from(*from->cache_, from->cache_->size());
}

void DraftModelDrafter::accept(const Acceptance & a) { cache_->rollback(std::min(cache_->size(), a.n_valid)); }

void DraftModelDrafter::start(const DraftRequest & req) {
    req_ = req;
    draft_ = Draft{};
    slot_of_.clear();
    const int L = static_cast<int>(req.history.size());
    if (cache_->size() >= L) cache_->rollback(L - 1);  // the root must be fed to get its successors
    TreeBudget budget = req.budget;
    // Each depth needs a cache slot per frontier node; stop at the context's edge.
    budget.depth = std::min(budget.depth, std::max(1, (cache_->capacity() - L) / std::max(1, budget.branching)));
    grower_.emplace(budget);
    path_states_.reset(req.processing);
    lookahead_tokens_ = lookahead_for(req, budget.depth);
    // Catch up on every token the cache lacks (the root, plus accepted tokens of a tree round),
    // then the lookahead, with a row of logits for the root and for each lookahead token.
    const int n_in = cache_->size();
    std::vector<int32_t> fed(req.history.begin() + n_in, req.history.end());
    fed.insert(fed.end(), lookahead_tokens_.begin(), lookahead_tokens_.end());
    std::vector<int32_t> rows;
    for (int r = L - n_in - 1; r < static_cast<int>(fed.size()); ++r) rows.push_back(r);
    pending_forward_.wait_for(*runner_, *cache_, out_, ForwardBatch::causal(fed, n_in, std::move(rows)));
}

std::vector<int32_t> DraftModelDrafter::lookahead_for(const DraftRequest & req, int depth) {
    if (!lookahead_ || req.budget.shape != TreeShape::Chain || depth < 2) return {};
    DraftRequest chain = req;
    chain.budget = TreeBudget{TreeShape::Chain, depth - 1, 1, depth - 1};
    lookahead_->start(chain);
    return lookahead_->take().tree.token;
}

void DraftModelDrafter::expand_along_lookahead(const DraftVocabulary & vocab) {
    TreeGrower & g = *grower_;
    const int L = static_cast<int>(req_.history.size());
    // A lookahead token stands where the draft model ranks it first: at T = 0 it is the token the
    // model would have drafted; at T > 0 it is proposed one-hot (no q), which the verifier accepts
    // at the target's own keyed draw, so sampling stays lossless whatever lookup proposed.
    DraftRequest ranked = req_;
    ranked.sampling = nullptr;
    const bool sampled = req_.sampled();
    size_t taken = 0;  // lookahead tokens that became nodes 0..taken-1, at slots L..L+taken-1
    while (true) {
        const int node = g.frontier().front();
        if (node != TokenTree::kRoot) {
            slot_of_.resize(g.tree().size(), -1);
            slot_of_[node] = L + node;
        }
        const std::span<const float> logits = out_.logits_row(static_cast<int>(taken));
        Expansion e = propose_on_path(path_states_, node, g.tree().parent, g.tree().token, logits, 1, ranked, probs_, vocab);
        const bool holds = taken < lookahead_tokens_.size() && !e.tokens.empty() && e.tokens.front() == lookahead_tokens_[taken];
        if (!holds && sampled) e = propose_on_path(path_states_, node, g.tree().parent, g.tree().token, logits, 1, req_, probs_, vocab);
        g.expand(std::span(&e, 1));
        if (!holds) break;
        ++taken;
        if (!g.growing()) break;
    }
    cache_->rollback(L + static_cast<int>(taken));
    lookahead_tokens_.clear();
}

void DraftModelDrafter::resume() {
    pending_forward_.done();
    TreeGrower & g = *grower_;
    // A trimmed vocabulary's logits: proposals and q over its ids alone, q zero elsewhere.
    const DraftVocabulary vocab{runner_->logit_ids(), runner_->network().shape().n_vocab};
    if (!lookahead_tokens_.empty()) {
        expand_along_lookahead(vocab);
    } else {
        const std::span<const int> frontier = g.frontier();
        std::vector<Expansion> ex;
        for (size_t i = 0; i < frontier.size(); ++i) {
            if (frontier[i] != TokenTree::kRoot) {
                if (static_cast<int>(slot_of_.size()) < g.tree().size()) slot_of_.resize(g.tree().size(), -1);
                slot_of_[frontier[i]] = pending_forward_.first_slot() + static_cast<int>(i);
            }
            ex.push_back(propose_on_path(path_states_, frontier[i], g.tree().parent, g.tree().token, out_.logits_row(i), g.n_children()[i], req_, probs_, vocab));
        }
        g.expand(ex);
    }
    const int L = static_cast<int>(req_.history.size());
    if (g.growing()) {
        pending_forward_.wait_for(*runner_, *cache_, out_, frontier_batch(g.tree(), g.frontier(), L - 1, L, slot_of_));
        return;
    }
    BuiltTree built = g.finish();
    grower_.reset();
    draft_.tree = std::move(built.tree);
    draft_.mean_entropy = built.mean_entropy;
    if (req_.budget.shape != TreeShape::Chain) {
        // Tree nodes sit in the cache in drafting order, not path order: keep only the sequence;
        // the accepted path is re-fed with the next catch-up block.
        cache_->rollback(L);
    }
}

}  // namespace specula
