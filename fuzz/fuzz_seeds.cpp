// Writes the fuzzers' seed corpora into DIR (scripts/fuzz.sh), a directory for each TARGET named
// (fuzz/targets.txt; the request targets' stay empty: their seeds are kept in fuzz/regressions/):
//   fuzz_seeds DIR TARGET...
//   DIR/target.gguf           the model EAGLE heads are fuzzed against (also a seed)
//   DIR/server.gguf           the model fuzz_http_request's server runs (a small vocabulary)
//   DIR/model_loading/*.gguf  small models of every supported family and weight-type kind (Gemma 3
//                             with sliding layers and a logit softcap), and EAGLE-1 / EAGLE-3
//                             heads for the target (with and without d2t)
//   DIR/safetensors/*         safetensors files with every dtype the reader converts
//   DIR/tokenizer/*.gguf      SentencePiece and byte-level BPE vocabularies: llama.cpp's, cut to
//                             their first tokens (and the merges among them)
//   DIR/exit_predictor/*.gguf SpecEE predictor sidecars for the target (with and without an
//                             offline schedule)
// Small on purpose: each fuzzer execution writes and loads its input whole.
#include <cstdint>
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "specula/error.h"
#include "eagle_convert.h"
#include "gguf.h"
#include "gguf_edit.h"
#include "ggml.h"
#include "model_writer.h"
#include "runtime/exit_predictor.h"

namespace {

using nlohmann::json;

specula::RandomModelSpec small_model(const std::string & arch) {
    specula::RandomModelSpec s;
    s.arch = arch;
    s.n_vocab = 64, s.n_embd = 32, s.n_layer = 2, s.n_head = 4, s.n_head_kv = 2, s.n_ff = 64, s.n_ctx = 256;
    return s;
}

// One safetensors file holding a tensor of each listed dtype, element size and shape.
void write_safetensors_seed(const std::string & path, const std::vector<std::tuple<std::string, size_t, std::vector<int64_t>>> & tensors) {
    json header = {{"__metadata__", {{"format", "pt"}}}};
    std::vector<uint8_t> data;
    for (const auto & [dtype, element_size, shape] : tensors) {
        size_t n = element_size;
        for (int64_t d : shape) n *= static_cast<size_t>(d);
        header[dtype + "_tensor"] = {{"dtype", dtype}, {"shape", shape}, {"data_offsets", {data.size(), data.size() + n}}};
        for (size_t i = 0; i < n; ++i) data.push_back(static_cast<uint8_t>(i * 37 + 11));
    }
    specula::write_safetensors_file(path, header.dump(), data);
}

// llama.cpp's vocabulary `src` cut to its first n tokens and the merges among them, so that a seed
// stays far below the fuzzers' input size limit. Special-token ids past the cut name the last token.
void write_small_vocabulary(const std::string & src, const std::string & out_path, size_t n) {
    gguf_init_params params{true, nullptr};
    gguf_context * in = gguf_init_from_file(src.c_str(), params);
    if (!in) throw specula::Error(src + ": cannot read the vocabulary");
    gguf_context * out = gguf_init_empty();
    gguf_set_kv(out, in);
    const int64_t tokens_id = gguf_find_key(in, "tokenizer.ggml.tokens");
    n = std::min<size_t>(n, gguf_get_arr_n(in, tokens_id));
    std::vector<std::string> tokens;
    for (size_t i = 0; i < n; ++i) tokens.push_back(gguf_get_arr_str(in, tokens_id, i));
    std::vector<const char *> token_ptrs;
    for (const std::string & t : tokens) token_ptrs.push_back(t.c_str());
    gguf_set_arr_str(out, "tokenizer.ggml.tokens", token_ptrs.data(), n);
    for (const char * key : {"tokenizer.ggml.scores", "tokenizer.ggml.token_type"}) {
        const int64_t id = gguf_find_key(in, key);
        if (id >= 0) gguf_set_arr_data(out, key, gguf_get_arr_type(in, id), gguf_get_arr_data(in, id), n);
    }
    if (const int64_t merges_id = gguf_find_key(in, "tokenizer.ggml.merges"); merges_id >= 0) {
        const std::set<std::string> kept(tokens.begin(), tokens.end());
        std::vector<std::string> merges;
        for (size_t i = 0; i < gguf_get_arr_n(in, merges_id); ++i) {
            const std::string m = gguf_get_arr_str(in, merges_id, i);
            const size_t space = m.find(' ', 1);
            if (space == std::string::npos) continue;
            const std::string a = m.substr(0, space), b = m.substr(space + 1);
            if (kept.count(a) && kept.count(b) && kept.count(a + b)) merges.push_back(m);
        }
        std::vector<const char *> merge_ptrs;
        for (const std::string & m : merges) merge_ptrs.push_back(m.c_str());
        gguf_set_arr_str(out, "tokenizer.ggml.merges", merge_ptrs.data(), merge_ptrs.size());
    }
    for (const char * key : {"tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id", "tokenizer.ggml.unknown_token_id",
                             "tokenizer.ggml.padding_token_id", "tokenizer.ggml.eot_token_id"}) {
        const int64_t id = gguf_find_key(in, key);
        if (id >= 0 && gguf_get_val_u32(in, id) >= n) gguf_set_val_u32(out, key, static_cast<uint32_t>(n - 1));
    }
    gguf_free(in);
    specula::write_gguf(out, nullptr, out_path);
}

// A SpecEE sidecar (docs/specee.md) for a target of n_layer layers and width n_embd, with
// predictors at `layers` and, when given, that offline schedule.
void write_exit_predictor(const std::string & path, int n_layer, int n_embd, const std::vector<int32_t> & layers,
                          const std::vector<int32_t> & offline) {
    constexpr int kHidden = 3;
    gguf_context * g = gguf_init_empty();
    gguf_set_val_str(g, "general.architecture", "specula-specee");
    gguf_set_val_u32(g, "specula-specee.target_block_count", n_layer);
    gguf_set_val_u32(g, "specula-specee.target_embedding_length", n_embd);
    gguf_set_val_u32(g, "specula-specee.candidates", specula::kExitCandidates);
    gguf_set_val_u32(g, "specula-specee.features", specula::kExitFeatures);
    gguf_set_val_u32(g, "specula-specee.hidden", kHidden);
    gguf_set_val_f32(g, "specula-specee.threshold", 0.6f);
    gguf_set_arr_data(g, "specula-specee.layers", GGUF_TYPE_INT32, layers.data(), layers.size());
    if (!offline.empty()) gguf_set_arr_data(g, "specula-specee.offline_layers", GGUF_TYPE_INT32, offline.data(), offline.size());
    ggml_init_params params{ggml_tensor_overhead() * 4 * layers.size() + (1 << 14), nullptr, false};
    ggml_context * ctx = ggml_init(params);
    auto add = [&](const std::string & name, int64_t ne0, int64_t ne1) {
        ggml_tensor * t = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, ne0, ne1);
        if (ne1 == 1) t = ggml_reshape_1d(ctx, t, ne0);
        ggml_set_name(t, name.c_str());
        float * v = static_cast<float *>(t->data);
        for (int64_t i = 0; i < ne0 * ne1; ++i) v[i] = 0.1f * static_cast<float>(i % 7) - 0.3f;
        gguf_add_tensor(g, t);
    };
    for (int32_t l : layers) {
        const std::string n = "exit." + std::to_string(l) + ".";
        add(n + "fc1.weight", specula::kExitFeatures, kHidden);
        add(n + "fc1.bias", kHidden, 1);
        add(n + "fc2.weight", kHidden, 1);
        add(n + "fc2.bias", 1, 1);
    }
    specula::write_gguf(g, ctx, path);
}

}  // namespace

int main(int argc, char ** argv) {
    if (argc < 3) {
        std::fprintf(stderr, "usage: fuzz_seeds DIR TARGET...\n");
        return 1;
    }
    namespace fs = std::filesystem;
    const fs::path dir = argv[1];
    try {
        for (int i = 2; i < argc; ++i) fs::create_directories(dir / argv[i]);
        const specula::RandomModelSpec target = small_model("llama");
        specula::write_random_model(target, (dir / "target.gguf").string());
        specula::write_random_model(target, (dir / "model_loading" / "llama.gguf").string());
        specula::RandomModelSpec tied = small_model("llama");
        tied.tied_output = true, tied.weight_type = "q8_0";
        specula::write_random_model(tied, (dir / "model_loading" / "llama-tied-q8_0.gguf").string());
        specula::write_random_model(small_model("qwen2"), (dir / "model_loading" / "qwen2.gguf").string());
        specula::RandomModelSpec qwen3 = small_model("qwen3");
        qwen3.head_dim = 16;
        specula::write_random_model(qwen3, (dir / "model_loading" / "qwen3.gguf").string());
        specula::RandomModelSpec gemma3 = small_model("gemma3");
        gemma3.n_layer = 3, gemma3.sliding_window = 8, gemma3.sliding_period = 3, gemma3.final_logit_softcap = 30.0f;
        gemma3.rope_freq_base = 1e6f, gemma3.rope_freq_base_sliding = 1e4f;
        specula::write_random_model(gemma3, (dir / "model_loading" / "gemma3.gguf").string());
        for (const char * kind : {"eagle1", "eagle3"}) {
            specula::RandomEagleSpec e;
            e.kind = kind;
            e.target = target;
            e.n_ff = 64;
            specula::write_random_eagle_head(e, (dir / "model_loading" / (std::string(kind) + ".gguf")).string());
        }
        specula::RandomEagleSpec compact;
        compact.target = target;
        compact.n_ff = 64;
        compact.n_draft_vocab = 16;
        specula::write_random_eagle_head(compact, (dir / "model_loading" / "eagle3-d2t.gguf").string());

        write_exit_predictor((dir / "exit_predictor" / "all-layers.gguf").string(), target.n_layer, target.n_embd, {1, 2}, {});
        write_exit_predictor((dir / "exit_predictor" / "offline.gguf").string(), target.n_layer, target.n_embd, {1, 2}, {2});
        for (const char * vocab : {"llama-spm", "gpt-2"}) {
            write_small_vocabulary(std::string(SPECULA_VOCAB_DIR) + "/ggml-vocab-" + vocab + ".gguf",
                                   (dir / "tokenizer" / (std::string(vocab) + ".gguf")).string(), 600);
        }
        // The model fuzz_http_request's server runs: with a vocabulary (the server tokenizes), the
        // cut SentencePiece one, and heads of 16 (specula's attention kernel takes multiples of 16).
        specula::RandomModelSpec server = small_model("llama");
        server.vocab_gguf = (dir / "tokenizer" / "llama-spm.gguf").string();
        server.n_head = 2, server.n_head_kv = 1;
        specula::write_random_model(server, (dir / "server.gguf").string());

        write_safetensors_seed((dir / "safetensors" / "floats.safetensors").string(),
                               {{"F32", 4, {4, 8}}, {"F16", 2, {8}}, {"BF16", 2, {2, 4}}, {"F64", 8, {3}}});
        write_safetensors_seed((dir / "safetensors" / "integers.safetensors").string(),
                               {{"I64", 8, {5}}, {"I32", 4, {2, 2}}, {"I16", 2, {3}}, {"I8", 1, {4}}, {"U8", 1, {4}}, {"BOOL", 1, {2}}});
    } catch (const specula::Error & e) {
        std::fprintf(stderr, "fuzz_seeds: %s\n", e.what());
        return 1;
    }
    return 0;
}
