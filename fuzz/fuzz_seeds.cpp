// Writes the fuzzers' seed corpora into DIR (scripts/fuzz.sh):
//   DIR/target.gguf           the model EAGLE heads are fuzzed against (also a seed)
//   DIR/model_loading/*.gguf  small models of every supported family and weight-type kind, and
//                             EAGLE-1 / EAGLE-3 heads for the target (with and without d2t)
//   DIR/safetensors/*         safetensors files with every dtype the reader converts
// Small on purpose: each fuzzer execution writes and loads its input whole.
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
#include <vector>

#include "specula/error.h"
#include "eagle_convert.h"
#include "model_writer.h"

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

}  // namespace

int main(int argc, char ** argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: fuzz_seeds DIR\n");
        return 1;
    }
    namespace fs = std::filesystem;
    const fs::path dir = argv[1];
    try {
        fs::create_directories(dir / "model_loading");
        fs::create_directories(dir / "safetensors");
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
