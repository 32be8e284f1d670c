#include "twin.h"

#include <array>
#include <cmath>
#include <cstring>
#include <functional>
#include <tuple>
#include <vector>

#include "specula/error.h"
#include "common/progress.h"
#include "ggml.h"
#include "gguf.h"
#include "gguf_edit.h"
#include "model_writer.h"
#include "runtime/gguf_file.h"
#include "runtime/gguf_validate.h"

namespace specula {

namespace {

ggml_type parse(const std::string & t) {
    if (t == "f16") return GGML_TYPE_F16;
    if (t == "f32") return GGML_TYPE_F32;
    if (t == "q8_0") return GGML_TYPE_Q8_0;
    if (t == "q4_0") return GGML_TYPE_Q4_0;
    throw Error("twin weight type must be f32, f16, q8_0 or q4_0 (got '" + t + "')");
}

}  // namespace

void write_bench_twin(const std::string & target_path, const std::string & shape_name, const std::string & weight_type,
                      const std::string & out_path) {
    GgufFile f(target_path);
    if (f.architecture() != "llama") throw Error(target_path + ": bench twins are made from llama models");
    const RandomModelSpec shape = bench_shape(shape_name, "");
    ModelConfig target;  // checked sizes: a hostile target is an Error here, not a division by zero
    read_layer_sizes(f, "llama.", target);
    const int Et = target.n_embd, Ht = target.n_head, KVt = target.n_head_kv, Ft = target.n_ff, D = target.head_dim;
    const int Lt = get_int_in(f, "llama.block_count", 1, kMaxModelDim);
    if (D * Ht != Et) throw Error(target_path + ": bench twins need heads x head size = width, the target has " + std::to_string(Ht) + " x " + std::to_string(D) + " != " + std::to_string(Et));
    const int E = shape.n_embd, L = shape.n_layer, H = shape.n_head, KV = shape.n_head_kv, F = shape.n_ff;
    const int Gt = Ht / KVt, G = H / KV;
    if (E / H != D) throw Error("twin shape has head size " + std::to_string(E / H) + ", the target " + std::to_string(D));
    for (auto [what, twin, tgt] : {std::tuple{"width", E, Et}, std::tuple{"layers", L, Lt}, std::tuple{"KV heads", KV, KVt},
                                   std::tuple{"query heads per KV head", G, Gt}, std::tuple{"FFN width", F, Ft}}) {
        if (twin < tgt) {
            throw Error("shape " + shape_name + " has " + std::to_string(twin) + " " + what + ", fewer than the target's " +
                        std::to_string(tgt) + " (30-layer targets such as SmolLM2 take smol-1b, smol-3b or smol-8b)");
        }
    }
    const int V = embedding_rows(f, "llama.vocab_size");
    const ggml_type wtype = parse(weight_type);
    const float norm_scale = std::sqrt(float(Et) / float(E));
    auto q_slot = [&](int head) { return (head / Gt) * G + head % Gt; };  // keeps each head's kv group

    gguf_context * out = metadata_of(target_path);
    gguf_set_val_str(out, "general.name", ("bench twin (" + shape_name + " shape) of " + target_path).c_str());
    gguf_set_val_u32(out, "llama.embedding_length", E);
    gguf_set_val_u32(out, "llama.block_count", L);
    gguf_set_val_u32(out, "llama.attention.head_count", H);
    gguf_set_val_u32(out, "llama.attention.head_count_kv", KV);
    gguf_set_val_u32(out, "llama.feed_forward_length", F);
    gguf_set_val_u32(out, "llama.rope.dimension_count", D);
    gguf_remove_key(out, "general.file_type");

    // Planned tensors: shapes first (to size one context), contents made one at a time.
    struct Planned {
        std::string name;
        int64_t ne0, ne1;
        ggml_type type;
        std::function<std::vector<float>()> make;
    };
    std::vector<Planned> plan;
    auto add = [&](const std::string & name, int64_t ne0, int64_t ne1, bool matrix, std::function<std::vector<float>()> make) {
        plan.push_back({name, ne0, ne1, matrix ? wtype : GGML_TYPE_F32, std::move(make)});
    };
    // W[n_out][n_in] with n_in = ne0: copy the target's rows/cols into a zero matrix through index maps.
    auto embed = [](const std::vector<float> & src, int in_t, int out_t, int n_in, int n_out, auto in_map, auto out_map) {
        std::vector<float> dst(static_cast<size_t>(n_in) * n_out, 0.0f);
        for (int o = 0; o < out_t; ++o) {
            for (int i = 0; i < in_t; ++i) dst[static_cast<size_t>(out_map(o)) * n_in + in_map(i)] = src[static_cast<size_t>(o) * in_t + i];
        }
        return dst;
    };
    auto id = [](int i) { return i; };
    auto q_row = [&](int r) { return q_slot(r / D) * D + r % D; };
    // The target's tensor, which must have the element count its metadata implies (indexed as such below).
    auto read_sized = [&](const std::string & name, int64_t n) {
        std::vector<float> w = read_f32(f, name);
        if (static_cast<int64_t>(w.size()) != n) {
            throw Error(target_path + ": tensor " + name + " has " + std::to_string(w.size()) + " elements, expected " + std::to_string(n));
        }
        return w;
    };
    auto norm = [&](const std::string & name) {
        std::vector<float> w = read_sized(name, Et), dst(E, norm_scale);
        for (int i = 0; i < Et; ++i) dst[i] = w[i] * norm_scale;
        return dst;
    };

    auto zeros = [](int64_t n) { return [n] { return std::vector<float>(static_cast<size_t>(n), 0.0f); }; };
    auto ones = [](int64_t n) { return [n] { return std::vector<float>(static_cast<size_t>(n), 1.0f); }; };
    auto from = [&](std::string name, int in_t, int out_t, int n_in, int n_out, std::function<int(int)> in_map, std::function<int(int)> out_map) {
        return [=, &read_sized] { return embed(read_sized(name, int64_t(in_t) * out_t), in_t, out_t, n_in, n_out, in_map, out_map); };
    };
    add("token_embd.weight", E, V, true, from("token_embd.weight", Et, V, E, V, id, id));
    add("output_norm.weight", E, 1, false, [&] { return norm("output_norm.weight"); });
    if (f.tensor_meta("output.weight")) add("output.weight", E, V, true, from("output.weight", Et, V, E, V, id, id));
    for (int l = 0; l < L; ++l) {
        const std::string p = "blk." + std::to_string(l) + ".";
        if (l < Lt) {
            add(p + "attn_norm.weight", E, 1, false, [&, p] { return norm(p + "attn_norm.weight"); });
            add(p + "attn_q.weight", E, H * D, true, from(p + "attn_q.weight", Et, Ht * D, E, H * D, id, q_row));
            add(p + "attn_k.weight", E, KV * D, true, from(p + "attn_k.weight", Et, KVt * D, E, KV * D, id, id));
            add(p + "attn_v.weight", E, KV * D, true, from(p + "attn_v.weight", Et, KVt * D, E, KV * D, id, id));
            add(p + "attn_output.weight", H * D, E, true, from(p + "attn_output.weight", Ht * D, Et, H * D, E, q_row, id));
            add(p + "ffn_norm.weight", E, 1, false, [&, p] { return norm(p + "ffn_norm.weight"); });
            add(p + "ffn_gate.weight", E, F, true, from(p + "ffn_gate.weight", Et, Ft, E, F, id, id));
            add(p + "ffn_up.weight", E, F, true, from(p + "ffn_up.weight", Et, Ft, E, F, id, id));
            add(p + "ffn_down.weight", F, E, true, from(p + "ffn_down.weight", Ft, Et, F, E, id, id));
        } else {  // identity layer: zero output projections, full-size compute
            add(p + "attn_norm.weight", E, 1, false, ones(E));
            add(p + "attn_q.weight", E, H * D, true, zeros(int64_t(E) * H * D));
            add(p + "attn_k.weight", E, KV * D, true, zeros(int64_t(E) * KV * D));
            add(p + "attn_v.weight", E, KV * D, true, zeros(int64_t(E) * KV * D));
            add(p + "attn_output.weight", H * D, E, true, zeros(int64_t(H) * D * E));
            add(p + "ffn_norm.weight", E, 1, false, ones(E));
            add(p + "ffn_gate.weight", E, F, true, zeros(int64_t(E) * F));
            add(p + "ffn_up.weight", E, F, true, zeros(int64_t(E) * F));
            add(p + "ffn_down.weight", F, E, true, zeros(int64_t(F) * E));
        }
    }

    size_t bytes = 1 << 20;
    for (const Planned & t : plan) bytes += ggml_row_size(t.type, t.ne0) * t.ne1 + 2 * ggml_tensor_overhead();
    ggml_init_params params{bytes, nullptr, false};
    ggml_context * ctx = ggml_init(params);
    Progress progress("writing " + out_path, static_cast<int64_t>(plan.size()));
    for (Planned & t : plan) {
        ggml_tensor * tensor = t.ne1 == 1 ? ggml_new_tensor_1d(ctx, t.type, t.ne0) : ggml_new_tensor_2d(ctx, t.type, t.ne0, t.ne1);
        ggml_set_name(tensor, t.name.c_str());
        const std::vector<float> data = t.make();
        if (t.type == GGML_TYPE_F32) {
            std::memcpy(tensor->data, data.data(), data.size() * sizeof(float));
        } else {
            ggml_quantize_chunk(t.type, data.data(), tensor->data, 0, t.ne1, t.ne0, nullptr);
        }
        gguf_add_tensor(out, tensor);
        progress.step(t.name);
    }
    write_gguf(out, ctx, out_path);
}

void write_bench_twin_eagle3(const std::string & head_path, const std::string & target_path, const std::string & shape_name,
                             const std::string & out_path) {
    GgufFile head(head_path), target(target_path);
    if (head.architecture() != "eagle3") throw Error(head_path + ": not an EAGLE-3 head");
    if (head.tensor_meta("token_embd.weight")) throw Error(head_path + ": head already has its own token embeddings");
    const RandomModelSpec shape = bench_shape(shape_name, "");
    const int Et = get_int_in(head, "eagle3.target_hidden_size", 1, kMaxModelDim);
    const int Eh = get_int_in(head, "eagle3.embedding_length", 1, kMaxModelDim);
    if (Et != get_int_in(target, "llama.embedding_length", 1, kMaxModelDim)) throw Error(head_path + ": head does not belong to " + target_path);
    embedding_rows(target, "llama.vocab_size");  // the target's embeddings exist and match its vocabulary
    if (Eh != Et) throw Error(head_path + ": the head's hidden size must equal its target's to take over its embeddings");
    const int E = shape.n_embd;

    gguf_context * out = metadata_of(head_path);
    gguf_set_val_u32(out, "eagle3.target_hidden_size", E);
    gguf_set_val_str(out, "general.name", ("EAGLE-3 head for the bench twin (" + shape_name + " shape) of " + target_path).c_str());

    // Each tensor as floats (to be written back in its stored type), or, for the integer vocabulary
    // maps of a compact draft vocabulary (d2t, t2d), its bytes as stored.
    struct Tensor {
        std::string name;
        std::array<int64_t, 2> ne;
        ggml_type type;
        std::vector<float> data;
        std::vector<uint8_t> raw;
    };
    std::vector<Tensor> tensors;
    for (ggml_tensor * t : head.tensors()) {
        const std::string name = ggml_get_name(t);
        if (ggml_n_dims(t) > 2) throw Error(head_path + ": tensor " + name + " has " + std::to_string(ggml_n_dims(t)) + " dimensions, expected at most 2");
        std::array<int64_t, 2> ne{t->ne[0], t->ne[1]};
        if (!ggml_get_type_traits(t->type)->to_float && t->type != GGML_TYPE_F32) {
            tensors.push_back({name, ne, t->type, {}, head.read_tensor_bytes(name)});
            continue;
        }
        std::vector<float> data = read_f32(head, name);
        if (name == "fc.weight") {  // [3 Et, Eh] -> [3 E, Eh]: each feature block padded with zeros
            if (ne[0] != 3 * int64_t(Et) || ne[1] != Eh) {
                throw Error(head_path + ": tensor fc.weight has shape [" + std::to_string(ne[0]) + ", " + std::to_string(ne[1]) + "], expected [" +
                            std::to_string(3 * int64_t(Et)) + ", " + std::to_string(Eh) + "]");
            }
            std::vector<float> wide(static_cast<size_t>(3) * E * Eh, 0.0f);
            for (int o = 0; o < Eh; ++o) {
                for (int b = 0; b < 3; ++b) {
                    for (int i = 0; i < Et; ++i) wide[static_cast<size_t>(o) * 3 * E + b * E + i] = data[static_cast<size_t>(o) * 3 * Et + b * Et + i];
                }
            }
            data = std::move(wide);
            ne = {3 * int64_t(E), Eh};
        }
        // Vectors stay F32; matrices keep their stored type where ggml can write it (a Q8_0 head
        // drafts at Q8_0 speed), else F16.
        const bool writable = ggml_get_type_traits(t->type)->from_float_ref != nullptr || t->type == GGML_TYPE_F16;
        const ggml_type type = ne[1] == 1 ? GGML_TYPE_F32 : writable ? t->type
                                                                     : GGML_TYPE_F16;
        tensors.push_back({name, ne, type, std::move(data), {}});
    }
    ggml_tensor * embd = target.tensor_meta("token_embd.weight");
    tensors.push_back({"token_embd.weight", {embd->ne[0], embd->ne[1]}, GGML_TYPE_F16, read_f32(target, "token_embd.weight"), {}});

    size_t bytes = 1 << 20;
    for (const Tensor & t : tensors) bytes += t.data.size() * sizeof(float) + t.raw.size() + 2 * ggml_tensor_overhead();
    ggml_init_params params{bytes, nullptr, false};
    ggml_context * ctx = ggml_init(params);
    Progress progress("writing " + out_path, static_cast<int64_t>(tensors.size()));
    for (const Tensor & src : tensors) {
        ggml_tensor * t = src.ne[1] > 1 ? ggml_new_tensor_2d(ctx, src.type, src.ne[0], src.ne[1]) : ggml_new_tensor_1d(ctx, src.type, src.ne[0]);
        ggml_set_name(t, src.name.c_str());
        if (!src.raw.empty()) {
            std::memcpy(t->data, src.raw.data(), src.raw.size());
        } else if (src.type == GGML_TYPE_F32) {
            std::memcpy(t->data, src.data.data(), src.data.size() * sizeof(float));
        } else {
            ggml_quantize_chunk(src.type, src.data.data(), t->data, 0, src.ne[1], src.ne[0], nullptr);
        }
        gguf_add_tensor(out, t);
        progress.step(src.name);
    }
    write_gguf(out, ctx, out_path);
}

}  // namespace specula
