// The AVX2 body of kernels/matmul.h (built with -mavx2 -mfma -mf16c, run only where the CPU has
// them). AVX2 has no vpdpbusd: `vpmaddubsw` (u8 x s8 -> pairs of s16) then `vpmaddwd` with ones
// (-> s32) take its place. Q8_0 uses the sign trick (|w| x sign(w) * a, so no pair can
// saturate s16) and needs no offset; Q4 nibbles are small enough to sum all 8 slices in s16.
// Each (row, token) float accumulator takes one FMA per block in block order, as in matmul.h.
#include <immintrin.h>

#include <cstring>

#include "runtime/kernels/matmul_impl.h"

namespace specula::kernels::avx2 {

void quantize_activations(const float * x, int64_t x_stride, QuantizedActivations & a) {
    const int64_t nb = a.k / kBlock;
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int t = 0; t < a.n_tokens; ++t) {
        const float * xr = x + t * x_stride;
        for (int64_t b = 0; b < nb; ++b) {
            __m256 v[4], m = _mm256_setzero_ps();
            for (int i = 0; i < 4; ++i) {
                v[i] = _mm256_loadu_ps(xr + b * kBlock + 8 * i);
                m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v[i]));
            }
            float lanes[8];
            _mm256_storeu_ps(lanes, m);
            float amax = 0.0f;
            for (float l : lanes) amax = amax > l ? amax : l;  // max is exact in any order
            const float d = amax / 127.0f;
            const __m256 id = _mm256_set1_ps(d != 0.0f ? 1.0f / d : 0.0f);
            int32_t q[32];
            for (int i = 0; i < 4; ++i) {
                // cvtps rounds to nearest-even under the default MXCSR, as nearbyint does in the generic body.
                _mm256_storeu_si256(reinterpret_cast<__m256i *>(q + 8 * i), _mm256_cvtps_epi32(_mm256_mul_ps(v[i], id)));
            }
            int32_t sum = 0;
            for (int c = 0; c < 32; ++c) {
                a.q[t * a.k + b * kBlock + c] = static_cast<int8_t>(q[c]);
                sum += q[c];
            }
            a.d[t * nb + b] = d;
            a.s[t * nb + b] = sum;
        }
    }
}

namespace {

inline __m256i broadcast4(const int8_t * p) {
    int32_t v;
    std::memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

// One 16-row group (two 8-row halves in ymm) x NT tokens, all blocks. Each token's broadcast
// activations serve both halves; the per-block integer sums stay in registers, the float
// accumulators live in L1 (one load + FMA + store per block), which keeps 16 ymm enough for 4 tokens.
template <PackedFormat F, int NT>
void tile(const PackedMatrix & m, const uint8_t * wg, const QuantizedActivations & a, int t0, float * y, int64_t g) {
    constexpr size_t kBytes = packed_block_bytes(F);
    constexpr size_t kScales = F == PackedFormat::Q8_0 ? 512 : 256;
    const int64_t nb = m.n_blocks();
    const int64_t nbk = a.k / kBlock;
    const __m256i ones = _mm256_set1_epi16(1);

    alignas(32) float acc[NT][16] = {};
    const int8_t * q[NT];
    const float * d[NT];
    const int32_t * s[NT];
    for (int t = 0; t < NT; ++t) {
        q[t] = a.q + (t0 + t) * a.k;
        d[t] = a.d + (t0 + t) * nbk;
        s[t] = a.s + (t0 + t) * nbk;
    }

    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t * blk = wg + b * kBytes;
        for (size_t line = 0; line < kBytes; line += 64) _mm_prefetch(reinterpret_cast<const char *>(blk + 4 * kBytes + line), _MM_HINT_T0);
        __m256i isum[NT][2];
        if constexpr (F == PackedFormat::Q8_0) {
            for (int t = 0; t < NT; ++t) isum[t][0] = isum[t][1] = _mm256_setzero_si256();
            const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
            for (int j = 0; j < 8; ++j) {
                // Stored bytes are w + 128: flipping the top bit gives the signed weight back.
                const __m256i w0 = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(blk + 64 * j)), flip);
                const __m256i w1 = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(blk + 64 * j + 32)), flip);
                const __m256i a0 = _mm256_abs_epi8(w0), a1 = _mm256_abs_epi8(w1);
                for (int t = 0; t < NT; ++t) {
                    const __m256i x = broadcast4(q[t] + b * kBlock + 4 * j);
                    isum[t][0] = _mm256_add_epi32(isum[t][0], _mm256_madd_epi16(_mm256_maddubs_epi16(a0, _mm256_sign_epi8(x, w0)), ones));
                    isum[t][1] = _mm256_add_epi32(isum[t][1], _mm256_madd_epi16(_mm256_maddubs_epi16(a1, _mm256_sign_epi8(x, w1)), ones));
                }
            }
        } else {
            const __m256i nibble = _mm256_set1_epi8(0x0f);
            __m256i p16[NT][2];
            for (int t = 0; t < NT; ++t) p16[t][0] = p16[t][1] = _mm256_setzero_si256();
            for (int j = 0; j < 4; ++j) {
                const __m256i v0 = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(blk + 64 * j));
                const __m256i v1 = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(blk + 64 * j + 32));
                const __m256i lo0 = _mm256_and_si256(v0, nibble), lo1 = _mm256_and_si256(v1, nibble);
                for (int t = 0; t < NT; ++t) {
                    // 8 slices x 2 pairs of 15 * 127 stay below 2^15: exact in s16.
                    const __m256i x = broadcast4(q[t] + b * kBlock + 4 * j);
                    p16[t][0] = _mm256_add_epi16(p16[t][0], _mm256_maddubs_epi16(lo0, x));
                    p16[t][1] = _mm256_add_epi16(p16[t][1], _mm256_maddubs_epi16(lo1, x));
                }
                const __m256i hi0 = _mm256_and_si256(_mm256_srli_epi16(v0, 4), nibble);
                const __m256i hi1 = _mm256_and_si256(_mm256_srli_epi16(v1, 4), nibble);
                for (int t = 0; t < NT; ++t) {
                    const __m256i x = broadcast4(q[t] + b * kBlock + 16 + 4 * j);
                    p16[t][0] = _mm256_add_epi16(p16[t][0], _mm256_maddubs_epi16(hi0, x));
                    p16[t][1] = _mm256_add_epi16(p16[t][1], _mm256_maddubs_epi16(hi1, x));
                }
            }
            for (int t = 0; t < NT; ++t) {
                isum[t][0] = _mm256_madd_epi16(p16[t][0], ones);
                isum[t][1] = _mm256_madd_epi16(p16[t][1], ones);
            }
        }
        for (int h = 0; h < 2; ++h) {
            const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(blk + kScales + 16 * h)));
            __m256 mw = _mm256_setzero_ps();
            if constexpr (F == PackedFormat::Q4_1) mw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(blk + 288 + 16 * h)));
            for (int t = 0; t < NT; ++t) {
                __m256i i32 = isum[t][h];
                if constexpr (F == PackedFormat::Q4_0) i32 = _mm256_sub_epi32(i32, _mm256_set1_epi32(8 * s[t][b]));
                __m256 r = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i32), _mm256_mul_ps(dw, _mm256_set1_ps(d[t][b])), _mm256_load_ps(acc[t] + 8 * h));
                if constexpr (F == PackedFormat::Q4_1) r = _mm256_fmadd_ps(mw, _mm256_set1_ps(d[t][b] * static_cast<float>(s[t][b])), r);
                _mm256_store_ps(acc[t] + 8 * h, r);
            }
        }
    }
    const int64_t row0 = g * kGroupRows;
    const int64_t rows = m.n_rows - row0 < kGroupRows ? m.n_rows - row0 : kGroupRows;
    for (int t = 0; t < NT; ++t) std::memcpy(y + (t0 + t) * m.n_rows + row0, acc[t], sizeof(float) * rows);
}

template <PackedFormat F>
void groups(const PackedMatrix & m, const uint8_t * packed, const QuantizedActivations & a, float * y, int64_t g_begin,
            int64_t g_end) {
    // Up to 4 tokens per pass; more tokens make further passes over the group while its weights
    // are in L1/L2.
    constexpr int kTile = 4;
    for (int64_t g = g_begin; g < g_end; ++g) {
        const uint8_t * wg = packed + g * m.group_bytes();
        for (int t0 = 0; t0 < a.n_tokens; t0 += kTile) {
            switch (a.n_tokens - t0 < kTile ? a.n_tokens - t0 : kTile) {
                case 1: tile<F, 1>(m, wg, a, t0, y, g); break;
                case 2: tile<F, 2>(m, wg, a, t0, y, g); break;
                case 3: tile<F, 3>(m, wg, a, t0, y, g); break;
                default: tile<F, 4>(m, wg, a, t0, y, g); break;
            }
        }
    }
}

}  // namespace

void matmul(const PackedMatrix & m, const uint8_t * packed, const QuantizedActivations & a, float * y, int64_t g_begin,
            int64_t g_end) {
    switch (m.format) {
        case PackedFormat::Q8_0: groups<PackedFormat::Q8_0>(m, packed, a, y, g_begin, g_end); break;
        case PackedFormat::Q4_0: groups<PackedFormat::Q4_0>(m, packed, a, y, g_begin, g_end); break;
        case PackedFormat::Q4_1: groups<PackedFormat::Q4_1>(m, packed, a, y, g_begin, g_end); break;
        case PackedFormat::F16:
        case PackedFormat::BF16: break;  // matmul_float
    }
}

namespace {

template <bool kBf16>
inline __m256 load8(const uint16_t * p) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i *>(p));
    if constexpr (kBf16) return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    return _mm256_cvtph_ps(h);
}

// The 16 lanes of matmul.h as two ymm (lanes 0-7, 8-15), reduced by the same halving tree.
inline float reduce16(__m256 lo, __m256 hi) {
    const __m256 s8 = _mm256_add_ps(lo, hi);                                                   // l + (l + 8)
    const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));    // l + (l + 4)
    const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));                                   // l + (l + 2)
    return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));                          // 0 + 1
}

template <bool kBf16, int NT>
void float_row(const uint16_t * w, int64_t k, const float * x, int64_t x_stride, int t0, float * y, int64_t n_rows, int64_t row) {
    __m256 lo[NT], hi[NT];
    for (int t = 0; t < NT; ++t) lo[t] = hi[t] = _mm256_setzero_ps();
    for (int64_t c = 0; c < k; c += 16) {
        const __m256 w0 = load8<kBf16>(w + c), w1 = load8<kBf16>(w + c + 8);
        for (int t = 0; t < NT; ++t) {
            const float * xt = x + (t0 + t) * x_stride + c;
            lo[t] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xt), lo[t]);
            hi[t] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xt + 8), hi[t]);
        }
    }
    for (int t = 0; t < NT; ++t) y[(t0 + t) * n_rows + row] = reduce16(lo[t], hi[t]);
}

template <bool kBf16>
void float_rows(const PackedMatrix & m, const uint8_t * packed, const float * x, int64_t x_stride, int n_tokens, float * y,
                int64_t g_begin, int64_t g_end) {
    constexpr int kTile = 4;  // 2 ymm per token + 2 for the weights: 10 of 16 registers
    for (int64_t row = g_begin * kGroupRows; row < g_end * kGroupRows && row < m.n_rows; ++row) {
        const auto * w = reinterpret_cast<const uint16_t *>(packed + (row / kGroupRows) * m.group_bytes()) + (row % kGroupRows) * m.k;
        for (int t0 = 0; t0 < n_tokens; t0 += kTile) {
            switch (n_tokens - t0 < kTile ? n_tokens - t0 : kTile) {
                case 1: float_row<kBf16, 1>(w, m.k, x, x_stride, t0, y, m.n_rows, row); break;
                case 2: float_row<kBf16, 2>(w, m.k, x, x_stride, t0, y, m.n_rows, row); break;
                case 3: float_row<kBf16, 3>(w, m.k, x, x_stride, t0, y, m.n_rows, row); break;
                default: float_row<kBf16, 4>(w, m.k, x, x_stride, t0, y, m.n_rows, row); break;
            }
        }
    }
}

}  // namespace

void matmul_float(const PackedMatrix & m, const uint8_t * packed, const float * x, int64_t x_stride, int n_tokens,
                  float * y, int64_t g_begin, int64_t g_end) {
    if (m.format == PackedFormat::BF16) float_rows<true>(m, packed, x, x_stride, n_tokens, y, g_begin, g_end);
    else float_rows<false>(m, packed, x, x_stride, n_tokens, y, g_begin, g_end);
}

}  // namespace specula::kernels::avx2
