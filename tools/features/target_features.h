#pragma once
// A drafter's training data from its target (tools/train/target_features.py --specula): per token
// of a sequence, the residual stream entering each tap layer and the target's top-k next-token
// log-probabilities, computed with the kernels the engine decodes with, so that a head trains on
// the features it will be fed.
#include <cstdint>
#include <span>
#include <vector>

namespace specula {

class KvCache;
class ModelRunner;

struct TargetFeatures {
    int n_tokens = 0;
    int width = 0;  // tap layers x n_embd
    int top_k = 0;
    std::vector<float> taps;       // [n_tokens, width]: each row its tap layers concatenated
    std::vector<int32_t> top_ids;  // [n_tokens, top_k], most probable first (ties by id)
    std::vector<float> top_logp;   // [n_tokens, top_k]: log-softmax of the target's logits
};

// Runs `tokens` through the target in causal blocks of at most `chunk` rows from the start of the
// empty `cache` (left holding them). Throws Error on an empty sequence, one longer than the cache,
// top_k outside [1, n_vocab] or a tap layer outside [0, n_layer].
TargetFeatures target_features(ModelRunner & runner, KvCache & cache, std::span<const int32_t> tokens,
                               std::span<const int> tap_layers, int top_k, int chunk = 128);

}  // namespace specula
