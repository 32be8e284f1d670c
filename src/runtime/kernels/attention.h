#pragma once
// specula's CPU attention for the model graph: softmax(scale * q K^T + mask) V over the cache,
// one (query row, KV head) at a time, so that a row's result does not depend on how many rows
// share the batch, which other rows they are, or the thread count (ggml's KQ/KQV matmuls switch
// kernels and summation orders with the number of query rows). Scores are taken only for the
// slots the mask leaves visible, summed in slot order.
struct ggml_context;
struct ggml_tensor;

namespace specula::kernels {

// q: F32 [D, n_head, n] (contiguous); k_cache, v_cache: F16 [n_head_kv * D, capacity], rows
// per slot (V not transposed); mask: F16 [n_kv, n], 0 = visible, -inf = hidden; returns F32
// [D * n_head, n]. D must be a multiple of 16 (attention_supported).
ggml_tensor * masked_attention(ggml_context * ctx, ggml_tensor * q, ggml_tensor * k_cache, ggml_tensor * v_cache,
                               ggml_tensor * mask, float scale);
bool attention_supported(int head_dim);

}  // namespace specula::kernels
