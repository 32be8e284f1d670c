#pragma once
// How a model-based drafter turns one node's draft logits into proposed children: top-k at
// temperature 0; otherwise drawn without replacement from the processed draft distribution (the
// same transforms the verifier applies), which is what keeps multi-draft verification lossless.
#include <span>
#include <vector>

#include "draft/drafter.h"

namespace specula {

// logits over the target vocabulary (-inf for tokens a compact draft vocabulary cannot propose).
Expansion propose_children(std::span<const float> logits, int n_children, const DraftRequest & req, std::vector<float> & scratch);

}  // namespace specula
