#include "runtime/eagle_head.h"

#include <algorithm>
#include <cstdint>

#include "specula/error.h"
#include "ggml.h"
#include "runtime/arch/graph.h"
#include "runtime/forward.h"
#include "runtime/gguf_file.h"
#include "runtime/gguf_validate.h"

namespace specula {

namespace {

// The single layer's sizes, from the head's own GGUF keys (prefix "eagle3." / "specula-eagle1.").
ModelConfig read_layer_config(const GgufFile & f, const std::string & arch) {
    const std::string a = arch + ".";
    ModelConfig c;
    c.arch_name = arch;
    c.n_layer = 1;
    get_int_in(f, a + "block_count", 1, 1);  // an EAGLE head has exactly one decoder layer
    check_block_count(f, a + "block_count", 1);
    read_layer_sizes(f, a, c);
    c.n_ctx_train = find_int_in(f, a + "context_length", 1, INT32_MAX).value_or(4096);
    c.rope_style = RopeStyle::Interleaved;  // llama.cpp runs eagle3 with LLAMA_ROPE_TYPE_NORM
    return c;
}

}  // namespace

std::unique_ptr<EagleHead> EagleHead::load(const std::string & path, const Model & target, Backend & backend) {
    GgufFile file(path);
    std::unique_ptr<EagleHead> h(new EagleHead(target, backend));
    EagleHeadConfig & c = h->config_;
    const ModelConfig & t = target.config();
    const std::string arch = file.architecture();
    if (arch == "eagle3") c.kind = EagleKind::Eagle3;
    else if (arch == "specula-eagle1") c.kind = EagleKind::Eagle1;
    else throw Error(path + ": not an EAGLE head (architecture '" + arch + "'; expected eagle3 or specula-eagle1)");
    c.layer = read_layer_config(file, arch);
    const int E = c.layer.n_embd;
    c.target_hidden = get_int_in(file, arch + ".target_hidden_size", 1, kMaxModelDim);
    if (c.target_hidden != t.n_embd) {
        throw Error(path + ": head expects a target hidden size of " + std::to_string(c.target_hidden) + ", the target " +
                    target.path() + " has " + std::to_string(t.n_embd));
    }
    if (c.kind == EagleKind::Eagle3) {
        c.target_layers = file.get_i32_array("eagle3.target_layers");
        if (c.target_layers.size() != 3) throw Error(path + ": eagle3.target_layers must list 3 layers");
        c.norm_before_residual = file.find_bool("eagle3.norm_before_residual").value_or(false);
        c.norm_before_fc = file.find_bool("eagle3.norm_before_fc").value_or(false);
    } else {
        if (E != t.n_embd) throw Error(path + ": an EAGLE-1 head must have the target's hidden size " + std::to_string(t.n_embd));
        c.target_layers = {t.n_layer};  // the final pre-norm hidden state
    }
    for (int l : c.target_layers) {
        if (l < 0 || l > t.n_layer) {
            throw Error(path + ": head taps target layer " + std::to_string(l) + " but the target has " + std::to_string(t.n_layer) + " layers");
        }
    }

    auto want = [&](const std::string & name, std::vector<int64_t> shape, bool matmul, bool required) {
        return h->store_.want(file, backend, name, std::move(shape), matmul, required);
    };
    const ModelConfig & L = c.layer;
    const int64_t Q = int64_t(L.n_head) * L.head_dim, KV = L.n_embd_kv(), F = L.n_ff;
    const int64_t attn_in = c.kind == EagleKind::Eagle3 ? 2 * E : E;
    LayerWeights & w = h->layer_;
    if (c.kind == EagleKind::Eagle3) {
        w.attn_norm = want("blk.0.attn_norm.weight", {E}, false, true);
        h->attn_norm_2_ = want("blk.0.attn_norm_2.weight", {E}, false, true);
        h->fc_ = want("fc.weight", {3 * int64_t(c.target_hidden), E}, true, true);
        if (c.norm_before_fc) h->enc_norm_ = want("enc.output_norm.weight", {3 * int64_t(c.target_hidden)}, false, true);
    } else {
        h->fc_ = want("fc.weight", {2 * int64_t(E), E}, true, true);
        h->fc_bias_ = want("fc.bias", {E}, false, false);
    }
    w.wq = want("blk.0.attn_q.weight", {attn_in, Q}, true, true);
    w.wk = want("blk.0.attn_k.weight", {attn_in, KV}, true, true);
    w.wv = want("blk.0.attn_v.weight", {attn_in, KV}, true, true);
    w.wo = want("blk.0.attn_output.weight", {Q, E}, true, true);
    w.ffn_norm = want("blk.0.ffn_norm.weight", {E}, false, true);
    w.ffn_gate = want("blk.0.ffn_gate.weight", {E, F}, true, true);
    w.ffn_up = want("blk.0.ffn_up.weight", {E, F}, true, true);
    w.ffn_down = want("blk.0.ffn_down.weight", {F, E}, true, true);

    const ModelWeights & tw = target.weights();
    h->tok_embd_ = tw.tok_embd;
    h->output_norm_ = tw.output_norm;
    h->output_ = tw.output;
    c.n_draft_vocab = t.n_vocab;
    if (c.kind == EagleKind::Eagle3) {
        if (ggml_tensor * own = file.tensor_meta("token_embd.weight")) {
            if (own->ne[0] != E || own->ne[1] != t.n_vocab) throw Error(path + ": head's token_embd does not match the target's vocabulary");
            h->tok_embd_ = want("token_embd.weight", {E, t.n_vocab}, false, true);
        } else if (E != t.n_embd) {
            throw Error(path + ": head has no token_embd and its hidden size differs from the target's");
        }
        h->output_norm_ = want("output_norm.weight", {E}, false, true);
        h->d2t_ = read_d2t(file, t.n_vocab);
        if (!h->d2t_.empty()) c.n_draft_vocab = static_cast<int>(h->d2t_.size());
        check_t2d(file, t.n_vocab, h->d2t_);
        if (ggml_tensor * out = file.tensor_meta("output.weight")) {
            if (out->ne[1] != c.n_draft_vocab) {
                throw Error(path + ": head's lm_head has " + std::to_string(out->ne[1]) + " rows, its draft vocabulary " +
                            std::to_string(c.n_draft_vocab) + (h->d2t_.empty() ? " (the target's vocabulary)" : ""));
            }
            h->output_ = want("output.weight", {E, c.n_draft_vocab}, true, true);
        } else if (!h->d2t_.empty() || E != t.n_embd) {
            throw Error(path + ": head has no lm_head and cannot share the target's");
        }
    }
    h->store_.load(file);
    h->shape_ = NetworkShape{1, E, L.n_embd_kv(), c.n_draft_vocab, t.n_vocab};
    return h;
}

int EagleHead::feature_width() const {
    return config_.kind == EagleKind::Eagle3 ? 3 * config_.target_hidden : config_.target_hidden;
}

void EagleHead::check_hidden_in(const ForwardBatch & b, int width) const {
    if (b.tokens.empty()) throw Error("EAGLE head: a batch needs tokens");
    if (b.layer_begin != 0 || !b.tap_layers.empty()) throw Error("EAGLE head: no layer ranges or taps");
    const bool ok = width == feature_width() || width == config_.layer.n_embd;
    if (!ok) throw Error("EAGLE head: hidden_in rows must be target features or the head's own hidden state");
}

// EAGLE-3 as llama.cpp's src/models/eagle3.cpp (encoder fc + decoder) in one graph; EAGLE-1 as
// tools/train/model.py's Eagle1Head.
GraphOutputs EagleHead::build_graph(ggml_context * ctx, ggml_cgraph * gf, KvCache & cache, const GraphInputs & in,
                                    const ForwardBatch &, int) const {
    const EagleHeadConfig & c = config_;
    const float eps = c.layer.rms_eps;
    GraphOutputs out;
    ggml_tensor * emb = ggml_get_rows(ctx, tok_embd_, in.tokens);  // [E, n]
    ggml_tensor * x;                                               // residual stream
    if (c.kind == EagleKind::Eagle3) {
        ggml_tensor * g = in.hidden_in;  // [feature_width or E, n]
        if (g->ne[0] == feature_width() && feature_width() != c.layer.n_embd) {
            if (enc_norm_) g = rms_norm(ctx, g, enc_norm_, eps);
            g = linear(ctx, fc_, g);  // fuse target features
        }
        ggml_tensor * emb_norm = rms_norm(ctx, emb, layer_.attn_norm, eps);
        ggml_tensor * g_norm = rms_norm(ctx, g, attn_norm_2_, eps);
        ggml_tensor * residual = c.norm_before_residual ? g_norm : g;
        ggml_tensor * cat = ggml_concat(ctx, emb_norm, g_norm, 0);  // [2E, n]
        x = ggml_add(ctx, residual, attention(ctx, gf, c.layer, layer_, cache, 0, cat, in, nullptr));
    } else {
        x = linear(ctx, fc_, ggml_concat(ctx, emb, in.hidden_in, 0), fc_bias_);  // fc([emb; f])
        x = ggml_add(ctx, x, attention(ctx, gf, c.layer, layer_, cache, 0, x, in, nullptr));
    }
    x = ggml_add(ctx, x, feed_forward(ctx, layer_, rms_norm(ctx, x, layer_.ffn_norm, eps)));
    out.hidden_out = x;  // pre-norm: fed back as the next step's hidden state
    if (in.out_rows) {
        ggml_tensor * rows = ggml_get_rows(ctx, x, in.out_rows);
        const float out_eps = c.kind == EagleKind::Eagle3 ? eps : target_.config().rms_eps;
        out.logits = linear(ctx, output_, rms_norm(ctx, rows, output_norm_, out_eps));
    }
    return out;
}

}  // namespace specula
