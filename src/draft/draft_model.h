#pragma once
// A small language model sharing the target's vocabulary drafts chains or trees with its own KV
// cache. A tree is drafted one depth per forward (the frontier as one block, each node seeing its
// cached ancestors). Afterwards the cache keeps only accepted tokens, never rejected drafts, so
// every draft step attends to exactly the sequence the target has.
#include <memory>

#include "draft/drafter.h"
#include "kv/kv_cache.h"
#include "runtime/forward.h"

namespace specula {

class Model;

class DraftModelDrafter : public Drafter {
public:
    DraftModelDrafter(const Model & model, int n_ctx);
    const char * name() const override { return "draft-model"; }
    Draft draft(const DraftRequest & request) override;
    void accept(const Acceptance & a) override;
    void reset() override { cache_.rollback(0); }

    const KvCache & cache() const { return cache_; }

private:
    const Model & model_;
    ModelRunner runner_;
    KvCache cache_;
    ForwardOutput out_;
    std::vector<float> probs_;
};

}  // namespace specula
