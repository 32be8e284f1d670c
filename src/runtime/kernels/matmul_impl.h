#pragma once
// Per-instruction-set bodies of kernels/matmul.h; internal to the kernels.
#include <cstdint>

#include "runtime/kernels/matmul.h"
#include "runtime/kernels/packed_matrix.h"

namespace specula::kernels {

// Activations quantized per 32-block: q [n_tokens, k], d, s and ds [n_tokens, k / 32], where
// ds = d * float(s) is the factor of the Q4_1/Q4_K min term (matmul.h), computed once per block
// rather than once per block and row group. The AVX-512 and AVX2 quantizations also write h32
// [n_tokens, k / 16], -32 x the sum of q over each 16-column half block: their Q6_K bodies take
// the dots of the unsigned weights u and add h32 (scaled), so that they end as dot(u - 32, q).
// The bodies write token t's output row r at y[t * y_stride + r].
struct QuantizedActivations {
    int n_tokens = 0;
    int64_t k = 0;
    int8_t * q = nullptr;
    float * d = nullptr;
    int32_t * s = nullptr;
    float * ds = nullptr;
    int32_t * h32 = nullptr;
};

// The given path's bodies (one the CPU can run), as the op runs them. with_min_factor: some
// weight is Q4_1 or Q4_K, whose bodies read ds. matmul_on: row groups [g_begin, g_end) of one
// matrix; integer formats read `a`, float formats x itself.
void quantize_activations_on(CpuPath path, const float * x, int64_t x_stride, QuantizedActivations & a, bool with_min_factor);
void matmul_on(CpuPath path, const PackedMatrix & m, const uint8_t * packed, const float * x, int64_t x_stride,
               const QuantizedActivations & a, float * y, int64_t y_stride, int64_t g_begin, int64_t g_end);

#define SPECULA_KERNEL_DECLS                                                                                           \
    void quantize_activations(const float * x, int64_t x_stride, QuantizedActivations & a);                            \
    void matmul(const PackedMatrix & m, const uint8_t * packed, const QuantizedActivations & a, float * y,             \
                int64_t y_stride, int64_t g_begin, int64_t g_end);                                                     \
    void matmul_float(const PackedMatrix & m, const uint8_t * packed, const float * x, int64_t x_stride, int n_tokens, \
                      float * y, int64_t y_stride, int64_t g_begin, int64_t g_end);

namespace generic {
SPECULA_KERNEL_DECLS
}
namespace avx2 {
SPECULA_KERNEL_DECLS
}
namespace neon_dotprod {
SPECULA_KERNEL_DECLS
}
#undef SPECULA_KERNEL_DECLS

// NEON with i8mm: the integer formats (the rest is neon_dotprod's).
namespace neon_i8mm {
void matmul(const PackedMatrix & m, const uint8_t * packed, const QuantizedActivations & a, float * y, int64_t y_stride,
            int64_t g_begin, int64_t g_end);
}  // namespace neon_i8mm

// AVX-512 VNNI: every format.
namespace avx512 {
void quantize_activations(const float * x, int64_t x_stride, QuantizedActivations & a);
void matmul(const PackedMatrix & m, const uint8_t * packed, const QuantizedActivations & a, float * y, int64_t y_stride,
            int64_t g_begin, int64_t g_end);
void matmul_float(const PackedMatrix & m, const uint8_t * packed, const float * x, int64_t x_stride, int n_tokens, float * y,
                  int64_t y_stride, int64_t g_begin, int64_t g_end);
}  // namespace avx512

}  // namespace specula::kernels
