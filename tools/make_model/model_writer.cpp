#include "model_writer.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "specula/error.h"
#include "common/progress.h"
#include "ggml.h"
#include "gguf.h"
#include "gguf_edit.h"

namespace specula {

namespace {

struct SplitMix {
    uint64_t s;
    uint64_t next() {
        uint64_t z = (s += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        return z ^ (z >> 31);
    }
    float uniform() { return static_cast<float>(next() >> 40) * 0x1.0p-24f * 2.0f - 1.0f; }  // [-1, 1)
};

ggml_type parse_type(const std::string & t) {
    if (t == "f32") return GGML_TYPE_F32;
    if (t == "f16") return GGML_TYPE_F16;
    if (t == "bf16") return GGML_TYPE_BF16;
    if (t == "q8_0") return GGML_TYPE_Q8_0;
    if (t == "q4_0") return GGML_TYPE_Q4_0;
    if (t == "q4_1") return GGML_TYPE_Q4_1;
    if (t == "q5_0") return GGML_TYPE_Q5_0;
    if (t == "q4_k") return GGML_TYPE_Q4_K;
    if (t == "q6_k") return GGML_TYPE_Q6_K;
    throw Error("unknown weight type '" + t + "' (f32 f16 bf16 q8_0 q4_0 q4_1 q5_0 q4_k q6_k)");
}

}  // namespace

RandomModelSpec bench_shape(const std::string & name, const std::string & vocab_dir) {
    RandomModelSpec s;
    if (name == "llama-1b") {  // Llama-3.2-1B
        s.vocab_gguf = vocab_dir + "/ggml-vocab-llama-bpe.gguf";
        s.n_embd = 2048, s.n_layer = 16, s.n_head = 32, s.n_head_kv = 8, s.n_ff = 8192;
        s.tied_output = true, s.rope_freq_base = 500000.0f, s.n_ctx = 4096;
    } else if (name == "smol-1b") {  // 1B-class widths at SmolLM2's depth (30 layers, head size 64): ~0.8B
        s.vocab_gguf = vocab_dir + "/ggml-vocab-llama-bpe.gguf";
        s.n_embd = 1536, s.n_layer = 30, s.n_head = 24, s.n_head_kv = 6, s.n_ff = 4096;
        s.tied_output = true, s.n_ctx = 4096;
    } else if (name == "smol-3b") {  // Llama-3.2-3B widths at SmolLM2's depth (30 layers, head size 64): ~3.2B
        s.vocab_gguf = vocab_dir + "/ggml-vocab-llama-bpe.gguf";
        s.n_embd = 3072, s.n_layer = 30, s.n_head = 48, s.n_head_kv = 16, s.n_ff = 8192;
        s.tied_output = true, s.n_ctx = 4096;
    } else if (name == "smol-8b") {  // Llama-3.1-8B widths and depth with SmolLM2's head size 64: ~7.8B
        s.vocab_gguf = vocab_dir + "/ggml-vocab-llama-bpe.gguf";
        s.n_embd = 4096, s.n_layer = 32, s.n_head = 64, s.n_head_kv = 16, s.n_ff = 14336;
        s.tied_output = true, s.n_ctx = 4096;
    } else if (name == "llama-100m") {
        s.vocab_gguf = vocab_dir + "/ggml-vocab-llama-spm.gguf";
        s.n_embd = 768, s.n_layer = 12, s.n_head = 12, s.n_head_kv = 4, s.n_ff = 2048, s.n_ctx = 4096;
    } else if (name == "twin-test") {  // small, for the bench-twin test
        s.vocab_gguf = vocab_dir + "/ggml-vocab-llama-spm.gguf";
        s.n_embd = 128, s.n_layer = 4, s.n_head = 8, s.n_head_kv = 4, s.n_ff = 256;
    } else if (name == "tiny") {
        s.vocab_gguf = vocab_dir + "/ggml-vocab-llama-spm.gguf";
    } else {
        throw Error("unknown shape '" + name + "' (llama-1b, smol-1b, smol-3b, smol-8b, llama-100m, tiny, twin-test)");
    }
    return s;
}

namespace {

// Copies every tokenizer.* key of a vocabulary GGUF into `out`; returns its token count.
int copy_vocabulary(const std::string & vocab_gguf, gguf_context * out) {
    ggml_context * vocab_meta = nullptr;
    gguf_init_params vp{true, &vocab_meta};
    gguf_context * vocab = gguf_init_from_file(vocab_gguf.c_str(), vp);
    if (!vocab) throw Error(vocab_gguf + ": cannot read vocabulary GGUF");
    const int64_t tokens_key = gguf_find_key(vocab, "tokenizer.ggml.tokens");
    if (tokens_key < 0) throw Error(vocab_gguf + ": has no tokenizer.ggml.tokens");
    const int n_vocab = static_cast<int>(gguf_get_arr_n(vocab, tokens_key));
    gguf_set_kv(out, vocab);
    gguf_free(vocab);
    if (vocab_meta) ggml_free(vocab_meta);
    return n_vocab;
}

struct Planned {
    std::string name;
    ggml_type type;
    int64_t ne0, ne1;
    float scale, offset;
};

// Fills each planned tensor with uniform noise (offset +- scale), adds it to `out`, writes the file.
void write_tensors(gguf_context * out, const std::vector<Planned> & plan, uint64_t seed, const std::string & out_path,
                   const std::vector<int64_t> & i64_data = {}, const std::string & i64_name = "") {
    size_t bytes = ggml_tensor_overhead() * 2 + i64_data.size() * sizeof(int64_t) + 64;
    for (auto & p : plan) {
        if (p.type != GGML_TYPE_F32 && p.ne0 % ggml_blck_size(p.type) != 0) {
            throw Error("row length " + std::to_string(p.ne0) + " of " + p.name + " is not a multiple of the " +
                        ggml_type_name(p.type) + " block size");
        }
        bytes += ggml_row_size(p.type, p.ne0) * p.ne1 + 2 * ggml_tensor_overhead() + 64;  // + reshape view
    }
    ggml_init_params params{bytes + 1024, nullptr, false};
    ggml_context * ctx = ggml_init(params);
    SplitMix rng{seed};
    std::vector<float> f32;
    Progress progress("writing " + out_path, static_cast<int64_t>(plan.size()));
    for (auto & p : plan) {
        ggml_tensor * t = ggml_new_tensor_2d(ctx, p.type, p.ne0, p.ne1);
        if (p.ne1 == 1) t = ggml_reshape_1d(ctx, t, p.ne0);
        ggml_set_name(t, p.name.c_str());
        f32.resize(static_cast<size_t>(p.ne0) * p.ne1);
        for (float & x : f32) x = p.offset + p.scale * rng.uniform();
        if (p.type == GGML_TYPE_F32) {
            std::memcpy(t->data, f32.data(), f32.size() * sizeof(float));
        } else {
            ggml_quantize_chunk(p.type, f32.data(), t->data, 0, p.ne1, p.ne0, nullptr);
        }
        gguf_add_tensor(out, t);
        progress.step(p.name);
    }
    if (!i64_data.empty()) {
        ggml_tensor * t = ggml_new_tensor_1d(ctx, GGML_TYPE_I64, static_cast<int64_t>(i64_data.size()));
        std::memcpy(t->data, i64_data.data(), i64_data.size() * sizeof(int64_t));
        ggml_set_name(t, i64_name.c_str());
        gguf_add_tensor(out, t);
    }
    write_gguf(out, ctx, out_path);
}

}  // namespace

void write_random_model(const RandomModelSpec & spec, const std::string & out_path) {
    const ggml_type wtype = parse_type(spec.weight_type);
    if (spec.arch != "llama" && spec.arch != "qwen2" && spec.arch != "qwen3" && spec.arch != "gemma3") {
        throw Error("unknown arch '" + spec.arch + "'");
    }
    const bool gemma3 = spec.arch == "gemma3";
    const int head_dim = spec.head_dim > 0 ? spec.head_dim : spec.n_embd / spec.n_head;

    gguf_context * out = gguf_init_empty();
    const int n_vocab = spec.vocab_gguf.empty() ? spec.n_vocab : copy_vocabulary(spec.vocab_gguf, out);
    if (n_vocab <= 0) throw Error("a random model needs a vocabulary GGUF or n_vocab");

    const std::string a = spec.arch + ".";
    gguf_set_val_str(out, "general.architecture", spec.arch.c_str());
    gguf_set_val_str(out, "general.name", ("specula random " + spec.arch).c_str());
    gguf_set_val_u32(out, (a + "block_count").c_str(), spec.n_layer);
    gguf_set_val_u32(out, (a + "embedding_length").c_str(), spec.n_embd);
    gguf_set_val_u32(out, (a + "feed_forward_length").c_str(), spec.n_ff);
    gguf_set_val_u32(out, (a + "attention.head_count").c_str(), spec.n_head);
    gguf_set_val_u32(out, (a + "attention.head_count_kv").c_str(), spec.n_head_kv);
    gguf_set_val_u32(out, (a + "attention.key_length").c_str(), head_dim);
    gguf_set_val_u32(out, (a + "attention.value_length").c_str(), head_dim);
    gguf_set_val_u32(out, (a + "rope.dimension_count").c_str(), head_dim);
    gguf_set_val_u32(out, (a + "context_length").c_str(), spec.n_ctx);
    gguf_set_val_f32(out, (a + "attention.layer_norm_rms_epsilon").c_str(), 1e-5f);
    gguf_set_val_f32(out, (a + "rope.freq_base").c_str(), spec.rope_freq_base);
    gguf_set_val_u32(out, (a + "vocab_size").c_str(), n_vocab);
    if (gemma3 && spec.sliding_window > 0) {
        gguf_set_val_u32(out, (a + "attention.sliding_window").c_str(), spec.sliding_window);
        gguf_set_val_u32(out, (a + "attention.sliding_window_pattern").c_str(), spec.sliding_period);
        gguf_set_val_f32(out, (a + "rope.freq_base_swa").c_str(), spec.rope_freq_base_sliding);
    }
    if (gemma3 && spec.final_logit_softcap > 0.0f) {
        gguf_set_val_f32(out, (a + "final_logit_softcapping").c_str(), spec.final_logit_softcap);
    }

    std::vector<Planned> plan;
    const int64_t E = spec.n_embd, Q = int64_t(spec.n_head) * head_dim, KV = int64_t(spec.n_head_kv) * head_dim, F = spec.n_ff;
    auto mat = [&](std::string n, int64_t in, int64_t outd, float gain = 1.0f) {
        plan.push_back({n, wtype, in, outd, gain * std::sqrt(3.0f / in), 0.0f});
    };
    auto vec = [&](std::string n, int64_t len, float offset) { plan.push_back({n, GGML_TYPE_F32, len, 1, 0.1f, offset}); };
    // Embeddings stay F32/F16/Q-type as the matmul weights (get_rows handles all of them).
    plan.push_back({"token_embd.weight", wtype, E, n_vocab, std::sqrt(3.0f), 0.0f});
    vec("output_norm.weight", E, 1.0f);
    if (!spec.tied_output) mat("output.weight", E, n_vocab, 3.0f);
    for (int il = 0; il < spec.n_layer; ++il) {
        auto n = [&](const char * s) { return "blk." + std::to_string(il) + "." + s; };
        vec(n("attn_norm.weight"), E, 1.0f);
        mat(n("attn_q.weight"), E, Q);
        mat(n("attn_k.weight"), E, KV);
        mat(n("attn_v.weight"), E, KV);
        mat(n("attn_output.weight"), Q, E);
        if (spec.arch == "qwen2") {
            vec(n("attn_q.bias"), Q, 0.0f);
            vec(n("attn_k.bias"), KV, 0.0f);
            vec(n("attn_v.bias"), KV, 0.0f);
        }
        if (spec.arch == "qwen3" || gemma3) {
            vec(n("attn_q_norm.weight"), head_dim, 1.0f);
            vec(n("attn_k_norm.weight"), head_dim, 1.0f);
        }
        if (gemma3) {
            vec(n("post_attention_norm.weight"), E, 1.0f);
            vec(n("post_ffw_norm.weight"), E, 1.0f);
        }
        vec(n("ffn_norm.weight"), E, 1.0f);
        mat(n("ffn_gate.weight"), E, F);
        mat(n("ffn_up.weight"), E, F);
        mat(n("ffn_down.weight"), F, E);
    }
    if (spec.tied_output) plan[0].scale = 3.0f * std::sqrt(3.0f / E);  // tied: embeddings double as lm_head

    write_tensors(out, plan, spec.seed, out_path);
}

void write_random_eagle_head(const RandomEagleSpec & spec, const std::string & out_path) {
    const RandomModelSpec & t = spec.target;
    const bool eagle3 = spec.kind == "eagle3";
    if (!eagle3 && spec.kind != "eagle1") throw Error("unknown head kind '" + spec.kind + "' (eagle1, eagle3)");
    const std::string arch = eagle3 ? "eagle3" : "specula-eagle1";
    gguf_context * out = gguf_init_empty();
    const int n_vocab = t.vocab_gguf.empty() ? t.n_vocab : copy_vocabulary(t.vocab_gguf, out);
    if (n_vocab <= 0) throw Error("a random EAGLE head needs its target's vocabulary GGUF or n_vocab");
    const int E = t.n_embd, D = E / spec.n_head;
    const std::string a = arch + ".";
    gguf_set_val_str(out, "general.architecture", arch.c_str());
    gguf_set_val_str(out, "general.name", ("specula random " + spec.kind).c_str());
    gguf_set_val_u32(out, (a + "block_count").c_str(), 1);
    gguf_set_val_u32(out, (a + "embedding_length").c_str(), E);
    gguf_set_val_u32(out, (a + "feed_forward_length").c_str(), spec.n_ff);
    gguf_set_val_u32(out, (a + "attention.head_count").c_str(), spec.n_head);
    gguf_set_val_u32(out, (a + "attention.head_count_kv").c_str(), spec.n_head_kv);
    gguf_set_val_u32(out, (a + "rope.dimension_count").c_str(), D);
    gguf_set_val_u32(out, (a + "context_length").c_str(), t.n_ctx);
    gguf_set_val_f32(out, (a + "attention.layer_norm_rms_epsilon").c_str(), 1e-5f);
    gguf_set_val_f32(out, (a + "rope.freq_base").c_str(), t.rope_freq_base);
    gguf_set_val_u32(out, (a + "vocab_size").c_str(), n_vocab);
    gguf_set_val_u32(out, (a + "target_hidden_size").c_str(), E);
    std::vector<int64_t> d2t;
    const int n_draft = eagle3 && spec.n_draft_vocab > 0 ? spec.n_draft_vocab : n_vocab;
    if (eagle3) {
        std::vector<int> layers = spec.target_layers.empty() ? std::vector<int>{1, t.n_layer / 2, t.n_layer} : spec.target_layers;
        gguf_set_arr_data(out, "eagle3.target_layers", GGUF_TYPE_INT32, layers.data(), layers.size());
        gguf_set_val_bool(out, "eagle3.norm_before_residual", false);
        if (n_draft < n_vocab) {  // every k-th target token, in increasing order
            for (int i = 0; i < n_draft; ++i) d2t.push_back(static_cast<int64_t>(i) * n_vocab / n_draft);
        }
    }
    std::vector<Planned> plan;
    auto mat = [&](std::string n, int64_t in, int64_t outd, float gain = 1.0f) {
        plan.push_back({n, GGML_TYPE_F32, in, outd, gain * std::sqrt(3.0f / in), 0.0f});
    };
    auto vec = [&](std::string n, int64_t len) { plan.push_back({n, GGML_TYPE_F32, len, 1, 0.1f, 1.0f}); };
    const int64_t Q = int64_t(spec.n_head) * D, KV = int64_t(spec.n_head_kv) * D, attn_in = eagle3 ? 2 * E : E;
    mat("fc.weight", eagle3 ? 3 * E : 2 * E, E);
    if (eagle3) {
        vec("blk.0.attn_norm.weight", E);
        vec("blk.0.attn_norm_2.weight", E);
    }
    mat("blk.0.attn_q.weight", attn_in, Q);
    mat("blk.0.attn_k.weight", attn_in, KV);
    mat("blk.0.attn_v.weight", attn_in, KV);
    mat("blk.0.attn_output.weight", Q, E);
    vec("blk.0.ffn_norm.weight", E);
    mat("blk.0.ffn_gate.weight", E, spec.n_ff);
    mat("blk.0.ffn_up.weight", E, spec.n_ff);
    mat("blk.0.ffn_down.weight", spec.n_ff, E);
    if (eagle3) {
        vec("output_norm.weight", E);
        mat("output.weight", E, n_draft, 3.0f);
    }
    write_tensors(out, plan, spec.seed, out_path, d2t, "d2t");
}

}  // namespace specula
