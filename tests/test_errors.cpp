// Bad inputs give one clear error naming the problem, never a crash.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "specula/error.h"
#include "gguf.h"
#include "runtime/kv_cache.h"
#include "runtime/backend.h"
#include "runtime/forward.h"
#include "runtime/model.h"
#include "specula/specula.h"
#include "test_models.h"

namespace specula {
namespace {

// A GGUF that declares `arch` and holds nothing a loader could use.
std::string write_arch_only(const std::string & name, const std::string & arch) {
    const std::string path = test::scratch_file(name);
    gguf_context * g = gguf_init_empty();
    gguf_set_val_str(g, "general.architecture", arch.c_str());
    gguf_write_to_file(g, path.c_str(), false);
    gguf_free(g);
    return path;
}

TEST(Errors, MissingFile) {
    Backend b(BackendOptions{"cpu", 1});
    EXPECT_EQ(test::error_message([&] { Model::load("/no/such/model.gguf", b); }), "/no/such/model.gguf: no such file");
}

TEST(Errors, NotGguf) {
    Backend b(BackendOptions{"cpu", 1});
    const std::string path = test::scratch_file("not-a-model.txt");
    std::ofstream(path) << "hello, I am text\n";
    EXPECT_EQ(test::error_message([&] { Model::load(path, b); }), path + ": not a GGUF file (bad magic)");
    const std::string trunc = test::scratch_file("truncated.gguf");
    std::ofstream(trunc) << "GGUF\x03";
    const std::string corrupt = test::error_message([&] { Model::load(trunc, b); });  // with ggml's reason in brackets
    EXPECT_EQ(corrupt.rfind(trunc + ": corrupt or truncated GGUF file (", 0), 0u) << corrupt;
}

TEST(Errors, UnsupportedArchitecture) {
    Backend b(BackendOptions{"cpu", 1});
    const std::string path = write_arch_only("gpt2.gguf", "gpt2");
    EXPECT_EQ(test::error_message([&] { Model::load(path, b); }),
              path + ": unsupported architecture 'gpt2' (specula runs llama, qwen2, qwen3, gemma3)");
}

TEST(Errors, PromptLongerThanContext) {
    EngineOptions o;
    o.model_path = test::model_path("llama_gqa_f32");
    o.n_ctx = 8;
    o.n_threads = 1;
    auto engine = Engine::open(o);
    GenerationOptions g;
    const std::string msg = test::error_message([&] {
        engine->generate("one two three four five six seven eight nine ten eleven", g, [](const std::string &) { return true; });
    });
    EXPECT_NE(msg.find("longer than the 8-token context"), std::string::npos) << msg;
}

TEST(Errors, EmptyPromptWithoutBos) {
    // The qwen2 vocabulary adds no BOS: an empty prompt is no tokens at all. With a drafter and the
    // cost policy, the verify-cost probe tiled the prompt to fill its batches and never returned.
    EngineOptions o;
    o.model_path = test::model_path("qwen2_bias");
    o.n_ctx = 64;
    o.n_threads = 1;
    o.drafter.kind = DrafterKind::Ngram;
    o.draft_policy = DraftPolicyKind::Cost;
    auto engine = Engine::open(o);
    GenerationOptions g;
    g.n_predict = 4;
    EXPECT_EQ(test::error_message([&] { engine->generate("", g, [](const std::string &) { return true; }); }),
              "the prompt is empty and the vocabulary adds no BOS token: nothing to generate from");
}

// Catches an enum parser that accepts a bad name or loses the name (or the choices) from its error.
TEST(Errors, UnknownEnumNamesAreNamed) {
    EXPECT_EQ(test::error_message([] { parse_attention("fast"); }), "unknown attention kernel 'fast' (expected auto, flash, matmul or specula)");
    EXPECT_EQ(test::error_message([] { parse_kernels("cuda"); }), "unknown kernels 'cuda' (expected auto, specula or ggml)");
    EXPECT_EQ(test::error_message([] { parse_draft_policy("fastest"); }), "unknown draft policy 'fastest' (expected cost, heuristic or fixed)");
    EXPECT_EQ(test::error_message([] { parse_tree_shape("bush"); }), "unknown tree shape 'bush' (expected chain, static or dynamic)");
    EXPECT_EQ(parse_attention("matmul"), Attention::Matmul);
    EXPECT_EQ(parse_kernels("ggml"), Kernels::Ggml);
    EXPECT_EQ(parse_draft_policy("heuristic"), DraftPolicyKind::Heuristic);
    EXPECT_EQ(parse_tree_shape("static"), TreeShape::Static);
    EXPECT_STREQ(attention_name(Attention::Specula), "specula");
    EXPECT_STREQ(kernels_name(Kernels::Auto), "auto");
}

TEST(Errors, UnknownDevice) {
    EXPECT_NE(test::error_message([] { Backend b(BackendOptions{"CUDA7", 1}); }).find("device 'CUDA7' not found"), std::string::npos);
}

// A sliding-window model cannot place a cached tree slot (cached_visible) whose position is
// unknown once the query is a window or more past the cached prefix; it says so, and the cache
// is left as it was.
TEST(Errors, SlidingWindowRefusesCachedTreeSlotsBeyondTheWindow) {
    Backend b(BackendOptions{"cpu", 1});
    auto model = Model::load(test::model_path("gemma3_swa"), b);
    const int window = model->config().sliding_window;
    ModelRunner runner(*model);
    KvCache cache(b, model->config(), 64);
    std::vector<int32_t> prompt(window + 2, 5);
    runner.forward(ForwardBatch::causal(prompt, 0, {}), cache);
    const int32_t one[1] = {7};
    ForwardBatch tree_node = ForwardBatch::causal(one, window + 2, {0});
    tree_node.visible_prefix = 2;      // slots 2.. are tree nodes drafted earlier
    tree_node.cached_visible = {{3}};  // its cached ancestor
    EXPECT_EQ(test::error_message([&] { runner.forward(tree_node, cache); }),
              "forward: a sliding-window model cannot see cached tree slots farther than its window from the cached prefix");
    EXPECT_EQ(cache.size(), window + 2);
    tree_node.visible_prefix = 4;  // the query is now inside the window of every slot past the prefix
    tree_node.cached_visible = {{5}};
    EXPECT_EQ(runner.forward(tree_node, cache).logits.size(), size_t(model->config().n_vocab));
}

}  // namespace
}  // namespace specula
