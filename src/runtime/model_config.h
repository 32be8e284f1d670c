#pragma once
// Hyper-parameters of a llama-family or Gemma 3 model, read from GGUF metadata.
#include <cstdint>
#include <string>
#include <vector>

namespace specula {

enum class Arch {
    Llama,
    Qwen2,
    Qwen3,
    Gemma3
};

enum class RopeStyle {
    Interleaved,  // llama: rotate adjacent pairs (x0,x1),(x2,x3)...
    Neox,         // qwen2/qwen3/gemma3: rotate (x_i, x_{i+d/2})
};

struct ModelConfig {
    Arch arch = Arch::Llama;
    std::string arch_name;    // general.architecture as stored
    std::string key_prefix;   // of its size keys: "llama.", "eagle3.", ... (errors name the keys)
    std::string path;         // the GGUF file it was read from
    uint64_t file_bytes = 0;  // that file's size: bounds the KV cache its sizes ask for (KvCache)
    int n_vocab = 0;
    int n_embd = 0;  // residual width
    int n_layer = 0;
    int n_head = 0;
    int n_head_kv = 0;
    int head_dim = 0;  // may differ from n_embd / n_head (qwen3)
    int n_ff = 0;
    int n_ctx_train = 0;
    float rms_eps = 1e-5f;
    float rope_freq_base = 10000.0f;
    float rope_freq_scale = 1.0f;  // linear rope scaling: 1 / factor
    RopeStyle rope_style = RopeStyle::Interleaved;
    bool tied_output = false;     // lm_head shares token_embd
    bool has_qkv_bias = false;    // qwen2
    bool has_qk_norm = false;     // qwen3, gemma3
    bool has_rope_freqs = false;  // llama3 per-dimension rope factors

    // Gemma 3 (src/runtime/arch/gemma3.cpp)
    int sliding_window = 0;                   // a sliding layer's query sees keys fewer than this many positions back (0: no sliding layers)
    std::vector<uint8_t> sliding_layers;      // [n_layer] 1 = sliding-window layer, 0 = global (empty: none)
    float rope_freq_base_sliding = 10000.0f;  // RoPE base of the sliding layers (global layers: rope_freq_base)
    float query_scale = 1.0f;                 // q is multiplied by this before the attention (whose own scale is then 1)
    float final_logit_softcap = 0.0f;         // logits = c * tanh(logits / c) when > 0

    int n_embd_kv() const { return head_dim * n_head_kv; }
    bool is_sliding(int il) const { return !sliding_layers.empty() && sliding_layers[il] != 0; }
};

const char * arch_display_name(Arch arch);

}  // namespace specula
