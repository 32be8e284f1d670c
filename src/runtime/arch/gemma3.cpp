// Gemma 3: the llama block with embeddings scaled by sqrt(n_embd), per-head q/k RMSNorm, queries
// scaled before the attention, a second RMSNorm on the attention and FFN outputs before each
// joins the residual ("sandwich" norms), a GELU-gated FFN, and sliding-window layers interleaved
// with global ones, each kind with its own RoPE base and attention mask. Optional final logit
// softcapping. Mirrors llama.cpp's src/models/gemma3.cpp op for op, so that the oracle tests can
// demand matching logits.
#include <cmath>

#include "ggml.h"
#include "runtime/arch/graph.h"
#include "runtime/model.h"

namespace specula {

namespace {

struct Qkv {
    ggml_tensor * q = nullptr;
    ggml_tensor * k = nullptr;
    ggml_tensor * v = nullptr;
};

// q (when asked for, scaled), k and v of a pre-normed input with each layer kind's RoPE. The
// K/V-only path of an early exit computes k and v exactly as the full layer does.
Qkv gemma3_qkv(ggml_context * ctx, const ModelConfig & c, const LayerWeights & L, int il, ggml_tensor * h,
               const GraphInputs & in, bool with_q) {
    const int D = c.head_dim;
    const bool sliding = c.is_sliding(il);
    // Linear RoPE scaling (rope.scaling.factor) applies to the global layers only, as in llama.cpp.
    const float freq_base = sliding ? c.rope_freq_base_sliding : c.rope_freq_base;
    const float freq_scale = sliding ? 1.0f : c.rope_freq_scale;
    auto rope = [&](ggml_tensor * t) {
        return ggml_rope_ext(ctx, t, in.positions, nullptr, D, GGML_ROPE_TYPE_NEOX, c.n_ctx_train, freq_base, freq_scale,
                             0.0f, 1.0f, 32.0f, 1.0f);
    };

    const std::vector<ggml_tensor *> proj = with_q ? linear_stack(ctx, {L.wq, L.wk, L.wv}, h) : linear_stack(ctx, {L.wk, L.wv}, h);
    const size_t first_kv = with_q ? 1 : 0;
    Qkv r;
    r.k = rope(rms_norm(ctx, split_heads(ctx, proj[first_kv], D, c.n_head_kv), L.k_norm, c.rms_eps));  // [D, n_head_kv, n]
    r.v = split_heads(ctx, proj[first_kv + 1], D, c.n_head_kv);
    if (with_q) {
        // The query scale is applied to q itself, and the attention then scales by 1: the same
        // rounding as llama.cpp, which scaling inside the kernel would not give.
        r.q = ggml_scale(ctx, rope(rms_norm(ctx, split_heads(ctx, proj[0], D, c.n_head), L.q_norm, c.rms_eps)), c.query_scale);
    }
    return r;
}

ggml_tensor * gemma3_attention(ggml_context * ctx, ggml_cgraph * gf, const ModelConfig & c, const LayerWeights & L,
                               KvCache & cache, int il, ggml_tensor * h, const GraphInputs & in) {
    const Qkv qkv = gemma3_qkv(ctx, c, L, il, h, in, true);
    ggml_tensor * o = attend_to_cache(ctx, gf, c, cache, il, qkv.q, qkv.k, qkv.v, in, c.is_sliding(il) ? in.kq_mask_sliding : in.kq_mask, 1.0f);
    return linear(ctx, L.wo, o);  // [n_embd, n]
}

ggml_tensor * gelu_feed_forward(ggml_context * ctx, const LayerWeights & L, ggml_tensor * h) {
    const std::vector<ggml_tensor *> gate_up = linear_stack(ctx, {L.ffn_gate, L.ffn_up}, h);
    return linear(ctx, L.ffn_down, ggml_geglu_split(ctx, gate_up[0], gate_up[1]));
}

}  // namespace

GraphOutputs build_gemma3_graph(ggml_context * ctx, ggml_cgraph * gf, const Model & model, KvCache & cache,
                                const GraphInputs & in, int layer_begin, int layer_end, std::span<const int> tap_layers,
                                bool kv_only) {
    const ModelConfig & c = model.config();
    const ModelWeights & w = model.weights();
    GraphOutputs out;
    out.taps.assign(tap_layers.size(), nullptr);

    ggml_tensor * x = layer_begin == 0
                          ? ggml_scale(ctx, ggml_get_rows(ctx, w.tok_embd, in.tokens), std::sqrt(static_cast<float>(c.n_embd)))
                          : in.hidden_in;  // [n_embd, n]
    auto tap = [&](int il) {
        for (size_t t = 0; t < tap_layers.size(); ++t) {
            if (tap_layers[t] == il) out.taps[t] = x;
        }
    };
    if (kv_only) {
        for (int il = layer_begin; il < layer_end; ++il) {
            const LayerWeights & L = w.layers[il];
            const Qkv kv = gemma3_qkv(ctx, c, L, il, rms_norm(ctx, x, L.attn_norm, c.rms_eps), in, false);
            store_kv(ctx, gf, c, cache, il, kv.k, kv.v, in);
        }
        return out;
    }
    for (int il = layer_begin; il < layer_end; ++il) {
        tap(il);
        const LayerWeights & L = w.layers[il];
        ggml_tensor * a = gemma3_attention(ctx, gf, c, L, cache, il, rms_norm(ctx, x, L.attn_norm, c.rms_eps), in);
        x = ggml_add(ctx, rms_norm(ctx, a, L.attn_post_norm, c.rms_eps), x);
        ggml_tensor * f = gelu_feed_forward(ctx, L, rms_norm(ctx, x, L.ffn_norm, c.rms_eps));
        x = ggml_add(ctx, rms_norm(ctx, f, L.ffn_post_norm, c.rms_eps), x);
        ggml_format_name(x, "l_out-%d", il);
    }
    tap(layer_end);
    output_head(ctx, model, in, layer_end, x, out);
    return out;
}

}  // namespace specula
