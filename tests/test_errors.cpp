// Bad inputs give one clear error naming the problem, never a crash.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "common/error.h"
#include "ggml.h"
#include "gguf.h"
#include "runtime/backend.h"
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
              path + ": unsupported architecture 'gpt2' (specula runs llama, qwen2, qwen3)");
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

}  // namespace
}  // namespace specula
