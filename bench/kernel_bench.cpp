// Micro-benchmarks of specula's CPU kernels, one thread, each path the CPU has:
// - packed matmul (runtime/kernels/matmul.h) on a matrix that stays in L2 (1536 x 768, about
//   SmolLM2-135M's FFN up projection), so the figure is the kernel's arithmetic rate, not the
//   memory's. Counter "GMAC/s" = weight x token multiply-adds per second;
// - masked attention (runtime/kernels/attention.h), one query row of SmolLM2-135M's shape (9 heads
//   of 64 over 3 KV heads) against n_kv visible F16 slots: the time is one row, all heads of one layer;
// - the sampling transforms over a vocabulary row (sample/sampler.h) at SmolLM2's 49152 tokens:
//   what every sampled token, drafted node and verified node at T > 0 pays.
//   build/bin/bench_kernels --benchmark_repetitions=5 --benchmark_report_aggregates_only
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

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

Fixture make(ggml_type type, int64_t n_rows, int64_t k, int n_tokens) {
    Fixture f;
    std::mt19937 rng(1);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> w(static_cast<size_t>(n_rows * k));
    for (float & v : w) v = normal(rng);
    std::vector<uint8_t> q(ggml_row_size(type, k) * n_rows);
    ggml_quantize_chunk(type, w.data(), q.data(), 0, n_rows, k, nullptr);
    if (!packable(type, k, &f.m.format)) std::abort();
    f.m.source_type = type, f.m.k = k, f.m.n_rows = n_rows;
    f.packed.resize(f.m.n_groups() * f.m.group_bytes());
    pack_matrix(f.m, q.data(), f.packed.data());
    f.x.resize(static_cast<size_t>(n_tokens * k));
    for (float & v : f.x) v = normal(rng);
    f.y.resize(static_cast<size_t>(n_tokens * n_rows));
    return f;
}

void packed_matmul(benchmark::State & state, ggml_type type, CpuPath path) {
    ggml_cpu_init();
    const int n_tokens = static_cast<int>(state.range(0));
    const int64_t n_rows = 1536, k = 768;  // k a multiple of 256 for the k-quants
    if (!cpu_can_run(path)) {
        state.SkipWithError("this CPU cannot run the path");
        return;
    }
    Fixture f = make(type, n_rows, k, n_tokens);
    for (auto _ : state) {
        matmul_groups(path, f.m, f.packed.data(), f.x.data(), k, n_tokens, f.y.data(), 0, f.m.n_groups());
        benchmark::DoNotOptimize(f.y.data());
    }
    state.counters["GMAC/s"] = benchmark::Counter(double(n_rows) * k * n_tokens * state.iterations() / 1e9, benchmark::Counter::kIsRate);
    state.SetLabel(cpu_path_name(path));
}

// Each type on each SIMD path (paths the CPU lacks are skipped): same bits, different speed.
#define SPECULA_KERNEL_BENCH_PATH(type, path) \
    BENCHMARK_CAPTURE(packed_matmul, type##_##path, GGML_TYPE_##type, CpuPath::path)->Arg(1)->Arg(2)->Arg(4)->Arg(5)->Arg(8)->Arg(16)->Arg(32)
#define SPECULA_KERNEL_BENCH(type)                                                         \
    SPECULA_KERNEL_BENCH_PATH(type, Avx2); SPECULA_KERNEL_BENCH_PATH(type, Avx512Vnni);     \
    SPECULA_KERNEL_BENCH_PATH(type, NeonDotprod); SPECULA_KERNEL_BENCH_PATH(type, NeonI8mm)

SPECULA_KERNEL_BENCH(Q8_0);
SPECULA_KERNEL_BENCH(Q4_0);
SPECULA_KERNEL_BENCH(Q4_1);
SPECULA_KERNEL_BENCH(Q5_0);
SPECULA_KERNEL_BENCH(Q4_K);
SPECULA_KERNEL_BENCH(Q6_K);
SPECULA_KERNEL_BENCH(F16);

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
    a.mask = mask.data(), a.mask_row = n_kv, a.n_kv = n_kv;
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

}  // namespace

BENCHMARK_MAIN();
