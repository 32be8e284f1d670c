#include "draft/drafter.h"

#include <chrono>
#include <tuple>

#include "specula/error.h"
#include "runtime/kv_cache.h"

namespace specula {

void prune_draft(Draft & draft, int n) {
    if (n >= draft.tree.size()) return;
    if (draft.grafted_from >= 0) {
        const std::vector<int> order = prune_order(draft.tree);
        int model_kept = 0;
        for (int i = 0; i < n; ++i) model_kept += order[i] < draft.grafted_from;
        draft.grafted_from = model_kept == n ? -1 : model_kept;
    }
    draft.tree = n > 0 ? prune_tree(draft.tree, n) : TokenTree{};
}

void PendingForward::wait_for(ModelRunner & runner, KvCache & cache, ForwardOutput & out, ForwardBatch batch) {
    batch_ = std::move(batch);
    first_slot_ = cache.size();
    forward_ = DraftForward{&runner, BatchPart{&batch_, &cache, &out}};
    waiting_ = true;
}

void PendingForward::done() {
    if (!waiting_) throw Error("drafter: resumed with no forward pending");
    waiting_ = false;
}

DraftLevels run_drafts(std::span<Drafter * const> drafters) {
    // Forwards can be merged when they go through one runner into one KV pool with the same kind
    // of input (an EAGLE head's catch-up rows carry target features, its tree rows its own state).
    using Key = std::tuple<ModelRunner *, uint64_t, size_t>;
    auto key_of = [](const DraftForward & f) {
        const ForwardBatch & b = *f.part.batch;
        return Key{f.runner, f.part.cache->id(), b.hidden_in.size() / static_cast<size_t>(b.n_tokens())};
    };
    std::vector<Drafter *> waiting, group_drafters;
    std::vector<BatchPart> group;
    DraftLevels levels;
    for (;;) {
        waiting.clear();
        for (Drafter * d : drafters) {
            if (d->pending()) waiting.push_back(d);
        }
        if (waiting.empty()) return levels;
        const auto t0 = std::chrono::steady_clock::now();
        // One group per distinct key, in the order drafters first name it.
        while (!waiting.empty()) {
            const Key key = key_of(*waiting.front()->pending());
            group.clear();
            group_drafters.clear();
            std::erase_if(waiting, [&](Drafter * d) {
                if (key_of(*d->pending()) != key) return false;
                group.push_back(d->pending()->part);
                group_drafters.push_back(d);
                return true;
            });
            std::get<0>(key)->forward_parts(group);
            for (Drafter * d : group_drafters) d->resume();
            ++levels.forwards;
        }
        levels.level_ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
}

}  // namespace specula
