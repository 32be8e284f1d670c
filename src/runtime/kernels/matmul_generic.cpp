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

namespace {

float f16(const uint8_t * p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return ggml_fp16_to_fp32(h);
}

// The stored unsigned integer of column c of row r in a block (packed_matrix.h).
int32_t weight_u(PackedFormat f, const uint8_t * blk, int r, int c) {
    if (f == PackedFormat::Q8_0) return blk[(c / 4) * 64 + 4 * r + c % 4];
    const uint8_t byte = blk[((c % 16) / 4) * 64 + 4 * r + c % 4];
    int32_t u = c < 16 ? (byte & 0x0f) : (byte >> 4);
    if (f == PackedFormat::Q5_0) u |= ((blk[256 + 4 * r + c % 4] >> (c / 4)) & 1) << 4;
    if (f == PackedFormat::Q6_K) u |= ((blk[256 + 64 * (c / 16) + 4 * r + c % 4] >> (2 * ((c % 16) / 4))) & 3) << 4;
    return u;
}

}  // namespace

void matmul(const PackedMatrix & m, const uint8_t * packed, const QuantizedActivations & a, float * y,
            int64_t y_stride, int64_t g_begin, int64_t g_end) {
    const PackedFormat f = m.format;
    const int64_t nb = m.n_blocks();
    for (int64_t g = g_begin; g < g_end; ++g) {
        const uint8_t * wg = packed + g * m.group_bytes();
        for (int r = 0; r < kGroupRows; ++r) {
            const int64_t row = g * kGroupRows + r;
            if (row >= m.n_rows) break;
            for (int t = 0; t < a.n_tokens; ++t) {
                float acc = 0.0f;
                for (int64_t b = 0; b < nb; ++b) {
                    const uint8_t * blk = wg + packed_block_offset(f, b);
                    const uint8_t * tail = wg + packed_super_tail_offset(f, b);
                    const int8_t * q = a.q + t * a.k + b * kBlock;
                    const int32_t s = a.s[t * nb + b];
                    const float da = a.d[t * nb + b];
                    int32_t isum = 0;
                    float dw = 0.0f, mw = 0.0f;
                    switch (f) {
                        case PackedFormat::Q6_K: {
                            int32_t half[2] = {0, 0};
                            for (int c = 0; c < kBlock; ++c) half[c / 16] += (weight_u(f, blk, r, c) - 32) * q[c];
                            isum = half[0] * static_cast<int8_t>(blk[384 + r]) + half[1] * static_cast<int8_t>(blk[400 + r]);
                            dw = f16(tail + 2 * r);
                            break;
                        }
                        default: {
                            for (int c = 0; c < kBlock; ++c) isum += weight_u(f, blk, r, c) * q[c];
                            break;
                        }
                    }
                    switch (f) {
                        case PackedFormat::Q8_0: isum -= 128 * s, dw = f16(blk + 512 + 2 * r); break;
                        case PackedFormat::Q4_0: isum -= 8 * s, dw = f16(blk + 256 + 2 * r); break;
                        case PackedFormat::Q5_0: isum -= 16 * s, dw = f16(blk + 320 + 2 * r); break;
                        case PackedFormat::Q4_1: dw = f16(blk + 256 + 2 * r), mw = f16(blk + 288 + 2 * r); break;
                        case PackedFormat::Q4_K:
                            dw = f16(tail + 2 * r) * static_cast<float>(blk[256 + r]);
                            mw = -(f16(tail + 32 + 2 * r) * static_cast<float>(blk[272 + r]));
                            break;
                        default: break;
                    }
                    acc = std::fma(static_cast<float>(isum), dw * da, acc);
                    if (f == PackedFormat::Q4_1 || f == PackedFormat::Q4_K) acc = std::fma(mw, da * static_cast<float>(s), acc);
                }
                y[t * y_stride + row] = acc;
            }
        }
    }
}

void matmul_float(const PackedMatrix & m, const uint8_t * packed, const float * x, int64_t x_stride, int n_tokens,
                  float * y, int64_t y_stride, int64_t g_begin, int64_t g_end) {
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
            y[t * y_stride + row] = lane[0];
        }
    }
}

}  // namespace specula::kernels::generic
