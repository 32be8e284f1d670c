#pragma once
// A loaded llama-family or Gemma 3 model: hyper-parameters and weights resident in backend buffers, used as
// stored in the GGUF (quantized types included). Immutable after load; the forward pass and the
// KV cache live elsewhere (runtime/forward.h, runtime/kv_cache.h).
#include <memory>
#include <string>
#include <vector>

#include "runtime/model_config.h"
#include "runtime/network.h"
#include "runtime/weight_store.h"

struct ggml_context;
struct ggml_tensor;
struct ggml_backend_buffer;

namespace specula {

class Backend;

struct LayerWeights {
    ggml_tensor * attn_norm = nullptr;  // [n_embd]
    ggml_tensor * wq = nullptr;         // [n_embd, n_head*head_dim]
    ggml_tensor * wk = nullptr;         // [n_embd, n_head_kv*head_dim]
    ggml_tensor * wv = nullptr;         // [n_embd, n_head_kv*head_dim]
    ggml_tensor * wo = nullptr;         // [n_head*head_dim, n_embd]
    ggml_tensor * bq = nullptr;         // qwen2 biases
    ggml_tensor * bk = nullptr;
    ggml_tensor * bv = nullptr;
    ggml_tensor * q_norm = nullptr;  // qwen3/gemma3 per-head norms [head_dim]
    ggml_tensor * k_norm = nullptr;
    ggml_tensor * ffn_norm = nullptr;        // [n_embd]
    ggml_tensor * ffn_gate = nullptr;        // [n_embd, n_ff]
    ggml_tensor * ffn_up = nullptr;          // [n_embd, n_ff]
    ggml_tensor * ffn_down = nullptr;        // [n_ff, n_embd]
    ggml_tensor * attn_post_norm = nullptr;  // gemma3 sandwich norms [n_embd]: on the attention output
    ggml_tensor * ffn_post_norm = nullptr;   // and on the FFN output, before each joins the residual
};

struct ModelWeights {
    ggml_tensor * tok_embd = nullptr;     // [n_embd, n_vocab]
    ggml_tensor * output_norm = nullptr;  // [n_embd]
    ggml_tensor * output = nullptr;       // [n_embd, n_vocab]; == tok_embd when tied
    ggml_tensor * rope_freqs = nullptr;   // [head_dim/2], llama3 only
    std::vector<LayerWeights> layers;
};

class Model : public Network {
public:
    static std::unique_ptr<Model> load(const std::string & path, Backend & backend);
    ~Model() override;

    const NetworkShape & shape() const override { return shape_; }
    Backend & backend() const override { return backend_; }
    void check_hidden_in(const ForwardBatch & batch, int hidden_width) const override;
    GraphOutputs build_graph(ggml_context * ctx, ggml_cgraph * gf, KvCache & cache, const GraphInputs & in,
                             const ForwardBatch & batch, int layer_end) const override;

    const ModelConfig & config() const { return config_; }
    const ModelWeights & weights() const { return weights_; }
    const std::string & path() const { return path_; }
    size_t weight_bytes() const { return store_.bytes(); }

private:
    Model(std::string path, Backend & backend) : path_(std::move(path)), backend_(backend) {}
    std::string path_;
    Backend & backend_;
    ModelConfig config_;
    NetworkShape shape_;
    ModelWeights weights_;
    WeightStore store_;
};

}  // namespace specula
