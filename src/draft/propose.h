#pragma once
// How a model-based drafter turns one node's draft logits into proposed children: top-k at
// temperature 0; otherwise drawn without replacement from the processed draft distribution (the
// same transforms the verifier applies), which is what keeps multi-draft verification lossless.
#include <span>
#include <vector>

#include "draft/drafter.h"
#include "runtime/forward.h"

namespace specula {

// logits over the target vocabulary (-inf for tokens a compact draft vocabulary cannot propose).
Expansion propose_children(std::span<const float> logits, int n_children, const DraftRequest & req, std::vector<float> & scratch);

// One tree level as one block: frontier node i at position_base + depth, seeing the first
// visible_prefix cache slots, its ancestors' slots (slot_of, from earlier levels) and itself.
ForwardBatch frontier_batch(const TokenTree & tree, std::span<const int> frontier, int position_base, int visible_prefix,
                            const std::vector<int> & slot_of);

}  // namespace specula
