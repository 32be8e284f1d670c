// KvCache: O(1) rollback and compaction to a verified tree path.
#include <gtest/gtest.h>

#include <cmath>

#include "specula/error.h"
#include "runtime/kv_cache.h"
#include "runtime/backend.h"
#include "runtime/forward.h"
#include "runtime/model.h"
#include "kv_compaction_check.h"
#include "test_models.h"

namespace specula {
namespace {

const std::vector<int32_t> kPrefix = {1, 450, 4996, 17354, 1701, 29916};

// Both V layouts: row-major (flash attention) and transposed (matmul attention).
struct Fixture {
    explicit Fixture(const char * attention = "auto") : backend(BackendOptions{"cpu", 1, parse_attention(attention)}) {}
    Backend backend;
    std::unique_ptr<Model> model = Model::load(test::model_path("llama_q8_0"), backend);
    ModelRunner runner{*model};
    std::unique_ptr<KvCache> cache() { return std::make_unique<KvCache>(backend, model->config(), 64); }
};

class KvLayout : public ::testing::TestWithParam<const char *> {};

TEST_P(KvLayout, RollbackThenRedecodeGivesIdenticalLogits) {
    Fixture f(GetParam());
    auto cache = f.cache();
    f.runner.forward(ForwardBatch::causal(kPrefix, 0, {}), *cache);
    const std::vector<int32_t> block = {310, 526, 2253, 825};
    ForwardOutput first = f.runner.forward(ForwardBatch::causal(block, 6, {0, 1, 2, 3}), *cache);
    EXPECT_EQ(cache->size(), 10);

    cache->rollback(6);
    EXPECT_EQ(cache->size(), 6);
    // Something else in between, then the original block again.
    f.runner.forward(ForwardBatch::causal(std::vector<int32_t>{3186, 29889}, 6, {1}), *cache);
    cache->rollback(6);
    ForwardOutput again = f.runner.forward(ForwardBatch::causal(block, 6, {0, 1, 2, 3}), *cache);
    EXPECT_EQ(first.logits, again.logits);  // bit-identical
    EXPECT_THROW(cache->rollback(11), Error);
}

// Catches a compaction that moves the wrong rows, misses a layer or a tensor, or mishandles the
// transposed V layout (one slot per column).
TEST_P(KvLayout, CompactLeavesTheCacheOfTheKeptPathAlone) {
    Backend backend(BackendOptions{"cpu", 1, parse_attention(GetParam())});
    const test::CompactionCheck c = test::check_tree_compaction(backend, test::model_path("llama_q8_0"));
    EXPECT_EQ(c.v_transposed, std::string(GetParam()) == "matmul");
    EXPECT_LT(c.max_kv_diff, 2e-3);
    EXPECT_LT(c.max_logit_diff, 1e-2);  // the next token sees the same context through either cache
}

INSTANTIATE_TEST_SUITE_P(Attention, KvLayout, ::testing::Values("flash", "matmul"));

TEST(KvCache, CompactRejectsBadRows) {
    Fixture f;
    auto cache = f.cache();
    f.runner.forward(ForwardBatch::causal(kPrefix, 0, {}), *cache);
    EXPECT_THROW(cache->compact(2, std::vector<int>{1, 0}), Error);
    EXPECT_THROW(cache->compact(2, std::vector<int>{0, 9}), Error);
}

}  // namespace
}  // namespace specula
