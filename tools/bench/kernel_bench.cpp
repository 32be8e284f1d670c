// Micro-benchmarks of specula's CPU kernels, one thread, each path the CPU has:
// - packed matmul (runtime/kernels/matmul.h) on a matrix that stays in L2 (1536 x 768, about
//   SmolLM2-135M's FFN up projection), so the figure is the kernel's arithmetic rate, not the
//   memory's, and Qwen2.5-Coder-1.5B's FFN matrices streamed from memory, as a forward reads
//   them, beside ggml's own matmul on the same matrices (`ggml_matmul_shape/qwen_*_ggml`: one
//   thread of its CPU backend, the weights in the buffer llama-bench gives them). Counter
//   "GMAC/s" = weight x token multiply-adds per second;
// - masked attention (runtime/kernels/attention.h), one query row of SmolLM2-135M's shape (9 heads
//   of 64 over 3 KV heads) against n_kv visible F16 slots: the time is one row, all heads of one layer;
// - the machine's int8 peak per core for each x86 path's instruction mixes (int8_peak): what the
//   packed matmul's GMAC/s is a fraction of;
// - the sampling transforms over a vocabulary row (sample/sampler.h) at SmolLM2's 49152 tokens:
//   what every sampled token, drafted node and verified node at T > 0 pays.
//   build/bin/bench_kernels --benchmark_repetitions=5 --benchmark_report_aggregates_only
#include <benchmark/benchmark.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <cstring>
#include <random>
#include <vector>

#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml.h"
#include "runtime/kernels/attention_impl.h"
#include "runtime/kernels/matmul.h"
#include "sample/sampler.h"

namespace {

using namespace specula::kernels;

struct Fixture {
    PackedMatrix m;
    std::vector<uint8_t> packed;
    std::vector<float> x, y;
};

// An n_rows x k matrix of normal weights, quantized to `type` by ggml.
std::vector<uint8_t> random_quantized(ggml_type type, int64_t n_rows, int64_t k, std::mt19937 & rng) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> w(static_cast<size_t>(n_rows * k));
    for (float & v : w) v = normal(rng);
    std::vector<uint8_t> q(ggml_row_size(type, k) * n_rows);
    ggml_quantize_chunk(type, w.data(), q.data(), 0, n_rows, k, nullptr);
    return q;
}

Fixture make(ggml_type type, int64_t n_rows, int64_t k, int n_tokens) {
    Fixture f;
    std::mt19937 rng(1);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    const std::vector<uint8_t> q = random_quantized(type, n_rows, k, rng);
    if (!packable(type, k, &f.m.format)) std::abort();
    f.m.source_type = type, f.m.k = k, f.m.n_rows = n_rows;
    f.packed.resize(f.m.n_groups() * f.m.group_bytes());
    pack_matrix(f.m, q.data(), f.packed.data());
    f.x.resize(static_cast<size_t>(n_tokens * k));
    for (float & v : f.x) v = normal(rng);
    f.y.resize(static_cast<size_t>(n_tokens * n_rows));
    return f;
}

// One thread's packed matmul of an n_rows x k matrix. copies > 1 streams the weights from memory,
// as a forward reads them: that many copies of the matrix taken in turn, so no call finds its
// weights in cache; 1 keeps them in cache.
void matmul_shape(benchmark::State & state, ggml_type type, CpuPath path, int64_t n_rows, int64_t k, int copies) {
    ggml_cpu_init();
    const int n_tokens = static_cast<int>(state.range(0));
    if (!cpu_can_run(path)) {
        state.SkipWithError("this CPU cannot run the path");
        return;
    }
    Fixture f = make(type, n_rows, k, n_tokens);
    std::vector<uint8_t> weights(f.packed.size() * copies);
    for (int c = 0; c < copies; ++c) std::copy(f.packed.begin(), f.packed.end(), weights.begin() + c * f.packed.size());
    int c = 0;
    for (auto _ : state) {
        matmul_groups(path, f.m, weights.data() + c * f.packed.size(), f.x.data(), k, n_tokens, f.y.data(), 0, f.m.n_groups());
        benchmark::DoNotOptimize(f.y.data());
        c = (c + 1) % copies;
    }
    state.counters["GMAC/s"] = benchmark::Counter(double(n_rows) * k * n_tokens * state.iterations() / 1e9, benchmark::Counter::kIsRate);
    if (copies > 1) state.counters["GB/s"] = benchmark::Counter(double(f.packed.size()) * state.iterations() / 1e9, benchmark::Counter::kIsRate);
    state.SetLabel(cpu_path_name(path));
}

// 1536 x 768 (k a multiple of 256 for the k-quants): in L2, or streamed as 64 copies (47 MB of Q4_1).
void packed_matmul(benchmark::State & state, ggml_type type, CpuPath path, int copies) { matmul_shape(state, type, path, 1536, 768, copies); }

BENCHMARK_CAPTURE(packed_matmul, streamed_Q4_1_Avx2, GGML_TYPE_Q4_1, CpuPath::Avx2, 64)->Arg(1)->Arg(2)->Arg(3)->Arg(4)->Arg(8);
BENCHMARK_CAPTURE(packed_matmul, streamed_Q4_1_Avx512Vnni, GGML_TYPE_Q4_1, CpuPath::Avx512Vnni, 64)->Arg(1)->Arg(2)->Arg(3)->Arg(4)->Arg(8);

// Each type on each SIMD path (paths the CPU lacks are skipped): same bits, different speed.
#define SPECULA_KERNEL_BENCH_PATH(type, path) \
    BENCHMARK_CAPTURE(packed_matmul, type##_##path, GGML_TYPE_##type, CpuPath::path, 1)->Arg(1)->Arg(2)->Arg(4)->Arg(5)->Arg(8)->Arg(16)->Arg(32)
#define SPECULA_KERNEL_BENCH(type)                \
    SPECULA_KERNEL_BENCH_PATH(type, Avx2);        \
    SPECULA_KERNEL_BENCH_PATH(type, Avx512Vnni);  \
    SPECULA_KERNEL_BENCH_PATH(type, NeonDotprod); \
    SPECULA_KERNEL_BENCH_PATH(type, NeonI8mm)

SPECULA_KERNEL_BENCH(Q8_0);
SPECULA_KERNEL_BENCH(Q4_0);
SPECULA_KERNEL_BENCH(Q4_1);
SPECULA_KERNEL_BENCH(Q5_0);
SPECULA_KERNEL_BENCH(Q4_K);
SPECULA_KERNEL_BENCH(Q6_K);
SPECULA_KERNEL_BENCH(F16);

// Qwen2.5-Coder-1.5B Q4_K_M's matrices streamed from memory as its forward reads them, each past
// the 32 MB L3 of a Zen 4 (about 90 MB of copies): ffn_gate/up (8960 x 1536, Q4_K) and ffn_down
// (1536 x 8960, Q6_K in half the layers; the 151936 x 1536 output matrix is Q6_K too).
#define SPECULA_QWEN_BENCH(name, type, rows, k, copies, path)                                                        \
    BENCHMARK_CAPTURE(matmul_shape, qwen_##name##_##type##_##path, GGML_TYPE_##type, CpuPath::path, rows, k, copies) \
        ->Arg(1)                                                                                                     \
        ->Arg(2)                                                                                                     \
        ->Arg(4)                                                                                                     \
        ->Arg(8)                                                                                                     \
        ->Arg(16)
SPECULA_QWEN_BENCH(ffn_up, Q4_K, 8960, 1536, 12, Avx512Vnni);
SPECULA_QWEN_BENCH(ffn_up, Q4_K, 8960, 1536, 12, Avx2);
SPECULA_QWEN_BENCH(ffn_down, Q6_K, 1536, 8960, 8, Avx512Vnni);
SPECULA_QWEN_BENCH(ffn_down, Q6_K, 1536, 8960, 8, Avx2);

// ggml's own matmul on the same matrices, one thread of its CPU backend: a graph of one mul_mat,
// the weights in the buffer ggml gives them under llama-bench (repack: its CPU_REPACK buffer,
// which on AVX2 and AVX-512 holds Q4_K interleaved 8 rows x 8 bytes for its gemv/gemm kernels;
// otherwise the file's layout and ggml's vec_dot). The activations are quantized inside the op,
// as specula's are inside matmul_groups.
void ggml_matmul_shape(benchmark::State & state, ggml_type type, int64_t n_rows, int64_t k, int copies, bool repack) {
    ggml_cpu_init();
    const int n_tokens = static_cast<int>(state.range(0));
    ggml_backend_t cpu = ggml_backend_cpu_init();
    ggml_backend_cpu_set_n_threads(cpu, 1);
    ggml_backend_buffer_type_t wbuft = repack ? nullptr : ggml_backend_cpu_buffer_type();
    if (repack) {
        ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(ggml_backend_get_device(cpu));
        auto get_extra = reinterpret_cast<ggml_backend_dev_get_extra_bufts_t>(
            ggml_backend_reg_get_proc_address(reg, "ggml_backend_dev_get_extra_bufts"));
        for (ggml_backend_buffer_type_t * p = get_extra ? get_extra(ggml_backend_get_device(cpu)) : nullptr; p && *p; ++p) {
            if (std::strcmp(ggml_backend_buft_name(*p), "CPU_REPACK") == 0) wbuft = *p;
        }
        if (!wbuft) {
            ggml_backend_free(cpu);
            state.SkipWithError("ggml's CPU backend has no CPU_REPACK buffer");
            return;
        }
    }
    ggml_init_params wparams{ggml_tensor_overhead() * static_cast<size_t>(copies), nullptr, true};
    ggml_context * wctx = ggml_init(wparams);
    std::vector<ggml_tensor *> ws;
    for (int c = 0; c < copies; ++c) ws.push_back(ggml_new_tensor_2d(wctx, type, k, n_rows));
    ggml_backend_buffer_t wbuf = ggml_backend_alloc_ctx_tensors_from_buft(wctx, wbuft);
    std::mt19937 rng(1);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    {
        const std::vector<uint8_t> q = random_quantized(type, n_rows, k, rng);
        for (ggml_tensor * t : ws) ggml_backend_tensor_set(t, q.data(), 0, q.size());
    }
    ggml_init_params gparams{(ggml_tensor_overhead() + ggml_graph_overhead()) * static_cast<size_t>(copies + 1), nullptr, true};
    ggml_context * gctx = ggml_init(gparams);
    ggml_tensor * x = ggml_new_tensor_2d(gctx, GGML_TYPE_F32, k, n_tokens);
    std::vector<ggml_cgraph *> graphs;
    for (ggml_tensor * w : ws) {
        graphs.push_back(ggml_new_graph(gctx));
        ggml_build_forward_expand(graphs.back(), ggml_mul_mat(gctx, w, x));
    }
    ggml_backend_buffer_t gbuf = ggml_backend_alloc_ctx_tensors(gctx, cpu);
    std::vector<float> xs(static_cast<size_t>(n_tokens * k));
    for (float & v : xs) v = normal(rng);
    ggml_backend_tensor_set(x, xs.data(), 0, xs.size() * sizeof(float));
    int c = 0;
    for (auto _ : state) {
        ggml_backend_graph_compute(cpu, graphs[c]);
        c = (c + 1) % copies;
    }
    state.counters["GMAC/s"] = benchmark::Counter(double(n_rows) * k * n_tokens * state.iterations() / 1e9, benchmark::Counter::kIsRate);
    state.SetLabel(ggml_backend_buft_name(wbuft));
    ggml_backend_buffer_free(gbuf);
    ggml_free(gctx);
    ggml_backend_buffer_free(wbuf);
    ggml_free(wctx);
    ggml_backend_free(cpu);
}

#define SPECULA_QWEN_GGML_BENCH(name, type, rows, k, copies, repack)                                             \
    BENCHMARK_CAPTURE(ggml_matmul_shape, qwen_##name##_##type##_ggml, GGML_TYPE_##type, rows, k, copies, repack) \
        ->Arg(1)                                                                                                 \
        ->Arg(2)                                                                                                 \
        ->Arg(4)                                                                                                 \
        ->Arg(8)                                                                                                 \
        ->Arg(16)
SPECULA_QWEN_GGML_BENCH(ffn_up, Q4_K, 8960, 1536, 12, true);
SPECULA_QWEN_GGML_BENCH(ffn_down, Q6_K, 1536, 8960, 8, false);

void masked_attention(benchmark::State & state, CpuPath path) {
    const int n_kv = static_cast<int>(state.range(0));
    const int D = 64, n_head = 9, n_head_kv = 3;
    if (!cpu_can_run(path)) {
        state.SkipWithError("this CPU cannot run the path");
        return;
    }
    std::mt19937 rng(1);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> q(static_cast<size_t>(n_head) * D), out(q.size());
    for (float & v : q) v = normal(rng);
    std::vector<uint16_t> k(static_cast<size_t>(n_kv) * n_head_kv * D), v(k.size()), mask(static_cast<size_t>(n_kv), 0);
    for (auto & h : k) h = ggml_fp32_to_fp16(normal(rng));
    for (auto & h : v) h = ggml_fp32_to_fp16(normal(rng));
    AttentionArgs a;
    a.q = q.data(), a.q_row = n_head * D, a.k = k.data(), a.v = v.data(), a.kv_row = n_head_kv * D;
    a.mask = mask.data(), a.mask_row = n_kv, a.n_kv = n_kv, a.n_rows = 1;
    a.head_dim = D, a.n_head = n_head, a.n_head_kv = n_head_kv, a.scale = 0.125f;
    a.out = out.data(), a.out_row = n_head * D;
    for (auto _ : state) {
        attend_on(path, a, 0, n_head_kv);
        benchmark::DoNotOptimize(out.data());
    }
    state.SetLabel(cpu_path_name(path));
}

BENCHMARK_CAPTURE(masked_attention, Avx2, CpuPath::Avx2)->Arg(128)->Arg(512)->Arg(2048);
BENCHMARK_CAPTURE(masked_attention, Avx512Vnni, CpuPath::Avx512Vnni)->Arg(128)->Arg(512)->Arg(2048);
BENCHMARK_CAPTURE(masked_attention, Neon, CpuPath::NeonDotprod)->Arg(128)->Arg(512)->Arg(2048);

#if defined(__x86_64__)
// The int8 multiply-add rate of one core with nothing but the dot-product instructions in flight,
// in independent chains: AVX2's vpmaddubsw + vpmaddwd + vpaddd (32 MACs per ymm; the Q8_0 and Q6_K
// bodies' mix), AVX2's vpmaddubsw + vpaddw (the 4-bit bodies' mix: their products sum in 16 bits
// for a whole block before one vpmaddwd), AVX-512 VNNI's vpdpbusd (64 MACs per zmm). The asm barriers make every operand new each iteration, so the
// compiler can neither hoist a product out of the loop nor share it between chains.
__attribute__((target("avx2"))) inline __m256i avx2_dot_step(__m256i acc, __m256i w, __m256i x) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1)));
}

__attribute__((target("avx2"))) inline __m256i avx2_s16_step(__m256i acc, __m256i w, __m256i x) {
    return _mm256_add_epi16(acc, _mm256_maddubs_epi16(w, x));
}

template <__m256i (*Step)(__m256i, __m256i, __m256i)>
__attribute__((target("avx2"))) void avx2_chains(int64_t iters) {
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0;
    __m256i x0 = _mm256_set1_epi8(5), x1 = x0, x2 = x0, x3 = x0, x4 = x0, x5 = x0;
    const __m256i w = _mm256_set1_epi8(3);
    for (int64_t it = 0; it < iters; ++it) {
        a0 = Step(a0, w, x0), a1 = Step(a1, w, x1), a2 = Step(a2, w, x2);
        a3 = Step(a3, w, x3), a4 = Step(a4, w, x4), a5 = Step(a5, w, x5);
        __asm__ volatile(""
                         : "+x"(a0), "+x"(a1), "+x"(a2), "+x"(a3), "+x"(a4), "+x"(a5), "+x"(x0), "+x"(x1), "+x"(x2), "+x"(x3),
                           "+x"(x4), "+x"(x5));
    }
    const __m256i sum = _mm256_xor_si256(_mm256_xor_si256(_mm256_xor_si256(a0, a1), _mm256_xor_si256(a2, a3)), _mm256_xor_si256(a4, a5));
    benchmark::DoNotOptimize(_mm256_extract_epi32(sum, 0));
}

__attribute__((target("avx512f,avx512bw,avx512vnni"))) void avx512_vnni_chains(int64_t iters) {
    __m512i a0 = _mm512_set1_epi32(0), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0, a8 = a0, a9 = a0;
    __m512i w = _mm512_set1_epi8(3), x = _mm512_set1_epi8(5);
    for (int64_t it = 0; it < iters; ++it) {
        a0 = _mm512_dpbusd_epi32(a0, w, x), a1 = _mm512_dpbusd_epi32(a1, w, x), a2 = _mm512_dpbusd_epi32(a2, w, x);
        a3 = _mm512_dpbusd_epi32(a3, w, x), a4 = _mm512_dpbusd_epi32(a4, w, x), a5 = _mm512_dpbusd_epi32(a5, w, x);
        a6 = _mm512_dpbusd_epi32(a6, w, x), a7 = _mm512_dpbusd_epi32(a7, w, x), a8 = _mm512_dpbusd_epi32(a8, w, x);
        a9 = _mm512_dpbusd_epi32(a9, w, x);
        __asm__ volatile(""
                         : "+v"(a0), "+v"(a1), "+v"(a2), "+v"(a3), "+v"(a4), "+v"(a5), "+v"(a6), "+v"(a7), "+v"(a8), "+v"(a9), "+v"(w), "+v"(x));
    }
    const __m512i sum = _mm512_add_epi32(_mm512_add_epi32(_mm512_add_epi32(a0, a1), _mm512_add_epi32(a2, a3)),
                                         _mm512_add_epi32(_mm512_add_epi32(_mm512_add_epi32(a4, a5), _mm512_add_epi32(a6, a7)), _mm512_add_epi32(a8, a9)));
    benchmark::DoNotOptimize(_mm512_reduce_add_epi32(sum));
}

// s16: AVX2's 16-bit accumulating mix (ignored for AVX-512 VNNI).
void int8_peak(benchmark::State & state, CpuPath path, bool s16) {
    if (!cpu_can_run(path)) {
        state.SkipWithError("this CPU cannot run the path");
        return;
    }
    constexpr int64_t kIters = 100000;
    const double macs = path == CpuPath::Avx512Vnni ? 10.0 * 64 : 6.0 * 32;
    for (auto _ : state) {
        if (path == CpuPath::Avx512Vnni) avx512_vnni_chains(kIters);
        else if (s16) avx2_chains<avx2_s16_step>(kIters);
        else avx2_chains<avx2_dot_step>(kIters);
    }
    state.counters["GMAC/s"] = benchmark::Counter(macs * kIters * state.iterations() / 1e9, benchmark::Counter::kIsRate);
    state.SetLabel(cpu_path_name(path));
}

BENCHMARK_CAPTURE(int8_peak, Avx2, CpuPath::Avx2, false);
BENCHMARK_CAPTURE(int8_peak, Avx2_s16, CpuPath::Avx2, true);
BENCHMARK_CAPTURE(int8_peak, Avx512Vnni, CpuPath::Avx512Vnni, false);
#endif

std::vector<float> vocabulary_logits() {
    std::mt19937 rng(1);
    std::normal_distribution<float> normal(0.0f, 3.0f);
    std::vector<float> logits(49152);
    for (float & v : logits) v = normal(rng);
    return logits;
}

void sampling_processed_probs(benchmark::State & state) {
    const std::vector<float> logits = vocabulary_logits();
    specula::SamplingParams params;
    params.temperature = 1.0f;
    std::vector<float> probs;
    for (auto _ : state) {
        specula::processed_probs(logits, params, probs);
        benchmark::DoNotOptimize(probs.data());
    }
}
BENCHMARK(sampling_processed_probs);

void sampling_softmax_stats(benchmark::State & state) {
    const std::vector<float> logits = vocabulary_logits();
    std::vector<float> scratch;
    for (auto _ : state) benchmark::DoNotOptimize(specula::softmax_stats(logits, scratch));
}
BENCHMARK(sampling_softmax_stats);

void sampling_sample_from(benchmark::State & state) {
    const std::vector<float> logits = vocabulary_logits();
    specula::SamplingParams params;
    params.temperature = 1.0f;
    std::vector<float> probs;
    specula::processed_probs(logits, params, probs);
    specula::Rng rng(1);
    for (auto _ : state) benchmark::DoNotOptimize(specula::sample_from(probs, rng));
}
BENCHMARK(sampling_sample_from);

// A tree's children at T > 0: four siblings drawn from a compact draft vocabulary's distribution.
void sampling_draw_siblings(benchmark::State & state) {
    std::vector<float> logits = vocabulary_logits();
    logits.resize(4096);
    specula::SamplingParams params;
    params.temperature = 1.0f;
    std::vector<float> probs;
    specula::processed_probs(logits, params, probs);
    specula::Rng rng(1);
    for (auto _ : state) benchmark::DoNotOptimize(specula::sample_without_replacement(probs, 4, rng));
}
BENCHMARK(sampling_draw_siblings);

}  // namespace

BENCHMARK_MAIN();
