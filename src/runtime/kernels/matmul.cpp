#include "runtime/kernels/matmul.h"

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#if defined(SPECULA_X86_KERNELS)
#include <cpuid.h>
#endif
#if defined(SPECULA_ARM64_KERNELS)
#include <asm/hwcap.h>
#include <sys/auxv.h>
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
    __asm__("xgetbv"
            : "=a"(lo), "=d"(hi)
            : "c"(0));
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
    __asm__("xgetbv"
            : "=a"(lo), "=d"(hi)
            : "c"(0));
    return (lo & 0xe6) == 0xe6;  // XMM, YMM, opmask, ZMM 0-15 upper halves, ZMM 16-31
}

}  // namespace
#endif

#if defined(SPECULA_ARM64_KERNELS)
namespace {

// The kernel reads these from the CPU's ID registers for every process (Linux's hwcaps).
bool cpu_has_dotprod() { return getauxval(AT_HWCAP) & HWCAP_ASIMDDP; }
bool cpu_has_i8mm() { return getauxval(AT_HWCAP2) & HWCAP2_I8MM; }

}  // namespace
#endif

namespace {

CpuPath fastest_cpu_path() {
#if defined(SPECULA_X86_KERNELS)
    if (!cpu_has_avx2_fma_f16c()) return CpuPath::Generic;
    return cpu_has_avx512_vnni() ? CpuPath::Avx512Vnni : CpuPath::Avx2;
#elif defined(SPECULA_ARM64_KERNELS)
    if (!cpu_has_dotprod()) return CpuPath::Generic;
    return cpu_has_i8mm() ? CpuPath::NeonI8mm : CpuPath::NeonDotprod;
#else
    return CpuPath::Generic;
#endif
}

constexpr CpuPath kAllPaths[] = {CpuPath::Generic, CpuPath::Avx2, CpuPath::Avx512Vnni, CpuPath::NeonDotprod, CpuPath::NeonI8mm};

// SPECULA_CPU_PATH's path, when it names one this CPU can run.
bool override_path(CpuPath * path, std::string * value) {
    const char * env = std::getenv("SPECULA_CPU_PATH");
    if (!env) return false;
    if (value) *value = env;
    for (CpuPath p : kAllPaths) {
        if (cpu_path_name(p) == std::string(env) && cpu_can_run(p)) {
            *path = p;
            return true;
        }
    }
    return false;
}

}  // namespace

bool cpu_can_run(CpuPath path) {
    static const CpuPath fastest = fastest_cpu_path();
    switch (path) {
        case CpuPath::Generic: return true;
        case CpuPath::Avx2: return fastest == CpuPath::Avx2 || fastest == CpuPath::Avx512Vnni;
        case CpuPath::Avx512Vnni: return fastest == CpuPath::Avx512Vnni;
        case CpuPath::NeonDotprod: return fastest == CpuPath::NeonDotprod || fastest == CpuPath::NeonI8mm;
        case CpuPath::NeonI8mm: return fastest == CpuPath::NeonI8mm;
    }
    return false;
}

CpuPath detected_cpu_path() {
    static const CpuPath path = [] {
        CpuPath p = CpuPath::Generic;
        return override_path(&p, nullptr) ? p : fastest_cpu_path();
    }();
    return path;
}

void check_cpu_path_override() {
    CpuPath p;
    std::string value;
    if (!std::getenv("SPECULA_CPU_PATH") || override_path(&p, &value)) return;
    std::string runnable;
    for (CpuPath q : kAllPaths) {
        if (cpu_can_run(q)) runnable += std::string(runnable.empty() ? "" : ", ") + cpu_path_name(q);
    }
    throw Error("SPECULA_CPU_PATH=" + value + ": not a kernel path this CPU runs (" + runnable + ")");
}

const char * cpu_path_name(CpuPath path) {
    switch (path) {
        case CpuPath::Avx2: return "avx2";
        case CpuPath::Avx512Vnni: return "avx512vnni";
        case CpuPath::NeonDotprod: return "neon-dotprod";
        case CpuPath::NeonI8mm: return "neon-i8mm";
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
    std::vector<float> ds;
    std::vector<int32_t> h32;
    QuantizedActivations view(int n_tokens, int64_t k) {
        q.resize(static_cast<size_t>(n_tokens) * k);
        d.resize(static_cast<size_t>(n_tokens) * (k / kBlock));
        s.resize(d.size());
        ds.resize(d.size());
        h32.resize(2 * d.size());
        return QuantizedActivations{n_tokens, k, q.data(), d.data(), s.data(), ds.data(), h32.data()};
    }
};

// dst = the weights' outputs stacked row-wise (src[0..n_w) the weights, src[n_w] the activations).
// Threads take contiguous runs of the stacked row groups and never split K: the split changes
// nothing in any output element. Each thread quantizes the (few) activation rows itself, once for
// all the weights, which costs far less than a barrier would.
void matmul_op(ggml_tensor * dst, int ith, int nth, void * /*userdata*/) {
    int n_w = 0;
    while (n_w + 1 < GGML_MAX_SRC && dst->src[n_w + 1]) ++n_w;
    const ggml_tensor * x = dst->src[n_w];
    int64_t total_groups = 0;
    bool any_integer = false, with_min_factor = false;
    for (int i = 0; i < n_w; ++i) {
        const PackedMatrix & m = *packed_matrix_of(dst->src[i]);
        total_groups += m.n_groups();
        any_integer = any_integer || !m.is_float();
        with_min_factor = with_min_factor || has_min_term(m.format);
    }
    const int64_t begin = total_groups * ith / nth, end = total_groups * (ith + 1) / nth;
    if (begin == end) return;

    const CpuPath path = detected_cpu_path();
    const auto * xd = static_cast<const float *>(x->data);
    const int64_t x_stride = static_cast<int64_t>(x->nb[1] / sizeof(float));
    const int n_tokens = static_cast<int>(ggml_nrows(x));
    thread_local Scratch scratch;
    QuantizedActivations a = scratch.view(n_tokens, x->ne[0]);
    if (any_integer) quantize_activations_on(path, xd, x_stride, a, with_min_factor);

    auto * y = static_cast<float *>(dst->data);
    const int64_t y_stride = dst->ne[0];
    int64_t g0 = 0, row0 = 0;
    for (int i = 0; i < n_w && g0 < end; ++i) {
        const PackedMatrix & m = *packed_matrix_of(dst->src[i]);
        const int64_t lo = std::max(begin, g0) - g0, hi = std::min(end, g0 + m.n_groups()) - g0;
        if (lo < hi) matmul_on(path, m, static_cast<const uint8_t *>(dst->src[i]->data), xd, x_stride, a, y + row0, y_stride, lo, hi);
        g0 += m.n_groups();
        row0 += m.n_rows;
    }
}

void quantize_blocks(CpuPath path, const float * x, int64_t x_stride, QuantizedActivations & a) {
#if defined(SPECULA_X86_KERNELS)
    if (path == CpuPath::Avx512Vnni) return avx512::quantize_activations(x, x_stride, a);
    if (path == CpuPath::Avx2) return avx2::quantize_activations(x, x_stride, a);
#endif
#if defined(SPECULA_ARM64_KERNELS)
    if (path == CpuPath::NeonI8mm || path == CpuPath::NeonDotprod) return neon_dotprod::quantize_activations(x, x_stride, a);
#endif
    generic::quantize_activations(x, x_stride, a);
}

}  // namespace

void quantize_activations_on(CpuPath path, const float * x, int64_t x_stride, QuantizedActivations & a, bool with_min_factor) {
    quantize_blocks(path, x, x_stride, a);
    if (!with_min_factor) return;
    const int64_t n = a.n_tokens * (a.k / kBlock);
    for (int64_t i = 0; i < n; ++i) a.ds[i] = a.d[i] * static_cast<float>(a.s[i]);
}

void matmul_on(CpuPath path, const PackedMatrix & m, const uint8_t * packed, const float * x, int64_t x_stride,
               const QuantizedActivations & a, float * y, int64_t y_stride, int64_t g_begin, int64_t g_end) {
    if (m.is_float()) {
#if defined(SPECULA_X86_KERNELS)
        if (path == CpuPath::Avx512Vnni) return avx512::matmul_float(m, packed, x, x_stride, a.n_tokens, y, y_stride, g_begin, g_end);
        if (path == CpuPath::Avx2) return avx2::matmul_float(m, packed, x, x_stride, a.n_tokens, y, y_stride, g_begin, g_end);
#endif
#if defined(SPECULA_ARM64_KERNELS)
        if (path == CpuPath::NeonI8mm || path == CpuPath::NeonDotprod) {
            return neon_dotprod::matmul_float(m, packed, x, x_stride, a.n_tokens, y, y_stride, g_begin, g_end);
        }
#endif
        return generic::matmul_float(m, packed, x, x_stride, a.n_tokens, y, y_stride, g_begin, g_end);
    }
#if defined(SPECULA_X86_KERNELS)
    if (path == CpuPath::Avx512Vnni) return avx512::matmul(m, packed, a, y, y_stride, g_begin, g_end);
    if (path == CpuPath::Avx2) return avx2::matmul(m, packed, a, y, y_stride, g_begin, g_end);
#endif
#if defined(SPECULA_ARM64_KERNELS)
    if (path == CpuPath::NeonI8mm) return neon_i8mm::matmul(m, packed, a, y, y_stride, g_begin, g_end);
    if (path == CpuPath::NeonDotprod) return neon_dotprod::matmul(m, packed, a, y, y_stride, g_begin, g_end);
#endif
    generic::matmul(m, packed, a, y, y_stride, g_begin, g_end);
}

void matmul_groups(CpuPath path, const PackedMatrix & m, const uint8_t * packed, const float * x, int64_t x_stride,
                   int n_tokens, float * y, int64_t g_begin, int64_t g_end) {
    thread_local Scratch scratch;
    QuantizedActivations a = scratch.view(n_tokens, m.k);
    if (!m.is_float()) quantize_activations_on(path, x, x_stride, a, has_min_term(m.format));
    matmul_on(path, m, packed, x, x_stride, a, y, m.n_rows, g_begin, g_end);
}

ggml_tensor * packed_matmul(ggml_context * ctx, std::span<ggml_tensor * const> ws, ggml_tensor * x) {
    if (ws.empty() || ws.size() >= GGML_MAX_SRC) throw Error("packed_matmul: 1 to " + std::to_string(GGML_MAX_SRC - 1) + " weights");
    int64_t n_rows = 0;
    for (ggml_tensor * w : ws) {
        const PackedMatrix * m = packed_matrix_of(w);
        if (!m) throw Error("packed_matmul: weight is not packed");
        if (x->type != GGML_TYPE_F32 || x->ne[0] != m->k) throw Error("packed_matmul: activations must be F32 rows of the weight's width");
        n_rows += m->n_rows;
    }
    // Rows must sit at a fixed stride: flatten anything else into a contiguous copy first.
    if (x->nb[0] != sizeof(float) || (x->ne[2] * x->ne[3] > 1 && !ggml_is_contiguous(x))) x = ggml_cont(ctx, x);
    ggml_tensor * args[GGML_MAX_SRC] = {};
    for (size_t i = 0; i < ws.size(); ++i) args[i] = ws[i];
    args[ws.size()] = x;
    return ggml_custom_4d(ctx, GGML_TYPE_F32, n_rows, x->ne[1], x->ne[2], x->ne[3], args, static_cast<int>(ws.size()) + 1,
                          matmul_op, GGML_N_TASKS_MAX, nullptr);
}

ggml_tensor * packed_matmul(ggml_context * ctx, ggml_tensor * w, ggml_tensor * x) { return packed_matmul(ctx, std::span(&w, 1), x); }

}  // namespace specula::kernels
