#pragma once
// The tree-compaction check shared by the CPU cache tests and the RPC device test: after a
// prefix, a 5-node tree (0:a -> 1:b -> 2:c ; 0:a -> 3:d -> 4:e) is decoded and the cache compacted
// to the path a, d, e; a second cache decodes that path alone. The compacted cache must hold the
// same K/V (every layer, both tensors) and give the next token the same logits.
#include <string>

namespace specula {

class Backend;

namespace test {

struct CompactionCheck {
    double max_kv_diff = 0.0;     // compacted tree cache vs the path decoded alone
    double max_logit_diff = 0.0;  // the next token's logits through either cache
    bool v_transposed = false;
};
CompactionCheck check_tree_compaction(Backend & backend, const std::string & model_path);

}  // namespace test
}  // namespace specula
