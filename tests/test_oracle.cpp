// specula's forward pass against libllama's on the same GGUF, for every family and option.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "engine/generate.h"
#include "kv/kv_cache.h"
#include "llama_peer.h"
#include "runtime/backend.h"
#include "runtime/forward.h"
#include "runtime/model.h"
#include "sample/sampler.h"
#include "test_models.h"

namespace specula {
namespace {

class Oracle : public ::testing::TestWithParam<test::Variant> {};

std::vector<int32_t> sequence(int n, int n_vocab, uint64_t seed) {
    std::vector<int32_t> t(n);
    Rng rng(seed);
    for (auto & x : t) x = static_cast<int32_t>(rng.uniform() * (n_vocab - 3)) + 3;  // skip special ids
    return t;
}

// Both attention kernels, each against libllama running the same one.
TEST_P(Oracle, TeacherForcedLogitsMatchLibllama) {
  for (const char * kernel : {"flash", "matmul"}) {
    SCOPED_TRACE(kernel);
    const test::Variant & v = GetParam();
    const std::string path = test::model_path(v.name);
    Backend backend(BackendOptions{"cpu", 1, kernel});
    auto model = Model::load(path, backend);
    ModelRunner runner(*model);
    KvCache cache(backend, model->config(), 256);
    LlamaPeer peer(path, 256, 1, backend.flash_attention());
    ASSERT_EQ(peer.n_vocab(), model->config().n_vocab);

    const int n = 72;
    const auto tokens = sequence(n, model->config().n_vocab, 7);
    std::vector<int32_t> rows(n);
    for (int i = 0; i < n; ++i) rows[i] = i;
    // Two blocks, so the second one attends to a cache written by the first.
    ForwardOutput a = runner.forward(ForwardBatch::causal(std::span(tokens).first(40), 0, {rows.begin(), rows.begin() + 40}), cache);
    ForwardOutput b = runner.forward(ForwardBatch::causal(std::span(tokens).subspan(40), 40, {rows.begin(), rows.begin() + 32}), cache);
    const std::vector<float> ref_a = peer.decode(std::span(tokens).first(40), true);
    const std::vector<float> ref_b = peer.decode(std::span(tokens).subspan(40), true);

    const int V = model->config().n_vocab;
    double max_diff = 0.0;
    for (int i = 0; i < n; ++i) {
        std::span<const float> ours = i < 40 ? a.logits_row(i) : b.logits_row(i - 40);
        std::span<const float> ref(i < 40 ? ref_a.data() + size_t(i) * V : ref_b.data() + size_t(i - 40) * V, V);
        for (int j = 0; j < V; ++j) max_diff = std::max(max_diff, double(std::fabs(ours[j] - ref[j])));
        EXPECT_EQ(argmax(ours), argmax(ref)) << "top-1 differs at position " << i;
    }
    std::printf("[oracle] %-16s %-6s max |logit diff| over %d positions = %.3g\n", v.name.c_str(), kernel, n, max_diff);
    EXPECT_LT(max_diff, v.logit_tol);
  }
}

TEST_P(Oracle, GreedyGenerationMatchesLibllama) {
    const test::Variant & v = GetParam();
    const std::string path = test::model_path(v.name);
    Backend backend(BackendOptions{"cpu", 1});
    auto model = Model::load(path, backend);
    ModelRunner runner(*model);
    KvCache cache(backend, model->config(), 256);
    const auto prompt = sequence(8, model->config().n_vocab, 11);

    std::vector<int32_t> ours;
    GenerationOptions opt;
    opt.n_predict = 64;
    opt.stop_at_end_of_generation = false;
    generate_plain(runner, cache, prompt, opt, [](int32_t) { return false; }, [&](int32_t t) {
        ours.push_back(t);
        return true;
    });

    LlamaPeer peer(path, 256, 1, backend.flash_attention());
    std::vector<int32_t> ref;
    std::vector<float> logits = peer.decode(prompt, false);
    for (int i = 0; i < 64; ++i) {
        const int32_t t = argmax(logits);
        ref.push_back(t);
        const int32_t one[1] = {t};
        logits = peer.decode(one, false);
    }
    EXPECT_EQ(ours, ref);
}

INSTANTIATE_TEST_SUITE_P(Families, Oracle, ::testing::ValuesIn(test::oracle_variants()),
                         [](const auto & info) { return info.param.name; });

}  // namespace
}  // namespace specula
