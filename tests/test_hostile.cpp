// Hostile inputs: well-formed GGUF files with values no real model has (edited by hand, written by
// a converter with a bug, cut short). One test per class of input in docs/validation.md; each
// asserts the one-line Error naming the file, the key or tensor, the value and the expectation.
// The CLI cases also assert exit code 1, exactly one `specula: error:` line on stderr and no signal.
#include <CLI/CLI.hpp>
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <sstream>

#include "specula/error.h"
#include "specula/specula.h"
#include "ggml.h"
#include "gguf.h"
#include "gguf_edit.h"
#include "runtime/backend.h"
#include "runtime/eagle_head.h"
#include "runtime/gguf_file.h"
#include "runtime/kv_cache.h"
#include "runtime/model.h"
#include "commands.h"  // tools/cli
#include "specee_predictor.h"
#include "test_models.h"
#include "tokenizer/tokenizer.h"

namespace specula {
namespace {

// A replacement for one tensor of a copied file; empty `data` stores zeros.
struct TensorEdit {
    ggml_type type;
    std::vector<int64_t> ne;
    std::vector<uint8_t> data;
};

template <typename T>
std::vector<uint8_t> bytes_of(const std::vector<T> & v) {
    std::vector<uint8_t> b(v.size() * sizeof(T));
    std::memcpy(b.data(), v.data(), b.size());
    return b;
}

// A copy of `src` named `name`: metadata edited by `edit_kv`, tensors replaced (or dropped, with
// nullopt) by `tensors`; a tensor in `tensors` the source lacks is added.
std::string edited(const std::string & src, const std::string & name, const std::function<void(gguf_context *)> & edit_kv,
                   const std::map<std::string, std::optional<TensorEdit>> & tensors = {}) {
    const std::string path = test::scratch_file("hostile-" + name + ".gguf");
    const GgufFile in(src);
    gguf_context * out = metadata_of(src);
    if (edit_kv) edit_kv(out);
    size_t bytes = 1 << 16;
    for (ggml_tensor * t : in.tensors()) bytes += ggml_nbytes(t) + ggml_tensor_overhead();
    for (const auto & [n, e] : tensors) {
        if (e) bytes += ggml_row_size(e->type, e->ne[0]) * (e->ne.size() > 1 ? e->ne[1] : 1) + ggml_tensor_overhead();
    }
    ggml_init_params params{bytes, nullptr, false};
    ggml_context * ctx = ggml_init(params);
    auto add = [&](const std::string & n, ggml_type type, const std::vector<int64_t> & ne, const std::vector<uint8_t> & data) {
        ggml_tensor * t = ggml_new_tensor(ctx, type, static_cast<int>(ne.size()), ne.data());
        ggml_set_name(t, n.c_str());
        std::memset(t->data, 0, ggml_nbytes(t));
        if (!data.empty()) std::memcpy(t->data, data.data(), std::min(data.size(), ggml_nbytes(t)));
        gguf_add_tensor(out, t);
    };
    for (ggml_tensor * t : in.tensors()) {
        const std::string n = ggml_get_name(t);
        auto it = tensors.find(n);
        if (it == tensors.end()) add(n, t->type, std::vector<int64_t>(t->ne, t->ne + ggml_n_dims(t)), in.read_tensor_bytes(n));
        else if (it->second) add(n, it->second->type, it->second->ne, it->second->data);
    }
    for (const auto & [n, e] : tensors) {
        if (e && !in.tensor_meta(n)) add(n, e->type, e->ne, e->data);
    }
    write_gguf(out, ctx, path);
    return path;
}

std::string target() { return test::model_path("llama_gqa_f32"); }  // E 64, 2 layers, 4 heads, 2 kv heads, FF 128
std::string eagle3() { return test::eagle_head_path("eagle3", "llama_gqa_f32"); }
constexpr int kTargetVocab = 32000;

std::string model_error(const std::string & path) {
    Backend b(BackendOptions{"cpu", 1});
    return test::error_message([&] { Model::load(path, b); });
}

std::string tokenizer_error(const std::string & path) {
    return test::error_message([&] { Tokenizer t(path); });
}

std::string head_error(const std::string & head) {
    Backend b(BackendOptions{"cpu", 1});
    auto t = Model::load(target(), b);
    return test::error_message([&] { EagleHead::load(head, *t, b); });
}

#define EXPECT_ERROR(msg, path, text)                                                  \
    do {                                                                               \
        const std::string m_ = (msg);                                                  \
        EXPECT_EQ(m_.rfind((path) + ": ", 0), 0u) << "does not name the file: " << m_; \
        EXPECT_NE(m_.find(text), std::string::npos) << m_;                             \
        EXPECT_EQ(m_.find('\n'), std::string::npos) << m_;                             \
    } while (0)

// ---------------------------------------------------------------- target and draft models: metadata

TEST(Hostile, HugeBlockCountIsOutOfRangeNotBadAlloc) {
    const std::string p = edited(target(), "block-count-huge", [](gguf_context * g) { gguf_set_val_u32(g, "llama.block_count", 0x7fffffff); });
    EXPECT_ERROR(model_error(p), p, "metadata key llama.block_count is 2147483647, expected 1..1048576");
}

TEST(Hostile, BlockCountMustMatchTheLayersPresent) {
    const std::string p = edited(target(), "block-count-3", [](gguf_context * g) { gguf_set_val_u32(g, "llama.block_count", 3); });
    EXPECT_ERROR(model_error(p), p, "metadata key llama.block_count is 3 but the file has tensors for 2 layers (blk.0 .. blk.1)");
    const std::string zero = edited(target(), "block-count-0", [](gguf_context * g) { gguf_set_val_u32(g, "llama.block_count", 0); });
    EXPECT_ERROR(model_error(zero), zero, "llama.block_count is 0, expected 1..1048576");
}

TEST(Hostile, SixtyFourBitValuesAreNotTruncated) {
    // 2^32 + 64 would read as 64, the right width, if cast to 32 bits.
    const std::string p = edited(target(), "embd-u64", [](gguf_context * g) { gguf_set_val_u64(g, "llama.embedding_length", (1ull << 32) + 64); });
    EXPECT_ERROR(model_error(p), p, "metadata key llama.embedding_length is 4294967360, expected 1..1048576");
    const std::string neg = edited(target(), "heads-negative", [](gguf_context * g) { gguf_set_val_i32(g, "llama.attention.head_count", -4); });
    EXPECT_ERROR(model_error(neg), neg, "metadata key llama.attention.head_count is -4, expected 1..1048576");
}

TEST(Hostile, MetadataOfTheWrongType) {
    const std::string p = edited(target(), "block-count-str", [](gguf_context * g) { gguf_set_val_str(g, "llama.block_count", "two"); });
    EXPECT_ERROR(model_error(p), p, "metadata key llama.block_count is not an integer");
}

TEST(Hostile, HeadCountsMustBeConsistent) {
    const std::string zero = edited(target(), "heads-0", [](gguf_context * g) { gguf_set_val_u32(g, "llama.attention.head_count", 0); });
    EXPECT_ERROR(model_error(zero), zero, "llama.attention.head_count is 0, expected 1..1048576");
    const std::string kv = edited(target(), "kv-heads-3", [](gguf_context * g) { gguf_set_val_u32(g, "llama.attention.head_count_kv", 3); });
    EXPECT_ERROR(model_error(kv), kv, "llama.attention.head_count_kv is 3, expected a divisor of llama.attention.head_count 4");
    const std::string width = edited(target(), "heads-3-no-key-length", [](gguf_context * g) {
        gguf_set_val_u32(g, "llama.attention.head_count", 3);
        gguf_set_val_u32(g, "llama.attention.head_count_kv", 3);
        gguf_remove_key(g, "llama.attention.key_length");
    });
    EXPECT_ERROR(model_error(width), width, "llama.attention.head_count 3 does not divide llama.embedding_length 64");
    const std::string wide = edited(target(), "heads-too-wide", [](gguf_context * g) {
        gguf_set_val_u32(g, "llama.attention.head_count", 1 << 12);
        gguf_set_val_u32(g, "llama.attention.head_count_kv", 1 << 12);
        gguf_set_val_u32(g, "llama.attention.key_length", 1 << 12);
        gguf_set_val_u32(g, "llama.attention.value_length", 1 << 12);
        gguf_set_val_u32(g, "llama.rope.dimension_count", 1 << 12);
    });
    EXPECT_ERROR(model_error(wide), wide, "4096 heads of size 4096 exceed the attention width bound 1048576");
}

TEST(Hostile, RopeDimensionsMustFitTheHead) {
    const std::string odd = edited(target(), "key-length-odd", [](gguf_context * g) { gguf_set_val_u32(g, "llama.attention.key_length", 15); });
    EXPECT_ERROR(model_error(odd), odd, "head size 15 is odd; rope rotates pairs of dimensions");
    const std::string rot = edited(target(), "rope-dims-big", [](gguf_context * g) { gguf_set_val_u32(g, "llama.rope.dimension_count", 32); });
    EXPECT_ERROR(model_error(rot), rot, "llama.rope.dimension_count is 32, expected the head size 16");
    const std::string v = edited(target(), "value-length", [](gguf_context * g) { gguf_set_val_u32(g, "llama.attention.value_length", 8); });
    EXPECT_ERROR(model_error(v), v, "llama.attention.value_length is 8, expected the key length 16");
}

TEST(Hostile, FloatMetadataMustBeFinitePositive) {
    const std::string nan = edited(target(), "eps-nan", [](gguf_context * g) { gguf_set_val_f32(g, "llama.attention.layer_norm_rms_epsilon", NAN); });
    EXPECT_ERROR(model_error(nan), nan, "llama.attention.layer_norm_rms_epsilon is nan, expected a finite value in (0, 1]");
    const std::string base = edited(target(), "rope-base-negative", [](gguf_context * g) { gguf_set_val_f32(g, "llama.rope.freq_base", -1.0f); });
    EXPECT_ERROR(model_error(base), base, "llama.rope.freq_base is -1, expected a finite value");
    const std::string factor = edited(target(), "rope-factor-0", [](gguf_context * g) {
        gguf_set_val_str(g, "llama.rope.scaling.type", "linear");
        gguf_set_val_f32(g, "llama.rope.scaling.factor", 0.0f);
    });
    EXPECT_ERROR(model_error(factor), factor, "llama.rope.scaling.factor is 0, expected a finite value in (0, 1e+06]");
}

// Gemma 3's own keys are range-checked: a u32 window or period of 2^31 must not turn negative as
// an int (nor the period's `period - 1` overflow), and the RoPE base of the sliding layers and the
// logit softcap must be finite and positive.
TEST(Hostile, Gemma3HyperparametersAreRangeChecked) {
    const std::string gemma = test::model_path("gemma3_swa");
    auto edit = [&](const std::string & name, const std::function<void(gguf_context *)> & kv) { return edited(gemma, name, kv); };
    const std::string period = edit("g3-period-2^31", [](gguf_context * g) { gguf_set_val_u32(g, "gemma3.attention.sliding_window_pattern", 0x80000000u); });
    EXPECT_ERROR(model_error(period), period, "metadata key gemma3.attention.sliding_window_pattern is 2147483648, expected 0..2147483647");
    const std::string window = edit("g3-window-2^31", [](gguf_context * g) { gguf_set_val_u32(g, "gemma3.attention.sliding_window", 0x80000000u); });
    EXPECT_ERROR(model_error(window), window, "metadata key gemma3.attention.sliding_window is 2147483648, expected 0..2147483647");
    const std::string flags = edit("g3-flags", [](gguf_context * g) {
        const int32_t per_layer[3] = {1, 256, 0};  // 256 would be held as the byte 0
        gguf_set_arr_data(g, "gemma3.attention.sliding_window_pattern", GGUF_TYPE_INT32, per_layer, 3);
    });
    EXPECT_ERROR(model_error(flags), flags, "metadata key gemma3.attention.sliding_window_pattern[1] is 256, expected 0 (global) or 1 (sliding)");
    const std::string base = edit("g3-swa-base-inf", [](gguf_context * g) { gguf_set_val_f32(g, "gemma3.rope.freq_base_swa", INFINITY); });
    EXPECT_ERROR(model_error(base), base, "metadata key gemma3.rope.freq_base_swa is inf, expected a finite value");
    const std::string cap = edit("g3-softcap-negative", [](gguf_context * g) { gguf_set_val_f32(g, "gemma3.final_logit_softcapping", -30.0f); });
    EXPECT_ERROR(model_error(cap), cap, "metadata key gemma3.final_logit_softcapping is -30, expected a finite value");
    const std::string nan_cap = edit("g3-softcap-nan", [](gguf_context * g) { gguf_set_val_f32(g, "gemma3.final_logit_softcapping", NAN); });
    EXPECT_ERROR(model_error(nan_cap), nan_cap, "metadata key gemma3.final_logit_softcapping is nan, expected a finite value");
    const std::string no_cap = edit("g3-softcap-0", [](gguf_context * g) { gguf_set_val_f32(g, "gemma3.final_logit_softcapping", 0.0f); });
    EXPECT_EQ(model_error(no_cap), "<no error>");
}

// The target's tensors for width E, feed-forward width F and one attention head of size A: F16
// matrices keep a file with a huge A small.
std::map<std::string, std::optional<TensorEdit>> resized_target_tensors(int64_t E, int64_t F, int64_t A) {
    std::map<std::string, std::optional<TensorEdit>> out;
    const GgufFile in(target());
    for (ggml_tensor * t : in.tensors()) {
        const std::string n = ggml_get_name(t);
        auto ends = [&](const char * suffix) { return n.ends_with(suffix); };
        std::vector<int64_t> ne = {E};  // norms
        if (n == "token_embd.weight" || n == "output.weight") ne = {E, t->ne[1]};
        else if (ends("attn_q.weight") || ends("attn_k.weight") || ends("attn_v.weight")) ne = {E, A};
        else if (ends("attn_output.weight")) ne = {A, E};
        else if (ends("ffn_gate.weight") || ends("ffn_up.weight")) ne = {E, F};
        else if (ends("ffn_down.weight")) ne = {F, E};
        out[n] = TensorEdit{ne.size() == 1 ? GGML_TYPE_F32 : GGML_TYPE_F16, ne, {}};
    }
    return out;
}

// A head size of 2^18 on a width of 2: each token's K and V rows take 2 MiB in a 9 MB file, so
// the default 2048-token context asked for 4 GiB, which was allocated and cleared (with 2^20 and
// more layers, until the process was killed) instead of refused.
std::string huge_key_length_model() {
    constexpr int64_t kHead = 1 << 18;
    return edited(
        target(), "key-length-2^18",
        [](gguf_context * g) {
            gguf_set_val_u32(g, "llama.embedding_length", 2);
            gguf_set_val_u32(g, "llama.feed_forward_length", 2);
            gguf_set_val_u32(g, "llama.attention.head_count", 1);
            gguf_set_val_u32(g, "llama.attention.head_count_kv", 1);
            for (const char * key : {"llama.attention.key_length", "llama.attention.value_length", "llama.rope.dimension_count"}) {
                gguf_set_val_u32(g, key, kHead);
            }
        },
        resized_target_tensors(2, 2, kHead));
}

TEST(Hostile, KvCacheFarLargerThanTheFileIsRefused) {
    const std::string p = huge_key_length_model();
    Backend b(BackendOptions{"cpu", 1});
    const auto model = Model::load(p, b);
    EXPECT_ERROR(test::error_message([&] { KvCache cache(b, model->config(), 2048); }), p,
                 "a KV cache of 2048 tokens would need 4294967296 bytes (2 layers x K and V x llama.attention.head_count_kv 1 x "
                 "llama.attention.key_length 262144 x 2 bytes), more than 64 times the ");
    EXPECT_ERROR(test::error_message([&] { KvCache::pool(b, model->config(), 1024, 2); }), p, "a KV cache of 2048 tokens would need");
    KvCache small(b, model->config(), 16);  // 32 MiB: within the bound
    EXPECT_EQ(small.capacity(), 16);
}

// A copy of `model` whose LM head rows for tokens 0..n-1 are NaN: their logits are NaN at every step.
std::string with_nan_logits(const std::string & model, const std::string & name, int64_t n) {
    const GgufFile in(model);
    const ggml_tensor * head = in.tensor_meta("output.weight");
    std::vector<uint8_t> bytes = in.read_tensor_bytes("output.weight");
    std::fill_n(reinterpret_cast<float *>(bytes.data()), head->ne[0] * n, NAN);
    return edited(model, name, nullptr, {{"output.weight", TensorEdit{GGML_TYPE_F32, {head->ne[0], head->ne[1]}, bytes}}});
}

// NaN weights load (docs/validation.md); their NaN logits weigh as -inf in the target's sampling and
// verification and in the drafter's tree. Before, token 0's NaN logit was the argmax at every step.
TEST(Hostile, NanLogitsAreNeverDrawn) {
    EngineOptions o;
    o.model_path = with_nan_logits(target(), "nan-logits-target", 100);
    o.drafter = DrafterSpec{DrafterKind::DraftModel, with_nan_logits(test::model_path("llama_draft_small"), "nan-logits-draft", 100)};
    o.tree = TreeShape::Dynamic;
    o.n_threads = 1;
    const auto engine = Engine::open(o);
    SamplingParams greedy, plain, top_k;
    plain.temperature = 0.8f, plain.seed = 3;
    top_k.temperature = 0.8f, top_k.top_k = 120, top_k.top_p = 0.95f, top_k.seed = 4;
    for (const SamplingParams & sampling : {greedy, plain, top_k}) {
        GenerationOptions g;
        g.n_predict = 24;
        g.sampling = sampling;
        std::vector<int32_t> out;
        engine->generate(engine->tokenize("Once upon a time"), g, [&](int32_t t) {
            out.push_back(t);
            return true;
        });
        EXPECT_EQ(out.size(), 24u);
        for (int32_t t : out) EXPECT_GE(t, 100) << "temperature " << sampling.temperature;
    }
}

TEST(Hostile, VocabularySizeMustMatchTheEmbeddingRows) {
    const std::string p = edited(target(), "vocab-size", [](gguf_context * g) { gguf_set_val_u32(g, "llama.vocab_size", 32001); });
    EXPECT_ERROR(model_error(p), p, "metadata key llama.vocab_size is 32001 but token_embd.weight has 32000 rows");
}

// ---------------------------------------------------------------- tensors

TEST(Hostile, NormWeightsMustBeF32) {  // reached GGML_ABORT inside ggml before
    const std::string p = edited(target(), "norm-f16", nullptr, {{"blk.1.ffn_norm.weight", TensorEdit{GGML_TYPE_F16, {64}, {}}}});
    EXPECT_ERROR(model_error(p), p, "tensor blk.1.ffn_norm.weight has type f16, expected f32");
    const std::string i64 = edited(target(), "norm-i64", nullptr, {{"output_norm.weight", TensorEdit{GGML_TYPE_I64, {64}, {}}}});
    EXPECT_ERROR(model_error(i64), i64, "tensor output_norm.weight has type i64, expected f32");
}

TEST(Hostile, MatrixWeightsMustBeAMatmulType) {
    const std::string p = edited(target(), "matrix-i32", nullptr, {{"blk.0.attn_k.weight", TensorEdit{GGML_TYPE_I32, {64, 32}, {}}}});
    EXPECT_ERROR(model_error(p), p, "tensor blk.0.attn_k.weight has type i32, expected a matrix type");
    const std::string embd = edited(target(), "embd-i32", nullptr, {{"token_embd.weight", TensorEdit{GGML_TYPE_I32, {64, kTargetVocab}, {}}}});
    EXPECT_ERROR(model_error(embd), embd, "tensor token_embd.weight has type i32, expected a matrix type");
}

TEST(Hostile, TensorShapesAreExact) {
    const std::string p = edited(target(), "shape", nullptr, {{"blk.0.ffn_up.weight", TensorEdit{GGML_TYPE_F32, {64, 64}, {}}}});
    EXPECT_ERROR(model_error(p), p, "tensor blk.0.ffn_up.weight has shape [64, 64], expected [64, 128]");
    const std::string dims = edited(target(), "shape-3d", nullptr, {{"blk.0.ffn_up.weight", TensorEdit{GGML_TYPE_F32, {64, 64, 2}, {}}}});
    EXPECT_ERROR(model_error(dims), dims, "tensor blk.0.ffn_up.weight has shape [64, 64, 2], expected [64, 128]");
}

TEST(Hostile, TruncatedFilesAreCaughtBeforeAllocating) {
    const std::string p = test::scratch_file("hostile-truncated.gguf");
    std::filesystem::copy_file(target(), p, std::filesystem::copy_options::overwrite_existing);
    std::filesystem::resize_file(p, std::filesystem::file_size(p) - 1000);
    const std::string m = model_error(p);
    EXPECT_ERROR(m, p, "past the end of the");
    EXPECT_NE(m.find("(truncated?)"), std::string::npos) << m;
}

// ---------------------------------------------------------------- EAGLE heads

TEST(Hostile, EagleHeadWithZeroHeadsIsAnErrorNotSigfpe) {
    const std::string p = edited(eagle3(), "e3-heads-0", [](gguf_context * g) { gguf_set_val_u32(g, "eagle3.attention.head_count", 0); });
    EXPECT_ERROR(head_error(p), p, "metadata key eagle3.attention.head_count is 0, expected 1..1048576");
}

TEST(Hostile, EagleHeadHasOneLayer) {
    const std::string p = edited(eagle3(), "e3-blocks-2", [](gguf_context * g) { gguf_set_val_u32(g, "eagle3.block_count", 2); });
    EXPECT_ERROR(head_error(p), p, "metadata key eagle3.block_count is 2, expected 1..1");
}

TEST(Hostile, EagleTargetLayersOutsideInt32AreNotTruncated) {
    const std::string p = edited(eagle3(), "e3-layers-i64", [](gguf_context * g) {
        const int64_t layers[3] = {1, (int64_t(1) << 32) + 1, 2};  // would read as 1 if truncated
        gguf_set_arr_data(g, "eagle3.target_layers", GGUF_TYPE_INT64, layers, 3);
    });
    EXPECT_ERROR(head_error(p), p, "metadata key eagle3.target_layers[1] is 4294967297, outside the 32-bit range");
}

TEST(Hostile, D2tTypeShapeAndRange) {
    const std::vector<int64_t> ids = {0, 5, 9, 31999};
    const std::string shape = edited(eagle3(), "d2t-2d", nullptr, {{"d2t", TensorEdit{GGML_TYPE_I64, {2, 2}, bytes_of(ids)}}});
    EXPECT_ERROR(head_error(shape), shape, "tensor d2t has shape [2, 2], expected [n] with 1 <= n <= 32000");
    const std::string type = edited(eagle3(), "d2t-i32", nullptr, {{"d2t", TensorEdit{GGML_TYPE_I32, {4}, {}}}});
    EXPECT_ERROR(head_error(type), type, "tensor d2t has type i32, expected i64 target token ids");
    const std::string range = edited(eagle3(), "d2t-range", nullptr, {{"d2t", TensorEdit{GGML_TYPE_I64, {4}, bytes_of(std::vector<int64_t>{0, 5, 32000, 7})}}});
    EXPECT_ERROR(head_error(range), range, "tensor d2t maps draft token 2 to 32000, outside the target's vocabulary 0..31999");
    const std::string dup = edited(eagle3(), "d2t-dup", nullptr, {{"d2t", TensorEdit{GGML_TYPE_I64, {4}, bytes_of(std::vector<int64_t>{0, 5, 5, 7})}}});
    EXPECT_ERROR(head_error(dup), dup, "tensor d2t maps two draft tokens to target token 5");
    const std::string longer = edited(eagle3(), "d2t-long", nullptr, {{"d2t", TensorEdit{GGML_TYPE_I64, {kTargetVocab + 1}, {}}}});
    EXPECT_ERROR(head_error(longer), longer, "tensor d2t has shape [32001], expected [n] with 1 <= n <= 32000");
}

TEST(Hostile, T2dTypeShapeAndAgreementWithD2t) {
    const std::string head = test::eagle_head_path("eagle3", "llama_gqa_f32", 100);  // d2t: every 320th token
    const std::string type = edited(head, "t2d-f32", nullptr, {{"t2d", TensorEdit{GGML_TYPE_F32, {kTargetVocab}, {}}}});
    EXPECT_ERROR(head_error(type), type, "tensor t2d has type f32, expected an integer type");
    const std::string shape = edited(head, "t2d-short", nullptr, {{"t2d", TensorEdit{GGML_TYPE_I8, {100}, {}}}});
    EXPECT_ERROR(head_error(shape), shape, "tensor t2d has shape [100], expected [32000]");
    std::vector<int8_t> flags(kTargetVocab, 0);
    for (int i = 0; i < 100; ++i) flags[static_cast<size_t>(i) * kTargetVocab / 100] = 1;
    const std::string good = edited(head, "t2d-good", nullptr, {{"t2d", TensorEdit{GGML_TYPE_I8, {kTargetVocab}, bytes_of(flags)}}});
    EXPECT_EQ(head_error(good), "<no error>");
    flags[1] = 1;
    const std::string extra = edited(head, "t2d-extra", nullptr, {{"t2d", TensorEdit{GGML_TYPE_I8, {kTargetVocab}, bytes_of(flags)}}});
    EXPECT_ERROR(head_error(extra), extra, "tensor t2d[1] is 1 but d2t maps no draft token to target token 1");
}

// ---------------------------------------------------------------- tokenizer vocabulary

TEST(Hostile, AddedSpecialTokenOutsideTheVocabulary) {
    // libllama disables an EOS id outside the vocabulary, then asserts when asked to add it.
    // A BPE vocabulary smaller than its default EOS id (11): no byte tokens needed, unlike SentencePiece.
    const std::string p = edited(target(), "add-eos-no-eos", [](gguf_context * g) {
        const char * tokens[] = {"a", "b", "ab"};
        const char * merges[] = {"a b"};
        gguf_set_val_str(g, "tokenizer.ggml.model", "gpt2");
        gguf_set_arr_str(g, "tokenizer.ggml.tokens", tokens, 3);
        gguf_set_arr_str(g, "tokenizer.ggml.merges", merges, 1);
        gguf_set_val_u32(g, "tokenizer.ggml.eos_token_id", 7);
        gguf_set_val_bool(g, "tokenizer.ggml.add_eos_token", true);
    });
    EXPECT_ERROR(tokenizer_error(p), p,
                 "tokenizer.ggml.add_eos_token is set but tokenizer.ggml.eos_token_id names no token of the 3-token vocabulary");
}

// A copy of the target whose token texts `edit_texts` changes.
std::string with_token_texts(const std::string & name, const std::function<void(std::vector<std::string> &)> & edit_texts) {
    return edited(target(), name, [&](gguf_context * g) {
        std::vector<std::string> tokens = *GgufFile(target()).find_str_array("tokenizer.ggml.tokens");
        edit_texts(tokens);
        std::vector<const char *> texts;
        for (const std::string & t : tokens) texts.push_back(t.c_str());
        gguf_set_arr_str(g, "tokenizer.ggml.tokens", texts.data(), texts.size());
    });
}

// libllama asserts (SIGABRT) when two tokens have the same text; an empty text reads as "[EMPTY_<id>]".
std::string duplicate_token_model() {
    return with_token_texts("tokens-duplicate", [](std::vector<std::string> & tokens) {
        tokens[7] = "";
        tokens[8] = "[EMPTY_7]";
    });
}

TEST(Hostile, DuplicateTokenTextsAreAnErrorNotAnAbort) {
    const std::string p = duplicate_token_model();
    EXPECT_ERROR(tokenizer_error(p), p, "metadata key tokenizer.ggml.tokens[8] is \"[EMPTY_7]\", as token 7 is (libllama needs distinct token texts)");
}

// A missing byte token made tokenizing text without a token of its own throw std::out_of_range
// (`unordered_map::at`) out of libllama.
TEST(Hostile, SentencePieceVocabularyHasEveryByteToken) {
    const std::string p = with_token_texts("tokens-no-byte-0x41", [](std::vector<std::string> & tokens) {
        std::replace(tokens.begin(), tokens.end(), std::string("<0x41>"), std::string("<0x41>?"));
    });
    EXPECT_ERROR(tokenizer_error(p), p, "the SentencePiece vocabulary (tokenizer.ggml.model llama) has no byte token <0x41>");
}

// ---------------------------------------------------------------- the CLI

void expect_cli_error(const std::string & args, const std::string & text) { test::expect_cli_error(SPECULA_CLI, args, text); }

// Catches an enum flag or drafter choice that crashes, is ignored, or fails without naming the value.
TEST(HostileCli, BadChoicesNameTheValue) {
    const std::string m = "generate -m " + target() + " -p hi -n 2 ";
    expect_cli_error(m + "--kernels fast", "unknown kernels 'fast' (expected auto, specula or ggml)");
    expect_cli_error(m + "--attention quick", "unknown attention kernel 'quick' (expected auto, flash, matmul or specula)");
    expect_cli_error(m + "--draft-policy best", "unknown draft policy 'best' (expected cost, heuristic or fixed)");
    expect_cli_error(m + "--tree bush", "unknown tree shape 'bush' (expected chain, static or dynamic)");
    expect_cli_error(m + "--ngram --draft " + target(), "choose one drafter: --draft, --eagle, --eagle3 or --ngram");
}

// Catches a malformed command line (an item of a list option that is no number, an unknown or
// incomplete flag) failing otherwise than every other bad input: one `specula: error:` line
// naming the option, exit 1.
TEST(HostileCli, MalformedCommandLinesAreOneLine) {
    const std::string m = "generate -m " + target() + " -p hi -n 2 ";
    expect_cli_error(m + "--bogus", "--bogus");
    expect_cli_error(m + "--temp warm", "--temp");
    expect_cli_error("generate -m " + target() + " -n 2", "--prompt is required");
    expect_cli_error("bench spec -m " + target() + " --temps 0,x", "--temps");
    expect_cli_error("bench serve -m " + target() + " --clients 1,two", "--clients");
    expect_cli_error("frobnicate", "unknown command 'frobnicate' (expected generate, ");
}

// Catches SpecEE flags that crash, are ignored, or fail without saying what is missing or wrong.
TEST(HostileCli, SpecEEFlagsNameTheProblem) {
    Backend backend(BackendOptions{"cpu", 1});
    auto model = Model::load(target(), backend);
    test::PredictorSpec spec;
    spec.layers = {1, 2};
    const std::string good = test::write_predictor(spec, *model, "hostile-cli-specee");
    spec.ints["specula-specee.target_block_count"] = 3;
    const std::string deeper = test::write_predictor(spec, *model, "hostile-cli-specee-deeper");
    const std::string m = "generate -m " + target() + " -p hi -n 2 ";
    expect_cli_error(m + "--specee " + good, "--specee takes its candidates from an EAGLE-3 head: add --eagle3 FILE");
    expect_cli_error(m + "--eagle3 " + eagle3() + " --specee " + deeper, "predictors for a target of 3 layers and width 64, the target has 2 and 64");
    expect_cli_error(m + "--eagle3 " + eagle3() + " --specee " + target(), "not a SpecEE predictor file (architecture 'llama'");
    expect_cli_error(m + "--eagle3 " + eagle3() + " --specee " + good + " --temp 0.5", "SpecEE's lossy mode decodes greedily");
    expect_cli_error(m + "--eagle3 " + eagle3() + " --specee " + good + " --specee-threshold 2", "--specee-threshold must be within 0..1");
    expect_cli_error(m + "--eagle3 " + eagle3() + " --specee-lossless", "--specee-lossless needs --specee FILE");
    expect_cli_error(m + "--eagle3 " + eagle3() + " --specee-online", "--specee-online needs --specee FILE");
    expect_cli_error(m + "--eagle3 " + eagle3() + " --specee " + good + " --lookup", "SpecEE (--specee) takes the head's own candidates");
    expect_cli_error(m + "--ngram --lookup", "prompt lookup (--lookup) grafts into a model drafter's trees");
}

// Catches a token list target-features crashes on, reads past, or fails on without naming the line.
TEST(HostileCli, TargetFeaturesNameTheBadLine) {
    auto tokens = [](const std::string & name, const std::string & text) {
        const std::string path = test::scratch_file("hostile-" + name + ".jsonl");
        std::ofstream(path) << text;
        return path;
    };
    const std::string base = "target-features -m " + target() + " -o " + test::scratch_file("hostile-features.bin");
    const std::string m = base + " --layers 1,2 --tokens ";
    expect_cli_error(m + tokens("ids-range", "{\"ids\": [1, 2]}\n{\"ids\": [1, 99999999]}\n"), "hostile-ids-range.jsonl:2: token id 99999999 outside the vocabulary");
    expect_cli_error(m + tokens("ids-json", "{\"ids\": [1, 2\n"), "hostile-ids-json.jsonl:1: not JSON");
    expect_cli_error(m + tokens("ids-missing", "{\"tokens\": [1]}\n"), "hostile-ids-missing.jsonl:1: no \"ids\" array");
    expect_cli_error(m + tokens("ids-empty", "{\"ids\": []}\n"), "hostile-ids-empty.jsonl:1: target features: empty sequence");
    expect_cli_error(m + tokens("ids-long", "{\"ids\": [1, 2, 3, 4, 5, 6]}\n") + " -c 4", "longer than the 4-token context");
    const std::string ok = " --tokens " + tokens("ids-ok", "{\"ids\": [1, 2]}\n");
    expect_cli_error(base + ok + " --layers 1,x", "--layers: 'x' is not a layer number");
    expect_cli_error(base + ok + " --layers 1,99", "--layers: layer 99 outside 0..2");
    expect_cli_error(base + ok, "a target of 2 layers: give the tap layers (--layers)");
}

TEST(HostileCli, MissingAndNonGgufFiles) {
    expect_cli_error("generate -m /nonexistent.gguf -p hi", "/nonexistent.gguf: no such file");
    expect_cli_error("generate -m " + std::string(SPECULA_SOURCE_DIR) + "/CMakeLists.txt -p hi", "not a GGUF file");
}

TEST(HostileCli, CorruptHeader) {  // ggml's parser logs its reason: it belongs in the one line
    const std::string p = test::scratch_file("hostile-cli-corrupt-header.gguf");
    std::filesystem::copy_file(target(), p, std::filesystem::copy_options::overwrite_existing);
    std::filesystem::resize_file(p, 1000);  // inside the metadata
    expect_cli_error("generate -m " + p + " -p hi -n 4", p + ": corrupt or truncated GGUF file (");
}

TEST(HostileCli, HugeBlockCount) {
    const std::string p = edited(target(), "block-count-huge", [](gguf_context * g) { gguf_set_val_u32(g, "llama.block_count", 0x7fffffff); });
    expect_cli_error("generate -m " + p + " -p hi -n 4", p + ": metadata key llama.block_count is 2147483647");
}

TEST(HostileCli, HugeKeyLength) {
    const std::string p = huge_key_length_model();
    expect_cli_error("generate -m " + p + " -p hi -n 4", p + ": a KV cache of 2048 tokens would need 4294967296 bytes");
}

TEST(HostileCli, DuplicateTokenTexts) {
    const std::string p = duplicate_token_model();
    expect_cli_error("generate -m " + p + " -p hi -n 4", p + ": metadata key tokenizer.ggml.tokens[8] is \"[EMPTY_7]\"");
}

TEST(HostileCli, EagleHeadWithZeroHeads) {
    const std::string p = edited(eagle3(), "e3-heads-0", [](gguf_context * g) { gguf_set_val_u32(g, "eagle3.attention.head_count", 0); });
    expect_cli_error("generate -m " + target() + " --eagle3 " + p + " -p hi -n 4", p + ": metadata key eagle3.attention.head_count is 0");
}

TEST(HostileCli, NonF32NormInADraftModel) {
    const std::string p = edited(test::model_path("llama_draft_small"), "draft-norm-f16", nullptr,
                                 {{"output_norm.weight", TensorEdit{GGML_TYPE_F16, {32}, {}}}});
    expect_cli_error("generate -m " + target() + " --draft " + p + " -p hi -n 4", p + ": tensor output_norm.weight has type f16, expected f32");
}

TEST(HostileCli, TruncatedTarget) {
    const std::string p = test::scratch_file("hostile-cli-truncated.gguf");
    std::filesystem::copy_file(target(), p, std::filesystem::copy_options::overwrite_existing);
    std::filesystem::resize_file(p, std::filesystem::file_size(p) / 2);
    expect_cli_error("generate -m " + p + " -p hi -n 4", "past the end of the");
}

TEST(HostileCli, D2tOfTheWrongShape) {
    const std::string p = edited(eagle3(), "d2t-2d", nullptr,
                                 {{"d2t", TensorEdit{GGML_TYPE_I64, {2, 2}, bytes_of(std::vector<int64_t>{0, 5, 9, 31999})}}});
    expect_cli_error("generate -m " + target() + " --eagle3 " + p + " -p hi -n 4", p + ": tensor d2t has shape [2, 2]");
}

TEST(HostileCli, VocabularyLibllamaRejects) {  // libllama's reason in the one line, not its log lines before it
    const std::string p = edited(target(), "tokens-not-strings", [](gguf_context * g) {
        const int32_t ids[2] = {1, 2};
        gguf_set_arr_data(g, "tokenizer.ggml.tokens", GGUF_TYPE_INT32, ids, 2);
    });
    expect_cli_error("generate -m " + p + " -p hi -n 4", p + ": libllama could not load the vocabulary (");
}

TEST(HostileCli, EmptyPromptWithoutBosAndADrafter) {  // spun forever in the cost policy's verify-cost probe before
    expect_cli_error("generate -m " + test::model_path("qwen2_bias") + " --ngram --draft-policy cost -p '' -n 4",
                     "the prompt is empty and the vocabulary adds no BOS token: nothing to generate from");
}

TEST(HostileCli, BenchTwinOfATargetWithZeroHeads) {  // divided the width by the head count before
    const std::string p = edited(target(), "heads-0", [](gguf_context * g) { gguf_set_val_u32(g, "llama.attention.head_count", 0); });
    expect_cli_error("make-twin --target " + p + " --shape twin-test -o " + test::scratch_file("hostile-twin.gguf"),
                     p + ": metadata key llama.attention.head_count is 0");
}

// Catches a command missing from the CLI this suite runs (built with every command,
// SPECULA_ALL_COMMANDS), or a left-out command's stand-in (tools/cli/cmd_left_out.cpp) linked into it.
TEST(HostileCli, EveryCommandIsInTheTestedBuild) {
    for (const char * name : {"generate", "chat", "report", "bench", "make-model", "make-twin", "compact-eagle3", "convert-eagle", "serve",
                              "specee-features", "specee-eval", "target-features", "draft-vocab"}) {
        const test::CommandRun r = test::run_command(std::string(SPECULA_CLI) + " " + name + " --help");
        EXPECT_EQ(r.exit_code, 0) << name << ": " << r.err;
        EXPECT_NE(r.out.find("Usage:"), std::string::npos) << name << ": " << r.out;
    }
    const test::CommandRun r = test::run_command(std::string(SPECULA_CLI) + " --help");
    EXPECT_EQ(r.out.find("not in this build"), std::string::npos) << r.out;
}

// Every stand-in of tools/cli/cmd_left_out.cpp, registered as tools/cli/main.cpp registers the commands.
void register_left_out_commands(CLI::App & app, cli::Commands & commands) {
    cli::register_bench(app, commands);
    cli::register_make_model(app, commands);
    cli::register_convert(app, commands);
    cli::register_serve(app, commands);
    cli::register_specee(app, commands);
    cli::register_features(app, commands);
    cli::register_draft_vocab(app, commands);
}

// The stand-ins of a build configured with -DSPECULA_ALL_COMMANDS=OFF (scripts/demo.sh's first),
// compiled into this test (the CLI under test has the real commands): any arguments, --help
// included, fail while parsing with the one line naming scripts/build.sh, and nothing runs.
// Catches a stand-in that parses its command's flags, answers --help, or hands arguments to the
// main command.
TEST(HostileCli, LeftOutCommandsNameTheBuildThatHasThem) {
    const std::vector<std::vector<std::string>> runs = {{"serve", "-m", "model.gguf", "--port", "8080"}, {"serve", "--help"}, {"bench", "spec", "-m", "model.gguf", "--temps", "0,x"}, {"convert-eagle"}, {"make-twin", "--quiet"}, {"target-features", "-h"}, {"draft-vocab", "--bogus"}};
    for (const auto & args : runs) {
        CLI::App app;
        app.require_subcommand(1);
        bool quiet = false;
        app.add_flag("-q,--quiet", quiet);
        app.fallthrough();  // as tools/cli/main.cpp
        cli::Commands commands;
        register_left_out_commands(app, commands);
        std::vector<std::string> reversed(args.rbegin(), args.rend());  // CLI11 takes them last first
        const std::string what = test::error_message([&] { app.parse(reversed); });
        EXPECT_EQ(what, cli::left_out_message(args[0])) << args[0] << " " << args[1 % args.size()];
        EXPECT_NE(what.find("-DSPECULA_ALL_COMMANDS=OFF"), std::string::npos);
        EXPECT_NE(what.find("run scripts/build.sh"), std::string::npos);
        EXPECT_FALSE(commands.run) << args[0];
        EXPECT_FALSE(quiet) << args[0];
    }
}

// A stand-in's --help line is its command's (commands.h's table), marked as not in the build.
// Catches a stand-in or a registration that spells its own description.
TEST(HostileCli, LeftOutCommandsDescribeThemselvesAsTheRealOnes) {
    CLI::App app;
    cli::Commands commands;
    register_left_out_commands(app, commands);
    const std::vector<CLI::App *> stand_ins = app.get_subcommands([](CLI::App *) { return true; });
    ASSERT_EQ(stand_ins.size(), 10u);
    const test::CommandRun real = test::run_command(std::string(SPECULA_CLI) + " --help");
    for (const CLI::App * sub : stand_ins) {
        const std::string marked = sub->get_description();
        const std::string suffix = " [not in this build: scripts/build.sh]";
        ASSERT_GT(marked.size(), suffix.size()) << sub->get_name();
        EXPECT_EQ(marked.substr(marked.size() - suffix.size()), suffix) << sub->get_name();
        const std::string description = marked.substr(0, marked.size() - suffix.size());
        EXPECT_NE(real.out.find(description), std::string::npos) << sub->get_name() << ": the CLI's --help has no line \"" << description << "\"";
    }
}

}  // namespace
}  // namespace specula
