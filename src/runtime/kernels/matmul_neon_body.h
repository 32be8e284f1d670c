#pragma once
// The NEON body of kernels/matmul.h, included by matmul_neon_dotprod.cpp (built for ARMv8.2-A
// with the dot product) and matmul_neon_i8mm.cpp (with the int8 matrix multiply too); each runs
// only where detected_cpu_path() finds the CPU features.
//
// The packed layout fits `sdot`'s lane form as it is: 16 bytes of a slice are 4 rows x 4 columns,
// and `sdot v, w, x.4b[j]` adds each row's 4-column dot with the activations' slice j. `smmla`
// multiplies 2 rows x 8 columns by 2 tokens x 8 columns: zipping the 32-bit words of two slices
// gives it rows in that shape, and two tokens' activations side by side the other operand.
// Integer dots are exact in any order; each (row, token) float accumulator takes matmul.h's one
// FMA per block in block order, as the portable body does.
#include <arm_neon.h>

#include <cstring>
#include <utility>

#include "runtime/kernels/matmul_impl.h"

namespace specula::kernels::SPECULA_NEON_NS {

namespace {

// The signed weights of slice J (columns 4J..4J+3 of a block) for rows 4c..4c+3: byte 4r + i is
// row 4c + r, column 4J + i. Q8_0's stored w + 128 and Q6_K's u - 32 become w; the other formats'
// unsigned integers (below 32) are their own signed values, their offsets applied per block.
template <PackedFormat F, int J>
inline int8x16_t slice(const uint8_t * blk, int c) {
    if constexpr (F == PackedFormat::Q8_0) {
        return vreinterpretq_s8_u8(veorq_u8(vld1q_u8(blk + 64 * J + 16 * c), vdupq_n_u8(0x80)));
    } else {
        const uint8x16_t v = vld1q_u8(blk + 64 * (J % 4) + 16 * c);
        uint8x16_t u;
        if constexpr (J < 4) u = vandq_u8(v, vdupq_n_u8(0x0f));
        else u = vshrq_n_u8(v, 4);
        if constexpr (F == PackedFormat::Q5_0) {  // bit J of the plane byte, moved to bit 4
            const uint8x16_t plane = vld1q_u8(blk + 256 + 16 * c);
            uint8x16_t hi;
            if constexpr (J < 4) hi = vshlq_n_u8(plane, 4 - J);
            else if constexpr (J == 4) hi = plane;
            else hi = vshrq_n_u8(plane, J - 4);
            u = vorrq_u8(u, vandq_u8(hi, vdupq_n_u8(0x10)));
        }
        if constexpr (F == PackedFormat::Q6_K) {  // bits 2(J % 4)..+1 of the half's plane, moved to bits 4-5
            const uint8x16_t plane = vld1q_u8(blk + 256 + 64 * (J / 4) + 16 * c);
            uint8x16_t hi;
            if constexpr (J % 4 == 0) hi = vshlq_n_u8(plane, 4);
            else if constexpr (J % 4 == 1) hi = vshlq_n_u8(plane, 2);
            else if constexpr (J % 4 == 2) hi = plane;
            else hi = vshrq_n_u8(plane, 2);
            u = vorrq_u8(u, vandq_u8(hi, vdupq_n_u8(0x30)));
            return vsubq_s8(vreinterpretq_s8_u8(u), vdupq_n_s8(32));
        }
        return vreinterpretq_s8_u8(u);
    }
}

// Integer dots of N tokens with `sdot`: half[t][h][c] sums columns 16h..16h+15 of rows 4c..4c+3.
template <PackedFormat F, int N, int J>
inline void sdot_slice(const uint8_t * blk, const int8x16_t (*x)[2], int32x4_t (*half)[2][4]) {
    for (int c = 0; c < 4; ++c) {
        const int8x16_t w = slice<F, J>(blk, c);
        for (int t = 0; t < N; ++t) half[t][J / 4][c] = vdotq_laneq_s32(half[t][J / 4][c], w, x[t][J / 4], J % 4);
    }
}

template <PackedFormat F, int N, int... J>
inline void sdot_block(const uint8_t * blk, const int8_t * const * q, int32x4_t (*half)[2][4], std::integer_sequence<int, J...>) {
    int8x16_t x[N][2];
    for (int t = 0; t < N; ++t) x[t][0] = vld1q_s8(q[t]), x[t][1] = vld1q_s8(q[t] + 16);
    (sdot_slice<F, N, J>(blk, x, half), ...);
}

#if defined(__ARM_FEATURE_MATMUL_INT8)
// Integer dots of NP token pairs with `smmla` over columns 8K..8K+7 (slices 2K, 2K + 1):
// m[p][h][c][0] holds rows 4c, 4c + 1 x the pair's two tokens, [1] rows 4c + 2, 4c + 3.
template <PackedFormat F, int NP, int K>
inline void smmla_columns(const uint8_t * blk, const int8x16_t (&x)[NP][4], int32x4_t (&m)[NP][2][4][2]) {
    for (int c = 0; c < 4; ++c) {
        const int32x4_t a = vreinterpretq_s32_s8(slice<F, 2 * K>(blk, c)), b = vreinterpretq_s32_s8(slice<F, 2 * K + 1>(blk, c));
        const int8x16_t rows01 = vreinterpretq_s8_s32(vzip1q_s32(a, b)), rows23 = vreinterpretq_s8_s32(vzip2q_s32(a, b));
        for (int p = 0; p < NP; ++p) {
            m[p][K / 2][c][0] = vmmlaq_s32(m[p][K / 2][c][0], rows01, x[p][K]);
            m[p][K / 2][c][1] = vmmlaq_s32(m[p][K / 2][c][1], rows23, x[p][K]);
        }
    }
}

template <PackedFormat F, int NP, int... K>
inline void smmla_block(const uint8_t * blk, const int8_t * const * q, int32x4_t (*half)[2][4], std::integer_sequence<int, K...>) {
    int8x16_t x[NP][4];
    for (int p = 0; p < NP; ++p) {
        for (int k = 0; k < 4; ++k) x[p][k] = vcombine_s8(vld1_s8(q[2 * p] + 8 * k), vld1_s8(q[2 * p + 1] + 8 * k));
    }
    int32x4_t m[NP][2][4][2];
    for (auto & pair : m) {
        for (auto & h : pair) {
            for (auto & c : h) c[0] = c[1] = vdupq_n_s32(0);
        }
    }
    (smmla_columns<F, NP, K>(blk, x, m), ...);
    for (int p = 0; p < NP; ++p) {  // [r0 t0, r0 t1, r1 t0, r1 t1] pairs back to one vector per token
        for (int h = 0; h < 2; ++h) {
            for (int c = 0; c < 4; ++c) {
                half[2 * p][h][c] = vuzp1q_s32(m[p][h][c][0], m[p][h][c][1]);
                half[2 * p + 1][h][c] = vuzp2q_s32(m[p][h][c][0], m[p][h][c][1]);
            }
        }
    }
}
#endif

// matmul.h's isum (before the offset correction) of one block for NT tokens, rows 4c..4c+3 in
// isum[t][c]; Q6_K's with its two 16-column scales applied.
template <PackedFormat F, int NT>
inline void block_isums(const uint8_t * blk, const int8_t * const (&q)[NT], int32x4_t (&isum)[NT][4]) {
    int32x4_t half[NT][2][4];
    for (auto & t : half) {
        for (auto & h : t) {
            for (auto & c : h) c = vdupq_n_s32(0);
        }
    }
#if defined(__ARM_FEATURE_MATMUL_INT8)
    if constexpr (NT >= 2) smmla_block<F, NT / 2>(blk, q, half, std::make_integer_sequence<int, 4>());
    if constexpr (NT % 2 == 1) sdot_block<F, 1>(blk, q + NT - 1, half + NT - 1, std::make_integer_sequence<int, 8>());
#else
    sdot_block<F, NT>(blk, q, half, std::make_integer_sequence<int, 8>());
#endif
    if constexpr (F == PackedFormat::Q6_K) {
        const int8x16_t s0 = vld1q_s8(reinterpret_cast<const int8_t *>(blk + 384)), s1 = vld1q_s8(reinterpret_cast<const int8_t *>(blk + 400));
        const int16x8_t s0l = vmovl_s8(vget_low_s8(s0)), s0h = vmovl_s8(vget_high_s8(s0));
        const int16x8_t s1l = vmovl_s8(vget_low_s8(s1)), s1h = vmovl_s8(vget_high_s8(s1));
        const int32x4_t sc0[4] = {vmovl_s16(vget_low_s16(s0l)), vmovl_s16(vget_high_s16(s0l)), vmovl_s16(vget_low_s16(s0h)), vmovl_s16(vget_high_s16(s0h))};
        const int32x4_t sc1[4] = {vmovl_s16(vget_low_s16(s1l)), vmovl_s16(vget_high_s16(s1l)), vmovl_s16(vget_low_s16(s1h)), vmovl_s16(vget_high_s16(s1h))};
        for (int t = 0; t < NT; ++t) {
            for (int c = 0; c < 4; ++c) isum[t][c] = vmlaq_s32(vmulq_s32(half[t][0][c], sc0[c]), half[t][1][c], sc1[c]);
        }
    } else {
        for (int t = 0; t < NT; ++t) {
            for (int c = 0; c < 4; ++c) isum[t][c] = vaddq_s32(half[t][0][c], half[t][1][c]);
        }
    }
}

inline float32x4_t load_f16x4(const uint8_t * p) {
    uint16_t h[4];
    std::memcpy(h, p, sizeof h);
    return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(h)));
}
inline float32x4_t load_u8x4(const uint8_t * p) {
    uint32_t v;
    std::memcpy(&v, p, 4);
    return vcvtq_f32_u32(vmovl_u16(vget_low_u16(vmovl_u8(vcreate_u8(v)))));
}

// One 16-row group (four 4-row vectors) x NT tokens, all blocks.
template <PackedFormat F, int NT>
void tile(const PackedMatrix & m, const uint8_t * wg, const QuantizedActivations & a, int t0, float * y, int64_t y_stride, int64_t g) {
    constexpr size_t kBytes = packed_block_bytes(F);
    const int64_t nb = m.n_blocks();
    const int64_t nbk = a.k / kBlock;
    float32x4_t acc[NT][4];
    for (auto & t : acc) {
        for (auto & c : t) c = vdupq_n_f32(0.0f);
    }
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t * blk = wg + packed_block_offset(F, b);
        const uint8_t * tail = wg + packed_super_tail_offset(F, b);
        for (size_t line = 0; line < kBytes; line += 64) __builtin_prefetch(blk + 4 * kBytes + line);
        const int8_t * q[NT];
        for (int t = 0; t < NT; ++t) q[t] = a.q + (t0 + t) * a.k + b * kBlock;
        int32x4_t isum[NT][4];
        block_isums<F, NT>(blk, q, isum);
        float32x4_t dw[4], mw[4];
        for (int c = 0; c < 4; ++c) {
            mw[c] = vdupq_n_f32(0.0f);
            switch (F) {
                case PackedFormat::Q8_0: dw[c] = load_f16x4(blk + 512 + 8 * c); break;
                case PackedFormat::Q5_0: dw[c] = load_f16x4(blk + 320 + 8 * c); break;
                case PackedFormat::Q4_K:
                    dw[c] = vmulq_f32(load_f16x4(tail + 8 * c), load_u8x4(blk + 256 + 4 * c));
                    mw[c] = vnegq_f32(vmulq_f32(load_f16x4(tail + 32 + 8 * c), load_u8x4(blk + 272 + 4 * c)));
                    break;
                case PackedFormat::Q6_K: dw[c] = load_f16x4(tail + 8 * c); break;
                default:  // Q4_0, Q4_1
                    dw[c] = load_f16x4(blk + 256 + 8 * c);
                    if (F == PackedFormat::Q4_1) mw[c] = load_f16x4(blk + 288 + 8 * c);
                    break;
            }
        }
        for (int t = 0; t < NT; ++t) {
            const float d = a.d[(t0 + t) * nbk + b];
            const int32_t s = a.s[(t0 + t) * nbk + b];
            for (int c = 0; c < 4; ++c) {
                int32x4_t i32 = isum[t][c];
                if constexpr (F == PackedFormat::Q4_0) i32 = vsubq_s32(i32, vdupq_n_s32(8 * s));
                if constexpr (F == PackedFormat::Q5_0) i32 = vsubq_s32(i32, vdupq_n_s32(16 * s));
                acc[t][c] = vfmaq_f32(acc[t][c], vcvtq_f32_s32(i32), vmulq_n_f32(dw[c], d));
                if constexpr (F == PackedFormat::Q4_1 || F == PackedFormat::Q4_K) {
                    acc[t][c] = vfmaq_f32(acc[t][c], mw[c], vdupq_n_f32(d * static_cast<float>(s)));
                }
            }
        }
    }
    const int64_t row0 = g * kGroupRows;
    const int64_t rows = m.n_rows - row0 < kGroupRows ? m.n_rows - row0 : kGroupRows;
    for (int t = 0; t < NT; ++t) {
        float out[kGroupRows];
        for (int c = 0; c < 4; ++c) vst1q_f32(out + 4 * c, acc[t][c]);
        std::memcpy(y + (t0 + t) * y_stride + row0, out, sizeof(float) * rows);
    }
}

template <PackedFormat F>
void groups(const PackedMatrix & m, const uint8_t * packed, const QuantizedActivations & a, float * y, int64_t y_stride,
            int64_t g_begin, int64_t g_end) {
    // Up to 4 tokens per pass; more tokens make further passes over the group while its weights
    // are in L1/L2.
    constexpr int kTile = 4;
    for (int64_t g = g_begin; g < g_end; ++g) {
        const uint8_t * wg = packed + g * m.group_bytes();
        for (int t0 = 0; t0 < a.n_tokens; t0 += kTile) {
            switch (a.n_tokens - t0 < kTile ? a.n_tokens - t0 : kTile) {
                case 1: tile<F, 1>(m, wg, a, t0, y, y_stride, g); break;
                case 2: tile<F, 2>(m, wg, a, t0, y, y_stride, g); break;
                case 3: tile<F, 3>(m, wg, a, t0, y, y_stride, g); break;
                default: tile<F, 4>(m, wg, a, t0, y, y_stride, g); break;
            }
        }
    }
}

}  // namespace

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

}  // namespace specula::kernels::SPECULA_NEON_NS
