// The AVX2 body of kernels/attention.h, written with intrinsics (the element-by-element body left
// to the compiler keeps its lane arrays in memory and calls fmaxf). The same float operations in
// the same order as the generic body, so the same bits:
//   score(j, g) = (16 lane sums of q * k over the dimensions, then the halving tree) * scale
//   softmax: max, exp_nonpositive(score - max), their sum (16 lane sums, the halving tree), one reciprocal
//   out(g, d) = sum over j in order of p(j, g) * v(j, d), times the reciprocal
// The 16 lanes live in two ymm (lanes 0-7, 8-15); the scores of a few slots against up to three
// query heads of a KV head accumulate side by side, each key chunk converted once for the heads;
// four of their halving trees run as one shuffle tree whose lanes are the four scores; V sums
// accumulate in registers over every visible slot.
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "runtime/kernels/attention_impl.h"

namespace specula::kernels::avx2 {

namespace {

constexpr uint16_t kF16NegInf = 0xfc00;
constexpr int kHeadBlock = 4;  // query heads whose V sums share one pass over the slots

inline __m256 load_f16x8(const uint16_t * p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(p))); }

// The halving tree of 16 lanes held as (lo, hi): l + (l + 8), then 4, 2, 1.
inline float reduce16(__m256 lo, __m256 hi) {
    const __m256 s8 = _mm256_add_ps(lo, hi);
    const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}

// The halving trees of four slots at once (slot t's lanes in lo[t], hi[t]); lane t of the
// result (t < 4) is slot t's sum. Each level adds the pairs reduce16 adds.
inline __m128 reduce16x4(const __m256 * lo, const __m256 * hi) {
    __m256 s8[4];
    for (int t = 0; t < 4; ++t) s8[t] = _mm256_add_ps(lo[t], hi[t]);  // l + (l + 8)
    __m256 s4[2];                                                     // [slot 2i: l + (l + 4) | slot 2i + 1: ...]
    for (int i = 0; i < 2; ++i) {
        s4[i] = _mm256_add_ps(_mm256_permute2f128_ps(s8[2 * i], s8[2 * i + 1], 0x20), _mm256_permute2f128_ps(s8[2 * i], s8[2 * i + 1], 0x31));
    }
    // l + (l + 2): per 128-bit half [slot a's two | slot b's two], halves (0, 2) and (1, 3)
    const __m256 s2 = _mm256_add_ps(_mm256_shuffle_ps(s4[0], s4[1], 0x44), _mm256_shuffle_ps(s4[0], s4[1], 0xee));
    // 0 + 1: lanes [0, 2, 0, 2 | 1, 3, 1, 3] of the slots
    const __m256 s1 = _mm256_add_ps(_mm256_shuffle_ps(s2, s2, 0x88), _mm256_shuffle_ps(s2, s2, 0xdd));
    return _mm256_castps256_ps128(_mm256_permutevar8x32_ps(s1, _mm256_setr_epi32(0, 4, 1, 5, 0, 0, 0, 0)));
}

// exp_nonpositive (common/fast_exp.h) on eight lanes, operation for operation.
inline __m256 exp_nonpositive8(__m256 x) {
    const __m256 xc = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
    const __m256 round = _mm256_set1_ps(12582912.0f);
    const __m256 k = _mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(xc, _mm256_set1_ps(1.44269504088896341f)), round), round);
    const __m256 r = _mm256_sub_ps(_mm256_sub_ps(xc, _mm256_mul_ps(k, _mm256_set1_ps(0.693145751953125f))),
                                   _mm256_mul_ps(k, _mm256_set1_ps(1.428606765330187045e-06f)));
    __m256 p = _mm256_set1_ps(1.0f / 720.0f);
    for (const float c : {1.0f / 120.0f, 1.0f / 24.0f, 1.0f / 6.0f, 0.5f, 1.0f, 1.0f}) p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(c));
    const __m256 scale = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(k), _mm256_set1_epi32(127)), 23));
    return _mm256_and_ps(_mm256_mul_ps(p, scale), _mm256_cmp_ps(x, _mm256_set1_ps(-87.0f), _CMP_NLT_UQ));
}

// Scores of NS visible slots (fewer at the end: n) against NG query heads of one KV head, times
// scale, into scores[g * nv + t]. Each key chunk is converted from F16 once for the NG heads
// (vcvtph2ps issues at half the rate of the multiplies and adds it feeds); NS * NG <= 6 keeps the
// 12 lane sums, a key chunk and the query chunk in the 16 ymm. Past n the last slot is read again
// and its scores are not stored.
template <int NS, int NG>
inline void block_scores(const float * q, int D, const uint16_t * k, const int * slots, int n, int64_t kv_row, int chunks,
                         float scale, float * scores, size_t nv) {
    constexpr int kSums = NS * NG;  // sum s: slot s / NG, head s % NG
    const uint16_t * kt[NS];
    for (int t = 0; t < NS; ++t) kt[t] = k + slots[t < n ? t : n - 1] * kv_row;
    __m256 lo[kSums], hi[kSums];
    for (int s = 0; s < kSums; ++s) lo[s] = hi[s] = _mm256_setzero_ps();
    for (int c = 0; c < chunks; ++c) {
        for (int t = 0; t < NS; ++t) {
            const __m256 k0 = load_f16x8(kt[t] + 16 * c), k1 = load_f16x8(kt[t] + 16 * c + 8);
            for (int g = 0; g < NG; ++g) {
                const float * qg = q + g * D + 16 * c;
                lo[t * NG + g] = _mm256_add_ps(lo[t * NG + g], _mm256_mul_ps(_mm256_loadu_ps(qg), k0));
                hi[t * NG + g] = _mm256_add_ps(hi[t * NG + g], _mm256_mul_ps(_mm256_loadu_ps(qg + 8), k1));
            }
        }
    }
    for (int s0 = 0; s0 < kSums; s0 += 4) {
        // reduce16x4 over sums s0..s0+3 (past kSums the last sum again, not stored)
        __m256 l4[4], h4[4];
        for (int u = 0; u < 4; ++u) {
            const int s = s0 + u < kSums ? s0 + u : kSums - 1;
            l4[u] = lo[s], h4[u] = hi[s];
        }
        float out[4];
        _mm_storeu_ps(out, _mm_mul_ps(reduce16x4(l4, h4), _mm_set1_ps(scale)));
        for (int u = 0; u < 4 && s0 + u < kSums; ++u) {
            const int t = (s0 + u) / NG, g = (s0 + u) % NG;
            if (t < n) scores[g * nv + t] = out[u];
        }
    }
}

// block_scores over all visible slots for NG consecutive query heads (q: the first one's), the
// slot count per pass fitted to NG.
template <int NG>
void head_block_scores(const float * q, int D, const uint16_t * k, const std::vector<int> & visible, int64_t kv_row, int chunks,
                       float scale, float * scores) {
    constexpr int NS = NG == 1 ? 4 : 6 / NG;
    const size_t nv = visible.size();
    for (size_t j = 0; j < nv; j += NS) {
        const int n = static_cast<int>(nv - j < NS ? nv - j : NS);
        block_scores<NS, NG>(q, D, k, visible.data() + j, n, kv_row, chunks, scale, scores + j, nv);
    }
}

void find_visible(const uint16_t * mask, int n_kv, std::vector<int> & visible) {
    visible.clear();
    const __m256i neg_inf = _mm256_set1_epi16(static_cast<short>(kF16NegInf));
    int s = 0;
    for (; s + 16 <= n_kv; s += 16) {
        const __m256i hidden = _mm256_cmpeq_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(mask + s)), neg_inf);
        uint32_t bits = ~static_cast<uint32_t>(_mm256_movemask_epi8(hidden)) & 0x55555555u;  // one bit per slot: its low byte
        while (bits) {
            visible.push_back(s + __builtin_ctz(bits) / 2);
            bits &= bits - 1;
        }
    }
    for (; s < n_kv; ++s) {
        if (mask[s] != kF16NegInf) visible.push_back(s);
    }
}

// NG query heads' outputs, CB 16-dimension chunks at a time with the sums in registers:
// out(g, d) = (sum over visible j of p(g, j) * v(j, d)) * inv_sum(g).
template <int NG, int CB>
void weighted_values(const float * p, size_t nv, const int * visible, const uint16_t * v, int64_t kv_row, int chunks,
                     const float * inv_sum, float * out, int D) {
    for (int c0 = 0; c0 < chunks; c0 += CB) {
        __m256 acc[NG][2 * CB];
        for (int g = 0; g < NG; ++g) {
            for (int c = 0; c < 2 * CB; ++c) acc[g][c] = _mm256_setzero_ps();
        }
        for (size_t j = 0; j < nv; ++j) {
            const uint16_t * vj = v + visible[j] * kv_row + 16 * c0;
            __m256 vc[2 * CB];
            for (int c = 0; c < 2 * CB; ++c) vc[c] = load_f16x8(vj + 8 * c);
            for (int g = 0; g < NG; ++g) {
                const __m256 pg = _mm256_broadcast_ss(p + g * nv + j);
                for (int c = 0; c < 2 * CB; ++c) acc[g][c] = _mm256_add_ps(acc[g][c], _mm256_mul_ps(pg, vc[c]));
            }
        }
        for (int g = 0; g < NG; ++g) {
            const __m256 inv = _mm256_set1_ps(inv_sum[g]);
            for (int c = 0; c < 2 * CB; ++c) _mm256_storeu_ps(out + g * D + 16 * c0 + 8 * c, _mm256_mul_ps(acc[g][c], inv));
        }
    }
}

// weighted_values for NG heads within 16 ymm: two chunks per pass for up to two heads, else one.
template <int NG>
void weighted_values_heads(const float * p, size_t nv, const int * visible, const uint16_t * v, int64_t kv_row, int chunks,
                           const float * inv_sum, float * out, int D) {
    if constexpr (NG <= 2) {
        if (chunks % 2 == 0) return weighted_values<NG, 2>(p, nv, visible, v, kv_row, chunks, inv_sum, out, D);
    }
    weighted_values<NG, 1>(p, nv, visible, v, kv_row, chunks, inv_sum, out, D);
}

}  // namespace

void attend(const AttentionArgs & a, int64_t pair_begin, int64_t pair_end) {
    const int D = a.head_dim, G = a.n_head / a.n_head_kv, C = D / 16;
    thread_local std::vector<float> scores;
    for_each_pair(a, pair_begin, pair_end, find_visible, [&](int64_t i, int kvh, const std::vector<int> & visible, float * o) {
        const size_t nv = visible.size();
        const float * q = a.q + i * a.q_row + static_cast<int64_t>(kvh) * G * D;
        scores.resize(static_cast<size_t>(G) * nv);
        const uint16_t * k = a.k + static_cast<int64_t>(kvh) * D;
        for (int g0 = 0; g0 < G; g0 += 3) {
            const float * qg = q + g0 * D;
            float * sg = scores.data() + g0 * nv;
            switch (G - g0 < 3 ? G - g0 : 3) {
                case 1: head_block_scores<1>(qg, D, k, visible, a.kv_row, C, a.scale, sg); break;
                case 2: head_block_scores<2>(qg, D, k, visible, a.kv_row, C, a.scale, sg); break;
                default: head_block_scores<3>(qg, D, k, visible, a.kv_row, C, a.scale, sg); break;
            }
        }
        float inv_sum[64];
        for (int g = 0; g < G; ++g) {
            float * sc = scores.data() + g * nv;
            __m256 mv = _mm256_set1_ps(sc[0]);
            size_t j = 0;
            for (; j + 8 <= nv; j += 8) mv = _mm256_max_ps(mv, _mm256_loadu_ps(sc + j));
            float lanes[8];
            _mm256_storeu_ps(lanes, mv);
            float m = lanes[0];
            for (const float l : lanes) m = l > m ? l : m;  // max is exact in any order
            for (; j < nv; ++j) m = sc[j] > m ? sc[j] : m;
            const __m256 mvec = _mm256_set1_ps(m);
            // The sum in the generic body's order: lane j % 16 (sum_lo: 0-7, sum_hi: 8-15), then the tree.
            __m256 sum[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
            for (j = 0; j + 8 <= nv; j += 8) {
                const __m256 e = exp_nonpositive8(_mm256_sub_ps(_mm256_loadu_ps(sc + j), mvec));
                _mm256_storeu_ps(sc + j, e);
                sum[(j / 8) % 2] = _mm256_add_ps(sum[(j / 8) % 2], e);
            }
            if (j < nv) {
                float tail[8] = {};
                std::memcpy(tail, sc + j, sizeof(float) * (nv - j));
                const __m256 live = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(nv - j)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)));
                const __m256 e = _mm256_and_ps(exp_nonpositive8(_mm256_sub_ps(_mm256_loadu_ps(tail), mvec)), live);
                _mm256_storeu_ps(tail, e);
                std::memcpy(sc + j, tail, sizeof(float) * (nv - j));
                sum[(j / 8) % 2] = _mm256_add_ps(sum[(j / 8) % 2], e);  // a lane past the end adds +0: its sum is unchanged
            }
            inv_sum[g] = 1.0f / reduce16(sum[0], sum[1]);
        }
        for (int g0 = 0; g0 < G; g0 += kHeadBlock) {
            const float * p = scores.data() + g0 * nv;
            float * og = o + g0 * D;
            const uint16_t * v = a.v + static_cast<int64_t>(kvh) * D;
            switch (G - g0 < kHeadBlock ? G - g0 : kHeadBlock) {
                case 1: weighted_values_heads<1>(p, nv, visible.data(), v, a.kv_row, C, inv_sum + g0, og, D); break;
                case 2: weighted_values_heads<2>(p, nv, visible.data(), v, a.kv_row, C, inv_sum + g0, og, D); break;
                case 3: weighted_values_heads<3>(p, nv, visible.data(), v, a.kv_row, C, inv_sum + g0, og, D); break;
                default: weighted_values_heads<4>(p, nv, visible.data(), v, a.kv_row, C, inv_sum + g0, og, D); break;
            }
        }
    });
}

}  // namespace specula::kernels::avx2
