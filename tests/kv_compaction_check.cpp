#include "kv_compaction_check.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "runtime/kv_cache.h"
#include "runtime/backend.h"
#include "runtime/forward.h"
#include "runtime/model.h"
#include "test_models.h"

namespace specula::test {

CompactionCheck check_tree_compaction(Backend & backend, const std::string & model_path) {
    const std::vector<int32_t> prefix = {1, 450, 4996, 17354, 1701, 29916};
    auto model = Model::load(model_path, backend);
    ModelRunner runner(*model);
    KvCache tree_cache(backend, model->config(), 64), path_cache(backend, model->config(), 64);
    CompactionCheck r;
    r.v_transposed = tree_cache.v_transposed();

    runner.forward(ForwardBatch::causal(prefix, 0, {}), tree_cache);
    const int base = tree_cache.size();
    ForwardBatch tree;
    tree.tokens = {310, 526, 2253, 825, 29889};
    tree.positions = {base, base + 1, base + 2, base + 1, base + 2};
    tree.mask = BlockMask::from_parents(std::vector<int>{-1, 0, 1, 0, 3});
    runner.forward(tree, tree_cache);
    tree_cache.compact(base, std::vector<int>{0, 3, 4});

    runner.forward(ForwardBatch::causal(prefix, 0, {}), path_cache);
    runner.forward(ForwardBatch::causal(std::vector<int32_t>{310, 825, 29889}, base, {}), path_cache);
    if (path_cache.size() != tree_cache.size()) {
        r.max_kv_diff = INFINITY;
        return r;
    }
    for (int layer = 0; layer < model->config().n_layer; ++layer) {
        for (bool value : {false, true}) {
            for (int slot = 0; slot < path_cache.size(); ++slot) {
                const auto a = tree_cache.read_row(layer, value, slot), b = path_cache.read_row(layer, value, slot);
                r.max_kv_diff = std::max(r.max_kv_diff, max_abs_diff(a, b));
            }
        }
    }
    const ForwardOutput x = runner.forward(ForwardBatch::causal(std::vector<int32_t>{3186}, base + 3, {0}), tree_cache);
    const ForwardOutput y = runner.forward(ForwardBatch::causal(std::vector<int32_t>{3186}, base + 3, {0}), path_cache);
    r.max_logit_diff = max_abs_diff(x.logits, y.logits);
    return r;
}

}  // namespace specula::test
