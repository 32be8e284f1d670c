#pragma once
// specula's CPU matmul for a few activation rows (1..16 verify tokens) against a packed weight
// (kernels/packed_matrix.h): each weight block is read once for all rows, and every output
// element is computed in one fixed order, so that row i's result is bit-identical whether it is
// computed alone or in a batch, with any thread count. That order, for output (row r, token t):
//   activations: per 32-block b, d = max|x| / 127, q = nearest-even(x * (1/d)), s = sum q
//   isum = exact integer dot of the block's stored integers u (packed_matrix.h) with q,
//          offset-corrected: Q8_0 - 128 s, Q4_0 - 8 s, Q5_0 - 16 s; Q6_K: sc0 * dot(u - 32, q)
//          over columns 0-15 + sc1 * the same over columns 16-31
//   dw   = the block's F16 scale; Q4_K: D * float(sc) (exact); Q6_K: D
//   acc  = fma(float(isum), dw[r,b] * d[t,b], acc)         for b = 0, 1, ... in order
//   Q4_1 and Q4_K add acc = fma(mw[r,b], d[t,b] * float(s[t,b]), acc) after each block's first
//   fma, mw = the F16 min (Q4_1) or -(Dmin * float(mn)) (Q4_K, exact)
// F16 and BF16 weights meet the F32 activations as they are: 16 lane sums,
//   lane[l] = fma(w[k + l], x[k + l], lane[l])                for k = 0, 16, 32, ... in order
// then a fixed halving tree (lane[l] += lane[l + w] for w = 8, 4, 2, 1); the result is lane[0].
// The AVX-512 VNNI, AVX2, NEON (dot-product and int8 matrix-multiply) and portable paths follow
// it to the bit.
#include <cstdint>
#include <span>

#include "runtime/kernels/packed_matrix.h"

struct ggml_context;
struct ggml_tensor;

namespace specula::kernels {

// The instruction sets specula's kernels have bodies for. x86-64: AVX2 (+FMA, F16C), then
// AVX-512 F/BW + VNNI. ARM64: NEON with the ARMv8.2 dot product (`sdot`), then with the int8
// matrix multiply (`smmla`, i8mm) too. Generic is the portable C++ reference.
enum class CpuPath {
    Generic,
    Avx2,
    Avx512Vnni,
    NeonDotprod,
    NeonI8mm
};
// The path the kernels run: the fastest this CPU has, or the one SPECULA_CPU_PATH names (a path
// the CPU can run; check_cpu_path_override() reports any other value).
CpuPath detected_cpu_path();
bool cpu_can_run(CpuPath path);
const char * cpu_path_name(CpuPath path);
// Throws Error when SPECULA_CPU_PATH is set to something other than a path this CPU can run.
void check_cpu_path_override();

// y = W x as a ggml custom op: w packed ([K, N] logically), x F32 [K, B] -> F32 [N, B].
ggml_tensor * packed_matmul(ggml_context * ctx, ggml_tensor * w, ggml_tensor * x);
// Several packed weights of the same K applied to x as one op (one node, one quantization of x):
// their outputs stacked row-wise, F32 [N0 + N1 + ..., B]; each element has the bits W_i x gives.
ggml_tensor * packed_matmul(ggml_context * ctx, std::span<ggml_tensor * const> ws, ggml_tensor * x);

// The op's arithmetic, callable directly (tests, benchmarks): rows of groups [g_begin, g_end)
// for all n_tokens columns of x (row stride x_stride floats); y is [n_tokens, m.n_rows].
void matmul_groups(CpuPath path, const PackedMatrix & m, const uint8_t * packed, const float * x, int64_t x_stride,
                   int n_tokens, float * y, int64_t g_begin, int64_t g_end);

}  // namespace specula::kernels
