#pragma once
// Greedy speculative output against plain greedy decoding where exact equality cannot be demanded:
// ggml's kernels (and ggml's matmul-form attention) round a 1-row forward differently from a
// multi-row verify block, so a near-tie in plain decoding's logits can fall the other way.
#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "runtime/kv_cache.h"
#include "runtime/backend.h"
#include "runtime/forward.h"
#include "runtime/model.h"

namespace specula::test {

struct FirstDifference {
    size_t position = 0;  // generated tokens before the first difference; plain.size() when none
    int32_t plain_token = -1, spec_token = -1;
    float plain_logit = 0.0f, spec_logit = 0.0f;  // both tokens' logits in plain decoding's forward there
    bool any() const { return spec_token >= 0; }
};

// Replays plain decoding (the prompt, then one-row forwards of its tokens) up to the first
// position where `got` leaves `plain`, and reads both tokens' logits there.
inline FirstDifference first_difference(ModelRunner & runner, Backend & backend, const Model & model, std::span<const int32_t> prompt,
                                        std::span<const int32_t> plain, std::span<const int32_t> got, int capacity) {
    FirstDifference f;
    const size_t n = std::min(plain.size(), got.size());
    f.position = std::mismatch(got.begin(), got.begin() + n, plain.begin()).first - got.begin();
    if (f.position == n) return f;
    KvCache replay(backend, model.config(), capacity);
    ForwardOutput out = runner.forward(ForwardBatch::causal(prompt, 0, {int32_t(prompt.size()) - 1}), replay);
    for (size_t i = 0; i < f.position; ++i) {
        const int32_t t[1] = {plain[i]};
        out = runner.forward(ForwardBatch::causal(t, int(prompt.size() + i), {0}), replay);
    }
    const std::span<const float> row = out.logits_row(0);
    f.plain_token = plain[f.position], f.spec_token = got[f.position];
    f.plain_logit = row[f.plain_token], f.spec_logit = row[f.spec_token];
    return f;
}

}  // namespace specula::test
