#pragma once
// How a model-based drafter turns one node's draft logits into proposed children: top-k at
// temperature 0; otherwise drawn without replacement from the processed draft distribution (the
// same transforms the verifier applies), which is what keeps multi-draft verification lossless.
#include <span>
#include <vector>

#include "draft/drafter.h"
#include "runtime/forward.h"

namespace specula {

// Where a drafter's logits live: a vocabulary of its own mapped to the target's ids by
// `to_target` (a compact EAGLE-3 draft vocabulary's d2t), or, when that is empty, the target's.
struct DraftVocabulary {
    std::span<const int32_t> to_target;
    int n_target = 0;  // the target's vocabulary size, the width of the q handed to the verifier
};

// logits over the drafter's vocabulary: the transforms run at its width (a 4096-token draft
// vocabulary costs a twelfth of SmolLM2's 49152), then the children and q are mapped to target ids.
// `allowed`: the request's state after the node's path (PathStates over the growing tree), or
// nullptr. With one, children come from the kMaskedCandidates likeliest tokens it allows (q is
// then the processed draft distribution on those alone, renormalised: whatever q is, drawing the
// children from it keeps verification lossless).
inline constexpr int kMaskedCandidates = 64;
Expansion propose_children(std::span<const float> logits, int n_children, const DraftRequest & req, std::vector<float> & scratch,
                           const DraftVocabulary & vocab = {}, const LogitsState * allowed = nullptr);

// propose_children with `allowed` the request's state after frontier node `node` (paths.after over
// the tree's parent and token arrays), proposing nothing there when that path's grammar is past a
// limit (GrammarError): a draft is never a decision, and the verifier meets the limit where the
// target goes.
Expansion propose_on_path(PathStates & paths, int node, std::span<const int> parent, std::span<const int32_t> token, std::span<const float> logits,
                          int n_children, const DraftRequest & req, std::vector<float> & scratch, const DraftVocabulary & vocab = {});

// One tree level as one block: frontier node i at position_base + depth, seeing the first
// visible_prefix cache slots, its ancestors' slots (slot_of, from earlier levels) and itself.
ForwardBatch frontier_batch(const TokenTree & tree, std::span<const int> frontier, int position_base, int visible_prefix,
                            const std::vector<int> & slot_of);

}  // namespace specula
