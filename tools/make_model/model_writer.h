#pragma once
// Writes random-weight llama-family and Gemma 3 GGUF models: test fixtures for every supported family and
// option, and bench-shaped models (e.g. Llama-3.2-1B shape) for cost curves. The vocabulary comes
// from one of llama.cpp's models/ggml-vocab-*.gguf files, so libllama can load the result.
#include <cstdint>
#include <string>
#include <vector>

namespace specula {

struct RandomModelSpec {
    std::string arch = "llama";  // llama | qwen2 | qwen3 | gemma3
    std::string vocab_gguf;      // path to a ggml-vocab-*.gguf
    int n_vocab = 0;             // with no vocab_gguf: this many tokens and no tokenizer (runtime-only models)
    int n_embd = 64;
    int n_layer = 2;
    int n_head = 4;
    int n_head_kv = 4;
    int head_dim = 0;  // 0 = n_embd / n_head
    int n_ff = 128;
    int n_ctx = 1024;
    bool tied_output = false;
    std::string weight_type = "f32";  // matmul weights: f32 f16 bf16 q8_0 q4_0 q4_k q6_k
    float rope_freq_base = 10000.0f;
    // gemma3 only
    int sliding_window = 0;  // > 0: sliding-window layers attend this far back
    int sliding_period = 6;  // the last layer of every period is global
    float rope_freq_base_sliding = 10000.0f;
    float final_logit_softcap = 0.0f;  // 0: none
    uint64_t seed = 1;
};

// Named shapes for benchmarks: "llama-1b" (Llama-3.2-1B), "llama-100m", "tiny".
RandomModelSpec bench_shape(const std::string & name, const std::string & vocab_dir);

void write_random_model(const RandomModelSpec & spec, const std::string & out_path);  // throws Error

// A random EAGLE head for a target written from `target` (same vocabulary file, or n_vocab tokens
// and no tokenizer, and sizes).
struct RandomEagleSpec {
    std::string kind = "eagle3";  // eagle3 (llama.cpp layout) | eagle1 (specula layout)
    RandomModelSpec target;
    std::vector<int> target_layers;  // eagle3: 3 layer ids; default {1, L/2, L}
    int n_head = 4, n_head_kv = 2, n_ff = 128;
    int n_draft_vocab = 0;  // eagle3: > 0 writes a compact vocabulary with d2t
    uint64_t seed = 7;
};
void write_random_eagle_head(const RandomEagleSpec & spec, const std::string & out_path);

}  // namespace specula
