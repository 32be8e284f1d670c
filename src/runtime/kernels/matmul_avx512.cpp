// The AVX-512 VNNI body of kernels/matmul.h (built with -mavx512f -mavx512bw -mavx512vnni, run
// only where the CPU and OS have them). The packed layout was made for this: one 64-byte load is
// one 4-column slice of a whole 16-row group, and `vpdpbusd` multiplies its unsigned bytes by 4
// broadcast activation bytes straight into 16 int32 row sums. No sign trick, no s16 stage: the
// stored unsigned integers meet the signed activations and the offsets are subtracted once per
// block (the exact isum of matmul.h). Each token keeps its 16 float accumulators in one register,
// so a tile of 8 tokens reads every weight byte once and never spills.
// The float formats have their own body here too: matmul.h's 16 lane sums are exactly one zmm,
// so a tile of 4 weight rows x 4 tokens keeps 16 sums in registers and reads each weight chunk
// once per 4 tokens and each activation chunk once per 4 rows (the AVX2 body: 2 ymm per sum, one
// row at a time), which is what a verify block of many sequences' rows needs.
#include <immintrin.h>

#include <algorithm>

#include "runtime/kernels/avx512_lanes.h"
#include "runtime/kernels/matmul_impl.h"

namespace specula::kernels::avx512 {

namespace {

// acc += dot(w's unsigned bytes, the 4 signed bytes at p broadcast to every lane), with the
// broadcast folded into vpdpbusd's memory operand: a separate vpbroadcastd per token and slice
// would cost an issue slot beside each vpdpbusd.
inline __m512i dpbusd_broadcast(__m512i acc, __m512i w, const int8_t * p) {
    asm("vpdpbusd %2%{1to16%}, %1, %0"
        : "+v"(acc)
        : "v"(w), "m"(*reinterpret_cast<const int32_t *>(p)));
    return acc;
}
inline __m512 load_u8x16(const uint8_t * p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i *>(p))));
}
inline __m512i load64(const uint8_t * p) { return _mm512_loadu_si512(p); }

// The block's integer dots before the offset correction, 16 rows per token.
template <PackedFormat F, int NT>
inline void block_isums(const uint8_t * blk, const int8_t * const (&q)[NT], __m512i (&isum)[NT]) {
    for (int t = 0; t < NT; ++t) isum[t] = _mm512_setzero_si512();
    if constexpr (F == PackedFormat::Q8_0) {
        for (int j = 0; j < 8; ++j) {
            const __m512i w = load64(blk + 64 * j);
            for (int t = 0; t < NT; ++t) isum[t] = dpbusd_broadcast(isum[t], w, q[t] + 4 * j);
        }
    } else {
        const __m512i nibble = _mm512_set1_epi8(0x0f);
        [[maybe_unused]] __m512i plane;
        if constexpr (F == PackedFormat::Q5_0) plane = load64(blk + 256);
        for (int j = 0; j < 4; ++j) {
            const __m512i v = load64(blk + 64 * j);
            __m512i lo = _mm512_and_si512(v, nibble), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), nibble);
            if constexpr (F == PackedFormat::Q5_0) {
                // 5th bits: plane bit j for slice j, bit j + 4 for slice j + 4.
                const __m512i fifth = _mm512_set1_epi8(0x10);
                const auto bit = [&](int slice) { return _mm512_test_epi8_mask(plane, _mm512_set1_epi8(static_cast<char>(1u << slice))); };
                lo = _mm512_or_si512(lo, _mm512_maskz_mov_epi8(bit(j), fifth));
                hi = _mm512_or_si512(hi, _mm512_maskz_mov_epi8(bit(j + 4), fifth));
            }
            for (int t = 0; t < NT; ++t) {
                isum[t] = dpbusd_broadcast(isum[t], lo, q[t] + 4 * j);
                isum[t] = dpbusd_broadcast(isum[t], hi, q[t] + 16 + 4 * j);
            }
        }
    }
}

// Plane bits 2j..2j+1 of Q6_K's slice j at bits 4-5, to be masked (the 16-bit shifts leak across
// bytes only outside bits 4-5).
inline __m512i q6_high_bits(__m512i plane, int j) {
    switch (j) {
        case 0: return _mm512_slli_epi16(plane, 4);
        case 1: return _mm512_slli_epi16(plane, 2);
        case 2: return plane;
        default: return _mm512_srli_epi16(plane, 2);
    }
}

// Q6_K's isum: each half's dots of the unsigned 6-bit weights start at h32 (-32 x the half's
// activation sum, matmul_impl.h), so they end as dot(u - 32, q) with no signed weights to make;
// its scale then multiplies it, exactly (|isum| < 2^24).
template <int NT>
inline void q6_k_isums(const uint8_t * blk, const int8_t * const (&q)[NT], const int32_t * const (&h32)[NT], __m512i (&isum)[NT]) {
    const __m512i nibble = _mm512_set1_epi8(0x0f), high = _mm512_set1_epi8(0x30);
    for (int half = 0; half < 2; ++half) {  // columns 0-15 (low nibbles), then 16-31 (high)
        const __m512i plane = load64(blk + 256 + 64 * half);
        __m512i dot[NT];
        for (int t = 0; t < NT; ++t) dot[t] = _mm512_set1_epi32(h32[t][half]);
        for (int j = 0; j < 4; ++j) {
            __m512i v = load64(blk + 64 * j);
            if (half == 1) v = _mm512_srli_epi16(v, 4);
            const __m512i hi = _mm512_and_si512(q6_high_bits(plane, j), high);
            const __m512i u = _mm512_ternarylogic_epi32(v, nibble, hi, 0xea);  // (v & 0x0f) | hi
            for (int t = 0; t < NT; ++t) dot[t] = dpbusd_broadcast(dot[t], u, q[t] + 16 * half + 4 * j);
        }
        const __m512i sc = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i *>(blk + 384 + 16 * half)));
        for (int t = 0; t < NT; ++t) {
            const __m512i scaled = _mm512_mullo_epi32(dot[t], sc);
            isum[t] = half == 0 ? scaled : _mm512_add_epi32(isum[t], scaled);
        }
    }
}

// How far ahead of the block it reads a pass prefetches: 4 KB (14 Q4_K blocks, 10 of Q6_K). A
// pass streams its weights from memory once per forward, and 4 blocks ahead left a Zen 4 core
// waiting on them (docs/runtime.md).
constexpr size_t kPrefetchAhead = 4096;

template <PackedFormat F, int NT>
void tile(const PackedMatrix & m, const uint8_t * wg, const QuantizedActivations & a, int t0, float * y, int64_t y_stride, int64_t g) {
    constexpr size_t kBytes = packed_block_bytes(F);
    const int64_t nb = m.n_blocks();
    const int64_t nbk = a.k / kBlock;

    __m512 acc[NT];
    const float * d[NT];
    const int32_t * s[NT];
    const float * ds[NT];
    for (int t = 0; t < NT; ++t) {
        acc[t] = _mm512_setzero_ps();
        d[t] = a.d + (t0 + t) * nbk;
        s[t] = a.s + (t0 + t) * nbk;
        ds[t] = a.ds + (t0 + t) * nbk;
    }
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t * blk = wg + packed_block_offset(F, b);
        const uint8_t * tail = wg + packed_super_tail_offset(F, b);
        for (size_t line = 0; line < kBytes; line += 64) _mm_prefetch(reinterpret_cast<const char *>(blk + kPrefetchAhead + line), _MM_HINT_T0);
        const int8_t * q[NT];
        for (int t = 0; t < NT; ++t) q[t] = a.q + (t0 + t) * a.k + b * kBlock;
        __m512i isum[NT];
        if constexpr (F == PackedFormat::Q6_K) {
            const int32_t * h32[NT];
            for (int t = 0; t < NT; ++t) h32[t] = a.h32 + 2 * ((t0 + t) * nbk + b);
            q6_k_isums<NT>(blk, q, h32, isum);
        } else {
            block_isums<F, NT>(blk, q, isum);
        }
        __m512 dw, mw = _mm512_setzero_ps();
        switch (F) {
            case PackedFormat::Q8_0: dw = load_f16x16(blk + 512); break;
            case PackedFormat::Q6_K: dw = load_f16x16(tail); break;
            case PackedFormat::Q5_0: dw = load_f16x16(blk + 320); break;
            case PackedFormat::Q4_K:
                dw = _mm512_mul_ps(load_f16x16(tail), load_u8x16(blk + 256));
                mw = _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(_mm512_mul_ps(load_f16x16(tail + 32), load_u8x16(blk + 272))),
                                                          _mm512_set1_epi32(static_cast<int>(0x80000000u))));
                break;
            default:  // Q4_0, Q4_1
                dw = load_f16x16(blk + 256);
                if (F == PackedFormat::Q4_1) mw = load_f16x16(blk + 288);
                break;
        }
        for (int t = 0; t < NT; ++t) {
            __m512i i32 = isum[t];
            if constexpr (F == PackedFormat::Q8_0) i32 = _mm512_sub_epi32(i32, _mm512_set1_epi32(128 * s[t][b]));
            if constexpr (F == PackedFormat::Q4_0) i32 = _mm512_sub_epi32(i32, _mm512_set1_epi32(8 * s[t][b]));
            if constexpr (F == PackedFormat::Q5_0) i32 = _mm512_sub_epi32(i32, _mm512_set1_epi32(16 * s[t][b]));
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i32), _mm512_mul_ps(dw, _mm512_set1_ps(d[t][b])), acc[t]);
            if constexpr (F == PackedFormat::Q4_1 || F == PackedFormat::Q4_K) {
                acc[t] = _mm512_fmadd_ps(mw, _mm512_set1_ps(ds[t][b]), acc[t]);
            }
        }
    }
    const int64_t row0 = g * kGroupRows;
    const int64_t rows = m.n_rows - row0 < kGroupRows ? m.n_rows - row0 : kGroupRows;
    const __mmask16 keep = static_cast<__mmask16>((1u << rows) - 1);
    for (int t = 0; t < NT; ++t) _mm512_mask_storeu_ps(y + (t0 + t) * y_stride + row0, keep, acc[t]);
}

template <PackedFormat F>
void groups(const PackedMatrix & m, const uint8_t * packed, const QuantizedActivations & a, float * y, int64_t y_stride,
            int64_t g_begin, int64_t g_end) {
    // Up to 8 tokens per pass (8 accumulators + 8 integer sums of 32 registers); more tokens
    // make further passes over the group while its weights are in L1.
    constexpr int kTile = 8;
    for (int64_t g = g_begin; g < g_end; ++g) {
        const uint8_t * wg = packed + g * m.group_bytes();
        for (int t0 = 0; t0 < a.n_tokens; t0 += kTile) {
            switch (a.n_tokens - t0 < kTile ? a.n_tokens - t0 : kTile) {
                case 1: tile<F, 1>(m, wg, a, t0, y, y_stride, g); break;
                case 2: tile<F, 2>(m, wg, a, t0, y, y_stride, g); break;
                case 3: tile<F, 3>(m, wg, a, t0, y, y_stride, g); break;
                case 4: tile<F, 4>(m, wg, a, t0, y, y_stride, g); break;
                case 5: tile<F, 5>(m, wg, a, t0, y, y_stride, g); break;
                case 6: tile<F, 6>(m, wg, a, t0, y, y_stride, g); break;
                case 7: tile<F, 7>(m, wg, a, t0, y, y_stride, g); break;
                default: tile<F, 8>(m, wg, a, t0, y, y_stride, g); break;
            }
        }
    }
}

}  // namespace

void quantize_activations(const float * x, int64_t x_stride, QuantizedActivations & a) {
    const int64_t nb = a.k / kBlock;
    for (int t = 0; t < a.n_tokens; ++t) {
        const float * xr = x + t * x_stride;
        for (int64_t b = 0; b < nb; ++b) {
            const __m512 v0 = _mm512_loadu_ps(xr + b * kBlock), v1 = _mm512_loadu_ps(xr + b * kBlock + 16);
            const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));  // exact in any order
            const float d = amax / 127.0f;
            const __m512 id = _mm512_set1_ps(d != 0.0f ? 1.0f / d : 0.0f);
            // cvtps rounds to nearest-even under the default MXCSR, as nearbyint does in the generic body.
            const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, id)), q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, id));
            int8_t * q = a.q + t * a.k + b * kBlock;
            _mm_storeu_si128(reinterpret_cast<__m128i *>(q), _mm512_cvtepi32_epi8(q0));
            _mm_storeu_si128(reinterpret_cast<__m128i *>(q + 16), _mm512_cvtepi32_epi8(q1));
            const int32_t s0 = _mm512_reduce_add_epi32(q0), s1 = _mm512_reduce_add_epi32(q1);
            a.d[t * nb + b] = d;
            a.s[t * nb + b] = s0 + s1;
            a.h32[2 * (t * nb + b)] = -32 * s0;
            a.h32[2 * (t * nb + b) + 1] = -32 * s1;
        }
    }
}

namespace {

template <bool kBf16>
inline __m512 load_w16(const uint16_t * p) {
    if constexpr (kBf16) {
        const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(p));
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
    return load_f16x16(p);
}

// Rows row0..row0+NR of one group against tokens t0..t0+NT.
template <bool kBf16, int NR, int NT>
void float_tile(const uint16_t * w, int64_t k, const float * x, int64_t x_stride, int t0, float * y, int64_t y_stride,
                int64_t row0) {
    __m512 acc[NR][NT];
    for (int r = 0; r < NR; ++r) {
        for (int t = 0; t < NT; ++t) acc[r][t] = _mm512_setzero_ps();
    }
    for (int64_t c = 0; c < k; c += 16) {
        __m512 wv[NR];
        for (int r = 0; r < NR; ++r) wv[r] = load_w16<kBf16>(w + r * k + c);
        for (int t = 0; t < NT; ++t) {
            const __m512 xv = _mm512_loadu_ps(x + (t0 + t) * x_stride + c);
            for (int r = 0; r < NR; ++r) acc[r][t] = _mm512_fmadd_ps(wv[r], xv, acc[r][t]);
        }
    }
    for (int r = 0; r < NR; ++r) {
        for (int t = 0; t < NT; ++t) y[(t0 + t) * y_stride + row0 + r] = reduce16(acc[r][t]);
    }
}

template <bool kBf16, int NR>
void float_rows_tiled(const uint16_t * w, int64_t k, const float * x, int64_t x_stride, int n_tokens, float * y,
                      int64_t y_stride, int64_t row0) {
    constexpr int kTile = 4;
    for (int t0 = 0; t0 < n_tokens; t0 += kTile) {
        switch (n_tokens - t0 < kTile ? n_tokens - t0 : kTile) {
            case 1: float_tile<kBf16, NR, 1>(w, k, x, x_stride, t0, y, y_stride, row0); break;
            case 2: float_tile<kBf16, NR, 2>(w, k, x, x_stride, t0, y, y_stride, row0); break;
            case 3: float_tile<kBf16, NR, 3>(w, k, x, x_stride, t0, y, y_stride, row0); break;
            default: float_tile<kBf16, NR, 4>(w, k, x, x_stride, t0, y, y_stride, row0); break;
        }
    }
}

template <bool kBf16>
void float_groups(const PackedMatrix & m, const uint8_t * packed, const float * x, int64_t x_stride, int n_tokens, float * y,
                  int64_t y_stride, int64_t g_begin, int64_t g_end) {
    constexpr int kRows = 4;
    for (int64_t g = g_begin; g < g_end; ++g) {
        const auto * wg = reinterpret_cast<const uint16_t *>(packed + g * m.group_bytes());
        const int64_t first = g * kGroupRows, rows = std::min<int64_t>(kGroupRows, m.n_rows - first);
        for (int64_t r = 0; r < rows; r += kRows) {
            const uint16_t * w = wg + r * m.k;
            switch (rows - r < kRows ? rows - r : kRows) {
                case 1: float_rows_tiled<kBf16, 1>(w, m.k, x, x_stride, n_tokens, y, y_stride, first + r); break;
                case 2: float_rows_tiled<kBf16, 2>(w, m.k, x, x_stride, n_tokens, y, y_stride, first + r); break;
                case 3: float_rows_tiled<kBf16, 3>(w, m.k, x, x_stride, n_tokens, y, y_stride, first + r); break;
                default: float_rows_tiled<kBf16, 4>(w, m.k, x, x_stride, n_tokens, y, y_stride, first + r); break;
            }
        }
    }
}

}  // namespace

void matmul_float(const PackedMatrix & m, const uint8_t * packed, const float * x, int64_t x_stride, int n_tokens, float * y,
                  int64_t y_stride, int64_t g_begin, int64_t g_end) {
    if (m.format == PackedFormat::BF16) float_groups<true>(m, packed, x, x_stride, n_tokens, y, y_stride, g_begin, g_end);
    else float_groups<false>(m, packed, x, x_stride, n_tokens, y, y_stride, g_begin, g_end);
}

void matmul(const PackedMatrix & m, const uint8_t * packed, const QuantizedActivations & a, float * y, int64_t y_stride,
            int64_t g_begin, int64_t g_end) {
    switch (m.format) {
        case PackedFormat::Q8_0: groups<PackedFormat::Q8_0>(m, packed, a, y, y_stride, g_begin, g_end); break;
        case PackedFormat::Q4_0: groups<PackedFormat::Q4_0>(m, packed, a, y, y_stride, g_begin, g_end); break;
        case PackedFormat::Q4_1: groups<PackedFormat::Q4_1>(m, packed, a, y, y_stride, g_begin, g_end); break;
        case PackedFormat::Q5_0: groups<PackedFormat::Q5_0>(m, packed, a, y, y_stride, g_begin, g_end); break;
        case PackedFormat::Q4_K: groups<PackedFormat::Q4_K>(m, packed, a, y, y_stride, g_begin, g_end); break;
        case PackedFormat::Q6_K: groups<PackedFormat::Q6_K>(m, packed, a, y, y_stride, g_begin, g_end); break;
        case PackedFormat::F16:
        case PackedFormat::BF16: break;  // matmul_float
    }
}

}  // namespace specula::kernels::avx512
