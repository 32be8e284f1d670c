// A bench twin computes its target's function in a bigger shape.
#include <gtest/gtest.h>

#include <cmath>

#include "eagle3_vocab.h"
#include "runtime/kv_cache.h"
#include "runtime/eagle_head.h"
#include "runtime/backend.h"
#include "runtime/forward.h"
#include "runtime/model.h"
#include "sample/sampler.h"
#include "test_models.h"
#include "twin.h"

namespace specula {
namespace {

TEST(BenchTwin, LogitsEqualTheTargetsInABiggerShape) {
    const std::string target_path = test::model_path("llama_gqa_f32");
    const std::string twin_path = test::scratch_file("twin_of_llama_gqa_f32.gguf");
    write_bench_twin(target_path, "twin-test", "f32", twin_path);
    Backend backend(BackendOptions{"cpu", 1});
    auto target = Model::load(target_path, backend);
    auto twin = Model::load(twin_path, backend);
    ASSERT_EQ(twin->config().n_embd, 128);
    ASSERT_EQ(twin->config().n_layer, 4);
    ModelRunner rt(*target), rw(*twin);
    KvCache ct(backend, target->config(), 128), cw(backend, twin->config(), 128);
    std::vector<int32_t> tokens(48), rows(48);
    Rng rng(3);
    for (int i = 0; i < 48; ++i) tokens[i] = 3 + static_cast<int32_t>(rng.uniform() * 30000), rows[i] = i;
    ForwardOutput a = rt.forward(ForwardBatch::causal(tokens, 0, rows), ct);
    ForwardOutput b = rw.forward(ForwardBatch::causal(tokens, 0, rows), cw);
    const double max_diff = test::max_abs_diff(a.logits, b.logits);
    for (int i = 0; i < 48; ++i) EXPECT_EQ(argmax(a.logits_row(i)), argmax(b.logits_row(i))) << i;
    std::printf("[twin] max |logit diff| target vs twin = %.3g\n", max_diff);
    EXPECT_LT(max_diff, 2e-2);  // RMSNorm epsilon sees a wider row; nothing else differs
}

// The EAGLE-3 head rewritten for a twin keeps a compact draft vocabulary's maps as stored (they
// are integers, not weights) and loads against the twin.
TEST(BenchTwin, EagleThreeHeadWithACompactVocabularyFollowsTheTwin) {
    const std::string target_path = test::model_path("llama_gqa_f32");
    const std::string twin_path = test::scratch_file("twin_of_llama_gqa_f32_for_head.gguf");
    write_bench_twin(target_path, "twin-test", "f32", twin_path);
    Backend backend(BackendOptions{"cpu", 1});
    auto target = Model::load(target_path, backend);
    std::vector<int64_t> counts(target->config().n_vocab);
    for (size_t id = 0; id < counts.size(); ++id) counts[id] = static_cast<int64_t>((id * 7919) % 1000);
    const std::string compact_path = test::scratch_file("eagle3_compact_for_twin.gguf");
    write_compact_eagle3(test::eagle_head_path("eagle3", "llama_gqa_f32"), counts, 3000, compact_path);
    const std::string twin_head_path = test::scratch_file("eagle3_compact_of_twin.gguf");
    write_bench_twin_eagle3(compact_path, target_path, "twin-test", twin_head_path);

    auto twin = Model::load(twin_path, backend);
    auto compact = EagleHead::load(compact_path, *target, backend);
    auto twin_head = EagleHead::load(twin_head_path, *twin, backend);
    ASSERT_EQ(compact->d2t().size(), 3000u);
    EXPECT_EQ(twin_head->d2t(), compact->d2t());
}

// A shape too small for the target names the dimension and the shapes that fit deep targets.
TEST(BenchTwin, AShapeSmallerThanTheTargetIsAClearError) {
    const std::string target_path = test::model_path("llama_gqa_f32");  // width 64, 2 layers
    const std::string msg = test::error_message([&] { write_bench_twin(target_path, "tiny", "f32", test::scratch_file("never.gguf")); });
    EXPECT_NE(msg.find("fewer than the target's"), std::string::npos) << msg;
    EXPECT_NE(msg.find("smol-1b"), std::string::npos) << msg;
}

}  // namespace
}  // namespace specula
