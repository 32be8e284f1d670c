#include "runtime/kernels/matmul.h"

#include <vector>

#if defined(SPECULA_X86_KERNELS)
#include <cpuid.h>
#endif

#include "specula/error.h"
#include "ggml.h"
#include "runtime/kernels/matmul_impl.h"

namespace specula::kernels {

#if defined(SPECULA_X86_KERNELS)
namespace {

// AVX2 + FMA + F16C, and the OS saving YMM state, read from cpuid directly (compilers disagree on
// which names __builtin_cpu_supports knows: clang 14 has no "f16c").
bool cpu_has_avx2_fma_f16c() {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return false;
    const bool fma = c & (1u << 12), osxsave = c & (1u << 27), f16c = c & (1u << 29), avx = c & (1u << 28);
    if (!(fma && osxsave && f16c && avx)) return false;
    unsigned lo = 0, hi = 0;
    __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & 0x6) != 0x6) return false;  // XMM and YMM state enabled by the OS
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    return b & (1u << 5);  // AVX2
}

// AVX-512 F + BW + VNNI, and the OS saving opmask and ZMM state.
bool cpu_has_avx512_vnni() {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    const bool f = b & (1u << 16), bw = b & (1u << 30), vnni = c & (1u << 11);
    if (!(f && bw && vnni)) return false;
    unsigned lo = 0, hi = 0;
    __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return (lo & 0xe6) == 0xe6;  // XMM, YMM, opmask, ZMM 0-15 upper halves, ZMM 16-31
}

}  // namespace
#endif

CpuPath detected_cpu_path() {
    static const CpuPath path = [] {
#if defined(SPECULA_X86_KERNELS)
        if (!cpu_has_avx2_fma_f16c()) return CpuPath::Generic;
        return cpu_has_avx512_vnni() ? CpuPath::Avx512Vnni : CpuPath::Avx2;
#else
        return CpuPath::Generic;
#endif
    }();
    return path;
}

const char * cpu_path_name(CpuPath path) {
    switch (path) {
        case CpuPath::Avx2: return "avx2";
        case CpuPath::Avx512Vnni: return "avx512vnni";
        case CpuPath::Generic: return "generic";
    }
    return "?";
}

namespace {

// Per-thread activation scratch: each thread quantizes the (few) activation rows itself, which
// costs far less than a barrier would, and keeps threads independent.
struct Scratch {
    std::vector<int8_t> q;
    std::vector<float> d;
    std::vector<int32_t> s;
    QuantizedActivations view(int n_tokens, int64_t k) {
        q.resize(static_cast<size_t>(n_tokens) * k);
        d.resize(static_cast<size_t>(n_tokens) * (k / kBlock));
        s.resize(d.size());
        return QuantizedActivations{n_tokens, k, q.data(), d.data(), s.data()};
    }
};

void run(CpuPath path, const PackedMatrix & m, const uint8_t * packed, const float * x, int64_t x_stride, int n_tokens,
         float * y, int64_t g_begin, int64_t g_end) {
    if (m.is_float()) {
#if defined(SPECULA_X86_KERNELS)
        if (path != CpuPath::Generic) return avx2::matmul_float(m, packed, x, x_stride, n_tokens, y, g_begin, g_end);
#endif
        return generic::matmul_float(m, packed, x, x_stride, n_tokens, y, g_begin, g_end);
    }
    thread_local Scratch scratch;
    QuantizedActivations a = scratch.view(n_tokens, m.k);
#if defined(SPECULA_X86_KERNELS)
    if (path != CpuPath::Generic) {
        if (path == CpuPath::Avx512Vnni) avx512::quantize_activations(x, x_stride, a);
        else avx2::quantize_activations(x, x_stride, a);
        if (path == CpuPath::Avx512Vnni && avx512::has_body(m.format)) avx512::matmul(m, packed, a, y, g_begin, g_end);
        else avx2::matmul(m, packed, a, y, g_begin, g_end);
        return;
    }
#endif
    {
        generic::quantize_activations(x, x_stride, a);
        generic::matmul(m, packed, a, y, g_begin, g_end);
    }
}

void matmul_op(ggml_tensor * dst, int ith, int nth, void * userdata) {
    const auto & m = *static_cast<const PackedMatrix *>(userdata);
    const ggml_tensor * w = dst->src[0];
    const ggml_tensor * x = dst->src[1];
    // Threads take contiguous runs of row groups and never split K: the split changes nothing
    // in any output element.
    const int64_t n_groups = m.n_groups();
    const int64_t g_begin = n_groups * ith / nth, g_end = n_groups * (ith + 1) / nth;
    if (g_begin == g_end) return;
    run(detected_cpu_path(), m, static_cast<const uint8_t *>(w->data), static_cast<const float *>(x->data),
        static_cast<int64_t>(x->nb[1] / sizeof(float)), static_cast<int>(ggml_nrows(x)), static_cast<float *>(dst->data),
        g_begin, g_end);
}

}  // namespace

void matmul_groups(CpuPath path, const PackedMatrix & m, const uint8_t * packed, const float * x, int64_t x_stride,
                   int n_tokens, float * y, int64_t g_begin, int64_t g_end) {
    run(path, m, packed, x, x_stride, n_tokens, y, g_begin, g_end);
}

ggml_tensor * packed_matmul(ggml_context * ctx, ggml_tensor * w, ggml_tensor * x) {
    const PackedMatrix * m = packed_matrix_of(w);
    if (!m) throw Error("packed_matmul: weight is not packed");
    if (x->type != GGML_TYPE_F32 || x->ne[0] != m->k) throw Error("packed_matmul: activations must be F32 rows of the weight's width");
    // Rows must sit at a fixed stride: flatten anything else into a contiguous copy first.
    if (x->nb[0] != sizeof(float) || (x->ne[2] * x->ne[3] > 1 && !ggml_is_contiguous(x))) x = ggml_cont(ctx, x);
    ggml_tensor * args[2] = {w, x};
    return ggml_custom_4d(ctx, GGML_TYPE_F32, m->n_rows, x->ne[1], x->ne[2], x->ne[3], args, 2, matmul_op, GGML_N_TASKS_MAX,
                          const_cast<PackedMatrix *>(m));
}

}  // namespace specula::kernels
