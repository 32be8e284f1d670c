// Bad inputs give one clear error naming the problem, never a crash.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "common/error.h"
#include "ggml.h"
#include "gguf.h"
#include "kv/kv_cache.h"
#include "runtime/backend.h"
#include "runtime/forward.h"
#include "runtime/model.h"
#include "specula/specula.h"
#include "test_models.h"

namespace specula {
namespace {


std::string write_gguf(const std::string & name, const std::string & arch, ggml_type embd_type) {
    const std::string path = test::scratch_dir() + "/" + name;
    gguf_context * g = gguf_init_empty();
    gguf_set_val_str(g, "general.architecture", arch.c_str());
    for (const char * k : {"block_count", "embedding_length", "feed_forward_length", "attention.head_count", "context_length"}) {
        gguf_set_val_u32(g, (arch + "." + k).c_str(), 8);
    }
    gguf_set_val_f32(g, (arch + ".attention.layer_norm_rms_epsilon").c_str(), 1e-5f);
    ggml_init_params p{1 << 20, nullptr, false};
    ggml_context * ctx = ggml_init(p);
    ggml_tensor * t = ggml_new_tensor_2d(ctx, embd_type, 8, 16);
    ggml_set_name(t, "token_embd.weight");
    gguf_add_tensor(g, t);
    gguf_write_to_file(g, path.c_str(), false);
    gguf_free(g);
    ggml_free(ctx);
    return path;
}

TEST(Errors, MissingFile) {
    Backend b(BackendOptions{"cpu", 1});
    EXPECT_EQ(test::error_message([&] { Model::load("/no/such/model.gguf", b); }), "/no/such/model.gguf: no such file");
}

TEST(Errors, NotGguf) {
    Backend b(BackendOptions{"cpu", 1});
    const std::string path = test::scratch_dir() + "/not-a-model.txt";
    std::ofstream(path) << "hello, I am text\n";
    EXPECT_EQ(test::error_message([&] { Model::load(path, b); }), path + ": not a GGUF file (bad magic)");
    const std::string trunc = test::scratch_dir() + "/truncated.gguf";
    std::ofstream(trunc) << "GGUF\x03";
    EXPECT_EQ(test::error_message([&] { Model::load(trunc, b); }), trunc + ": corrupt or truncated GGUF file");
}

TEST(Errors, UnsupportedArchitecture) {
    Backend b(BackendOptions{"cpu", 1});
    const std::string path = write_gguf("gpt2.gguf", "gpt2", GGML_TYPE_F32);
    EXPECT_EQ(test::error_message([&] { Model::load(path, b); }),
              path + ": unsupported architecture 'gpt2' (specula runs llama, qwen2, qwen3, gemma3)");
}

TEST(Errors, UnsupportedTensorType) {
    Backend b(BackendOptions{"cpu", 1});
    const std::string path = write_gguf("i32-embd.gguf", "llama", GGML_TYPE_I32);
    EXPECT_EQ(test::error_message([&] { Model::load(path, b); }), path + ": unsupported tensor type i32 for tensor token_embd.weight");
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

TEST(Errors, UnknownAttentionKernel) {
    EXPECT_NE(test::error_message([] { Backend b(BackendOptions{"cpu", 1, "fast"}); }).find("unknown attention kernel 'fast'"),
              std::string::npos);
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
