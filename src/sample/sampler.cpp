#include "sample/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace specula {

int32_t argmax(std::span<const float> logits) {
    return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

void processed_probs(std::span<const float> logits, const SamplingParams & p, std::vector<float> & probs) {
    const size_t n = logits.size();
    probs.assign(n, 0.0f);
    if (p.greedy()) {
        probs[argmax(logits)] = 1.0f;
        return;
    }
    if (p.top_k <= 0 && p.top_p >= 1.0f && p.min_p <= 0.0f) {  // plain temperature: no sort needed
        const double inv_t = 1.0 / p.temperature;
        const float max_logit = *std::max_element(logits.begin(), logits.end());
        double sum = 0.0;
        for (size_t i = 0; i < n; ++i) sum += (probs[i] = static_cast<float>(std::exp((logits[i] - max_logit) * inv_t)));
        const float inv = static_cast<float>(1.0 / sum);
        for (float & x : probs) x *= inv;
        return;
    }
    // Candidates sorted by logit, descending (ties by id, so results are deterministic).
    std::vector<int32_t> ids(n);
    std::iota(ids.begin(), ids.end(), 0);
    size_t keep = n;
    if (p.top_k > 0 && static_cast<size_t>(p.top_k) < n) {
        keep = static_cast<size_t>(p.top_k);
        std::partial_sort(ids.begin(), ids.begin() + keep, ids.end(), [&](int32_t a, int32_t b) {
            return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
        });
    } else {
        std::sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) {
            return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
        });
    }
    ids.resize(keep);

    if (p.top_p < 1.0f || p.min_p > 0.0f) {
        const float max_logit = logits[ids[0]];
        std::vector<double> w(keep);
        double sum = 0.0;
        for (size_t i = 0; i < keep; ++i) sum += (w[i] = std::exp(static_cast<double>(logits[ids[i]]) - max_logit));
        size_t cut = keep;
        if (p.min_p > 0.0f) {
            // w[0] is the max probability (times sum); keep tokens with prob >= min_p * max.
            cut = 1;
            while (cut < keep && w[cut] >= p.min_p * w[0]) ++cut;
        }
        if (p.top_p < 1.0f) {
            double cum = 0.0;
            for (size_t i = 0; i < cut; ++i) {
                cum += w[i] / sum;
                if (cum >= p.top_p) {
                    cut = i + 1;
                    break;
                }
            }
        }
        ids.resize(std::max<size_t>(cut, 1));
    }

    const double inv_t = 1.0 / p.temperature;
    const double max_scaled = logits[ids[0]] * inv_t;
    double sum = 0.0;
    for (int32_t id : ids) sum += (probs[id] = static_cast<float>(std::exp(logits[id] * inv_t - max_scaled)));
    for (int32_t id : ids) probs[id] = static_cast<float>(probs[id] / sum);
}

std::vector<int32_t> top_k_ids(std::span<const float> scores, int k) {
    std::vector<int32_t> ids(scores.size());
    std::iota(ids.begin(), ids.end(), 0);
    k = std::min<int>(k, static_cast<int>(ids.size()));
    std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), [&](int32_t a, int32_t b) {
        return scores[a] > scores[b] || (scores[a] == scores[b] && a < b);
    });
    ids.resize(k);
    return ids;
}

std::vector<int32_t> sample_without_replacement(std::span<const float> probs, int k, Rng & rng) {
    // argsort of log p + Gumbel noise = successive draws without replacement.
    std::vector<float> keys(probs.size(), -INFINITY);
    int support = 0;
    for (size_t i = 0; i < probs.size(); ++i) {
        if (probs[i] <= 0.0f) continue;
        const double u = std::max(rng.uniform(), 1e-300);
        keys[i] = static_cast<float>(std::log(double(probs[i])) - std::log(-std::log(u)));
        ++support;
    }
    return top_k_ids(keys, std::min(k, support));
}

int32_t sample_from(std::span<const float> probs, Rng & rng) {
    double total = 0.0;
    for (float q : probs) total += q;
    const double r = rng.uniform() * total;
    double acc = 0.0;
    int32_t last_nonzero = 0;
    for (size_t i = 0; i < probs.size(); ++i) {
        if (probs[i] <= 0.0f) continue;
        acc += probs[i];
        last_nonzero = static_cast<int32_t>(i);
        if (r < acc) return last_nonzero;
    }
    return last_nonzero;
}

}  // namespace specula
