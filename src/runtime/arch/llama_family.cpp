// llama, qwen2 and qwen3 share one block: pre-RMSNorm attention with RoPE and GQA, then a SwiGLU
// FFN. They differ only in RoPE style (interleaved vs NeoX), qwen2's q/k/v biases and qwen3's
// per-head q/k RMSNorm. Mirrors llama.cpp's src/models/{llama,qwen2,qwen3}.cpp op for op, so that
// the oracle tests can demand matching logits.
#include <algorithm>
#include <cmath>

#include "ggml.h"
#include "runtime/kv_cache.h"
#include "runtime/arch/graph.h"
#include "runtime/kernels/attention.h"
#include "runtime/kernels/matmul.h"
#include "runtime/model.h"

namespace specula {

ggml_tensor * rms_norm(ggml_context * ctx, ggml_tensor * x, ggml_tensor * weight, float eps) {
    return ggml_mul(ctx, ggml_rms_norm(ctx, x, eps), weight);
}

// The one seam for weight matmuls: a weight the WeightStore packed runs specula's kernel, any
// other ggml's mul_mat (on whatever device holds it).
ggml_tensor * linear(ggml_context * ctx, ggml_tensor * w, ggml_tensor * x, ggml_tensor * bias) {
    ggml_tensor * y = kernels::packed_matrix_of(w) ? kernels::packed_matmul(ctx, w, x) : ggml_mul_mat(ctx, w, x);
    return bias ? ggml_add(ctx, y, bias) : y;
}

std::vector<ggml_tensor *> linear_stack(ggml_context * ctx, std::initializer_list<ggml_tensor *> ws, ggml_tensor * x) {
    std::vector<ggml_tensor *> out;
    if (!std::all_of(ws.begin(), ws.end(), [](const ggml_tensor * w) { return kernels::packed_matrix_of(w) != nullptr; })) {
        for (ggml_tensor * w : ws) out.push_back(linear(ctx, w, x));
        return out;
    }
    ggml_tensor * y = kernels::packed_matmul(ctx, std::span(ws.begin(), ws.size()), x);
    size_t offset = 0;
    for (ggml_tensor * w : ws) {
        const int64_t rows = kernels::packed_matrix_of(w)->n_rows;
        out.push_back(ggml_view_2d(ctx, y, rows, y->ne[1], y->nb[1], offset));
        offset += static_cast<size_t>(rows) * sizeof(float);
    }
    return out;
}

ggml_tensor * split_heads(ggml_context * ctx, ggml_tensor * t, int64_t D, int64_t heads) {
    if (ggml_is_contiguous(t)) return ggml_reshape_3d(ctx, t, D, heads, t->ne[1]);
    return ggml_view_3d(ctx, t, D, heads, t->ne[1], D * ggml_element_size(t), t->nb[1], 0);
}

namespace {

// q (when asked for), k and v of a pre-normed input, roped: [D, heads, n] each. The K/V-only
// path of an early exit computes k and v exactly as the full layer does.
struct Qkv {
    ggml_tensor * q = nullptr;
    ggml_tensor * k = nullptr;
    ggml_tensor * v = nullptr;
};

Qkv project_qkv(ggml_context * ctx, const ModelConfig & c, const LayerWeights & L, ggml_tensor * x, const GraphInputs & in,
                ggml_tensor * rope_freqs, bool with_q) {
    const int D = c.head_dim;
    const int rope_mode = c.rope_style == RopeStyle::Neox ? GGML_ROPE_TYPE_NEOX : 0;
    auto biased = [&](ggml_tensor * t, ggml_tensor * bias) { return bias ? ggml_add(ctx, t, bias) : t; };
    auto rope = [&](ggml_tensor * t) {
        return ggml_rope_ext(ctx, t, in.positions, rope_freqs, D, rope_mode, c.n_ctx_train, c.rope_freq_base,
                             c.rope_freq_scale, 0.0f, 1.0f, 32.0f, 1.0f);
    };
    const std::vector<ggml_tensor *> proj = with_q ? linear_stack(ctx, {L.wq, L.wk, L.wv}, x) : linear_stack(ctx, {L.wk, L.wv}, x);
    const size_t first_kv = with_q ? 1 : 0;
    Qkv r;
    r.k = split_heads(ctx, biased(proj[first_kv], L.bk), D, c.n_head_kv);  // [D, n_head_kv, n]
    r.v = split_heads(ctx, biased(proj[first_kv + 1], L.bv), D, c.n_head_kv);
    if (L.k_norm) r.k = rms_norm(ctx, r.k, L.k_norm, c.rms_eps);
    r.k = rope(r.k);
    if (with_q) {
        r.q = split_heads(ctx, biased(proj[0], L.bq), D, c.n_head);  // [D, n_head, n]
        if (L.q_norm) r.q = rms_norm(ctx, r.q, L.q_norm, c.rms_eps);
        r.q = rope(r.q);
        ggml_set_name(r.q, "q_rope");
    }
    return r;
}

}  // namespace

ggml_tensor * attention(ggml_context * ctx, ggml_cgraph * gf, const ModelConfig & c, const LayerWeights & L,
                        KvCache & cache, int il, ggml_tensor * x, const GraphInputs & in, ggml_tensor * rope_freqs) {
    const Qkv qkv = project_qkv(ctx, c, L, x, in, rope_freqs, true);
    return linear(ctx, L.wo, attend_to_cache(ctx, gf, c, cache, il, qkv.q, qkv.k, qkv.v, in, in.kq_mask,
                                             1.0f / std::sqrt(static_cast<float>(c.head_dim))));  // [n_embd, n]
}

void store_kv(ggml_context * ctx, ggml_cgraph * gf, const ModelConfig & c, KvCache & cache, int il, ggml_tensor * k,
              ggml_tensor * v, const GraphInputs & in) {
    const int n = static_cast<int>(k->ne[2]);
    ggml_tensor * cache_k = cache.k(il);  // [n_embd_kv, capacity]
    ggml_tensor * cache_v = cache.v(il);
    const int64_t n_embd_kv = c.n_embd_kv();
    // Rows of [D, heads, n] as [n_embd_kv, n]; v may be a view into a q/k/v stack.
    auto rows_of = [&](ggml_tensor * t) { return ggml_view_2d(ctx, t, n_embd_kv, n, t->nb[2], 0); };
    ggml_build_forward_expand(gf, ggml_set_rows(ctx, cache_k, rows_of(k), in.kv_slots));
    if (in.attention != AttentionKernel::Matmul) {
        ggml_build_forward_expand(gf, ggml_set_rows(ctx, cache_v, rows_of(v), in.kv_slots));
        return;
    }
    // Element (channel j, slot s) of the transposed V lives at j * capacity + s: one scatter per element.
    ggml_tensor * v_flat = ggml_reshape_2d(ctx, cache_v, 1, ggml_nelements(cache_v));
    ggml_build_forward_expand(gf, ggml_set_rows(ctx, v_flat, ggml_reshape_2d(ctx, ggml_is_contiguous(v) ? v : ggml_cont(ctx, v), 1, n_embd_kv * n), in.v_elements));
}

ggml_tensor * attend_to_cache(ggml_context * ctx, ggml_cgraph * gf, const ModelConfig & c, KvCache & cache, int il,
                              ggml_tensor * q, ggml_tensor * k, ggml_tensor * v, const GraphInputs & in,
                              ggml_tensor * kq_mask, float kq_scale) {
    const int n = static_cast<int>(q->ne[2]);
    const int D = c.head_dim;

    // Store the block's K/V at their slots; the attention then reads the cache views.
    store_kv(ctx, gf, c, cache, il, k, v, in);
    ggml_tensor * cache_k = cache.k(il);  // [n_embd_kv, capacity]
    ggml_tensor * cache_v = cache.v(il);
    const size_t es = ggml_element_size(cache_k);
    ggml_tensor * kp = ggml_permute(ctx, ggml_view_3d(ctx, cache_k, D, c.n_head_kv, in.n_kv, es * D, cache_k->nb[1], 0), 0, 2, 1, 3);
    ggml_tensor * qp = ggml_permute(ctx, q, 0, 2, 1, 3);  // [D, n, n_head];  kp: [D, n_kv, n_head_kv]

    ggml_tensor * o;
    if (in.attention == AttentionKernel::Specula) {
        o = kernels::masked_attention(ctx, q, cache_k, cache_v, kq_mask, kq_scale);  // [D*n_head, n]
    } else if (in.attention == AttentionKernel::Flash) {
        ggml_tensor * vp = ggml_permute(ctx, ggml_view_3d(ctx, cache_v, D, c.n_head_kv, in.n_kv, es * D, cache_v->nb[1], 0), 0, 2, 1, 3);
        o = ggml_flash_attn_ext(ctx, qp, kp, vp, kq_mask, kq_scale, 0.0f, 0.0f);
        ggml_prec_set_acc(o, GGML_PREC_F32);
        o = ggml_reshape_2d(ctx, o, D * c.n_head, n);                                             // [D*n_head, n]
    } else {                                                                                      // llama.cpp's -fa off path op for op: KQ, masked softmax, V^T KQ
        const size_t row = cache_v->nb[1];                                                        // one channel across all slots
        ggml_tensor * vt = ggml_view_3d(ctx, cache_v, in.n_kv, D, c.n_head_kv, row, row * D, 0);  // [n_kv, D, n_head_kv]
        ggml_tensor * kq = ggml_mul_mat(ctx, kp, qp);                                             // [n_kv, n, n_head]
        ggml_prec_set_acc(kq, GGML_PREC_F32);
        kq = ggml_soft_max_ext(ctx, kq, kq_mask, kq_scale, 0.0f);
        o = ggml_mul_mat(ctx, vt, kq);                                             // [D, n, n_head]
        o = ggml_cont_2d(ctx, ggml_permute(ctx, o, 0, 2, 1, 3), D * c.n_head, n);  // [D*n_head, n]
    }
    return o;
}

ggml_tensor * feed_forward(ggml_context * ctx, const LayerWeights & L, ggml_tensor * h) {
    const std::vector<ggml_tensor *> gate_up = linear_stack(ctx, {L.ffn_gate, L.ffn_up}, h);
    return linear(ctx, L.ffn_down, ggml_swiglu_split(ctx, gate_up[0], gate_up[1]));
}

void output_head(ggml_context * ctx, const Model & model, const GraphInputs & in, int layer_end, ggml_tensor * x, GraphOutputs & out) {
    const ModelConfig & c = model.config();
    const ModelWeights & w = model.weights();
    if (layer_end < c.n_layer) {
        out.hidden_out = x;
        return;
    }
    if (!in.out_rows) return;
    x = ggml_get_rows(ctx, x, in.out_rows);  // [n_embd, n_out]
    x = rms_norm(ctx, x, w.output_norm, c.rms_eps);
    ggml_tensor * logits = linear(ctx, in.output ? in.output : w.output, x);  // [n_vocab, n_out]
    if (c.final_logit_softcap > 0.0f) {
        logits = ggml_scale(ctx, logits, 1.0f / c.final_logit_softcap);
        logits = ggml_scale(ctx, ggml_tanh(ctx, logits), c.final_logit_softcap);
    }
    out.logits = logits;
}

GraphOutputs build_llama_family_graph(ggml_context * ctx, ggml_cgraph * gf, const Model & model, KvCache & cache,
                                      const GraphInputs & in, int layer_begin, int layer_end,
                                      std::span<const int> tap_layers, bool kv_only) {
    const ModelConfig & c = model.config();
    const ModelWeights & w = model.weights();
    GraphOutputs out;
    out.taps.assign(tap_layers.size(), nullptr);

    ggml_tensor * x = layer_begin == 0 ? ggml_get_rows(ctx, w.tok_embd, in.tokens) : in.hidden_in;  // [n_embd, n]
    auto tap = [&](int il) {
        for (size_t t = 0; t < tap_layers.size(); ++t) {
            if (tap_layers[t] == il) out.taps[t] = x;
        }
    };
    if (kv_only) {
        for (int il = layer_begin; il < layer_end; ++il) {
            const LayerWeights & L = w.layers[il];
            const Qkv kv = project_qkv(ctx, c, L, rms_norm(ctx, x, L.attn_norm, c.rms_eps), in, w.rope_freqs, false);
            store_kv(ctx, gf, c, cache, il, kv.k, kv.v, in);
        }
        return out;
    }
    for (int il = layer_begin; il < layer_end; ++il) {
        tap(il);
        const LayerWeights & L = w.layers[il];
        ggml_tensor * h = rms_norm(ctx, x, L.attn_norm, c.rms_eps);
        x = ggml_add(ctx, x, attention(ctx, gf, c, L, cache, il, h, in, w.rope_freqs));
        x = ggml_add(ctx, x, feed_forward(ctx, L, rms_norm(ctx, x, L.ffn_norm, c.rms_eps)));
        ggml_format_name(x, "l_out-%d", il);
    }
    tap(layer_end);
    output_head(ctx, model, in, layer_end, x, out);
    return out;
}

}  // namespace specula
