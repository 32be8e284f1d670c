// kernels/matmul.h on NEON with the ARMv8.2 dot product: the integer formats with `sdot`
// (matmul_neon_body.h), the activations' quantization, and the F16/BF16 rows with FMA lanes.
#define SPECULA_NEON_NS neon_dotprod
#include "runtime/kernels/matmul_neon_body.h"

namespace specula::kernels::neon_dotprod {

void quantize_activations(const float * x, int64_t x_stride, QuantizedActivations & a) {
    const int64_t nb = a.k / kBlock;
    for (int t = 0; t < a.n_tokens; ++t) {
        const float * xr = x + t * x_stride;
        for (int64_t b = 0; b < nb; ++b) {
            float32x4_t v[8], m = vdupq_n_f32(0.0f);
            for (int i = 0; i < 8; ++i) {
                v[i] = vld1q_f32(xr + b * kBlock + 4 * i);
                m = vmaxnmq_f32(m, vabsq_f32(v[i]));  // fmax's semantics; max is exact in any order
            }
            const float d = vmaxnmvq_f32(m) / 127.0f;
            const float id = d != 0.0f ? 1.0f / d : 0.0f;
            int32x4_t sum = vdupq_n_s32(0);
            int16x4_t q16[8];
            for (int i = 0; i < 8; ++i) {
                const int32x4_t q = vcvtnq_s32_f32(vmulq_n_f32(v[i], id));  // nearest-even, as nearbyint
                sum = vaddq_s32(sum, q);
                q16[i] = vmovn_s32(q);
            }
            for (int i = 0; i < 4; ++i) vst1_s8(a.q + t * a.k + b * kBlock + 8 * i, vmovn_s16(vcombine_s16(q16[2 * i], q16[2 * i + 1])));
            a.d[t * nb + b] = d;
            a.s[t * nb + b] = vaddvq_s32(sum);
        }
    }
}

namespace {

template <bool kBf16>
inline float32x4_t load4(const uint16_t * p) {
    const uint16x4_t h = vld1_u16(p);
    if constexpr (kBf16) return vreinterpretq_f32_u32(vshll_n_u16(h, 16));
    return vcvt_f32_f16(vreinterpret_f16_u16(h));
}

// matmul.h's 16 lanes as four vectors (lanes 0-3, 4-7, 8-11, 12-15), reduced by its halving tree.
inline float reduce16(const float32x4_t (&v)[4]) {
    const float32x4_t s4 = vaddq_f32(vaddq_f32(v[0], v[2]), vaddq_f32(v[1], v[3]));  // (l + (l + 8)) + (l + 4 + (l + 12))
    const float32x2_t s2 = vadd_f32(vget_low_f32(s4), vget_high_f32(s4));            // l + (l + 2)
    return vget_lane_f32(s2, 0) + vget_lane_f32(s2, 1);                              // 0 + 1
}

template <bool kBf16, int NT>
void float_row(const uint16_t * w, int64_t k, const float * x, int64_t x_stride, int t0, float * y, int64_t y_stride, int64_t row) {
    float32x4_t lanes[NT][4];
    for (auto & t : lanes) {
        for (auto & l : t) l = vdupq_n_f32(0.0f);
    }
    for (int64_t c = 0; c < k; c += 16) {
        const float32x4_t wv[4] = {load4<kBf16>(w + c), load4<kBf16>(w + c + 4), load4<kBf16>(w + c + 8), load4<kBf16>(w + c + 12)};
        for (int t = 0; t < NT; ++t) {
            const float * xt = x + (t0 + t) * x_stride + c;
            for (int i = 0; i < 4; ++i) lanes[t][i] = vfmaq_f32(lanes[t][i], wv[i], vld1q_f32(xt + 4 * i));
        }
    }
    for (int t = 0; t < NT; ++t) y[(t0 + t) * y_stride + row] = reduce16(lanes[t]);
}

template <bool kBf16>
void float_rows(const PackedMatrix & m, const uint8_t * packed, const float * x, int64_t x_stride, int n_tokens, float * y,
                int64_t y_stride, int64_t g_begin, int64_t g_end) {
    constexpr int kTile = 4;  // 4 vectors per token + 4 for the weights: 20 of 32 registers
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

}  // namespace specula::kernels::neon_dotprod
