#include "model_writer.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "common/error.h"
#include "ggml.h"
#include "gguf.h"

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
    if (t == "q4_k") return GGML_TYPE_Q4_K;
    if (t == "q6_k") return GGML_TYPE_Q6_K;
    throw Error("unknown weight type '" + t + "' (f32 f16 bf16 q8_0 q4_0 q4_k q6_k)");
}

}  // namespace

RandomModelSpec bench_shape(const std::string & name, const std::string & vocab_dir) {
    RandomModelSpec s;
    if (name == "llama-1b") {  // Llama-3.2-1B
        s.vocab_gguf = vocab_dir + "/ggml-vocab-llama-bpe.gguf";
        s.n_embd = 2048, s.n_layer = 16, s.n_head = 32, s.n_head_kv = 8, s.n_ff = 8192;
        s.tied_output = true, s.rope_freq_base = 500000.0f, s.n_ctx = 4096;
    } else if (name == "llama-100m") {
        s.vocab_gguf = vocab_dir + "/ggml-vocab-llama-spm.gguf";
        s.n_embd = 768, s.n_layer = 12, s.n_head = 12, s.n_head_kv = 4, s.n_ff = 2048, s.n_ctx = 4096;
    } else if (name == "tiny") {
        s.vocab_gguf = vocab_dir + "/ggml-vocab-llama-spm.gguf";
    } else {
        throw Error("unknown shape '" + name + "' (llama-1b, llama-100m, tiny)");
    }
    return s;
}

void write_random_model(const RandomModelSpec & spec, const std::string & out_path) {
    const ggml_type wtype = parse_type(spec.weight_type);
    if (spec.arch != "llama" && spec.arch != "qwen2" && spec.arch != "qwen3") throw Error("unknown arch '" + spec.arch + "'");
    const int head_dim = spec.head_dim > 0 ? spec.head_dim : spec.n_embd / spec.n_head;

    int n_vocab = spec.n_vocab;
    gguf_context * out = gguf_init_empty();
    if (!spec.vocab_gguf.empty()) {
        ggml_context * vocab_meta = nullptr;
        gguf_init_params vp{true, &vocab_meta};
        gguf_context * vocab = gguf_init_from_file(spec.vocab_gguf.c_str(), vp);
        if (!vocab) throw Error(spec.vocab_gguf + ": cannot read vocabulary GGUF");
        const int64_t tokens_key = gguf_find_key(vocab, "tokenizer.ggml.tokens");
        if (tokens_key < 0) throw Error(spec.vocab_gguf + ": has no tokenizer.ggml.tokens");
        n_vocab = static_cast<int>(gguf_get_arr_n(vocab, tokens_key));
        gguf_set_kv(out, vocab);  // every tokenizer.* key, as stored
        gguf_free(vocab);
        if (vocab_meta) ggml_free(vocab_meta);
    }
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

    // Count bytes for one context holding every tensor.
    struct Planned { std::string name; ggml_type type; int64_t ne0, ne1; float scale; float offset; };
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
        if (spec.arch == "qwen3") {
            vec(n("attn_q_norm.weight"), head_dim, 1.0f);
            vec(n("attn_k_norm.weight"), head_dim, 1.0f);
        }
        vec(n("ffn_norm.weight"), E, 1.0f);
        mat(n("ffn_gate.weight"), E, F);
        mat(n("ffn_up.weight"), E, F);
        mat(n("ffn_down.weight"), F, E);
    }
    if (spec.tied_output) plan[0].scale = 3.0f * std::sqrt(3.0f / E);  // tied: embeddings double as lm_head

    size_t bytes = 0;
    for (auto & p : plan) {
        if (p.type != GGML_TYPE_F32 && p.ne0 % ggml_blck_size(p.type) != 0) {
            throw Error("row length " + std::to_string(p.ne0) + " of " + p.name + " is not a multiple of the " +
                        ggml_type_name(p.type) + " block size");
        }
        bytes += ggml_row_size(p.type, p.ne0) * p.ne1 + 2 * ggml_tensor_overhead() + 64;  // + reshape view
    }
    ggml_init_params params{bytes + 1024, nullptr, false};
    ggml_context * ctx = ggml_init(params);
    SplitMix rng{spec.seed};
    std::vector<float> f32;
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
    }
    const bool ok = gguf_write_to_file(out, out_path.c_str(), false);
    gguf_free(out);
    ggml_free(ctx);
    if (!ok) throw Error(out_path + ": could not write");
}

}  // namespace specula
