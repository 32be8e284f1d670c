// The AVX-512 VNNI body of kernels/matmul.h (built with -mavx512f/bw/vl/vnni, run only where the
// CPU has them). A tile is one 16-row group x up to 16 tokens: per 32-column block the group's
// weights are loaded once (8 zmm of 16 rows x 4 columns), each token's 4 activation bytes are
// broadcast into `vpdpbusd` against them, and each (row, token) float accumulator takes one
// FMA per block, in block order: the reference order of matmul.h, lane-parallel over rows.
#include <immintrin.h>

#include <cstring>

#include "runtime/kernels/matmul_impl.h"

namespace specula::kernels::avx512 {

void quantize_activations(const float * x, int64_t x_stride, QuantizedActivations & a) {
    const int64_t nb = a.k / kBlock;
    for (int t = 0; t < a.n_tokens; ++t) {
        const float * xr = x + t * x_stride;
        for (int64_t b = 0; b < nb; ++b) {
            const __m512 x0 = _mm512_loadu_ps(xr + b * kBlock), x1 = _mm512_loadu_ps(xr + b * kBlock + 16);
            const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(x0), _mm512_abs_ps(x1)));
            const float d = amax / 127.0f;
            const __m512 id = _mm512_set1_ps(d != 0.0f ? 1.0f / d : 0.0f);
            // cvtps rounds to nearest-even under the default MXCSR, as nearbyint does in the generic body.
            const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(x0, id)), q1 = _mm512_cvtps_epi32(_mm512_mul_ps(x1, id));
            _mm_storeu_si128(reinterpret_cast<__m128i *>(a.q + t * a.k + b * kBlock), _mm512_cvtsepi32_epi8(q0));
            _mm_storeu_si128(reinterpret_cast<__m128i *>(a.q + t * a.k + b * kBlock + 16), _mm512_cvtsepi32_epi8(q1));
            a.d[t * nb + b] = d;
            a.s[t * nb + b] = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
        }
    }
}

namespace {

inline int32_t load_i32(const int8_t * p) {
    int32_t v;
    std::memcpy(&v, p, 4);
    return v;
}

template <PackedFormat F, int NT>
void tile(const PackedMatrix & m, const uint8_t * wg, const QuantizedActivations & a, int t0, float * y, int64_t g) {
    constexpr size_t kBytes = packed_block_bytes(F);
    constexpr size_t kScales = F == PackedFormat::Q8_0 ? 512 : 256;
    constexpr int32_t kOffset = F == PackedFormat::Q8_0 ? 128 : F == PackedFormat::Q4_0 ? 8 : 0;
    // Few tokens leave vpdpbusd's latency exposed; two partial integer sums per token (exact) hide it.
    constexpr bool kSplit = NT <= 4;
    const int64_t nb = m.n_blocks();
    const int64_t nbk = a.k / kBlock;
    const __m512i nibble = _mm512_set1_epi8(0x0f);

    __m512 acc[NT];
    for (int t = 0; t < NT; ++t) acc[t] = _mm512_setzero_ps();
    const int8_t * q[NT];
    for (int t = 0; t < NT; ++t) q[t] = a.q + (t0 + t) * a.k;

    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t * blk = wg + b * kBytes;
        for (size_t line = 0; line < kBytes; line += 64) _mm_prefetch(reinterpret_cast<const char *>(blk + 4 * kBytes + line), _MM_HINT_T0);
        __m512i w[8];
        if constexpr (F == PackedFormat::Q8_0) {
            for (int j = 0; j < 8; ++j) w[j] = _mm512_loadu_si512(blk + 64 * j);
        } else {
            for (int j = 0; j < 4; ++j) {
                const __m512i v = _mm512_loadu_si512(blk + 64 * j);
                w[j] = _mm512_and_si512(v, nibble);
                w[j + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), nibble);
            }
        }
        // Activation column offset of slice j: Q8_0 slices are 4j; Q4 slices 0-3 are 4j, 4-7 are 16 + 4(j-4).
        auto col = [](int j) { return F == PackedFormat::Q8_0 ? 4 * j : (j < 4 ? 4 * j : 16 + 4 * (j - 4)); };
        __m512i s0[NT], s1[NT];
        for (int t = 0; t < NT; ++t) s0[t] = s1[t] = _mm512_setzero_si512();
        for (int j = 0; j < 8; ++j) {
            for (int t = 0; t < NT; ++t) {
                const __m512i x = _mm512_set1_epi32(load_i32(q[t] + b * kBlock + col(j)));
                if (kSplit && (j & 1)) s1[t] = _mm512_dpbusd_epi32(s1[t], w[j], x);
                else s0[t] = _mm512_dpbusd_epi32(s0[t], w[j], x);
            }
        }
        const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(blk + kScales)));
        __m512 mw = _mm512_setzero_ps();
        if constexpr (F == PackedFormat::Q4_1) mw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(blk + 288)));
        for (int t = 0; t < NT; ++t) {
            const int32_t s = a.s[(t0 + t) * nbk + b];
            const float d = a.d[(t0 + t) * nbk + b];
            __m512i isum = kSplit ? _mm512_add_epi32(s0[t], s1[t]) : s0[t];
            if constexpr (kOffset != 0) isum = _mm512_sub_epi32(isum, _mm512_set1_epi32(kOffset * s));
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(dw, _mm512_set1_ps(d)), acc[t]);
            if constexpr (F == PackedFormat::Q4_1) acc[t] = _mm512_fmadd_ps(mw, _mm512_set1_ps(d * static_cast<float>(s)), acc[t]);
        }
    }
    const int64_t row0 = g * kGroupRows;
    const int64_t rows = m.n_rows - row0 < kGroupRows ? m.n_rows - row0 : kGroupRows;
    const __mmask16 keep = static_cast<__mmask16>((1u << rows) - 1);
    for (int t = 0; t < NT; ++t) _mm512_mask_storeu_ps(y + (t0 + t) * m.n_rows + row0, keep, acc[t]);
}

template <PackedFormat F>
void groups(const PackedMatrix & m, const uint8_t * packed, const QuantizedActivations & a, float * y, int64_t g_begin,
            int64_t g_end) {
    for (int64_t g = g_begin; g < g_end; ++g) {
        const uint8_t * wg = packed + g * m.group_bytes();
        // Up to 8 tokens per pass keep every accumulator in registers; 9-16 tokens make a second
        // pass over the group while its weights are still in L1/L2.
        for (int t0 = 0; t0 < a.n_tokens; t0 += 8) {
            switch (a.n_tokens - t0 < 8 ? a.n_tokens - t0 : 8) {
                case 1: tile<F, 1>(m, wg, a, t0, y, g); break;
                case 2: tile<F, 2>(m, wg, a, t0, y, g); break;
                case 3: tile<F, 3>(m, wg, a, t0, y, g); break;
                case 4: tile<F, 4>(m, wg, a, t0, y, g); break;
                case 5: tile<F, 5>(m, wg, a, t0, y, g); break;
                case 6: tile<F, 6>(m, wg, a, t0, y, g); break;
                case 7: tile<F, 7>(m, wg, a, t0, y, g); break;
                default: tile<F, 8>(m, wg, a, t0, y, g); break;
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
    }
}

}  // namespace specula::kernels::avx512
