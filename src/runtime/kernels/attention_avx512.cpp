// The AVX-512 body of kernels/attention.h, written with intrinsics: the element-by-element body
// (attention_body.inc) leaves the compiler to vectorise and spends most of its time storing and
// reloading its lane arrays. This one does the same float operations in the same order, so it
// gives the generic body's bits:
//   score(j, g) = (16 lane sums of q * k over the dimensions, then the halving tree) * scale
//   softmax: max, exp_nonpositive(score - max), a sequential sum, one reciprocal
//   out(g, d) = sum over j in order of p(j, g) * v(j, d), times the reciprocal
// Lanes live in one zmm; each V chunk accumulates in registers over every visible slot.
#include <immintrin.h>

#include <cstring>
#include <vector>

#include "common/fast_exp.h"
#include "runtime/kernels/attention_impl.h"

namespace specula::kernels::avx512 {

namespace {

constexpr uint16_t kF16NegInf = 0xfc00;
constexpr int kMaxChunks = 16;  // head size up to 256
constexpr int kHeadBlock = 8;   // query heads whose V sums share one pass over the slots

inline __m512 load_f16x16(const uint16_t * p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(p))); }

// attention_body.inc's halving tree: lane[l] += lane[l + w] for w = 8, 4, 2, 1.
inline float reduce16(__m512 v) {
    const __m256 s8 = _mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
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

// NG query heads' outputs, one 16-dimension chunk at a time with the sums in registers:
// out(g, d) = (sum over visible j of p(g, j) * v(j, d)) * inv_sum(g).
template <int NG>
void weighted_values(const float * p, size_t nv, const int * visible, const uint16_t * v, int64_t kv_row, int chunks,
                     const float * inv_sum, float * out, int D) {
    for (int c = 0; c < chunks; ++c) {
        __m512 acc[NG];
        for (int g = 0; g < NG; ++g) acc[g] = _mm512_setzero_ps();
        for (size_t j = 0; j < nv; ++j) {
            const __m512 vc = load_f16x16(v + visible[j] * kv_row + 16 * c);
            for (int g = 0; g < NG; ++g) acc[g] = _mm512_add_ps(acc[g], _mm512_mul_ps(_mm512_set1_ps(p[g * nv + j]), vc));
        }
        for (int g = 0; g < NG; ++g) _mm512_storeu_ps(out + g * D + 16 * c, _mm512_mul_ps(acc[g], _mm512_set1_ps(inv_sum[g])));
    }
}

}  // namespace

void attend(const AttentionArgs & a, int64_t pair_begin, int64_t pair_end) {
    const int D = a.head_dim, G = a.n_head / a.n_head_kv, C = D / 16;
    thread_local std::vector<int> visible;
    thread_local std::vector<float> scores;
    int64_t visible_row = -1;
    for (int64_t pair = pair_begin; pair < pair_end; ++pair) {
        const int64_t i = pair / a.n_head_kv;
        const int kvh = static_cast<int>(pair % a.n_head_kv);
        if (i != visible_row) find_visible(a.mask + i * a.mask_row, a.n_kv, visible), visible_row = i;
        const size_t nv = visible.size();
        float * o = a.out + i * a.out_row + static_cast<int64_t>(kvh) * G * D;
        if (nv == 0) {  // a row that sees nothing (never produced by the engine): zeros, not NaN
            std::memset(o, 0, sizeof(float) * G * D);
            continue;
        }
        const float * q = a.q + i * a.q_row + static_cast<int64_t>(kvh) * G * D;
        scores.resize(static_cast<size_t>(G) * nv);
        for (size_t j = 0; j < nv; ++j) {
            const uint16_t * k = a.k + visible[j] * a.kv_row + static_cast<int64_t>(kvh) * D;
            __m512 kc[kMaxChunks];
            for (int c = 0; c < C; ++c) kc[c] = load_f16x16(k + 16 * c);
            for (int g = 0; g < G; ++g) {
                __m512 lane = _mm512_setzero_ps();
                for (int c = 0; c < C; ++c) lane = _mm512_add_ps(lane, _mm512_mul_ps(_mm512_loadu_ps(q + g * D + 16 * c), kc[c]));
                scores[g * nv + j] = reduce16(lane) * a.scale;
            }
        }
        float inv_sum[64];
        for (int g = 0; g < G; ++g) {
            float * sc = scores.data() + g * nv;
            __m512 mv = _mm512_set1_ps(sc[0]);
            size_t j = 0;
            for (; j + 16 <= nv; j += 16) mv = _mm512_max_ps(mv, _mm512_loadu_ps(sc + j));
            float m = _mm512_reduce_max_ps(mv);  // max is exact in any order
            for (; j < nv; ++j) m = sc[j] > m ? sc[j] : m;
            for (j = 0; j < nv; ++j) sc[j] = exp_nonpositive(sc[j] - m);
            float sum = 0.0f;
            for (j = 0; j < nv; ++j) sum = sum + sc[j];
            inv_sum[g] = 1.0f / sum;
        }
        for (int g0 = 0; g0 < G; g0 += kHeadBlock) {
            const float * p = scores.data() + g0 * nv;
            float * og = o + g0 * D;
            const uint16_t * v = a.v + static_cast<int64_t>(kvh) * D;
            switch (G - g0 < kHeadBlock ? G - g0 : kHeadBlock) {
                case 1: weighted_values<1>(p, nv, visible.data(), v, a.kv_row, C, inv_sum + g0, og, D); break;
                case 2: weighted_values<2>(p, nv, visible.data(), v, a.kv_row, C, inv_sum + g0, og, D); break;
                case 3: weighted_values<3>(p, nv, visible.data(), v, a.kv_row, C, inv_sum + g0, og, D); break;
                case 4: weighted_values<4>(p, nv, visible.data(), v, a.kv_row, C, inv_sum + g0, og, D); break;
                case 5: weighted_values<5>(p, nv, visible.data(), v, a.kv_row, C, inv_sum + g0, og, D); break;
                case 6: weighted_values<6>(p, nv, visible.data(), v, a.kv_row, C, inv_sum + g0, og, D); break;
                case 7: weighted_values<7>(p, nv, visible.data(), v, a.kv_row, C, inv_sum + g0, og, D); break;
                default: weighted_values<8>(p, nv, visible.data(), v, a.kv_row, C, inv_sum + g0, og, D); break;
            }
        }
    }
}

}  // namespace specula::kernels::avx512
