#pragma once
#include <algorithm>
#include <bit>
#include <cstdint>

namespace specula {

// e^x for x <= 0 with relative error < 2e-7, and 0 below -87 (so for -inf). Plain arithmetic,
// which the compiler vectorises where it cannot vectorise calls to std::exp: drafting and
// verification exponentiate a whole vocabulary per token, and attention every visible score.
// Without FMA contraction (-ffp-contract=off) it gives the same bits on every instruction set.
// NaN gives 0, as -inf: the comparisons below send it to the clamp, never to the int conversion
// (undefined for NaN).
inline float exp_nonpositive(float x) {
    const float xc = x >= -87.0f ? x : -87.0f;
    const float k = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;        // round(x / ln 2)
    const float r = (xc - k * 0.693145751953125f) - k * 1.428606765330187045e-06f;  // |r| <= ln2 / 2
    float p = 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    const float scale = std::bit_cast<float>((static_cast<int32_t>(k) + 127) << 23);
    // Computed before the select: a product evaluated only on one side is a branch the
    // vectoriser must keep (it may raise a floating-point exception), and the loop stays scalar.
    const float e = p * scale;
    return x >= -87.0f ? e : 0.0f;
}

}  // namespace specula
