// target-features: a drafter's training data from its target (tools/train/target_features.py
// --specula): for each token sequence of a JSON-lines file ({"ids": [...]} per line), the residual
// stream entering each tap layer and the target's top-k next-token log-probabilities, computed
// with the engine's own kernels. Output, little-endian:
//   "SPFEAT01", int32 tap layers, int32 n_embd, int32 top_k, then per sequence
//   int32 n, bf16 taps [n, tap layers * n_embd], int32 top ids [n, top_k], float32 log-probs [n, top_k].
#include <CLI/CLI.hpp>
#include <bit>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "commands.h"
#include "engine/model_bundle.h"
#include "target_features.h"
#include "runtime/kv_cache.h"
#include "runtime/model.h"
#include "specula/error.h"
#include "specula/specula.h"

namespace specula::cli {
namespace {

// Round to nearest even, as torch's float -> bfloat16.
uint16_t to_bf16(float x) {
    const uint32_t u = std::bit_cast<uint32_t>(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;  // NaN
    return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

template <class T>
void write_raw(std::ofstream & out, const T * data, size_t n) {
    out.write(reinterpret_cast<const char *>(data), static_cast<std::streamsize>(n * sizeof(T)));
}

std::vector<int> parse_layers(const std::string & text) {
    std::vector<int> layers;
    std::stringstream ss(text);
    std::string item;
    while (std::getline(ss, item, ',')) {
        try {
            size_t used = 0;
            layers.push_back(std::stoi(item, &used));
            if (used != item.size()) throw std::invalid_argument(item);
        } catch (const std::exception &) {
            throw Error("--layers: '" + item + "' is not a layer number");
        }
    }
    if (layers.empty()) throw Error("--layers: no layer");
    return layers;
}

struct Args {
    EngineOptions engine;
    std::string tokens_path, out_path, layers;  // empty: EAGLE-3's taps and the final state
    int top_k = 16;
};

int run(const Args & a) {
    std::ifstream in(a.tokens_path);
    if (!in) throw Error("cannot open " + a.tokens_path);
    auto t = ModelBundle::open(a.engine);
    const int n_embd = t->model->config().n_embd;
    const int n_vocab = t->model->config().n_vocab;
    const int n_layer = t->model->config().n_layer;
    std::vector<int> layers;
    if (!a.layers.empty()) {
        layers = parse_layers(a.layers);
    } else if (n_layer >= 6) {
        layers = {2, n_layer / 2, n_layer - 3, n_layer};  // the layers llama.cpp's EAGLE-3 converters tap
    } else {
        throw Error("a target of " + std::to_string(n_layer) + " layers: give the tap layers (--layers)");
    }
    for (int l : layers) {
        if (l < 0 || l > n_layer) throw Error("--layers: layer " + std::to_string(l) + " outside 0.." + std::to_string(n_layer));
    }
    std::ofstream out(a.out_path, std::ios::binary);
    if (!out) throw Error("cannot write " + a.out_path);
    out.write("SPFEAT01", 8);
    const int32_t header[3] = {static_cast<int32_t>(layers.size()), n_embd, a.top_k};
    write_raw(out, header, 3);

    KvCache cache(*t->backend, t->model->config(), a.engine.n_ctx);
    std::string line;
    int line_no = 0, n_seqs = 0;
    long n_tokens = 0;
    std::vector<uint16_t> taps;
    const auto t0 = std::chrono::steady_clock::now();
    while (std::getline(in, line)) {
        ++line_no;
        if (line.empty()) continue;
        const std::string where = a.tokens_path + ":" + std::to_string(line_no);
        std::vector<int32_t> ids;
        try {
            const nlohmann::json j = nlohmann::json::parse(line);
            if (!j.contains("ids") || !j["ids"].is_array()) throw Error(where + ": no \"ids\" array");
            for (const auto & v : j["ids"]) {
                if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= n_vocab) {
                    throw Error(where + ": token id " + v.dump() + " outside the vocabulary (0.." + std::to_string(n_vocab - 1) + ")");
                }
                ids.push_back(v.get<int32_t>());
            }
        } catch (const nlohmann::json::exception &) {
            throw Error(where + ": not JSON");
        }
        cache.rollback(0);
        TargetFeatures f;
        try {
            f = target_features(*t->runner, cache, ids, layers, a.top_k);
        } catch (const Error & e) {
            throw Error(where + ": " + e.what());
        }
        taps.resize(f.taps.size());
        for (size_t i = 0; i < f.taps.size(); ++i) taps[i] = to_bf16(f.taps[i]);
        const int32_t n = f.n_tokens;
        write_raw(out, &n, 1);
        write_raw(out, taps.data(), taps.size());
        write_raw(out, f.top_ids.data(), f.top_ids.size());
        write_raw(out, f.top_logp.data(), f.top_logp.size());
        ++n_seqs;
        n_tokens += n;
        if (n_seqs % 50 == 0) {
            const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            std::fprintf(stderr, "target-features: %d sequences, %ld tokens, %.0f tok/s\n", n_seqs, n_tokens, n_tokens / s);
        }
    }
    out.close();
    if (!out) throw Error("writing " + a.out_path + " failed");
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::fprintf(stderr, "target-features: wrote %s: %d sequences, %ld tokens in %.1f s\n", a.out_path.c_str(), n_seqs, n_tokens, s);
    return 0;
}

}  // namespace

void register_features(CLI::App & app, Commands & commands) {
    auto a = std::make_shared<Args>();
    a->engine.n_ctx = 2048;
    CLI::App * sub = app.add_subcommand(command::target_features.name, command::target_features.description);
    sub->add_option("-m,--model", a->engine.model_path, "target model GGUF")->required();
    sub->add_option("--tokens", a->tokens_path, "JSON lines, one {\"ids\": [...]} per sequence")->required();
    sub->add_option("-o,--out", a->out_path, "output file (format: tools/cli/cmd_features.cpp)")->required();
    sub->add_option("--layers", a->layers,
                    "tap layers, comma-separated: the residual stream entering each, n_layer = the final pre-norm state "
                    "(default: EAGLE-3's 2, n_layer/2, n_layer-3 and n_layer)");
    sub->add_option("--top-k", a->top_k, "log-probabilities per token")->capture_default_str();
    sub->add_option("-t,--threads", a->engine.n_threads, "CPU threads (0 = physical cores)")->capture_default_str();
    sub->add_option("-c,--ctx-size", a->engine.n_ctx, "the longest sequence in tokens")->capture_default_str();
    sub->callback([a, &commands] { commands.run = [a] { return run(*a); }; });
}

}  // namespace specula::cli
