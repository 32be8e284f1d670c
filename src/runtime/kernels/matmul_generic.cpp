// The portable body of kernels/matmul.h: the reference order, one scalar step at a time.
#include <cmath>
#include <cstring>

#include "ggml.h"
#include "runtime/kernels/matmul_impl.h"

namespace specula::kernels::generic {

void quantize_activations(const float * x, int64_t x_stride, QuantizedActivations & a) {
    const int64_t nb = a.k / kBlock;
    for (int t = 0; t < a.n_tokens; ++t) {
        const float * xr = x + t * x_stride;
        for (int64_t b = 0; b < nb; ++b) {
            float amax = 0.0f;
            for (int c = 0; c < kBlock; ++c) amax = std::fmax(amax, std::fabs(xr[b * kBlock + c]));
            const float d = amax / 127.0f;
            const float id = d != 0.0f ? 1.0f / d : 0.0f;
            int32_t sum = 0;
            for (int c = 0; c < kBlock; ++c) {
                const int8_t q = static_cast<int8_t>(std::nearbyint(xr[b * kBlock + c] * id));
                a.q[t * a.k + b * kBlock + c] = q;
                sum += q;
            }
            a.d[t * nb + b] = d;
            a.s[t * nb + b] = sum;
        }
    }
}

void matmul(const PackedMatrix & m, const uint8_t * packed, const QuantizedActivations & a, float * y,
            int64_t g_begin, int64_t g_end) {
    const int64_t nb = m.n_blocks();
    const size_t block_bytes = packed_block_bytes(m.format);
    const bool q8 = m.format == PackedFormat::Q8_0;
    const int32_t offset = q8 ? 128 : m.format == PackedFormat::Q4_0 ? 8 : 0;
    const size_t scales_at = q8 ? 512 : 256;
    for (int64_t g = g_begin; g < g_end; ++g) {
        const uint8_t * wg = packed + g * m.group_bytes();
        for (int r = 0; r < kGroupRows; ++r) {
            const int64_t row = g * kGroupRows + r;
            if (row >= m.n_rows) break;
            for (int t = 0; t < a.n_tokens; ++t) {
                float acc = 0.0f;
                for (int64_t b = 0; b < nb; ++b) {
                    const uint8_t * blk = wg + b * block_bytes;
                    const int8_t * q = a.q + t * a.k + b * kBlock;
                    int32_t isum = 0;
                    for (int c = 0; c < kBlock; ++c) {
                        int32_t u;
                        if (q8) {
                            u = blk[(c / 4) * 64 + 4 * r + c % 4];
                        } else {
                            const uint8_t byte = blk[((c % 16) / 4) * 64 + 4 * r + c % 4];
                            u = c < 16 ? (byte & 0x0f) : (byte >> 4);
                        }
                        isum += u * q[c];
                    }
                    const int32_t s = a.s[t * nb + b];
                    isum -= offset * s;
                    uint16_t dh;
                    std::memcpy(&dh, blk + scales_at + 2 * r, 2);
                    const float da = a.d[t * nb + b];
                    acc = std::fma(static_cast<float>(isum), ggml_fp16_to_fp32(dh) * da, acc);
                    if (m.format == PackedFormat::Q4_1) {
                        uint16_t mh;
                        std::memcpy(&mh, blk + 288 + 2 * r, 2);
                        acc = std::fma(ggml_fp16_to_fp32(mh), da * static_cast<float>(s), acc);
                    }
                }
                y[t * m.n_rows + row] = acc;
            }
        }
    }
}

void matmul_float(const PackedMatrix & m, const uint8_t * packed, const float * x, int64_t x_stride, int n_tokens,
                  float * y, int64_t g_begin, int64_t g_end) {
    const bool bf16 = m.format == PackedFormat::BF16;
    for (int64_t row = g_begin * kGroupRows; row < g_end * kGroupRows && row < m.n_rows; ++row) {
        const auto * w = reinterpret_cast<const uint16_t *>(packed + (row / kGroupRows) * m.group_bytes()) + (row % kGroupRows) * m.k;
        for (int t = 0; t < n_tokens; ++t) {
            const float * xt = x + t * x_stride;
            float lane[16] = {};
            for (int64_t k = 0; k < m.k; k += 16) {
                for (int l = 0; l < 16; ++l) {
                    lane[l] = std::fma(bf16 ? ggml_bf16_to_fp32(ggml_bf16_t{w[k + l]}) : ggml_fp16_to_fp32(w[k + l]), xt[k + l], lane[l]);
                }
            }
            for (int width = 8; width >= 1; width /= 2) {
                for (int l = 0; l < width; ++l) lane[l] = lane[l] + lane[l + width];
            }
            y[t * m.n_rows + row] = lane[0];
        }
    }
}

}  // namespace specula::kernels::generic
