#include "target_features.h"

#include <algorithm>
#include <string>

#include "runtime/forward.h"
#include "runtime/kv_cache.h"
#include "runtime/network.h"
#include "sample/sampler.h"
#include "specula/error.h"

namespace specula {

TargetFeatures target_features(ModelRunner & runner, KvCache & cache, std::span<const int32_t> tokens,
                               std::span<const int> tap_layers, int top_k, int chunk) {
    const int n_layer = runner.network().shape().n_layer;
    const int n_vocab = runner.network().shape().n_vocab;
    if (tokens.empty()) throw Error("target features: empty sequence");
    if (cache.size() != 0) throw Error("target features: the cache must start empty");
    if (static_cast<int>(tokens.size()) > cache.capacity()) {
        throw Error("target features: a sequence of " + std::to_string(tokens.size()) + " tokens, longer than the " +
                    std::to_string(cache.capacity()) + "-token context");
    }
    if (top_k < 1 || top_k > n_vocab) throw Error("target features: top-k " + std::to_string(top_k) + " outside 1.." + std::to_string(n_vocab));
    if (tap_layers.empty()) throw Error("target features: no tap layer");
    for (int l : tap_layers) {
        if (l < 0 || l > n_layer) throw Error("target features: tap layer " + std::to_string(l) + " outside 0.." + std::to_string(n_layer));
    }
    if (chunk < 1) throw Error("target features: chunk must be positive");

    TargetFeatures f;
    f.n_tokens = static_cast<int>(tokens.size());
    f.top_k = top_k;
    ForwardOutput out;
    std::vector<float> scratch;
    for (size_t start = 0; start < tokens.size(); start += chunk) {
        const size_t n = std::min<size_t>(chunk, tokens.size() - start);
        std::vector<int32_t> rows(n);
        for (size_t r = 0; r < n; ++r) rows[r] = static_cast<int32_t>(r);
        ForwardBatch b = ForwardBatch::causal(tokens.subspan(start, n), cache.size(), std::move(rows));
        b.tap_layers.assign(tap_layers.begin(), tap_layers.end());
        runner.forward(b, cache, out);
        out.append_tap_rows(0, n, f.taps);
        for (size_t r = 0; r < n; ++r) {
            const std::span<const float> logits = out.logits_row(r);
            const SoftmaxStats s = softmax_stats(logits, scratch);
            for (int32_t id : top_k_ids(logits, top_k)) {
                f.top_ids.push_back(id);
                f.top_logp.push_back(s.log_prob(logits[id]));
            }
        }
    }
    f.width = static_cast<int>(f.taps.size() / tokens.size());
    return f;
}

}  // namespace specula
