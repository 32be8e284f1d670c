#include "runtime/model.h"

#include <cmath>
#include <cstdint>

#include "specula/error.h"
#include "ggml-backend.h"
#include "ggml.h"
#include "runtime/arch/graph.h"
#include "runtime/backend.h"
#include "runtime/forward.h"
#include "runtime/gguf_file.h"
#include "runtime/gguf_validate.h"
#include "runtime/weight_store.h"

namespace specula {

const char * arch_display_name(Arch arch) {
    switch (arch) {
        case Arch::Llama: return "llama";
        case Arch::Qwen2: return "qwen2";
        case Arch::Qwen3: return "qwen3";
        case Arch::Gemma3: return "gemma3";
    }
    return "?";
}

namespace {

// The keys llama.cpp's gemma3 loader reads, with its defaults for the absent ones, each
// range-checked before it is held as an int or a float the graph scales by.
void read_gemma3_config(const GgufFile & f, ModelConfig & c) {
    const std::string a = c.arch_name + ".";
    c.sliding_window = find_int_in(f, a + "attention.sliding_window", 0, INT32_MAX).value_or(0);
    if (c.sliding_window > 0) {
        const std::string pattern_key = a + "attention.sliding_window_pattern";
        if (f.array_length(pattern_key) > 0) {  // one flag per layer
            const std::vector<int32_t> flags = f.get_i32_array(pattern_key);
            if (static_cast<int>(flags.size()) != c.n_layer) throw Error(f.path() + ": " + pattern_key + " does not have one entry per layer");
            for (size_t il = 0; il < flags.size(); ++il) {
                if (flags[il] != 0 && flags[il] != 1) {
                    throw Error(f.path() + ": metadata key " + pattern_key + "[" + std::to_string(il) + "] is " + std::to_string(flags[il]) +
                                ", expected 0 (global) or 1 (sliding)");
                }
            }
            c.sliding_layers.assign(flags.begin(), flags.end());
        } else {  // a period: the last layer of every period is global (Gemma 3: 5 sliding, 1 global)
            const int period = find_int_in(f, pattern_key, 0, INT32_MAX).value_or(6);
            c.sliding_layers.resize(c.n_layer);
            for (int il = 0; il < c.n_layer; ++il) c.sliding_layers[il] = period == 0 || il % period < period - 1;
        }
        c.rope_freq_base_sliding = find_float_in(f, a + "rope.freq_base_swa", 0.0f, 1e30f).value_or(10000.0f);
    }
    // 0 (or absent): no softcapping; Gemma 3 stores none, Gemma 2 stored 30.
    const std::string softcap_key = a + "final_logit_softcapping";
    if (f.find_f32(softcap_key) != 0.0f) c.final_logit_softcap = find_float_in(f, softcap_key, 0.0f, 1e30f).value_or(0.0f);
    // Gemma 3 scales queries by 1/sqrt(query_pre_attn_scalar), which is the head size except in
    // the 27B model (62 layers), where it is n_embd / n_head; llama.cpp tells them apart the same way.
    const int pre_attn_scalar = c.n_layer == 62 ? c.n_embd / c.n_head : c.head_dim;
    if (pre_attn_scalar < 1) {
        throw Error(f.path() + ": " + a + "embedding_length " + std::to_string(c.n_embd) + " is less than " + a + "attention.head_count " +
                    std::to_string(c.n_head) + ": a 62-layer Gemma 3 scales queries by their ratio");
    }
    c.query_scale = 1.0f / std::sqrt(static_cast<float>(pre_attn_scalar));
}

ModelConfig read_config(const GgufFile & f) {
    ModelConfig c;
    c.arch_name = f.architecture();
    if (c.arch_name == "llama") c.arch = Arch::Llama;
    else if (c.arch_name == "qwen2") c.arch = Arch::Qwen2;
    else if (c.arch_name == "qwen3") c.arch = Arch::Qwen3;
    else if (c.arch_name == "gemma3") c.arch = Arch::Gemma3;
    else throw Error(f.path() + ": unsupported architecture '" + c.arch_name + "' (specula runs llama, qwen2, qwen3, gemma3)");

    const std::string a = c.arch_name + ".";
    c.n_layer = get_int_in(f, a + "block_count", 1, kMaxModelDim);
    check_block_count(f, a + "block_count", c.n_layer);
    read_layer_sizes(f, a, c);
    c.n_ctx_train = get_int_in(f, a + "context_length", 1, INT32_MAX);
    if (auto type = f.find_str(a + "rope.scaling.type"); type && *type != "none") {
        if (*type != "linear") throw Error(f.path() + ": unsupported rope scaling '" + *type + "'");
        c.rope_freq_scale = 1.0f / get_float_in(f, a + "rope.scaling.factor", 0.0f, 1e6f);
    }
    c.rope_style = c.arch == Arch::Llama ? RopeStyle::Interleaved : RopeStyle::Neox;
    c.has_qkv_bias = c.arch == Arch::Qwen2;
    c.has_qk_norm = c.arch == Arch::Qwen3 || c.arch == Arch::Gemma3;
    if (c.arch == Arch::Gemma3) read_gemma3_config(f, c);
    return c;
}

}  // namespace

Model::~Model() = default;

std::unique_ptr<Model> Model::load(const std::string & path, Backend & backend) {
    GgufFile file(path);
    std::unique_ptr<Model> m(new Model(path, backend));
    ModelConfig & c = m->config_;
    c = read_config(file);

    backend.place_layers(c.n_layer);
    auto want = [&](const std::string & name, std::vector<int64_t> shape, bool matmul, bool required, int layer = Backend::kIo) {
        return m->store_.want(file, backend, name, std::move(shape), matmul, required, layer);
    };

    const int64_t E = c.n_embd, Q = int64_t(c.n_head) * c.head_dim, KV = c.n_embd_kv(), F = c.n_ff, D = c.head_dim;
    c.n_vocab = embedding_rows(file, c.arch_name + ".vocab_size");

    ModelWeights & w = m->weights_;
    w.tok_embd = want("token_embd.weight", {E, c.n_vocab}, false, true);
    w.output_norm = want("output_norm.weight", {E}, false, true);
    w.output = want("output.weight", {E, c.n_vocab}, true, false);
    if (!w.output) {
        c.tied_output = true;
        // The embedding rows stay as stored for get_rows; the LM head may need its own packed copy.
        w.output = WeightStore::packs(backend, file.tensor_meta("token_embd.weight")) ? want("token_embd.weight", {E, c.n_vocab}, true, true) : w.tok_embd;
    }
    w.rope_freqs = want("rope_freqs.weight", {D / 2}, false, false);
    c.has_rope_freqs = w.rope_freqs != nullptr;
    w.layers.resize(c.n_layer);
    for (int il = 0; il < c.n_layer; ++il) {
        auto n = [&](const char * s) { return "blk." + std::to_string(il) + "." + s; };
        LayerWeights & L = w.layers[il];
        L.attn_norm = want(n("attn_norm.weight"), {E}, false, true, il);
        L.wq = want(n("attn_q.weight"), {E, Q}, true, true, il);
        L.wk = want(n("attn_k.weight"), {E, KV}, true, true, il);
        L.wv = want(n("attn_v.weight"), {E, KV}, true, true, il);
        L.wo = want(n("attn_output.weight"), {Q, E}, true, true, il);
        L.bq = want(n("attn_q.bias"), {Q}, false, c.has_qkv_bias, il);
        L.bk = want(n("attn_k.bias"), {KV}, false, c.has_qkv_bias, il);
        L.bv = want(n("attn_v.bias"), {KV}, false, c.has_qkv_bias, il);
        L.q_norm = want(n("attn_q_norm.weight"), {D}, false, c.has_qk_norm, il);
        L.k_norm = want(n("attn_k_norm.weight"), {D}, false, c.has_qk_norm, il);
        L.ffn_norm = want(n("ffn_norm.weight"), {E}, false, true, il);
        L.ffn_gate = want(n("ffn_gate.weight"), {E, F}, true, true, il);
        L.ffn_up = want(n("ffn_up.weight"), {E, F}, true, true, il);
        L.ffn_down = want(n("ffn_down.weight"), {F, E}, true, true, il);
        if (c.arch == Arch::Gemma3) {
            L.attn_post_norm = want(n("post_attention_norm.weight"), {E}, false, true, il);
            L.ffn_post_norm = want(n("post_ffw_norm.weight"), {E}, false, true, il);
        }
    }

    m->store_.load(file);
    m->shape_ = NetworkShape{c.n_layer, c.n_embd, c.n_embd_kv(), c.n_vocab, c.n_vocab, c.sliding_window};
    return m;
}

void Model::check_hidden_in(const ForwardBatch & b, int hidden_width) const {
    if (b.layer_begin == 0 && hidden_width != 0) throw Error("forward: a batch starting at layer 0 takes tokens, not hidden_in");
    if (b.layer_begin > 0 && hidden_width != config_.n_embd) throw Error("forward: hidden_in has the wrong size");
    if (b.layer_begin > 0 && !b.tokens.empty()) throw Error("forward: a batch starting past layer 0 takes hidden_in, not tokens");
}

GraphOutputs Model::build_graph(ggml_context * ctx, ggml_cgraph * gf, KvCache & cache, const GraphInputs & in,
                                const ForwardBatch & b, int layer_end) const {
    if (config_.arch == Arch::Gemma3) return build_gemma3_graph(ctx, gf, *this, cache, in, b.layer_begin, layer_end, b.tap_layers, b.kv_only);
    return build_llama_family_graph(ctx, gf, *this, cache, in, b.layer_begin, layer_end, b.tap_layers, b.kv_only);
}

}  // namespace specula
