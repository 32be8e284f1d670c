// specula convert-eagle: tiny hand-written HF-style EAGLE-1 / EAGLE-3 checkpoints (config.json +
// safetensors, F32 and BF16) converted against the llama_gqa_f32 fixture target. Checks: the GGUF
// loads as an EagleHead; every tensor round-trips (q/k rows permuted as llama.cpp's
// LlamaModel.permute, d2t absolute); a head forward equals a plain C++ computation of the
// checkpoint's HF semantics (rotate-half RoPE on the unpermuted weights); multi-file checkpoints;
// and malformed checkpoints fail with one clear line.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include "specula/error.h"
#include "eagle_convert.h"
#include "ggml.h"
#include "gguf.h"
#include "runtime/kv_cache.h"
#include "llama_oracle.h"
#include "runtime/backend.h"
#include "runtime/eagle_head.h"
#include "runtime/forward.h"
#include "runtime/gguf_file.h"
#include "runtime/model.h"
#include "test_models.h"
#include "tokenizer/tokenizer.h"

namespace specula {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using Vec = std::vector<float>;

constexpr int E = 64, NH = 4, NKV = 2, D = 16, FF = 96, V = 32000, NDRAFT = 200;
constexpr float EPS = 1e-5f, THETA = 10000.0f;

// ---------------------------------------------------------------- a tiny safetensors writer

struct StTensor {
    std::string dtype;
    std::vector<int64_t> shape;
    std::vector<uint8_t> bytes;
};

struct Checkpoint {
    json config;
    std::map<std::string, StTensor> tensors;
    std::map<std::string, Vec> values;  // exact float values (after BF16 rounding), by checkpoint name
};

uint64_t g_rng = 0x1234567;
float uniform() {  // [-1, 1)
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<float>(g_rng >> 40) * 0x1.0p-24f * 2.0f - 1.0f;
}

void add_float(Checkpoint & c, const std::string & name, std::vector<int64_t> shape, bool bf16, float scale, float offset = 0.0f) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    Vec v(n);
    StTensor t{bf16 ? "BF16" : "F32", shape, {}};
    for (auto & x : v) {
        x = offset + scale * uniform();
        if (bf16) {  // truncate to bf16 so the stored value is exact
            uint32_t bits;
            std::memcpy(&bits, &x, 4);
            bits &= 0xffff0000u;
            std::memcpy(&x, &bits, 4);
            const uint16_t hi = static_cast<uint16_t>(bits >> 16);
            t.bytes.push_back(hi & 0xff), t.bytes.push_back(hi >> 8);
        } else {
            uint8_t b[4];
            std::memcpy(b, &x, 4);
            t.bytes.insert(t.bytes.end(), b, b + 4);
        }
    }
    c.tensors[name] = std::move(t);
    c.values[name] = std::move(v);
}

void add_i64(Checkpoint & c, const std::string & name, const std::vector<int64_t> & v) {
    StTensor t{"I64", {static_cast<int64_t>(v.size())}, std::vector<uint8_t>(v.size() * 8)};
    std::memcpy(t.bytes.data(), v.data(), t.bytes.size());
    c.tensors[name] = std::move(t);
}

void write_safetensors(const std::string & path, const std::map<std::string, StTensor> & ts) {
    json h = json::object();
    h["__metadata__"] = {{"format", "pt"}};
    std::vector<uint8_t> data;
    for (const auto & [n, t] : ts) {
        h[n] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {data.size(), data.size() + t.bytes.size()}}};
        data.insert(data.end(), t.bytes.begin(), t.bytes.end());
    }
    write_safetensors_file(path, h.dump(), data);
}

// A fresh directory for one checkpoint. Per process: ctest -j runs test cases of this file at
// once, and two cases writing "e3" into one shared directory read each other's half-written files.
std::string fresh_checkpoint_dir(const std::string & name) {
    struct ProcessDir {
        std::string path = test::scratch_file("convert");
        ~ProcessDir() {
            std::error_code ec;
            fs::remove_all(path, ec);
        }
    };
    static const ProcessDir process_dir;
    const std::string dir = process_dir.path + "/" + name;
    fs::remove_all(dir);
    fs::create_directories(dir);
    return dir;
}

std::string write_checkpoint(const Checkpoint & c, const std::string & name, int n_shards = 1) {
    const std::string dir = fresh_checkpoint_dir(name);
    std::ofstream(dir + "/config.json") << c.config.dump(2);
    if (n_shards == 1) {
        write_safetensors(dir + "/model.safetensors", c.tensors);
        return dir;
    }
    std::vector<std::map<std::string, StTensor>> shards(n_shards);
    json index = {{"metadata", json::object()}, {"weight_map", json::object()}};
    int i = 0;
    for (const auto & [n, t] : c.tensors) {
        const int s = i++ % n_shards;
        shards[s][n] = t;
        index["weight_map"][n] = "model-0000" + std::to_string(s + 1) + "-of-0000" + std::to_string(n_shards) + ".safetensors";
    }
    for (int s = 0; s < n_shards; ++s) {
        write_safetensors(dir + "/model-0000" + std::to_string(s + 1) + "-of-0000" + std::to_string(n_shards) + ".safetensors", shards[s]);
    }
    std::ofstream(dir + "/model.safetensors.index.json") << index.dump(2);
    return dir;
}

json base_config() {
    return {{"architectures", {"LlamaForCausalLM"}}, {"hidden_size", E}, {"intermediate_size", FF}, {"num_attention_heads", NH}, {"num_key_value_heads", NKV}, {"num_hidden_layers", 1}, {"rms_norm_eps", EPS}, {"rope_theta", THETA}, {"max_position_embeddings", 2048}, {"vocab_size", V}, {"rope_scaling", nullptr}};
}

// Absolute target ids of the compact vocabulary (a permutation: 7919 is coprime to 32000).
int64_t draft_id(int i) { return (int64_t(i) * 7919 + 5) % V; }

Checkpoint eagle3_checkpoint(const std::string & layer_prefix = "midlayer.") {
    g_rng = 0xe3;
    Checkpoint c;
    c.config = base_config();
    c.config["architectures"] = {"LlamaForCausalLMEagle3"};
    c.config["draft_vocab_size"] = NDRAFT;
    c.config["eagle_aux_hidden_state_layer_ids"] = {0, 1, 2};
    const std::string p = layer_prefix;
    add_float(c, "fc.weight", {E, 3 * E}, false, std::sqrt(3.0f / (3 * E)));
    add_float(c, p + "input_layernorm.weight", {E}, false, 0.2f, 1.0f);
    add_float(c, p + "hidden_norm.weight", {E}, true, 0.2f, 1.0f);
    add_float(c, p + "self_attn.q_proj.weight", {NH * D, 2 * E}, false, 2.0f * std::sqrt(3.0f / (2 * E)));
    add_float(c, p + "self_attn.k_proj.weight", {NKV * D, 2 * E}, true, 2.0f * std::sqrt(3.0f / (2 * E)));
    add_float(c, p + "self_attn.v_proj.weight", {NKV * D, 2 * E}, false, std::sqrt(3.0f / (2 * E)));
    add_float(c, p + "self_attn.o_proj.weight", {E, NH * D}, false, std::sqrt(3.0f / E));
    add_float(c, p + "post_attention_layernorm.weight", {E}, false, 0.2f, 1.0f);
    add_float(c, p + "mlp.gate_proj.weight", {FF, E}, true, std::sqrt(3.0f / E));
    add_float(c, p + "mlp.up_proj.weight", {FF, E}, false, std::sqrt(3.0f / E));
    add_float(c, p + "mlp.down_proj.weight", {E, FF}, false, std::sqrt(3.0f / FF));
    add_float(c, "norm.weight", {E}, false, 0.2f, 1.0f);
    add_float(c, "lm_head.weight", {NDRAFT, E}, false, 3.0f * std::sqrt(3.0f / E));
    std::vector<int64_t> d2t(NDRAFT);
    for (int i = 0; i < NDRAFT; ++i) d2t[i] = draft_id(i) - i;  // offsets, as EAGLE-3 checkpoints store them
    add_i64(c, "d2t", d2t);
    StTensor t2d{"BOOL", {V}, std::vector<uint8_t>(V, 0)};
    for (int i = 0; i < NDRAFT; ++i) t2d.bytes[draft_id(i)] = 1;
    c.tensors["t2d"] = t2d;
    return c;
}

Checkpoint eagle1_checkpoint() {
    g_rng = 0xe1;
    Checkpoint c;
    c.config = base_config();
    add_float(c, "fc.weight", {E, 2 * E}, false, std::sqrt(3.0f / (2 * E)));
    add_float(c, "fc.bias", {E}, false, 0.1f);
    add_float(c, "layers.0.self_attn.q_proj.weight", {NH * D, E}, true, 2.0f * std::sqrt(3.0f / E));
    add_float(c, "layers.0.self_attn.k_proj.weight", {NKV * D, E}, false, 2.0f * std::sqrt(3.0f / E));
    add_float(c, "layers.0.self_attn.v_proj.weight", {NKV * D, E}, false, std::sqrt(3.0f / E));
    add_float(c, "layers.0.self_attn.o_proj.weight", {E, NH * D}, true, std::sqrt(3.0f / E));
    add_float(c, "layers.0.post_attention_layernorm.weight", {E}, false, 0.2f, 1.0f);
    add_float(c, "layers.0.mlp.gate_proj.weight", {FF, E}, false, std::sqrt(3.0f / E));
    add_float(c, "layers.0.mlp.up_proj.weight", {FF, E}, false, std::sqrt(3.0f / E));
    add_float(c, "layers.0.mlp.down_proj.weight", {E, FF}, false, std::sqrt(3.0f / FF));
    add_float(c, "embed_tokens.weight", {V, E}, true, 0.5f);  // dropped by the converter
    return c;
}

std::string target_path() { return test::model_path("llama_gqa_f32"); }

std::string convert(const std::string & kind, const std::string & dir, const std::string & type = "f32") {
    const std::string out = dir + "-" + type + ".gguf";
    convert_eagle(EagleConvertOptions{kind, dir, target_path(), out, type});
    return out;
}

// ---------------------------------------------------------------- reading the GGUF back

struct Gguf {
    gguf_context * g = nullptr;
    ggml_context * ctx = nullptr;
    explicit Gguf(const std::string & path) {
        gguf_init_params p{false, &ctx};
        g = gguf_init_from_file(path.c_str(), p);
        if (!g) throw Error(path + ": cannot read");
    }
    ~Gguf() {
        gguf_free(g);
        ggml_free(ctx);
    }
    ggml_tensor * tensor(const std::string & n) const { return ggml_get_tensor(ctx, n.c_str()); }
    Vec floats(const std::string & n) const {
        ggml_tensor * t = tensor(n);
        if (!t) throw Error("no tensor " + n);
        Vec v(ggml_nelements(t));
        if (t->type == GGML_TYPE_F32) std::memcpy(v.data(), t->data, v.size() * 4);
        else ggml_get_type_traits(t->type)->to_float(t->data, v.data(), static_cast<int64_t>(v.size()));
        return v;
    }
};

// llama.cpp's permute, written out: out row h*D + 2i + j holds HF row h*D + j*D/2 + i.
Vec permuted(const Vec & w, int n_head, int64_t cols) {
    Vec out(w.size());
    const int64_t d = static_cast<int64_t>(w.size()) / cols / n_head;
    for (int64_t h = 0; h < n_head; ++h)
        for (int64_t i = 0; i < d / 2; ++i)
            for (int64_t j = 0; j < 2; ++j)
                for (int64_t col = 0; col < cols; ++col) out[((h * d) + 2 * i + j) * cols + col] = w[((h * d) + j * d / 2 + i) * cols + col];
    return out;
}

// ---------------------------------------------------------------- the HF computation, by hand

Vec matvec(const Vec & w, const Vec & x) {  // w: [rows, x.size()]
    const size_t cols = x.size(), rows = w.size() / cols;
    Vec y(rows, 0.0f);
    for (size_t r = 0; r < rows; ++r) {
        double s = 0.0;
        for (size_t c = 0; c < cols; ++c) s += double(w[r * cols + c]) * x[c];
        y[r] = static_cast<float>(s);
    }
    return y;
}

Vec rms_norm(const Vec & x, const Vec & w, float eps) {
    double ss = 0.0;
    for (float v : x) ss += double(v) * v;
    const float s = 1.0f / std::sqrt(static_cast<float>(ss / x.size()) + eps);
    Vec y(x.size());
    for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * s * w[i];
    return y;
}

bool g_wrong_rope = false;  // negative control: adjacent pairs on the HF rows (what skipping the permutation runs)

void rope_rotate_half(float * v, int pos) {  // HF apply_rotary_pos_emb on one head
    if (g_wrong_rope) {
        for (int i = 0; i < D / 2; ++i) {
            const double th = pos * std::pow(double(THETA), -2.0 * i / D);
            const float c = static_cast<float>(std::cos(th)), s = static_cast<float>(std::sin(th));
            const float a = v[2 * i], b = v[2 * i + 1];
            v[2 * i] = a * c - b * s;
            v[2 * i + 1] = b * c + a * s;
        }
        return;
    }
    for (int i = 0; i < D / 2; ++i) {
        const double th = pos * std::pow(double(THETA), -2.0 * i / D);
        const float c = static_cast<float>(std::cos(th)), s = static_cast<float>(std::sin(th));
        const float a = v[i], b = v[i + D / 2];
        v[i] = a * c - b * s;
        v[i + D / 2] = b * c + a * s;
    }
}

// Causal GQA self-attention over rows xs (positions 0..n-1), HF LlamaAttention semantics.
std::vector<Vec> attention(const std::map<std::string, Vec> & w, const std::string & p, const std::vector<Vec> & xs) {
    const int n = static_cast<int>(xs.size());
    std::vector<Vec> q(n), k(n), v(n), out(n);
    for (int t = 0; t < n; ++t) {
        q[t] = matvec(w.at(p + "self_attn.q_proj.weight"), xs[t]);
        k[t] = matvec(w.at(p + "self_attn.k_proj.weight"), xs[t]);
        v[t] = matvec(w.at(p + "self_attn.v_proj.weight"), xs[t]);
        for (int h = 0; h < NH; ++h) rope_rotate_half(q[t].data() + h * D, t);
        for (int h = 0; h < NKV; ++h) rope_rotate_half(k[t].data() + h * D, t);
    }
    for (int t = 0; t < n; ++t) {
        Vec heads(NH * D, 0.0f);
        for (int h = 0; h < NH; ++h) {
            const int kh = h / (NH / NKV);
            std::vector<double> s(t + 1);
            double mx = -1e30, sum = 0.0;
            for (int u = 0; u <= t; ++u) {
                double d = 0.0;
                for (int i = 0; i < D; ++i) d += double(q[t][h * D + i]) * k[u][kh * D + i];
                s[u] = d / std::sqrt(double(D));
                mx = std::max(mx, s[u]);
            }
            for (auto & x : s) sum += (x = std::exp(x - mx));
            for (int u = 0; u <= t; ++u)
                for (int i = 0; i < D; ++i) heads[h * D + i] += static_cast<float>(s[u] / sum * v[u][kh * D + i]);
        }
        out[t] = matvec(w.at(p + "self_attn.o_proj.weight"), heads);
    }
    return out;
}

Vec mlp(const std::map<std::string, Vec> & w, const std::string & p, const Vec & x) {
    Vec g = matvec(w.at(p + "mlp.gate_proj.weight"), x), u = matvec(w.at(p + "mlp.up_proj.weight"), x);
    for (size_t i = 0; i < g.size(); ++i) g[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
    return matvec(w.at(p + "mlp.down_proj.weight"), g);
}

Vec add(Vec a, const Vec & b) {
    for (size_t i = 0; i < a.size(); ++i) a[i] += b[i];
    return a;
}

Vec cat(Vec a, const Vec & b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
}

const std::vector<int32_t> kTokens = {822, 5713, 29898, 29876, 1125, 13};

struct Fixture {
    Backend backend{BackendOptions{"cpu", 1}};
    std::unique_ptr<Model> target = Model::load(target_path(), backend);
    Vec embd(int32_t tok) {
        static Vec table;
        if (table.empty()) {
            GgufFile f(target_path());
            auto raw = f.read_tensor_bytes("token_embd.weight");
            table.resize(raw.size() / 4);
            std::memcpy(table.data(), raw.data(), raw.size());
        }
        return Vec(table.begin() + int64_t(tok) * E, table.begin() + int64_t(tok + 1) * E);
    }
    // Runs the converted head over (kTokens[i], features[i]); returns pre-norm outputs and logits of every row.
    ForwardOutput run(const std::string & head_path, const std::vector<Vec> & features) {
        auto head = EagleHead::load(head_path, *target, backend);
        std::vector<int32_t> rows;
        for (size_t i = 0; i < kTokens.size(); ++i) rows.push_back(static_cast<int32_t>(i));
        ForwardBatch b = ForwardBatch::causal(kTokens, 0, rows);
        for (const auto & f : features) b.hidden_in.insert(b.hidden_in.end(), f.begin(), f.end());
        KvCache cache(backend, 1, head->shape().n_embd_kv, 64);
        ModelRunner runner(*head);
        return runner.forward(b, cache);
    }
};

std::vector<Vec> random_features(int width) {
    std::vector<Vec> f(kTokens.size(), Vec(width));
    for (auto & row : f)
        for (auto & x : row) x = 2.0f * uniform();
    return f;
}

// ---------------------------------------------------------------- tests

TEST(Convert, Eagle3TensorsRoundTripWithPermutedQkAndAbsoluteD2t) {
    const Checkpoint c = eagle3_checkpoint();
    const std::string out = convert("eagle3", write_checkpoint(c, "e3"));
    Gguf g(out);
    EXPECT_EQ(std::string(gguf_get_val_str(g.g, gguf_find_key(g.g, "general.architecture"))), "eagle3");
    const int64_t tl = gguf_find_key(g.g, "eagle3.target_layers");
    ASSERT_GE(tl, 0);
    ASSERT_EQ(gguf_get_arr_type(g.g, tl), GGUF_TYPE_INT32);
    const int32_t * layers = static_cast<const int32_t *>(gguf_get_arr_data(g.g, tl));
    EXPECT_EQ(std::vector<int32_t>(layers, layers + gguf_get_arr_n(g.g, tl)), (std::vector<int32_t>{0, 1, 2}));
    EXPECT_EQ(gguf_get_val_u32(g.g, gguf_find_key(g.g, "eagle3.target_hidden_size")), uint32_t(E));
    EXPECT_EQ(gguf_get_val_u32(g.g, gguf_find_key(g.g, "eagle3.vocab_size")), uint32_t(V));
    EXPECT_EQ(gguf_get_val_u32(g.g, gguf_find_key(g.g, "eagle3.rope.dimension_count")), uint32_t(D));
    EXPECT_FALSE(gguf_get_val_bool(g.g, gguf_find_key(g.g, "eagle3.norm_before_residual")));
    EXPECT_EQ(gguf_get_arr_n(g.g, gguf_find_key(g.g, "tokenizer.ggml.tokens")), size_t(V));
    EXPECT_LT(gguf_find_key(g.g, "llama.block_count"), 0) << "only the target's tokenizer.* keys are copied";

    const std::map<std::string, std::string> plain = {
        {"fc.weight", "fc.weight"},
        {"blk.0.attn_norm.weight", "midlayer.input_layernorm.weight"},
        {"blk.0.attn_norm_2.weight", "midlayer.hidden_norm.weight"},
        {"blk.0.attn_v.weight", "midlayer.self_attn.v_proj.weight"},
        {"blk.0.attn_output.weight", "midlayer.self_attn.o_proj.weight"},
        {"blk.0.ffn_norm.weight", "midlayer.post_attention_layernorm.weight"},
        {"blk.0.ffn_gate.weight", "midlayer.mlp.gate_proj.weight"},
        {"blk.0.ffn_up.weight", "midlayer.mlp.up_proj.weight"},
        {"blk.0.ffn_down.weight", "midlayer.mlp.down_proj.weight"},
        {"output_norm.weight", "norm.weight"},
        {"output.weight", "lm_head.weight"}};
    for (const auto & [gname, hf] : plain) EXPECT_EQ(test::max_abs_diff(g.floats(gname), c.values.at(hf)), 0.0) << gname;
    EXPECT_EQ(test::max_abs_diff(g.floats("blk.0.attn_q.weight"), permuted(c.values.at("midlayer.self_attn.q_proj.weight"), NH, 2 * E)), 0.0);
    EXPECT_EQ(test::max_abs_diff(g.floats("blk.0.attn_k.weight"), permuted(c.values.at("midlayer.self_attn.k_proj.weight"), NKV, 2 * E)), 0.0);
    EXPECT_NE(test::max_abs_diff(g.floats("blk.0.attn_q.weight"), c.values.at("midlayer.self_attn.q_proj.weight")), 0.0);
    ggml_tensor * q = g.tensor("blk.0.attn_q.weight");
    EXPECT_EQ(q->ne[0], 2 * E);
    EXPECT_EQ(q->ne[1], NH * D);

    ggml_tensor * d2t = g.tensor("d2t");
    ASSERT_TRUE(d2t);
    ASSERT_EQ(d2t->type, GGML_TYPE_I64);
    ASSERT_EQ(d2t->ne[0], NDRAFT);
    for (int i = 0; i < NDRAFT; ++i) ASSERT_EQ(static_cast<const int64_t *>(d2t->data)[i], draft_id(i)) << i;
    EXPECT_FALSE(g.tensor("t2d"));
    EXPECT_FALSE(g.tensor("token_embd.weight"));

    // Default type f16: matrices F16, norms F32; q8_0 quantizes matrices.
    Gguf h(convert("eagle3", write_checkpoint(c, "e3"), "f16"));
    EXPECT_EQ(h.tensor("fc.weight")->type, GGML_TYPE_F16);
    EXPECT_EQ(h.tensor("blk.0.attn_norm.weight")->type, GGML_TYPE_F32);
    EXPECT_LT(test::max_abs_diff(h.floats("blk.0.attn_k.weight"), g.floats("blk.0.attn_k.weight")), 2e-3);
    Gguf q8(convert("eagle3", write_checkpoint(c, "e3"), "q8_0"));
    EXPECT_EQ(q8.tensor("fc.weight")->type, GGML_TYPE_Q8_0);
    EXPECT_LT(test::max_abs_diff(q8.floats("fc.weight"), g.floats("fc.weight")), 1e-2);
}

// Max |specula - reference| over every row of `got` (hidden_out, and logits when given), and the
// reference's magnitude. The KV cache is F16, so agreement is to ~1e-3 relative, not exact.
struct Agreement {
    double hidden = 0.0, logits = 0.0, scale = 0.0;
};

Agreement compare(const ForwardOutput & got, const std::vector<Vec> & hidden, const std::vector<Vec> & logits) {
    Agreement a;
    for (size_t t = 0; t < hidden.size(); ++t) {
        a.hidden = std::max(a.hidden, test::max_abs_diff(Vec(got.hidden_out.begin() + t * E, got.hidden_out.begin() + (t + 1) * E), hidden[t]));
        for (float v : hidden[t]) a.scale = std::max(a.scale, double(std::fabs(v)));
        if (!logits.empty()) {
            auto row = got.logits_row(t);
            a.logits = std::max(a.logits, test::max_abs_diff(Vec(row.begin(), row.end()), logits[t]));
        }
    }
    return a;
}

// The checkpoint's EAGLE-3 layer as the HF/EAGLE code computes it, for rows (kTokens[t], feats[t]).
template <class Fx>
void eagle3_reference(Fx & f, const Checkpoint & c, const std::vector<Vec> & feats, std::vector<Vec> & hidden, std::vector<Vec> & logits) {
    const auto & w = c.values;
    const std::string p = "midlayer.";
    std::vector<Vec> gs, cats;
    for (size_t t = 0; t < kTokens.size(); ++t) {
        gs.push_back(matvec(w.at("fc.weight"), feats[t]));
        cats.push_back(cat(rms_norm(f.embd(kTokens[t]), w.at(p + "input_layernorm.weight"), EPS), rms_norm(gs[t], w.at(p + "hidden_norm.weight"), EPS)));
    }
    const auto attn = attention(w, p, cats);
    for (size_t t = 0; t < kTokens.size(); ++t) {
        Vec x = add(gs[t], attn[t]);  // residual from g (norm_before_residual = false)
        x = add(x, mlp(w, p, rms_norm(x, w.at(p + "post_attention_layernorm.weight"), EPS)));
        logits.push_back(matvec(w.at("lm_head.weight"), rms_norm(x, w.at("norm.weight"), EPS)));
        hidden.push_back(std::move(x));
    }
}

TEST(Convert, Eagle3HeadForwardMatchesTheCheckpointsHfSemantics) {
    Fixture f;
    const Checkpoint c = eagle3_checkpoint();
    const std::string out = convert("eagle3", write_checkpoint(c, "e3"));
    auto head = EagleHead::load(out, *f.target, f.backend);
    EXPECT_EQ(head->config().target_layers, (std::vector<int>{0, 1, 2}));
    EXPECT_EQ(head->config().n_draft_vocab, NDRAFT);
    ASSERT_EQ(head->d2t().size(), size_t(NDRAFT));
    EXPECT_EQ(head->d2t()[17], draft_id(17));

    g_rng = 99;
    const auto feats = random_features(3 * E);
    const ForwardOutput got = f.run(out, feats);
    ASSERT_EQ(got.n_vocab, NDRAFT);
    auto reference = [&](std::vector<Vec> & hidden, std::vector<Vec> & logits) { eagle3_reference(f, c, feats, hidden, logits); };
    std::vector<Vec> hidden, logits, wrong_hidden, wrong_logits;
    reference(hidden, logits);
    g_wrong_rope = true;
    reference(wrong_hidden, wrong_logits);
    g_wrong_rope = false;
    const Agreement ok = compare(got, hidden, logits), wrong = compare(got, wrong_hidden, wrong_logits);
    std::printf("eagle3: |specula - HF reference| hidden %.2e logits %.2e (scale %.2f); without the q/k permutation it would be %.2e / %.2e\n",
                ok.hidden, ok.logits, ok.scale, wrong.hidden, wrong.logits);
    EXPECT_LT(ok.hidden, 5e-3 * ok.scale);
    EXPECT_LT(ok.logits, 5e-3 * ok.scale);
    EXPECT_GT(wrong.hidden, 10 * ok.hidden) << "the check cannot tell the RoPE layouts apart";
}

// llama.cpp v0.5.0 itself runs the converted eagle3 GGUF (encoder fc, then the decoder on (token, g)
// pairs, as tests/test_eagle.cpp drives it) and its logits, scattered to target ids through d2t,
// equal the checkpoint's HF semantics.
TEST(Convert, LlamaCppRunsTheConvertedEagle3Head) {
    Fixture f;
    const Checkpoint c = eagle3_checkpoint();
    const std::string head_path = convert("eagle3", write_checkpoint(c, "e3"));
    g_rng = 99;
    const auto feats = random_features(3 * E);
    std::vector<Vec> hidden, logits;
    eagle3_reference(f, c, feats, hidden, logits);
    const int n = static_cast<int>(kTokens.size());

    Vec features;
    for (const auto & row : feats) features.insert(features.end(), row.begin(), row.end());
    int n_vocab = 0;
    const std::vector<float> llama_logits = llama_eagle3_logits(target_path(), head_path, kTokens, features, /*flash_attn=*/true, n_vocab);
    ASSERT_EQ(n_vocab, V);
    double diff = 0.0, scale = 0.0;
    int finite = 0;
    for (int i = 0; i < n; ++i) {
        const float * ref = llama_logits.data() + static_cast<size_t>(i) * V;  // target vocabulary, d2t-scattered
        for (int v = 0; v < V; ++v) finite += std::isfinite(ref[v]) ? 1 : 0;
        Vec scattered;  // llama.cpp's logits of the draft tokens, in draft order
        for (int k = 0; k < NDRAFT; ++k) {
            scattered.push_back(ref[draft_id(k)]);
            scale = std::max(scale, double(std::fabs(logits[i][k])));
        }
        diff = std::max(diff, test::max_abs_diff(scattered, logits[i]));
    }
    std::printf("eagle3 in llama.cpp: |llama.cpp - HF reference| logits %.2e (scale %.2f)\n", diff, scale);
    EXPECT_EQ(finite, n * NDRAFT) << "llama.cpp should score exactly the d2t ids";
    EXPECT_LT(diff, 5e-3 * scale);
}

TEST(Convert, Eagle1HeadForwardMatchesTheCheckpointsHfSemantics) {
    Fixture f;
    const Checkpoint c = eagle1_checkpoint();
    const std::string out = convert("eagle1", write_checkpoint(c, "e1"));
    Gguf g(out);
    EXPECT_EQ(std::string(gguf_get_val_str(g.g, gguf_find_key(g.g, "general.architecture"))), "specula-eagle1");
    EXPECT_EQ(gguf_get_val_u32(g.g, gguf_find_key(g.g, "specula-eagle1.target_hidden_size")), uint32_t(E));
    EXPECT_EQ(test::max_abs_diff(g.floats("fc.bias"), c.values.at("fc.bias")), 0.0);
    EXPECT_EQ(test::max_abs_diff(g.floats("blk.0.attn_q.weight"), permuted(c.values.at("layers.0.self_attn.q_proj.weight"), NH, E)), 0.0);
    EXPECT_EQ(test::max_abs_diff(g.floats("blk.0.attn_k.weight"), permuted(c.values.at("layers.0.self_attn.k_proj.weight"), NKV, E)), 0.0);
    EXPECT_EQ(test::max_abs_diff(g.floats("blk.0.attn_output.weight"), c.values.at("layers.0.self_attn.o_proj.weight")), 0.0);
    EXPECT_FALSE(g.tensor("token_embd.weight")) << "EAGLE-1 uses the target's embeddings";
    EXPECT_FALSE(g.tensor("blk.0.attn_norm.weight"));
    EXPECT_EQ(gguf_get_n_tensors(g.g), 10);

    g_rng = 77;
    const auto feats = random_features(E);
    const ForwardOutput got = f.run(out, feats);
    const auto & w = c.values;
    const std::string p = "layers.0.";
    auto reference = [&](std::vector<Vec> & hidden) {
        std::vector<Vec> xs;
        for (size_t t = 0; t < kTokens.size(); ++t) {
            xs.push_back(add(matvec(w.at("fc.weight"), cat(f.embd(kTokens[t]), feats[t])), w.at("fc.bias")));  // fc([emb; f])
        }
        const auto attn = attention(w, p, xs);  // no input_layernorm in EAGLE-1's layer 0
        for (size_t t = 0; t < kTokens.size(); ++t) {
            Vec x = add(xs[t], attn[t]);
            hidden.push_back(add(x, mlp(w, p, rms_norm(x, w.at(p + "post_attention_layernorm.weight"), EPS))));
        }
    };
    std::vector<Vec> hidden, wrong_hidden;
    reference(hidden);
    g_wrong_rope = true;
    reference(wrong_hidden);
    g_wrong_rope = false;
    const Agreement ok = compare(got, hidden, {}), wrong = compare(got, wrong_hidden, {});
    std::printf("eagle1: |specula - HF reference| hidden %.2e (scale %.2f); without the q/k permutation it would be %.2e\n", ok.hidden,
                ok.scale, wrong.hidden);
    EXPECT_LT(ok.hidden, 5e-3 * ok.scale);
    EXPECT_GT(wrong.hidden, 10 * ok.hidden) << "the check cannot tell the RoPE layouts apart";
}

TEST(Convert, ShardedAndSpeculatorsStyleCheckpointsGiveTheSameFile) {
    const Checkpoint c = eagle3_checkpoint();
    Gguf one(convert("eagle3", write_checkpoint(c, "e3")));
    Gguf sharded(convert("eagle3", write_checkpoint(c, "e3_sharded", 3)));
    // RedHat speculators: layers.0.* names and the layer's sizes nested in transformer_layer_config.
    Checkpoint s = eagle3_checkpoint("layers.0.");
    json inner = s.config;
    s.config = {{"architectures", {"Eagle3Speculator"}}, {"draft_vocab_size", NDRAFT}, {"transformer_layer_config", inner}, {"eagle_aux_hidden_state_layer_ids", {0, 1, 2}}};
    Gguf spec(convert("eagle3", write_checkpoint(s, "e3_speculators")));
    ASSERT_EQ(gguf_get_n_tensors(one.g), gguf_get_n_tensors(sharded.g));
    ASSERT_EQ(gguf_get_n_tensors(one.g), gguf_get_n_tensors(spec.g));
    for (int64_t i = 0; i < gguf_get_n_tensors(one.g); ++i) {
        const std::string n = gguf_get_tensor_name(one.g, i);
        if (n == "d2t") continue;
        EXPECT_EQ(test::max_abs_diff(one.floats(n), sharded.floats(n)), 0.0) << n;
        EXPECT_EQ(test::max_abs_diff(one.floats(n), spec.floats(n)), 0.0) << n;
    }
}

TEST(Convert, Eagle3NormFlagsAndInputNormPassThrough) {
    Fixture f;
    Checkpoint c = eagle3_checkpoint();
    c.config["norm_before_fc"] = true;
    c.config["norm_before_residual"] = true;
    EXPECT_NE(test::error_message([&] { convert("eagle3", write_checkpoint(c, "e3_nofc")); }).find("missing tensor input_norm.weight"), std::string::npos);
    add_float(c, "input_norm.weight", {3 * E}, false, 0.2f, 1.0f);
    const std::string out = convert("eagle3", write_checkpoint(c, "e3_fc"));
    Gguf g(out);
    EXPECT_TRUE(gguf_get_val_bool(g.g, gguf_find_key(g.g, "eagle3.norm_before_fc")));
    EXPECT_TRUE(gguf_get_val_bool(g.g, gguf_find_key(g.g, "eagle3.norm_before_residual")));
    EXPECT_EQ(test::max_abs_diff(g.floats("enc.output_norm.weight"), c.values.at("input_norm.weight")), 0.0);
    auto head = EagleHead::load(out, *f.target, f.backend);
    EXPECT_TRUE(head->config().norm_before_fc);
    EXPECT_TRUE(head->config().norm_before_residual);
}

TEST(Convert, MalformedCheckpointsFailWithOneClearLine) {
    auto fails = [](const std::string & kind, const Checkpoint & c, const std::string & name) {
        const std::string dir = write_checkpoint(c, name);
        return test::error_message([&] { convert(kind, dir); });
    };
    auto has = [](const std::string & msg, const std::string & want) {
        return msg.find(want) != std::string::npos && msg.find('\n') == std::string::npos;
    };
    {
        Checkpoint c = eagle3_checkpoint();
        c.tensors.erase("midlayer.mlp.down_proj.weight");
        const std::string m = fails("eagle3", c, "bad_missing");
        EXPECT_TRUE(has(m, "missing tensor midlayer.mlp.down_proj.weight")) << m;
    }
    {
        Checkpoint c = eagle1_checkpoint();
        c.config["hidden_size"] = 32;
        const std::string m = fails("eagle1", c, "bad_hidden");
        EXPECT_TRUE(has(m, "hidden_size is 32 but the target")) << m;
        EXPECT_TRUE(has(m, "has hidden size 64")) << m;
    }
    {
        Checkpoint c = eagle3_checkpoint();
        c.config["target_hidden_size"] = 128;
        EXPECT_TRUE(has(fails("eagle3", c, "bad_target_hidden"), "target_hidden_size is 128")) << fails("eagle3", c, "bad_target_hidden");
    }
    {
        Checkpoint c = eagle3_checkpoint();
        c.tensors["midlayer.self_attn.q_proj.weight"].shape = {2 * E, E};  // same byte count, wrong shape
        const std::string m = fails("eagle3", c, "bad_shape");
        EXPECT_TRUE(has(m, "midlayer.self_attn.q_proj.weight has shape [128, 64], expected [64, 128]")) << m;
    }
    {
        Checkpoint c = eagle3_checkpoint();
        std::vector<int64_t> d2t(NDRAFT, 0);
        d2t[NDRAFT - 1] = V;  // absolute id V + 199
        add_i64(c, "d2t", d2t);
        EXPECT_TRUE(has(fails("eagle3", c, "bad_d2t_range"), "outside the target vocabulary of 32000")) << fails("eagle3", c, "bad_d2t_range");
        d2t.assign(NDRAFT, 0);
        d2t[5] = -1;  // 5 - 1 = 4 = d2t[4] + 4
        add_i64(c, "d2t", d2t);
        EXPECT_TRUE(has(fails("eagle3", c, "bad_d2t_dup"), "d2t maps two draft tokens to target id 4")) << fails("eagle3", c, "bad_d2t_dup");
    }
    {
        Checkpoint c = eagle3_checkpoint();
        c.tensors["norm.weight"].dtype = "F8_E4M3";
        c.tensors["norm.weight"].bytes.resize(E);
        EXPECT_TRUE(has(fails("eagle3", c, "bad_dtype"), "norm.weight has unsupported dtype F8_E4M3")) << fails("eagle3", c, "bad_dtype");
    }
    {
        Checkpoint c = eagle3_checkpoint();
        c.config.erase("eagle_aux_hidden_state_layer_ids");  // default [2, L/2, L-3] on a 2-layer target
        EXPECT_TRUE(has(fails("eagle3", c, "bad_layers"), "default target layers [2, L/2, L-3] include layer -1")) << fails("eagle3", c, "bad_layers");
    }
    {
        Checkpoint c = eagle3_checkpoint();
        c.config["vocab_size"] = 128256;
        EXPECT_TRUE(has(fails("eagle3", c, "bad_vocab"), "vocab_size is 128256 but the target")) << fails("eagle3", c, "bad_vocab");
    }
    {
        Checkpoint c = eagle1_checkpoint();
        add_float(c, "layers.0.input_layernorm.weight", {E}, false, 0.1f, 1.0f);
        EXPECT_TRUE(has(fails("eagle1", c, "bad_e1_norm"), "unexpected tensor layers.0.input_layernorm.weight")) << fails("eagle1", c, "bad_e1_norm");
    }
    {
        const std::string dir = fresh_checkpoint_dir("bad_bin");
        std::ofstream(dir + "/config.json") << base_config().dump();
        std::ofstream(dir + "/pytorch_model.bin") << "x";
        const std::string m = test::error_message([&] { convert("eagle1", dir); });
        EXPECT_TRUE(has(m, "pytorch .bin checkpoints are not supported")) << m;
    }
}

// An index.json whose weight_map names a file outside the checkpoint folder: read (a well-formed
// safetensors file there was converted into the head) and echoed in errors before.
TEST(Convert, ShardNamesStayInsideTheCheckpointFolder) {
    auto refused = [](const std::string & shard, const std::string & name, bool link_out = false) {
        const std::string dir = write_checkpoint(eagle3_checkpoint(), name, 2);
        write_safetensors(fs::path(dir).parent_path().string() + "/x.safetensors", eagle3_checkpoint().tensors);
        if (link_out) fs::create_symlink("../x.safetensors", dir + "/link.safetensors");
        std::ifstream in(dir + "/model.safetensors.index.json");
        json index = json::parse(in);
        index["weight_map"]["fc.weight"] = shard;
        std::ofstream(dir + "/model.safetensors.index.json") << index.dump();
        return test::error_message([&] { SafetensorsCheckpoint ck(dir); });
    };
    auto one_line = [](const std::string & msg, const std::string & want) {
        return msg.find("model.safetensors.index.json: weight_map") != std::string::npos && msg.find(want) != std::string::npos &&
               msg.find('\n') == std::string::npos;
    };
    std::string m = refused("../x.safetensors", "shard_climbs");
    EXPECT_TRUE(one_line(m, "names shard \"../x.safetensors\", expected a file name inside the checkpoint folder")) << m;
    m = refused("sub/../../x.safetensors", "shard_climbs_later");
    EXPECT_TRUE(one_line(m, "expected a file name inside the checkpoint folder")) << m;
    m = refused("/etc/passwd", "shard_absolute");
    EXPECT_TRUE(one_line(m, "names shard \"/etc/passwd\", expected a file name inside the checkpoint folder")) << m;
    m = refused("link.safetensors", "shard_symlink", true);
    EXPECT_TRUE(one_line(m, "shard \"link.safetensors\" leads outside the checkpoint folder")) << m;
    // A link that stays inside, and a huggingface_hub snapshot's links into the repository's blobs/, are followed.
    const std::string inside = write_checkpoint(eagle3_checkpoint(), "shard_symlink_inside", 2);
    fs::rename(inside + "/model-00001-of-00002.safetensors", inside + "/real.safetensors");
    fs::create_symlink("real.safetensors", inside + "/model-00001-of-00002.safetensors");
    EXPECT_NO_THROW(SafetensorsCheckpoint{inside});
    const std::string repo = fresh_checkpoint_dir("models--hub");
    const std::string snapshot = repo + "/snapshots/0123abc";
    fs::create_directories(repo + "/blobs");
    fs::create_directories(repo + "/snapshots");
    fs::copy(write_checkpoint(eagle3_checkpoint(), "hub_files", 2), snapshot, fs::copy_options::recursive);
    fs::rename(snapshot + "/model-00002-of-00002.safetensors", repo + "/blobs/f00d");
    fs::create_symlink("../../blobs/f00d", snapshot + "/model-00002-of-00002.safetensors");
    EXPECT_NO_THROW(SafetensorsCheckpoint{snapshot});
}

// Headers whose numbers overflow when added or multiplied, and config.json sizes beyond 32 bits:
// each an error naming the file and tensor or key, never a read outside the file or a truncation.
TEST(Convert, HostileSafetensorsHeadersAndConfigs) {
    auto header_error = [](const std::string & name, const json & entry, size_t data_bytes) {
        const std::string dir = fresh_checkpoint_dir(name);
        write_safetensors_file(dir + "/model.safetensors", json{{"x", entry}}.dump(), std::vector<uint8_t>(data_bytes));
        return test::error_message([&] { SafetensorsCheckpoint ck(dir); });
    };
    const uint64_t top = ~uint64_t(0);
    std::string m = header_error("st_wrap", {{"dtype", "U8"}, {"shape", {7}}, {"data_offsets", {top - 7, top}}}, 8);
    EXPECT_NE(m.find("model.safetensors: tensor x: data_offsets end at byte 18446744073709551615 of the data, past the end of the file (8 data bytes)"),
              std::string::npos)
        << m;
    m = header_error("st_numel", {{"dtype", "F32"}, {"shape", {int64_t(1) << 62, 8}}, {"data_offsets", {0, 0}}}, 0);
    EXPECT_NE(m.find("tensor x: shape [4611686018427387904, 8] overflows"), std::string::npos) << m;
    m = header_error("st_bytes", {{"dtype", "F32"}, {"shape", {int64_t(1) << 62}}, {"data_offsets", {0, 0}}}, 0);
    EXPECT_NE(m.find("tensor x: byte size 0 does not match dtype F32 and shape [4611686018427387904]"), std::string::npos) << m;

    Checkpoint c = eagle1_checkpoint();
    c.config["hidden_size"] = (int64_t(1) << 32) + E;  // E if truncated to 32 bits
    m = test::error_message([&] { convert("eagle1", write_checkpoint(c, "cfg_hidden_64bit")); });
    EXPECT_NE(m.find("config.json: hidden_size is 4294967360, expected 1..2147483647"), std::string::npos) << m;
    c = eagle1_checkpoint();
    c.config["rms_norm_eps"] = -1e-5;
    m = test::error_message([&] { convert("eagle1", write_checkpoint(c, "cfg_eps")); });
    EXPECT_NE(m.find("config.json: rms_norm_eps is -1e-05, expected a positive finite number"), std::string::npos) << m;
}

// JSON nested 10^6 arrays deep in a checkpoint's files: dumping such a value for an error message
// recursed once per level and overflowed the stack. Catches: a file deeper than the nesting limit
// read (or walked) rather than refused with one line naming it.
TEST(Convert, DeeplyNestedJsonFilesAreRefusedWithOneLine) {
    const std::string deep = std::string(1000000, '[') + std::string(1000000, ']');
    auto one_line = [](const std::string & msg, const std::string & want) {
        return msg.find(want) != std::string::npos && msg.find("nested more than 64 levels deep") != std::string::npos &&
               msg.find('\n') == std::string::npos && msg.size() < 400;
    };
    std::string dir = write_checkpoint(eagle3_checkpoint(), "deep_config");
    const std::string config = eagle3_checkpoint().config.dump();
    std::ofstream(dir + "/config.json") << config.substr(0, config.size() - 1) + R"(, "eagle_aux_hidden_state_layer_ids": )" + deep + "}";
    std::string m = test::error_message([&] { convert("eagle3", dir); });
    EXPECT_TRUE(one_line(m, "config.json: invalid JSON")) << m.substr(0, 400);

    dir = write_checkpoint(eagle3_checkpoint(), "deep_index", 2);
    std::ifstream in(dir + "/model.safetensors.index.json");
    json index = json::parse(in);
    std::ofstream(dir + "/model.safetensors.index.json") << R"({"metadata": )" + deep + R"(, "weight_map": )" + index["weight_map"].dump() + "}";
    m = test::error_message([&] { convert("eagle3", dir); });
    EXPECT_TRUE(one_line(m, "model.safetensors.index.json: invalid JSON")) << m.substr(0, 400);

    dir = fresh_checkpoint_dir("deep_header");
    write_safetensors_file(dir + "/model.safetensors", R"({"x": {"dtype": "U8", "shape": )" + deep + R"(, "data_offsets": [0, 0]}})", {});
    m = test::error_message([&] { SafetensorsCheckpoint ck(dir); });
    EXPECT_TRUE(one_line(m, "model.safetensors: invalid safetensors header JSON")) << m.substr(0, 400);
}

}  // namespace
}  // namespace specula
