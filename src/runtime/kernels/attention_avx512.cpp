// The AVX-512 body of kernels/attention.h, written with intrinsics: the element-by-element body
// (attention_body.inc) leaves the compiler to vectorise and spends most of its time storing and
// reloading its lane arrays. This one does the same float operations in the same order, so it
// gives the generic body's bits:
//   score(j, g) = (16 lane sums of q * k over the dimensions, then the halving tree) * scale
//   softmax: max, exp_nonpositive(score - max), their sum (16 lane sums, the halving tree), one reciprocal
//   out(g, d) = sum over j in order of p(j, g) * v(j, d), times the reciprocal
// Lanes live in one zmm; sixteen slots' halving trees run as one shuffle tree whose lanes are the
// sixteen scores; each V chunk accumulates in registers over every visible slot.
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "common/fast_exp.h"
#include "runtime/kernels/attention_impl.h"
#include "runtime/kernels/avx512_lanes.h"

namespace specula::kernels::avx512 {

namespace {

constexpr uint16_t kF16NegInf = 0xfc00;
constexpr int kHeadBlock = 8;  // query heads whose V sums share one pass over the slots

// One level of sixteen halving trees at once: lane l of the result is a[lo[l]] + a[hi[l]], with
// indices past 15 reading b. The pairs added are reduce16's pairs, so the bits are its bits.
inline __m512 pair_level(__m512 a, __m512 b, __m512i lo, __m512i hi) {
    return _mm512_add_ps(_mm512_permutex2var_ps(a, lo, b), _mm512_permutex2var_ps(a, hi, b));
}

// reduce16 of v[0..15], lane t of the result holding v[t]'s sum.
inline __m512 reduce16x16(const __m512 * v) {
    const __m512i lo1 = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23);
    const __m512i hi1 = _mm512_setr_epi32(8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
    const __m512i lo2 = _mm512_setr_epi32(0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27);
    const __m512i hi2 = _mm512_setr_epi32(4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
    const __m512i lo3 = _mm512_setr_epi32(0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29);
    const __m512i hi3 = _mm512_setr_epi32(2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31);
    const __m512i lo4 = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i hi4 = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    __m512 s8[8], s4[4], s2[2];
    for (int i = 0; i < 8; ++i) s8[i] = pair_level(v[2 * i], v[2 * i + 1], lo1, hi1);    // [v(2i) | v(2i+1)], 8 lanes each
    for (int i = 0; i < 4; ++i) s4[i] = pair_level(s8[2 * i], s8[2 * i + 1], lo2, hi2);  // four vectors, 4 lanes each
    for (int i = 0; i < 2; ++i) s2[i] = pair_level(s4[2 * i], s4[2 * i + 1], lo3, hi3);  // eight vectors, 2 lanes each
    return pair_level(s2[0], s2[1], lo4, hi4);
}

// exp_nonpositive (common/fast_exp.h) on sixteen lanes, operation for operation.
inline __m512 exp_nonpositive16(__m512 x) {
    const __m512 xc = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
    const __m512 round = _mm512_set1_ps(12582912.0f);
    const __m512 k = _mm512_sub_ps(_mm512_add_ps(_mm512_mul_ps(xc, _mm512_set1_ps(1.44269504088896341f)), round), round);
    const __m512 r = _mm512_sub_ps(_mm512_sub_ps(xc, _mm512_mul_ps(k, _mm512_set1_ps(0.693145751953125f))),
                                   _mm512_mul_ps(k, _mm512_set1_ps(1.428606765330187045e-06f)));
    __m512 p = _mm512_set1_ps(1.0f / 720.0f);
    for (const float c : {1.0f / 120.0f, 1.0f / 24.0f, 1.0f / 6.0f, 0.5f, 1.0f, 1.0f}) p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(c));
    const __m512 scale = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvttps_epi32(k), _mm512_set1_epi32(127)), 23));
    return _mm512_maskz_mul_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.0f), _CMP_NLT_UQ), p, scale);
}

// Scores of sixteen visible slots (fewer at the end: n) against one query head, times scale.
// Chunk by chunk over all sixteen slots: sixteen independent sums, no chain to wait on. Past n the
// last slot is read again and its lanes are not stored.
inline void block_scores(const float * q, const uint16_t * k, const int * slots, int n, int64_t kv_row, int chunks, float scale, float * out) {
    const uint16_t * kt[16];
    for (int t = 0; t < 16; ++t) kt[t] = k + slots[t < n ? t : n - 1] * kv_row;
    __m512 lane[16];
#pragma GCC unroll 16
    for (int t = 0; t < 16; ++t) lane[t] = _mm512_setzero_ps();
    for (int c = 0; c < chunks; ++c) {
        const __m512 qc = _mm512_loadu_ps(q + 16 * c);
#pragma GCC unroll 16
        for (int t = 0; t < 16; ++t) lane[t] = _mm512_add_ps(lane[t], _mm512_mul_ps(qc, load_f16x16(kt[t] + 16 * c)));
    }
    const __m512 s = _mm512_mul_ps(reduce16x16(lane), _mm512_set1_ps(scale));
    _mm512_mask_storeu_ps(out, static_cast<__mmask16>(n >= 16 ? 0xffff : (1u << n) - 1), s);
}

void find_visible(const uint16_t * mask, int n_kv, std::vector<int> & visible) {
    visible.clear();
    const __m512i neg_inf = _mm512_set1_epi16(static_cast<short>(kF16NegInf));
    int s = 0;
    for (; s + 32 <= n_kv; s += 32) {
        uint32_t bits = _mm512_cmpneq_epi16_mask(_mm512_loadu_si512(mask + s), neg_inf);
        while (bits) {
            visible.push_back(s + __builtin_ctz(bits));
            bits &= bits - 1;
        }
    }
    for (; s < n_kv; ++s) {
        if (mask[s] != kF16NegInf) visible.push_back(s);
    }
}

// NG query heads' outputs, CB 16-dimension chunks at a time with the sums in registers:
// out(g, d) = (sum over visible j of p(g, j) * v(j, d)) * inv_sum(g). One pass over the slots
// reads each V row once for CB chunks (at depth the V rows come from beyond L2), and the NG x CB
// sums are independent chains.
template <int NG, int CB>
void weighted_values(const float * p, size_t nv, const int * visible, const uint16_t * v, int64_t kv_row, int chunks,
                     const float * inv_sum, float * out, int D) {
    for (int c0 = 0; c0 < chunks; c0 += CB) {
        __m512 acc[NG][CB];
        for (int g = 0; g < NG; ++g) {
            for (int c = 0; c < CB; ++c) acc[g][c] = _mm512_setzero_ps();
        }
        for (size_t j = 0; j < nv; ++j) {
            const uint16_t * vj = v + visible[j] * kv_row + 16 * c0;
            __m512 vc[CB];
            for (int c = 0; c < CB; ++c) vc[c] = load_f16x16(vj + 16 * c);
            for (int g = 0; g < NG; ++g) {
                const __m512 pg = _mm512_set1_ps(p[g * nv + j]);
                for (int c = 0; c < CB; ++c) acc[g][c] = _mm512_add_ps(acc[g][c], _mm512_mul_ps(pg, vc[c]));
            }
        }
        for (int g = 0; g < NG; ++g) {
            const __m512 inv = _mm512_set1_ps(inv_sum[g]);
            for (int c = 0; c < CB; ++c) _mm512_storeu_ps(out + g * D + 16 * (c0 + c), _mm512_mul_ps(acc[g][c], inv));
        }
    }
}

// weighted_values for NG heads with up to 16 sums in registers: 4 or 2 chunks per pass where the
// head size allows, else one.
template <int NG>
void weighted_values_heads(const float * p, size_t nv, const int * visible, const uint16_t * v, int64_t kv_row, int chunks,
                           const float * inv_sum, float * out, int D) {
    constexpr int kChunks = 16 / NG >= 4 ? 4 : (16 / NG >= 2 ? 2 : 1);
    if (chunks % kChunks == 0) return weighted_values<NG, kChunks>(p, nv, visible, v, kv_row, chunks, inv_sum, out, D);
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
        for (size_t j = 0; j < nv; j += 16) {
            const int n = static_cast<int>(nv - j < 16 ? nv - j : 16);
            for (int g = 0; g < G; ++g) block_scores(q + g * D, k, visible.data() + j, n, a.kv_row, C, a.scale, scores.data() + g * nv + j);
        }
        float inv_sum[64];
        for (int g = 0; g < G; ++g) {
            float * sc = scores.data() + g * nv;
            __m512 mv = _mm512_set1_ps(sc[0]);
            size_t j = 0;
            for (; j + 16 <= nv; j += 16) mv = _mm512_max_ps(mv, _mm512_loadu_ps(sc + j));
            float m = _mm512_reduce_max_ps(mv);  // max is exact in any order
            for (; j < nv; ++j) m = sc[j] > m ? sc[j] : m;
            const __m512 mvec = _mm512_set1_ps(m);
            __m512 sum = _mm512_setzero_ps();
            for (j = 0; j < nv; j += 16) {
                const __mmask16 live = static_cast<__mmask16>(nv - j >= 16 ? 0xffff : (1u << (nv - j)) - 1);
                const __m512 e = exp_nonpositive16(_mm512_sub_ps(_mm512_maskz_loadu_ps(live, sc + j), mvec));
                _mm512_mask_storeu_ps(sc + j, live, e);
                sum = _mm512_add_ps(sum, _mm512_maskz_mov_ps(live, e));  // a lane past the end adds +0: its sum is unchanged
            }
            inv_sum[g] = 1.0f / reduce16(sum);
        }
        for (int g0 = 0; g0 < G; g0 += kHeadBlock) {
            const float * p = scores.data() + g0 * nv;
            float * og = o + g0 * D;
            const uint16_t * v = a.v + static_cast<int64_t>(kvh) * D;
            switch (G - g0 < kHeadBlock ? G - g0 : kHeadBlock) {
                case 1: weighted_values_heads<1>(p, nv, visible.data(), v, a.kv_row, C, inv_sum + g0, og, D); break;
                case 2: weighted_values_heads<2>(p, nv, visible.data(), v, a.kv_row, C, inv_sum + g0, og, D); break;
                case 3: weighted_values_heads<3>(p, nv, visible.data(), v, a.kv_row, C, inv_sum + g0, og, D); break;
                case 4: weighted_values_heads<4>(p, nv, visible.data(), v, a.kv_row, C, inv_sum + g0, og, D); break;
                case 5: weighted_values_heads<5>(p, nv, visible.data(), v, a.kv_row, C, inv_sum + g0, og, D); break;
                case 6: weighted_values_heads<6>(p, nv, visible.data(), v, a.kv_row, C, inv_sum + g0, og, D); break;
                case 7: weighted_values_heads<7>(p, nv, visible.data(), v, a.kv_row, C, inv_sum + g0, og, D); break;
                default: weighted_values_heads<8>(p, nv, visible.data(), v, a.kv_row, C, inv_sum + g0, og, D); break;
            }
        }
    });
}

}  // namespace specula::kernels::avx512
