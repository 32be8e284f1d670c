#include "draft/propose.h"

#include <algorithm>
#include <cmath>

namespace specula {

Expansion propose_children(std::span<const float> logits, int n_children, const DraftRequest & req, std::vector<float> & probs) {
    Expansion e;
    // log-softmax at temperature 1: entropy for the policies, log-probs for tree ranking.
    const float m = *std::max_element(logits.begin(), logits.end());
    double z = 0.0, s = 0.0;
    for (float l : logits) {
        if (!std::isfinite(l)) continue;
        const double x = std::exp(double(l) - m);
        z += x;
        s += x * (double(l) - m);
    }
    const double log_z = std::log(z);
    e.entropy = static_cast<float>(log_z - s / z);
    if (req.sampling == nullptr || req.sampling->greedy()) {
        e.tokens = top_k_ids(logits, n_children);
        for (int32_t t : e.tokens) e.logp.push_back(static_cast<float>(logits[t] - m - log_z));
    } else {
        processed_probs(logits, *req.sampling, probs);
        e.tokens = sample_without_replacement(probs, n_children, *req.rng);
        for (int32_t t : e.tokens) e.logp.push_back(std::log(std::max(probs[t], 1e-30f)));
        e.q = probs;
    }
    return e;
}

}  // namespace specula
