#include "draft/propose.h"

#include <algorithm>
#include <cmath>

#include "constrain/grammar_guard.h"

namespace specula {

namespace {

// The likeliest of the kMaskedCandidates best-scored draft ids that `allowed` lets through, at
// most n, best first.
std::vector<int32_t> allowed_best(std::span<const float> scores, int n, const LogitsState & allowed, const DraftVocabulary & vocab) {
    std::vector<int32_t> kept;
    for (int32_t t : top_k_ids(scores, std::max(n, kMaskedCandidates))) {
        if (static_cast<int>(kept.size()) == n) break;
        if (allowed.allows(vocab.to_target.empty() ? t : vocab.to_target[t])) kept.push_back(t);
    }
    return kept;
}

}  // namespace

Expansion propose_children(std::span<const float> logits, int n_children, const DraftRequest & req, std::vector<float> & probs,
                           const DraftVocabulary & vocab, const LogitsState * allowed) {
    Expansion e;
    // log-softmax at temperature 1: entropy for the policies, log-probs for tree ranking.
    const SoftmaxStats st = softmax_stats(logits, probs);
    e.entropy = st.entropy;
    if (req.sampling == nullptr || req.sampling->greedy()) {
        e.tokens = allowed ? allowed_best(logits, n_children, *allowed, vocab) : top_k_ids(logits, n_children);
        for (int32_t t : e.tokens) e.logp.push_back(st.log_prob(logits[t]));
    } else {
        processed_probs(logits, *req.sampling, probs);
        if (allowed) {  // q: the draft distribution on the allowed candidates alone
            const std::vector<int32_t> kept = allowed_best(probs, kMaskedCandidates, *allowed, vocab);
            double total = 0.0;
            for (int32_t t : kept) total += probs[t];
            std::vector<float> masked(probs.size(), 0.0f);
            for (int32_t t : kept) masked[t] = static_cast<float>(probs[t] / total);
            probs.swap(masked);
        }
        e.tokens = sample_without_replacement(probs, n_children, *req.rng);
        // The verifier tries sampled siblings in drawn order, and a later one counts only after
        // every earlier one was rejected. The first is accepted about as often as q matches p,
        // whichever token was drawn, so it gets the draft's confidence (its top probability);
        // the later ones share the rest by their own probability.
        const float top = max_value(probs);
        for (size_t j = 0; j < e.tokens.size(); ++j) {
            const float reach = j == 0 ? top : (1.0f - top) * probs[e.tokens[j]];
            e.logp.push_back(std::log(std::max(reach, 1e-30f)));
        }
        if (vocab.to_target.empty()) {
            e.q = probs;
        } else {
            e.q.assign(static_cast<size_t>(vocab.n_target), 0.0f);
            for (size_t i = 0; i < probs.size(); ++i) e.q[vocab.to_target[i]] = probs[i];
        }
    }
    if (!vocab.to_target.empty()) {
        for (int32_t & t : e.tokens) t = vocab.to_target[t];
    }
    return e;
}

ForwardBatch frontier_batch(const TokenTree & tree, std::span<const int> frontier, int position_base, int visible_prefix,
                            const std::vector<int> & slot_of) {
    ForwardBatch b;
    const int n = static_cast<int>(frontier.size());
    b.visible_prefix = visible_prefix;
    b.mask.n = n;
    b.mask.visible.assign(static_cast<size_t>(n) * n, 0);
    for (int i = 0; i < n; ++i) {
        const int node = frontier[i];
        b.tokens.push_back(tree.token[node]);
        b.positions.push_back(position_base + tree.depth[node]);
        b.logit_rows.push_back(i);
        b.mask.visible[static_cast<size_t>(i) * n + i] = 1;
        std::vector<int32_t> ancestors;
        for (int a = tree.parent[node]; a != TokenTree::kRoot; a = tree.parent[a]) ancestors.push_back(slot_of[a]);
        b.cached_visible.push_back(std::move(ancestors));
    }
    return b;
}

Expansion propose_on_path(PathStates & paths, int node, std::span<const int> parent, std::span<const int32_t> token, std::span<const float> logits,
                          int n_children, const DraftRequest & req, std::vector<float> & scratch, const DraftVocabulary & vocab) {
    try {
        return propose_children(logits, n_children, req, scratch, vocab, paths.after(node, parent, token));
    } catch (const GrammarError &) {
        return {};
    }
}

}  // namespace specula
