#pragma once
// What a family's graph builder receives and returns. Internal to the runtime.
#include <span>
#include <vector>

#include "runtime/backend.h"

struct ggml_context;
struct ggml_cgraph;
struct ggml_tensor;

namespace specula {

class KvCache;
class Model;
struct LayerWeights;
struct ModelConfig;

struct GraphInputs {
    ggml_tensor * tokens = nullptr;           // I32 [n]            (layer_begin == 0)
    ggml_tensor * hidden_in = nullptr;        // F32 [n_embd, n]    (layer_begin > 0)
    ggml_tensor * positions = nullptr;        // I32 [n]
    ggml_tensor * kq_mask = nullptr;          // F16 [n_kv, n]
    ggml_tensor * kq_mask_sliding = nullptr;  // F16 [n_kv, n] kq_mask minus keys outside the window (sliding-window layers only)
    ggml_tensor * kv_slots = nullptr;         // I64 [n] cache slots the block's K (and row-major V) rows are written to
    ggml_tensor * v_elements = nullptr;       // I64 [n_embd_kv * n] element indices of a transposed V cache
    ggml_tensor * out_rows = nullptr;         // I32 [n_out] rows to compute logits for (nullptr: none)
    int n_kv = 0;                             // cache slots visible to the attention (padded)
    AttentionKernel attention = AttentionKernel::Matmul;
    // The LM head's weight when the logits cover a trimmed vocabulary (ModelRunner's logit_ids:
    // a copy of the output weight's rows of those ids); nullptr: the model's output weight.
    ggml_tensor * output = nullptr;
};

struct GraphOutputs {
    ggml_tensor * logits = nullptr;      // [n_vocab, n_out]
    std::vector<ggml_tensor *> taps;     // [n_embd, n] per tap layer
    ggml_tensor * hidden_out = nullptr;  // [n_embd, n] when the range stops before n_layer
};

// Shared building blocks (arch/llama_family.cpp), also used by arch/gemma3.cpp.
ggml_tensor * rms_norm(ggml_context * ctx, ggml_tensor * x, ggml_tensor * weight, float eps);
ggml_tensor * linear(ggml_context * ctx, ggml_tensor * w, ggml_tensor * x, ggml_tensor * bias = nullptr);
// Weights applied to the same input (q/k/v, gate/up): one packed op when all are packed (x
// quantized once, one node and barrier instead of several), else one linear() each. Returns each
// weight's [n_rows_i, n] output; fused, these are views of the stacked result (rows contiguous,
// the stack's row stride), with the bits linear() gives.
std::vector<ggml_tensor *> linear_stack(ggml_context * ctx, std::initializer_list<ggml_tensor *> ws, ggml_tensor * x);
// [D * heads, n] as [D, heads, n] (a view where the rows sit in a wider stack).
ggml_tensor * split_heads(ggml_context * ctx, ggml_tensor * t, int64_t D, int64_t heads);
// Writes the block's k/v ([head_dim, heads, n], final form) into layer `il` of the cache and
// attends q to the cache under `kq_mask`, scores scaled by kq_scale; returns [head_dim*n_head, n]
// before the output projection.
ggml_tensor * attend_to_cache(ggml_context * ctx, ggml_cgraph * gf, const ModelConfig & c, KvCache & cache, int il,
                              ggml_tensor * q, ggml_tensor * k, ggml_tensor * v, const GraphInputs & in,
                              ggml_tensor * kq_mask, float kq_scale);
// Writes the block's k/v ([head_dim, heads, n], final form) into layer `il` of the cache at in.kv_slots.
void store_kv(ggml_context * ctx, ggml_cgraph * gf, const ModelConfig & c, KvCache & cache, int il, ggml_tensor * k,
              ggml_tensor * v, const GraphInputs & in);
// Self-attention of the block against layer `il` of the cache; writes the block's K/V there.
ggml_tensor * attention(ggml_context * ctx, ggml_cgraph * gf, const ModelConfig & c, const LayerWeights & L, KvCache & cache,
                        int il, ggml_tensor * x, const GraphInputs & in, ggml_tensor * rope_freqs);
// SwiGLU feed-forward of a pre-normed input.
ggml_tensor * feed_forward(ggml_context * ctx, const LayerWeights & L, ggml_tensor * h);
// The end of a layer range at `x`: the hidden state when the range stops before the last layer,
// else the logits of in.out_rows (output norm, LM head or in.output, the model's final
// soft-cap if it has one).
void output_head(ggml_context * ctx, const Model & model, const GraphInputs & in, int layer_end, ggml_tensor * x, GraphOutputs & out);

GraphOutputs build_llama_family_graph(ggml_context * ctx, ggml_cgraph * gf, const Model & model, KvCache & cache,
                                      const GraphInputs & in, int layer_begin, int layer_end,
                                      std::span<const int> tap_layers, bool kv_only);
GraphOutputs build_gemma3_graph(ggml_context * ctx, ggml_cgraph * gf, const Model & model, KvCache & cache,
                                const GraphInputs & in, int layer_begin, int layer_end, std::span<const int> tap_layers,
                                bool kv_only);
// kv_only (ForwardBatch::kv_only): each layer in the range only writes the K/V projections of
// the same input rows; nothing is returned.

}  // namespace specula
