// The AVX2 body of kernels/matmul.h (built with -mavx2 -mfma -mf16c, run only where the CPU has
// them). AVX2 has no vpdpbusd: `vpmaddubsw` (u8 x s8 -> pairs of s16) then `vpmaddwd` with ones
// (-> s32) take its place. Q8_0 uses the sign trick (|w| x sign(w) * a, so no pair can
// saturate s16) and needs no offset; Q4 nibbles are small enough to sum all 8 slices in s16, Q5_0's
// 5-bit weights 4, Q6_K's 6-bit ones 2 (its `vpmaddwd` takes the row's scale in place of the ones).
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
            __m256i q[4];
            // cvtps rounds to nearest-even under the default MXCSR, as nearbyint does in the generic body.
            for (int i = 0; i < 4; ++i) q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], id));
            // |q| <= 127, so the saturating packs are plain narrowing; they interleave 128-bit
            // lanes, which the final permutation undoes.
            const __m256i q8 = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
            _mm256_storeu_si256(reinterpret_cast<__m256i *>(a.q + t * a.k + b * kBlock),
                                _mm256_permutevar8x32_epi32(q8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
            // The halves' sums (columns 0-15 in the low 128-bit lane, 16-31 in the high one).
            const __m256i s8 = _mm256_add_epi32(_mm256_permute2x128_si256(q[0], q[2], 0x20), _mm256_permute2x128_si256(q[0], q[2], 0x31));
            const __m256i t8 = _mm256_add_epi32(_mm256_permute2x128_si256(q[1], q[3], 0x20), _mm256_permute2x128_si256(q[1], q[3], 0x31));
            const __m256i s4 = _mm256_add_epi32(s8, t8);
            const __m256i s2 = _mm256_add_epi32(s4, _mm256_shuffle_epi32(s4, 0x4e));
            const __m256i s1 = _mm256_add_epi32(s2, _mm256_shuffle_epi32(s2, 0xb1));
            const int32_t s_lo = _mm256_cvtsi256_si32(s1), s_hi = _mm256_extract_epi32(s1, 4);
            a.s[t * nb + b] = s_lo + s_hi;
            a.h32[2 * (t * nb + b)] = -32 * s_lo;
            a.h32[2 * (t * nb + b) + 1] = -32 * s_hi;
            a.d[t * nb + b] = d;
        }
    }
}

namespace {

// How far ahead of the block it reads a pass prefetches: 4 blocks, or 4 KB for the k-quants (14
// Q4_K blocks, about 10 of Q6_K), whose passes over Qwen2.5-Coder-1.5B's FFN matrices left a Zen 3
// core waiting on memory 4 blocks ahead (docs/runtime.md).
constexpr size_t prefetch_ahead(PackedFormat f) { return is_k_quant(f) ? 4096 : 4 * packed_block_bytes(f); }

// GCC 12 reassociates the integer sums below into trees that need all of a block's products at
// once, which spills them to the stack: an empty asm on each running sum keeps it a chain that
// accumulates as the products come.
inline void keep_in_register(__m256i & v) { __asm__(""
                                                    : "+x"(v)); }

inline __m256i broadcast4(const int8_t * p) {
    int32_t v;
    std::memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

// broadcast4 as one `vpbroadcastd` from memory (a load, no vector ALU op): GCC otherwise loads the
// 4 bytes into a general register, hoists them out of loops (spilling them) and broadcasts from
// there (vmovd + vpbroadcastd, two vector ops per use).
inline __m256i broadcast4_mem(const int8_t * p) {
    __m256i v;
    __asm__("vpbroadcastd %1, %0"
            : "=x"(v)
            : "m"(*reinterpret_cast<const int32_t *>(p)));
    return v;
}

// Bits 4-5 of Q6_K's unsigned weights for slice j: plane bits 2j..2j+1, moved into place (the
// 16-bit shifts leak bits across bytes only outside the mask).
inline __m256i q6_high_bits(__m256i plane, int j) {
    const __m256i mask = _mm256_set1_epi8(0x30);
    switch (j) {
        case 0: return _mm256_and_si256(_mm256_slli_epi16(plane, 4), mask);
        case 1: return _mm256_and_si256(_mm256_slli_epi16(plane, 2), mask);
        case 2: return _mm256_and_si256(plane, mask);
        default: return _mm256_and_si256(_mm256_srli_epi16(plane, 2), mask);
    }
}

// Q5_0's 5th bit of slice `bit` (0..7) as 0x10 where set.
inline __m256i q5_high_bit(__m256i plane, int bit) {
    const __m256i b = _mm256_set1_epi8(static_cast<char>(1u << bit));
    return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(plane, b), b), _mm256_set1_epi8(0x10));
}

// The exact integer dots of one block (matmul.h's isum before the offset correction) for NT
// tokens, rows 0-7 in [t][0] and 8-15 in [t][1]; Q6_K's are q6_k_half_isums'.
template <PackedFormat F, int NT>
inline void block_isums(const uint8_t * blk, const int8_t * const (&q)[NT], __m256i (&isum)[NT][2]) {
    const __m256i ones = _mm256_set1_epi16(1);
    const __m256i nibble = _mm256_set1_epi8(0x0f);
    auto load = [&](size_t at) { return _mm256_loadu_si256(reinterpret_cast<const __m256i *>(blk + at)); };
    if constexpr (F == PackedFormat::Q8_0) {
        for (int t = 0; t < NT; ++t) isum[t][0] = isum[t][1] = _mm256_setzero_si256();
        const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
        for (int j = 0; j < 8; ++j) {
            // Stored bytes are w + 128: flipping the top bit gives the signed weight back.
            const __m256i w0 = _mm256_xor_si256(load(64 * j), flip), w1 = _mm256_xor_si256(load(64 * j + 32), flip);
            const __m256i a0 = _mm256_abs_epi8(w0), a1 = _mm256_abs_epi8(w1);
            for (int t = 0; t < NT; ++t) {
                const __m256i x = broadcast4(q[t] + 4 * j);
                isum[t][0] = _mm256_add_epi32(isum[t][0], _mm256_madd_epi16(_mm256_maddubs_epi16(a0, _mm256_sign_epi8(x, w0)), ones));
                isum[t][1] = _mm256_add_epi32(isum[t][1], _mm256_madd_epi16(_mm256_maddubs_epi16(a1, _mm256_sign_epi8(x, w1)), ones));
                keep_in_register(isum[t][0]), keep_in_register(isum[t][1]);
            }
        }
    } else {
        // Q4_0/Q4_1/Q4_K: 8 slices x pairs of 15 * 127 stay below 2^15, exact in s16, so the sum
        // may take them in any order: each slice's bytes are loaded once for both nibbles. Q5_0's
        // 31 * 127 allows 4 slices: its low and high nibbles' sums widen separately.
        constexpr bool kQ5 = F == PackedFormat::Q5_0;
        __m256i planes[2];
        if constexpr (kQ5) planes[0] = load(256), planes[1] = load(288);
        __m256i p16[NT][2];
        for (int t = 0; t < NT; ++t) p16[t][0] = p16[t][1] = _mm256_setzero_si256();
        // Slice (v0: rows 0-7, v1: rows 8-15) against each token's 4 activations from column col.
        // always_inline: GCC 12 left it a call, and the tile ran a fifth slower.
        auto add_slice = [&](__m256i v0, __m256i v1, int col) __attribute__((always_inline)) {
            for (int t = 0; t < NT; ++t) {
                const __m256i x = broadcast4(q[t] + col);
                p16[t][0] = _mm256_add_epi16(p16[t][0], _mm256_maddubs_epi16(v0, x));
                p16[t][1] = _mm256_add_epi16(p16[t][1], _mm256_maddubs_epi16(v1, x));
                keep_in_register(p16[t][0]), keep_in_register(p16[t][1]);
            }
        };
        if constexpr (kQ5) {
            for (int t = 0; t < NT; ++t) isum[t][0] = isum[t][1] = _mm256_setzero_si256();
            for (int part = 0; part < 2; ++part) {
                for (int j = 0; j < 4; ++j) {
                    __m256i v0 = load(64 * j), v1 = load(64 * j + 32);
                    if (part == 1) v0 = _mm256_srli_epi16(v0, 4), v1 = _mm256_srli_epi16(v1, 4);
                    add_slice(_mm256_or_si256(_mm256_and_si256(v0, nibble), q5_high_bit(planes[0], 4 * part + j)),
                              _mm256_or_si256(_mm256_and_si256(v1, nibble), q5_high_bit(planes[1], 4 * part + j)), 16 * part + 4 * j);
                }
                for (int t = 0; t < NT; ++t) {
                    for (int h = 0; h < 2; ++h) {
                        isum[t][h] = _mm256_add_epi32(isum[t][h], _mm256_madd_epi16(p16[t][h], ones));
                        p16[t][h] = _mm256_setzero_si256();
                    }
                }
            }
        } else {
            for (int j = 0; j < 4; ++j) {
                const __m256i r0 = load(64 * j), r1 = load(64 * j + 32);
                add_slice(_mm256_and_si256(r0, nibble), _mm256_and_si256(r1, nibble), 4 * j);
                add_slice(_mm256_and_si256(_mm256_srli_epi16(r0, 4), nibble), _mm256_and_si256(_mm256_srli_epi16(r1, 4), nibble), 16 + 4 * j);
            }
        }
        if constexpr (!kQ5) {
            for (int t = 0; t < NT; ++t) isum[t][0] = _mm256_madd_epi16(p16[t][0], ones), isum[t][1] = _mm256_madd_epi16(p16[t][1], ones);
        }
    }
}

inline __m256 load_f16x8(const uint8_t * p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(p))); }
inline __m256 load_u8x8(const uint8_t * p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i *>(p))));
}

// One 16-row group (two 8-row halves in ymm) x NT tokens, all blocks. Each token's broadcast
// activations serve both halves; the per-block integer sums stay in registers, the float
// accumulators live in L1 (one load + FMA + store per block), which keeps 16 ymm enough for 4 tokens.
template <PackedFormat F, int NT>
void tile(const PackedMatrix & m, const uint8_t * wg, const QuantizedActivations & a, int t0, float * y, int64_t y_stride, int64_t g) {
    constexpr size_t kBytes = packed_block_bytes(F);
    const int64_t nb = m.n_blocks();
    const int64_t nbk = a.k / kBlock;

    alignas(32) float acc[NT][16] = {};
    const float * d[NT];
    const int32_t * s[NT];
    const float * ds[NT];
    for (int t = 0; t < NT; ++t) {
        d[t] = a.d + (t0 + t) * nbk;
        s[t] = a.s + (t0 + t) * nbk;
        ds[t] = a.ds + (t0 + t) * nbk;
    }

    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t * blk = wg + packed_block_offset(F, b);
        const uint8_t * tail = wg + packed_super_tail_offset(F, b);
        for (size_t line = 0; line < kBytes; line += 64) _mm_prefetch(reinterpret_cast<const char *>(blk + prefetch_ahead(F) + line), _MM_HINT_T0);
        const int8_t * q[NT];
        for (int t = 0; t < NT; ++t) q[t] = a.q + (t0 + t) * a.k + b * kBlock;
        __m256i isum[NT][2];
        block_isums<F, NT>(blk, q, isum);
        for (int h = 0; h < 2; ++h) {
            __m256 dw, mw = _mm256_setzero_ps();
            switch (F) {
                case PackedFormat::Q8_0: dw = load_f16x8(blk + 512 + 16 * h); break;
                case PackedFormat::Q5_0: dw = load_f16x8(blk + 320 + 16 * h); break;
                case PackedFormat::Q4_K:
                    dw = _mm256_mul_ps(load_f16x8(tail + 16 * h), load_u8x8(blk + 256 + 8 * h));
                    mw = _mm256_xor_ps(_mm256_mul_ps(load_f16x8(tail + 32 + 16 * h), load_u8x8(blk + 272 + 8 * h)), _mm256_set1_ps(-0.0f));
                    break;
                default:  // Q4_0, Q4_1
                    dw = load_f16x8(blk + 256 + 16 * h);
                    if (F == PackedFormat::Q4_1) mw = load_f16x8(blk + 288 + 16 * h);
                    break;
            }
            for (int t = 0; t < NT; ++t) {
                __m256i i32 = isum[t][h];
                if constexpr (F == PackedFormat::Q4_0) i32 = _mm256_sub_epi32(i32, _mm256_set1_epi32(8 * s[t][b]));
                if constexpr (F == PackedFormat::Q5_0) i32 = _mm256_sub_epi32(i32, _mm256_set1_epi32(16 * s[t][b]));
                __m256 r = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i32), _mm256_mul_ps(dw, _mm256_set1_ps(d[t][b])), _mm256_load_ps(acc[t] + 8 * h));
                if constexpr (F == PackedFormat::Q4_1 || F == PackedFormat::Q4_K) {
                    r = _mm256_fmadd_ps(mw, _mm256_broadcast_ss(ds[t] + b), r);
                }
                _mm256_store_ps(acc[t] + 8 * h, r);
            }
        }
    }
    const int64_t row0 = g * kGroupRows;
    const int64_t rows = m.n_rows - row0 < kGroupRows ? m.n_rows - row0 : kGroupRows;
    for (int t = 0; t < NT; ++t) std::memcpy(y + (t0 + t) * y_stride + row0, acc[t], sizeof(float) * rows);
}

// Q6_K's integer dots of one block for the 8 rows of half h (rows 8h..8h+7) and NT tokens, from
// the unsigned 6-bit weights u: sc0 * dot(u, q) over columns 0-15 + sc1 * the same over 16-31, plus
// -32 (sc0 S0 + sc1 S1), S the halves' activation sums (neg_s: -S0 and -S1 as s16 in every 32-bit
// lane), which is exactly matmul.h's sc0 * dot(u - 32, q) + sc1 * ... u <= 63 and |q| <= 127: a
// `vpmaddubsw` pair is at most 16002, so two slices sum in s16, and `vpmaddwd` against the row's
// scale (an s16 in both halves of its lane) widens and scales in one step. One half at a time
// keeps NT + 6 ymm live, so 8 tokens share each unpacked slice without spilling.
template <int NT>
inline void q6_k_half_isums(const uint8_t * blk, int h, const int8_t * const (&q)[NT], const __m256i * neg_s, __m256i (&isum)[NT]) {
    const __m256i nibble = _mm256_set1_epi8(0x0f);
    auto load = [&](size_t at) { return _mm256_loadu_si256(reinterpret_cast<const __m256i *>(blk + at)); };
    // Each row's s8 scale sign-extended to s32, its low s16 copied into the high one.
    const __m256i dup = _mm256_setr_epi8(0, 1, 0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12, 13, 12, 13,  //
                                         0, 1, 0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12, 13, 12, 13);
    __m256i sc[2];
    for (int part = 0; part < 2; ++part) {
        const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i *>(blk + 384 + 16 * part + 8 * h));
        sc[part] = _mm256_shuffle_epi8(_mm256_cvtepi8_epi32(b), dup);
    }
    // (sc0, sc1) per row against (-S0, -S1): the offset term over 32 (|S| <= 2032 fits s16).
    const __m256i sc01 = _mm256_blend_epi16(sc[0], sc[1], 0xaa);
    for (int t = 0; t < NT; ++t) isum[t] = _mm256_slli_epi32(_mm256_madd_epi16(sc01, neg_s[t]), 5);
    for (int part = 0; part < 2; ++part) {  // columns 0-15 (low nibbles), then 16-31 (high)
        const __m256i plane = load(256 + 64 * part + 32 * h);
        for (int pair = 0; pair < 2; ++pair) {  // slices 0-1, then 2-3
            __m256i w[2];
            for (int i = 0; i < 2; ++i) {
                const int j = 2 * pair + i;
                __m256i v = load(64 * j + 32 * h);
                if (part == 1) v = _mm256_srli_epi16(v, 4);
                w[i] = _mm256_or_si256(_mm256_and_si256(v, nibble), q6_high_bits(plane, j));
            }
            const int col = 16 * part + 8 * pair;
            for (int t = 0; t < NT; ++t) {
                const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(w[0], broadcast4_mem(q[t] + col)),
                                                   _mm256_maddubs_epi16(w[1], broadcast4_mem(q[t] + col + 4)));
                isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(p, sc[part]));
                keep_in_register(isum[t]);
            }
        }
    }
}

// tile for Q6_K: within each block one half (8 rows) at a time, for up to 8 tokens.
template <int NT>
__attribute__((noinline)) void q6_k_tile(const PackedMatrix & m, const uint8_t * wg, const QuantizedActivations & a, int t0, float * y,
                                         int64_t y_stride, int64_t g) {
    constexpr PackedFormat F = PackedFormat::Q6_K;
    constexpr size_t kBytes = packed_block_bytes(F);
    const int64_t nb = m.n_blocks();
    const int64_t nbk = a.k / kBlock;

    alignas(32) float acc[NT][16] = {};
    const float * d[NT];
    for (int t = 0; t < NT; ++t) d[t] = a.d + (t0 + t) * nbk;

    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t * blk = wg + packed_block_offset(F, b);
        const uint8_t * tail = wg + packed_super_tail_offset(F, b);
        for (size_t line = 0; line < kBytes; line += 64) _mm_prefetch(reinterpret_cast<const char *>(blk + prefetch_ahead(F) + line), _MM_HINT_T0);
        const int8_t * q[NT];
        for (int t = 0; t < NT; ++t) q[t] = a.q + (t0 + t) * a.k + b * kBlock;
        __m256i neg_s[NT];
        for (int t = 0; t < NT; ++t) {
            const int32_t * h32 = a.h32 + 2 * ((t0 + t) * nbk + b);  // -32 S: exact over 32
            const uint32_t pair = (static_cast<uint32_t>(h32[0] >> 5) & 0xffffu) | (static_cast<uint32_t>(h32[1] >> 5) << 16);
            neg_s[t] = _mm256_set1_epi32(static_cast<int32_t>(pair));
        }
        for (int h = 0; h < 2; ++h) {
            __m256i isum[NT];
            q6_k_half_isums<NT>(blk, h, q, neg_s, isum);
            const __m256 dw = load_f16x8(tail + 16 * h);
            for (int t = 0; t < NT; ++t) {
                const __m256 r = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t]), _mm256_mul_ps(dw, _mm256_set1_ps(d[t][b])), _mm256_load_ps(acc[t] + 8 * h));
                _mm256_store_ps(acc[t] + 8 * h, r);
            }
        }
    }
    const int64_t row0 = g * kGroupRows;
    const int64_t rows = m.n_rows - row0 < kGroupRows ? m.n_rows - row0 : kGroupRows;
    for (int t = 0; t < NT; ++t) std::memcpy(y + (t0 + t) * y_stride + row0, acc[t], sizeof(float) * rows);
}

// One pass of NT tokens over a group.
template <PackedFormat F, int NT>
inline void pass(const PackedMatrix & m, const uint8_t * wg, const QuantizedActivations & a, int t0, float * y, int64_t y_stride, int64_t g) {
    if constexpr (F == PackedFormat::Q6_K) q6_k_tile<NT>(m, wg, a, t0, y, y_stride, g);
    else if constexpr (NT <= 4) tile<F, NT>(m, wg, a, t0, y, y_stride, g);
}

template <PackedFormat F>
void groups(const PackedMatrix & m, const uint8_t * packed, const QuantizedActivations & a, float * y, int64_t y_stride,
            int64_t g_begin, int64_t g_end) {
    // Up to 4 tokens per pass (Q6_K 8: its tile keeps NT + 6 ymm live, the others 2 NT + a few);
    // more tokens make further passes over the group while its weights are in L1/L2, as even as
    // can be (5 tokens as 3 + 2, not 4 + 1: a one-token pass unpacks each weight block for a
    // single token).
    constexpr int kTile = F == PackedFormat::Q6_K ? 8 : 4;
    const int passes = (a.n_tokens + kTile - 1) / kTile;
    for (int64_t g = g_begin; g < g_end; ++g) {
        const uint8_t * wg = packed + g * m.group_bytes();
        for (int p = 0, t0 = 0; p < passes; ++p) {
            const int n = a.n_tokens / passes + (p < a.n_tokens % passes ? 1 : 0);
            const int first = t0;
            t0 += n;
            switch (n) {
                case 1: pass<F, 1>(m, wg, a, first, y, y_stride, g); break;
                case 2: pass<F, 2>(m, wg, a, first, y, y_stride, g); break;
                case 3: pass<F, 3>(m, wg, a, first, y, y_stride, g); break;
                case 4: pass<F, 4>(m, wg, a, first, y, y_stride, g); break;
                case 5: pass<F, 5>(m, wg, a, first, y, y_stride, g); break;
                case 6: pass<F, 6>(m, wg, a, first, y, y_stride, g); break;
                case 7: pass<F, 7>(m, wg, a, first, y, y_stride, g); break;
                default: pass<F, 8>(m, wg, a, first, y, y_stride, g); break;
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

namespace {

template <bool kBf16>
inline __m256 load8(const uint16_t * p) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i *>(p));
    if constexpr (kBf16) return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    return _mm256_cvtph_ps(h);
}

// The 16 lanes of matmul.h as two ymm (lanes 0-7, 8-15), reduced by the same halving tree.
inline float reduce16(__m256 lo, __m256 hi) {
    const __m256 s8 = _mm256_add_ps(lo, hi);                                                 // l + (l + 8)
    const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));  // l + (l + 4)
    const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));                                 // l + (l + 2)
    return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));                         // 0 + 1
}

template <bool kBf16, int NT>
void float_row(const uint16_t * w, int64_t k, const float * x, int64_t x_stride, int t0, float * y, int64_t y_stride, int64_t row) {
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
    for (int t = 0; t < NT; ++t) y[(t0 + t) * y_stride + row] = reduce16(lo[t], hi[t]);
}

template <bool kBf16>
void float_rows(const PackedMatrix & m, const uint8_t * packed, const float * x, int64_t x_stride, int n_tokens, float * y,
                int64_t y_stride, int64_t g_begin, int64_t g_end) {
    constexpr int kTile = 4;  // 2 ymm per token + 2 for the weights: 10 of 16 registers
    for (int64_t row = g_begin * kGroupRows; row < g_end * kGroupRows && row < m.n_rows; ++row) {
        const auto * w = reinterpret_cast<const uint16_t *>(packed + (row / kGroupRows) * m.group_bytes()) + (row % kGroupRows) * m.k;
        for (int t0 = 0; t0 < n_tokens; t0 += kTile) {
            switch (n_tokens - t0 < kTile ? n_tokens - t0 : kTile) {
                case 1: float_row<kBf16, 1>(w, m.k, x, x_stride, t0, y, y_stride, row); break;
                case 2: float_row<kBf16, 2>(w, m.k, x, x_stride, t0, y, y_stride, row); break;
                case 3: float_row<kBf16, 3>(w, m.k, x, x_stride, t0, y, y_stride, row); break;
                default: float_row<kBf16, 4>(w, m.k, x, x_stride, t0, y, y_stride, row); break;
            }
        }
    }
}

}  // namespace

void matmul_float(const PackedMatrix & m, const uint8_t * packed, const float * x, int64_t x_stride, int n_tokens,
                  float * y, int64_t y_stride, int64_t g_begin, int64_t g_end) {
    if (m.format == PackedFormat::BF16) float_rows<true>(m, packed, x, x_stride, n_tokens, y, y_stride, g_begin, g_end);
    else float_rows<false>(m, packed, x, x_stride, n_tokens, y, y_stride, g_begin, g_end);
}

}  // namespace specula::kernels::avx2
