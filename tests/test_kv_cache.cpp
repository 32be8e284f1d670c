// KvCache: O(1) rollback and compaction to a verified tree path.
#include <gtest/gtest.h>

#include <cmath>

#include "specula/error.h"
#include "kv/kv_cache.h"
#include "runtime/backend.h"
#include "runtime/forward.h"
#include "runtime/model.h"
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

TEST_P(KvLayout, CompactLeavesTheCacheOfTheKeptPathAlone) {
    Fixture f(GetParam());
    EXPECT_EQ(f.cache()->v_transposed(), std::string(GetParam()) == "matmul");
    auto tree_cache = f.cache();
    f.runner.forward(ForwardBatch::causal(kPrefix, 0, {}), *tree_cache);
    const int base = tree_cache->size();
    //   0:a -> 1:b -> 2:c ;  0:a -> 3:d -> 4:e
    const std::vector<int32_t> tokens = {310, 526, 2253, 825, 29889};
    ForwardBatch tree;
    tree.tokens = tokens;
    tree.positions = {base, base + 1, base + 2, base + 1, base + 2};
    tree.mask = BlockMask::from_parents(std::vector<int>{-1, 0, 1, 0, 3});
    f.runner.forward(tree, *tree_cache);
    const std::vector<int> kept = {0, 3, 4};
    tree_cache->compact(base, kept);
    ASSERT_EQ(tree_cache->size(), base + 3);

    auto path_cache = f.cache();
    f.runner.forward(ForwardBatch::causal(kPrefix, 0, {}), *path_cache);
    f.runner.forward(ForwardBatch::causal(std::vector<int32_t>{310, 825, 29889}, base, {}), *path_cache);
    ASSERT_EQ(path_cache->size(), tree_cache->size());

    double max_diff = 0.0;
    for (int layer = 0; layer < f.model->config().n_layer; ++layer) {
        for (bool value : {false, true}) {
            for (int slot = 0; slot < path_cache->size(); ++slot) {
                auto a = tree_cache->read_row(layer, value, slot), b = path_cache->read_row(layer, value, slot);
                for (size_t i = 0; i < a.size(); ++i) max_diff = std::max(max_diff, double(std::fabs(a[i] - b[i])));
            }
        }
    }
    EXPECT_LT(max_diff, 2e-3);

    // And the next token sees the same context through either cache.
    ForwardOutput x = f.runner.forward(ForwardBatch::causal(std::vector<int32_t>{3186}, base + 3, {0}), *tree_cache);
    ForwardOutput y = f.runner.forward(ForwardBatch::causal(std::vector<int32_t>{3186}, base + 3, {0}), *path_cache);
    double logit_diff = 0.0;
    for (size_t i = 0; i < x.logits.size(); ++i) logit_diff = std::max(logit_diff, double(std::fabs(x.logits[i] - y.logits[i])));
    EXPECT_LT(logit_diff, 1e-2);
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
