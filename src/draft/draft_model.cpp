#include "draft/draft_model.h"

#include <algorithm>
#include <cmath>

#include "common/error.h"
#include "runtime/model.h"

namespace specula {

namespace {
float entropy_and_top(std::span<const float> logits, float & top_prob) {
    const float m = *std::max_element(logits.begin(), logits.end());
    double z = 0.0, s = 0.0;
    for (float l : logits) {
        const double e = std::exp(double(l) - m);
        z += e;
        s += e * (double(l) - m);
    }
    top_prob = static_cast<float>(1.0 / z);
    return static_cast<float>(std::log(z) - s / z);  // H = log Z - E[l - m]
}
}  // namespace

DraftModelDrafter::DraftModelDrafter(const Model & model, int n_ctx)
    : model_(model), runner_(model), cache_(model.backend(), model.config(), n_ctx) {}

void DraftModelDrafter::accept(int n_valid) { cache_.rollback(std::min(cache_.size(), n_valid)); }

Draft DraftModelDrafter::draft(const DraftRequest & req) {
    Draft d;
    const int L = static_cast<int>(req.history.size());
    if (cache_.size() >= L) cache_.rollback(L - 1);  // the root must be fed to get its successor
    if (req.max_tokens <= 0) return d;
    const bool greedy = req.sampling == nullptr || req.sampling->greedy();

    // Catch up on every token the cache lacks (the root, plus a bonus token's predecessor).
    const int n_in = cache_.size();
    runner_.forward(ForwardBatch::causal(req.history.subspan(n_in), n_in, {L - n_in - 1}), cache_, out_);
    int prev = TokenTree::kRoot;
    float cum = 0.0f, entropy_sum = 0.0f;
    for (int i = 0; i < req.max_tokens; ++i) {
        const std::span<const float> logits = out_.logits_row(0);
        float top = 0.0f;
        entropy_sum += entropy_and_top(logits, top);
        int32_t tok;
        if (greedy) {
            tok = argmax(logits);
            cum += std::log(top);
        } else {
            processed_probs(logits, *req.sampling, probs_);
            tok = sample_from(probs_, *req.rng);
            cum += std::log(std::max(probs_[tok], 1e-30f));
            d.tree.q.resize(d.tree.size() + 1);
            d.tree.q.back() = probs_;  // q for node prev's children
        }
        prev = d.tree.add(prev, tok, cum);
        if (i + 1 == req.max_tokens || top < req.min_confidence) break;
        if (cache_.size() >= cache_.capacity()) break;
        const int32_t one[1] = {tok};
        runner_.forward(ForwardBatch::causal(one, cache_.size(), {0}), cache_, out_);
    }
    d.mean_entropy = entropy_sum / static_cast<float>(d.tree.size());
    return d;
}

}  // namespace specula
