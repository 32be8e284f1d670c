#pragma once
// Hyper-parameters of a llama-family model, read from GGUF metadata.
#include <cstdint>
#include <string>

namespace specula {

enum class Arch { Llama, Qwen2, Qwen3 };

enum class RopeStyle {
    Interleaved,  // llama: rotate adjacent pairs (x0,x1),(x2,x3)...
    Neox,         // qwen2/qwen3: rotate (x_i, x_{i+d/2})
};

struct ModelConfig {
    Arch arch = Arch::Llama;
    std::string arch_name;       // general.architecture as stored
    int n_vocab = 0;
    int n_embd = 0;              // residual width
    int n_layer = 0;
    int n_head = 0;
    int n_head_kv = 0;
    int head_dim = 0;            // may differ from n_embd / n_head (qwen3)
    int n_ff = 0;
    int n_ctx_train = 0;
    float rms_eps = 1e-5f;
    float rope_freq_base = 10000.0f;
    float rope_freq_scale = 1.0f;  // linear rope scaling: 1 / factor
    RopeStyle rope_style = RopeStyle::Interleaved;
    bool tied_output = false;      // lm_head shares token_embd
    bool has_qkv_bias = false;     // qwen2
    bool has_qk_norm = false;      // qwen3
    bool has_rope_freqs = false;   // llama3 per-dimension rope factors

    int n_embd_kv() const { return head_dim * n_head_kv; }
};

const char * arch_display_name(Arch arch);

}  // namespace specula
