#include "decode_bench.h"

#include <array>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <thread>

#include "bench_util.h"
#include "specula/error.h"
#include "common/progress.h"
#include "runtime/kv_cache.h"
#include "llama_peer.h"
#include "runtime/backend.h"
#include "ggml.h"
#include "runtime/forward.h"
#include "runtime/kernels/matmul.h"
#include "runtime/model.h"
#include "sample/sampler.h"

namespace specula::bench {

namespace {

using clock_type = std::chrono::steady_clock;
double ms_since(clock_type::time_point t0) {
    return std::chrono::duration<double, std::milli>(clock_type::now() - t0).count();
}

std::vector<int32_t> bench_tokens(int n, int n_vocab) {
    std::vector<int32_t> t(n);
    Rng rng(1234);
    for (auto & x : t) x = 3 + static_cast<int32_t>(rng.uniform() * (n_vocab - 3));
    return t;
}

// llama-bench's own tg figure (decode n tokens one by one from an empty cache).
Summary llama_bench_tg(const std::string & llama_bench, const DecodeBenchOptions & o, int threads, bool flash_attn) {
    const std::string cmd = llama_bench + " -m '" + o.model + "' -p 0 -n " + std::to_string(o.n_gen) +
                            " -t " + std::to_string(threads) + " -r " + std::to_string(o.reps) + (flash_attn ? " -fa on" : " -fa off") + " -o json";
    const auto j = nlohmann::json::parse(run_command(cmd));
    std::vector<double> samples = j.at(0).at("samples_ts").get<std::vector<double>>();
    return summarize(samples);
}

// The machine's limits, measured here so the table's GB/s and G MAC/s have a yardstick: streaming
// read bandwidth over a buffer far larger than the caches (all threads), and the rate of
// specula's own int8 kernel on a cache-resident Q8_0 matrix at 16 tokens (compute-bound).
struct Roofline {
    double read_gb_s = 0;
    double kernel_gmac_s = 0;
    std::string path;
};

Roofline measure_roofline(int threads) {
    Roofline r;
    const size_t n = size_t(1) << 27;  // 1 GiB of uint64
    std::vector<uint64_t> buf(n, 1);
    std::vector<double> gbs;
    for (int rep = 0; rep < 4; ++rep) {
        std::vector<uint64_t> sums(threads);
        std::vector<std::thread> pool;
        const auto t0 = clock_type::now();
        for (int t = 0; t < threads; ++t) {
            pool.emplace_back([&, t] {
                uint64_t acc[8] = {};
                for (size_t i = n * t / threads; i + 8 <= n * (t + 1) / threads; i += 8) {
                    for (int j = 0; j < 8; ++j) acc[j] += buf[i + j];
                }
                for (uint64_t a : acc) sums[t] += a;
            });
        }
        for (auto & th : pool) th.join();
        const double ms = ms_since(t0);
        if (sums[0] == 0) std::printf(" ");  // keeps the reads
        if (rep > 0) gbs.push_back(n * sizeof(uint64_t) / ms / 1e6);
    }
    r.read_gb_s = summarize(gbs).median;

    kernels::PackedMatrix m;
    m.format = kernels::PackedFormat::Q8_0;
    m.k = 1024;
    m.n_rows = 256;  // 272 KB packed: stays in L2
    std::vector<uint8_t> raw(ggml_row_size(GGML_TYPE_Q8_0, m.k) * m.n_rows, 1), packed(m.n_groups() * m.group_bytes());
    for (size_t i = 0; i < raw.size(); i += 34) raw[i] = 0, raw[i + 1] = 0x3c;  // F16 scale 1.0
    kernels::pack_matrix(m, raw.data(), packed.data());
    const int B = 16;
    std::vector<float> x(size_t(B) * m.k, 0.5f), y(size_t(B) * m.n_rows);
    const kernels::CpuPath path = kernels::detected_cpu_path();
    r.path = kernels::cpu_path_name(path);
    std::vector<double> rates;
    for (int rep = 0; rep < 5; ++rep) {
        const int iters = 200;
        const auto t0 = clock_type::now();
        std::vector<std::thread> pool;
        for (int t = 0; t < threads; ++t) {
            pool.emplace_back([&, t] {
                std::vector<float> yt(y.size());
                for (int it = 0; it < iters; ++it) {
                    kernels::matmul_groups(path, m, packed.data(), x.data(), m.k, B, yt.data(), 0, m.n_groups());
                }
            });
        }
        for (auto & th : pool) th.join();
        rates.push_back(double(iters) * threads * B * m.k * m.n_rows / ms_since(t0) / 1e6);
    }
    r.kernel_gmac_s = summarize(rates).median;
    return r;
}

// Multiply-accumulates per token of the weight matmuls (the LM head included).
double macs_per_token(const ModelConfig & c) {
    const double E = c.n_embd, Q = double(c.n_head) * c.head_dim, KV = c.n_embd_kv(), F = c.n_ff;
    return c.n_layer * (E * Q + 2 * E * KV + Q * E + 3 * E * F) + E * c.n_vocab;
}

// One of the two specula engines the benchmark compares: a runner and its cache.
struct BenchEngine {
    ModelRunner * runner;
    KvCache * cache;
};

// Generation, tokens per second per rep: one token at a time from an empty cache, as llama-bench's
// tg does; the first run of each engine is a warm-up.
std::array<Summary, 2> measure_generation(const DecodeBenchOptions & o, const BenchEngine (&engines)[2], std::span<const int32_t> tokens,
                                          Progress & progress) {
    std::array<Summary, 2> tg_of;
    ForwardOutput out;
    for (int e = 0; e < 2; ++e) {
        std::vector<double> tg;
        for (int r = 0; r < o.reps + 1; ++r) {
            engines[e].cache->rollback(0);
            const auto t0 = clock_type::now();
            for (int i = 0; i < o.n_gen; ++i) {
                engines[e].runner->forward(ForwardBatch::causal(tokens.subspan(i, 1), i, {0}), *engines[e].cache, out);
            }
            if (r > 0) tg.push_back(o.n_gen * 1000.0 / ms_since(t0));
            progress.step(std::string("generation, ") + (e == 0 ? "specula kernels" : "ggml kernels") + ", rep " + std::to_string(r) + "/" +
                          std::to_string(o.reps) + (r == 0 ? " (warm-up)" : ""));
        }
        tg_of[e] = summarize(tg);
    }
    return tg_of;
}

// Verifier-style batch cost: B rows with logits on top of `depth` cached tokens, both engines and
// llama.cpp taking turns rep by rep; prints a table row per B and returns the rows as JSON.
nlohmann::json measure_batches(const DecodeBenchOptions & o, const BenchEngine (&engines)[2], LlamaPeer & peer, std::span<const int32_t> tokens,
                               double weight_gb, double macs, Progress & progress) {
    ForwardOutput out;
    for (const BenchEngine & e : engines) {
        e.cache->rollback(0);
        e.runner->forward(ForwardBatch::causal(tokens.first(o.depth), 0, {}), *e.cache, out);
    }
    peer.decode(tokens.first(o.depth), false);
    nlohmann::json batches = nlohmann::json::array();
    std::printf("\n%-4s | %9s %7s %7s %8s | %9s %7s | %9s %7s | %8s %8s\n", "B", "own ms", "/B=1", "GB/s", "G MAC/s", "ggml ms",
                "/B=1", "llama ms", "/B=1", "own/ggml", "own/llama");
    double b1[3] = {0, 0, 0};
    for (int B : o.batch_sizes) {
        std::vector<int32_t> rows(B);
        for (int i = 0; i < B; ++i) rows[i] = i;
        const auto block = tokens.subspan(o.depth, B);
        std::vector<double> ms[3];
        for (int r = 0; r < o.reps + 1; ++r) {  // alternate engines so drift hits all alike
            for (int e = 0; e < 2; ++e) {
                const auto t0 = clock_type::now();
                engines[e].runner->forward(ForwardBatch::causal(block, o.depth, rows), *engines[e].cache, out);
                if (r > 0) ms[e].push_back(ms_since(t0));
                engines[e].cache->rollback(o.depth);
            }
            const auto t0 = clock_type::now();
            peer.decode(block, true);
            if (r > 0) ms[2].push_back(ms_since(t0));
            peer.rollback(o.depth);
        }
        progress.step("verify batch B=" + std::to_string(B));
        Summary s[3];
        for (int e = 0; e < 3; ++e) s[e] = summarize(ms[e]);
        if (B == o.batch_sizes.front()) {
            for (int e = 0; e < 3; ++e) b1[e] = s[e].median;
        }
        const double gbs = weight_gb / (s[0].median / 1e3), gmacs = B * macs / (s[0].median / 1e3) / 1e9;
        std::printf("%-4d | %9.2f %7.2f %7.1f %8.1f | %9.2f %7.2f | %9.2f %7.2f | %8.2f %8.2f\n", B, s[0].median, s[0].median / b1[0], gbs,
                    gmacs, s[1].median, s[1].median / b1[1], s[2].median, s[2].median / b1[2], s[0].median / s[1].median,
                    s[0].median / s[2].median);
        batches.push_back({{"B", B},
                           {"specula_ms", s[0].median},
                           {"specula_ms_min", s[0].min},
                           {"specula_ms_max", s[0].max},
                           {"specula_vs_b1", s[0].median / b1[0]},
                           {"specula_gb_s", gbs},
                           {"specula_gmac_s", gmacs},
                           {"specula_ggml_kernels_ms", s[1].median},
                           {"specula_ggml_kernels_ms_min", s[1].min},
                           {"specula_ggml_kernels_ms_max", s[1].max},
                           {"specula_ggml_kernels_vs_b1", s[1].median / b1[1]},
                           {"llamacpp_ms", s[2].median},
                           {"llamacpp_ms_min", s[2].min},
                           {"llamacpp_ms_max", s[2].max},
                           {"llamacpp_vs_b1", s[2].median / b1[2]},
                           {"specula_vs_llamacpp", s[0].median / s[2].median}});
    }
    return batches;
}

}  // namespace

int run_decode_bench(const DecodeBenchOptions & o) {
    // Fail on a missing peer before spending minutes on specula's runs.
    const std::string llama_bench = peer_binary("llama-bench");
    const MachineLoad load = measure_machine_load();
    print_machine(load);

    // Two specula engines on the same file: its own kernels (packed matmuls, its attention op) and
    // ggml's kernels with the attention kernel asked for; llama.cpp runs ggml's attention setting.
    Backend own(BackendOptions{"cpu", o.threads, Attention::Auto, Kernels::Specula});
    Backend ggml_k(BackendOptions{"cpu", o.threads, o.attention, Kernels::Ggml});
    const int threads = own.n_threads();
    const bool flash = ggml_k.flash_attention();
    const Roofline roof = measure_roofline(threads);
    std::printf("roofline: read %.1f GB/s (%d threads); specula int8 kernel (%s) %.0f G MAC/s at 16 tokens, in L2\n",
                roof.read_gb_s, threads, roof.path.c_str(), roof.kernel_gmac_s);
    std::printf("engines: specula (own kernels, %s), specula (ggml kernels, %s attention), llama.cpp (-fa %s)\n",
                roof.path.c_str(), attention_kernel_name(ggml_k.attention_kernel()), flash ? "on" : "off");

    const int max_b = *std::max_element(o.batch_sizes.begin(), o.batch_sizes.end());
    const int n_ctx = o.depth + std::max(max_b, o.n_gen) + 8;
    auto own_model = Model::load(o.model, own);
    auto ggml_model = Model::load(o.model, ggml_k);
    const ModelConfig & cfg = own_model->config();
    const std::vector<int32_t> tokens = bench_tokens(o.depth + std::max(max_b, o.n_gen), cfg.n_vocab);
    ModelRunner own_runner(*own_model), ggml_runner(*ggml_model);
    KvCache own_cache(own, cfg, n_ctx), ggml_cache(ggml_k, cfg, n_ctx);
    LlamaPeer peer(o.model, n_ctx, threads, flash, std::max(512, max_b));
    const BenchEngine engines[2] = {{&own_runner, &own_cache}, {&ggml_runner, &ggml_cache}};

    Progress progress("bench decode", int64_t(2) * (o.reps + 1) + int64_t(o.batch_sizes.size()));
    const std::array<Summary, 2> tg = measure_generation(o, engines, tokens, progress);
    const Summary peer_tg = llama_bench_tg(llama_bench, o, threads, flash);
    const double weight_gb = double(own_model->weight_bytes()) / 1e9;
    const double macs = macs_per_token(cfg);
    const nlohmann::json batches = measure_batches(o, engines, peer, tokens, weight_gb, macs, progress);
    std::printf("\n%-30s %10s %10s %10s\n", "generation (tok/s)", "median", "min", "max");
    std::printf("%-30s %10.2f %10.2f %10.2f\n", "specula (own kernels)", tg[0].median, tg[0].min, tg[0].max);
    std::printf("%-30s %10.2f %10.2f %10.2f\n", "specula (ggml kernels)", tg[1].median, tg[1].min, tg[1].max);
    std::printf("%-30s %10.2f %10.2f %10.2f\n", "llama.cpp (llama-bench tg)", peer_tg.median, peer_tg.min, peer_tg.max);
    std::printf("%-30s %10.3f\n", "ratio own kernels/llama.cpp", tg[0].median / peer_tg.median);

    if (!o.json_path.empty()) {
        nlohmann::json j = {
            {"model", o.model},
            {"threads", threads},
            {"reps", o.reps},
            {"depth", o.depth},
            {"kernel_path", roof.path},
            {"ggml_kernels_attention", attention_kernel_name(ggml_k.attention_kernel())},
            {"roofline_read_gb_s", roof.read_gb_s},
            {"roofline_kernel_gmac_s", roof.kernel_gmac_s},
            {"weight_gb", weight_gb},
            {"macs_per_token", macs},
            {"machine_busy_fraction_before", load.busy_fraction},
            {"machine_idle", load.idle()},
            {"cpu", load.cpu},
            {"specula_tg_tok_s", tg[0].median},
            {"specula_tg_tok_s_min", tg[0].min},
            {"specula_tg_tok_s_max", tg[0].max},
            {"specula_ggml_kernels_tg_tok_s", tg[1].median},
            {"llamacpp_tg_tok_s", peer_tg.median},
            {"llamacpp_tg_tok_s_min", peer_tg.min},
            {"llamacpp_tg_tok_s_max", peer_tg.max},
            {"tg_ratio", tg[0].median / peer_tg.median},
            {"batches", batches},
        };
        write_result(o.json_path, j.dump(2) + "\n");
    }
    return 0;
}

}  // namespace specula::bench
