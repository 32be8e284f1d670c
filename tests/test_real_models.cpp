// specula's forward pass against libllama's on the real pretrained models that
// scripts/fetch_models.sh puts in the model cache: SmolLM2-135M-Instruct (llama, Q4_1, tied
// output) and Gemma 3 270M (gemma3, Q4_K_M mix, sliding-window layers). Skipped, saying why, when
// the cache does not hold them.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "kv/kv_cache.h"
#include "llama_peer.h"
#include "runtime/backend.h"
#include "runtime/forward.h"
#include "runtime/model.h"
#include "sample/sampler.h"
#include "tokenizer/tokenizer.h"

namespace specula {
namespace {

// The cache scripts/fetch_models.sh fills (same variable, same default).
std::string model_cache() {
    if (const char * dir = std::getenv("SPECULA_MODEL_CACHE"); dir && *dir) return dir;
    const char * home = std::getenv("HOME");
    return std::string(home ? home : "") + "/.cache/specula/models";
}

struct RealModel {
    std::string name;
    std::string file;
    std::string arch;
    int n_tokens;  // teacher-forced sequence length
};

// Gemma 3's sequence is longer than its 512-token window, so that the sliding layers mask keys.
const RealModel kModels[] = {
    {"SmolLM2_135M_Instruct_Q4_1", "SmolLM2-135M-Instruct.Q4_1.gguf", "llama", 320},
    {"Gemma3_270M_Q4_K_M", "gemma-3-270m-q4_k_m.gguf", "gemma3", 640},
};

// Natural text (the repository's own docs), tokenized by the model: real top-1 margins, unlike
// random token ids.
std::vector<int32_t> text_tokens(const std::string & model_path, int n) {
    std::string text;
    for (const char * doc : {"/README.md", "/docs/runtime.md", "/models/README.md"}) {
        std::ifstream in(std::string(SPECULA_SOURCE_DIR) + doc);
        std::stringstream ss;
        ss << in.rdbuf();
        text += ss.str();
    }
    std::vector<int32_t> tokens = Tokenizer(model_path).tokenize(text, true);
    if (static_cast<int>(tokens.size()) < n) throw std::runtime_error("not enough text for the teacher-forced sequence");
    tokens.resize(n);
    return tokens;
}

class RealModelOracle : public ::testing::TestWithParam<RealModel> {};

// Both attention kernels, each against libllama running the same one. The sequence goes through
// in blocks of 64, so every block after the first attends to a cache written by earlier ones.
TEST_P(RealModelOracle, TeacherForcedTop1MatchesLibllama) {
    const RealModel & m = GetParam();
    const std::string path = model_cache() + "/" + m.file;
    if (!std::filesystem::exists(path)) {
        GTEST_SKIP() << path << " is absent: run scripts/fetch_models.sh (SPECULA_MODEL_CACHE sets the cache)";
    }
    const std::vector<int32_t> tokens = text_tokens(path, m.n_tokens);
    for (const char * kernel : {"flash", "matmul"}) {
        SCOPED_TRACE(kernel);
        Backend backend(BackendOptions{"cpu", 2, kernel});
        auto model = Model::load(path, backend);
        ASSERT_EQ(model->config().arch_name, m.arch);
        ModelRunner runner(*model);
        KvCache cache(backend, model->config(), 1024);
        LlamaPeer peer(path, 1024, 2, backend.flash_attention());
        ASSERT_EQ(peer.n_vocab(), model->config().n_vocab);

        const int V = model->config().n_vocab;
        constexpr int kBlock = 64;
        double max_diff = 0.0;
        int top1_mismatches = 0;
        for (int start = 0; start < m.n_tokens; start += kBlock) {
            const int n = std::min(kBlock, m.n_tokens - start);
            std::vector<int32_t> rows(n);
            for (int i = 0; i < n; ++i) rows[i] = i;
            const auto block = std::span(tokens).subspan(start, n);
            const ForwardOutput ours = runner.forward(ForwardBatch::causal(block, start, rows), cache);
            const std::vector<float> ref = peer.decode(block, true);
            for (int i = 0; i < n; ++i) {
                const std::span<const float> a = ours.logits_row(i);
                const std::span<const float> r(ref.data() + size_t(i) * V, V);
                for (int j = 0; j < V; ++j) max_diff = std::max(max_diff, double(std::fabs(a[j] - r[j])));
                if (argmax(a) != argmax(r)) {
                    ++top1_mismatches;
                    ADD_FAILURE() << "top-1 differs at position " << start + i;
                }
            }
        }
        std::printf("[real-oracle] %-28s %-6s %d positions: top-1 mismatches %d, max |logit diff| = %.3g\n", m.name.c_str(),
                    kernel, m.n_tokens, top1_mismatches, max_diff);
        EXPECT_LT(max_diff, 1e-2);
    }
}

INSTANTIATE_TEST_SUITE_P(Cached, RealModelOracle, ::testing::ValuesIn(kModels), [](const auto & info) { return info.param.name; });

}  // namespace
}  // namespace specula
