#include "decode_bench.h"

#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "bench_util.h"
#include "common/error.h"
#include "kv/kv_cache.h"
#include "llama_peer.h"
#include "runtime/backend.h"
#include "runtime/forward.h"
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
Summary llama_bench_tg(const DecodeBenchOptions & o, int threads, bool flash_attn) {
    const std::string cmd = peer_binary("llama-bench") + " -m '" + o.model + "' -p 0 -n " + std::to_string(o.n_gen) +
                            " -t " + std::to_string(threads) + " -r " + std::to_string(o.reps) + (flash_attn ? " -fa on" : " -fa off") + " -o json";
    const auto j = nlohmann::json::parse(run_command(cmd));
    std::vector<double> samples = j.at(0).at("samples_ts").get<std::vector<double>>();
    return summarize(samples);
}

}  // namespace

int run_decode_bench(const DecodeBenchOptions & o) {
    const MachineLoad load = measure_machine_load();
    std::printf("machine: %.0f%% busy before start, loadavg %.2f%s\n", load.busy_fraction * 100, load.loadavg_1m,
                load.idle() ? "" : "  ** NOT IDLE: figures are unreliable **");

    Backend backend(BackendOptions{"cpu", o.threads, o.attention});
    const int threads = backend.n_threads();
    const bool flash = backend.flash_attention();
    std::printf("attention: %s in both engines\n", flash ? "flash (llama.cpp -fa on)" : "matmul (llama.cpp -fa off)");
    auto model = Model::load(o.model, backend);
    ModelRunner runner(*model);
    const int max_b = *std::max_element(o.batch_sizes.begin(), o.batch_sizes.end());
    const int n_ctx = o.depth + std::max(max_b, o.n_gen) + 8;
    KvCache cache(backend, model->config(), n_ctx);
    LlamaPeer peer(o.model, n_ctx, threads, flash, std::max(512, max_b));
    const std::vector<int32_t> tokens = bench_tokens(o.depth + std::max(max_b, o.n_gen), model->config().n_vocab);

    // Generation: one token at a time from an empty cache, as llama-bench's tg does.
    std::vector<double> tg;
    ForwardOutput out;
    for (int r = 0; r < o.reps + 1; ++r) {
        cache.rollback(0);
        const auto t0 = clock_type::now();
        for (int i = 0; i < o.n_gen; ++i) {
            runner.forward(ForwardBatch::causal(std::span(tokens).subspan(i, 1), i, {0}), cache, out);
        }
        if (r > 0) tg.push_back(o.n_gen * 1000.0 / ms_since(t0));  // first run is warm-up
    }
    const Summary ours_tg = summarize(tg);
    const Summary peer_tg = llama_bench_tg(o, threads, flash);

    // Verifier-style batch cost: B rows with logits, on top of `depth` cached tokens.
    cache.rollback(0);
    runner.forward(ForwardBatch::causal(std::span(tokens).first(o.depth), 0, {}), cache, out);
    peer.decode(std::span(tokens).first(o.depth), false);
    nlohmann::json batches = nlohmann::json::array();
    std::printf("\n%-6s %12s %12s %10s %10s %10s\n", "B", "specula ms", "llama.cpp ms", "spec/B=1", "llama/B=1", "spec/llama");
    double ours_b1 = 0, peer_b1 = 0;
    for (int B : o.batch_sizes) {
        std::vector<int32_t> rows(B);
        for (int i = 0; i < B; ++i) rows[i] = i;
        const auto block = std::span(tokens).subspan(o.depth, B);
        std::vector<double> ours_ms, peer_ms;
        for (int r = 0; r < o.reps + 1; ++r) {  // alternate engines so drift hits both alike
            auto t0 = clock_type::now();
            runner.forward(ForwardBatch::causal(block, o.depth, rows), cache, out);
            const double a = ms_since(t0);
            cache.rollback(o.depth);
            t0 = clock_type::now();
            peer.decode(block, true);
            const double b = ms_since(t0);
            peer.rollback(o.depth);
            if (r > 0) ours_ms.push_back(a), peer_ms.push_back(b);
        }
        const Summary s = summarize(ours_ms), p = summarize(peer_ms);
        if (B == o.batch_sizes.front()) ours_b1 = s.median, peer_b1 = p.median;
        std::printf("%-6d %12.2f %12.2f %10.2f %10.2f %10.2f\n", B, s.median, p.median, s.median / ours_b1,
                    p.median / peer_b1, s.median / p.median);
        batches.push_back({{"B", B},
                           {"specula_ms", s.median}, {"specula_ms_min", s.min}, {"specula_ms_max", s.max},
                           {"llamacpp_ms", p.median}, {"llamacpp_ms_min", p.min}, {"llamacpp_ms_max", p.max},
                           {"specula_vs_llamacpp", s.median / p.median}});
    }
    std::printf("\n%-28s %10s %10s %10s\n", "generation (tok/s)", "median", "min", "max");
    std::printf("%-28s %10.2f %10.2f %10.2f\n", "specula", ours_tg.median, ours_tg.min, ours_tg.max);
    std::printf("%-28s %10.2f %10.2f %10.2f\n", "llama.cpp (llama-bench tg)", peer_tg.median, peer_tg.min, peer_tg.max);
    std::printf("%-28s %10.3f\n", "ratio specula/llama.cpp", ours_tg.median / peer_tg.median);

    if (!o.json_path.empty()) {
        nlohmann::json j = {
            {"model", o.model},
            {"threads", threads},
            {"reps", o.reps},
            {"depth", o.depth},
            {"attention", flash ? "flash" : "matmul"},
            {"machine_busy_fraction_before", load.busy_fraction},
            {"machine_idle", load.idle()},
            {"specula_tg_tok_s", ours_tg.median}, {"specula_tg_tok_s_min", ours_tg.min}, {"specula_tg_tok_s_max", ours_tg.max},
            {"llamacpp_tg_tok_s", peer_tg.median}, {"llamacpp_tg_tok_s_min", peer_tg.min}, {"llamacpp_tg_tok_s_max", peer_tg.max},
            {"tg_ratio", ours_tg.median / peer_tg.median},
            {"batches", batches},
        };
        std::ofstream(o.json_path) << j.dump(2) << "\n";
        std::printf("wrote %s\n", o.json_path.c_str());
    }
    return 0;
}

}  // namespace specula::bench
