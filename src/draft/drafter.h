#pragma once
// A drafter proposes tokens to follow the sequence; the verifier decides. The drafter never
// touches the target's cache: after each round it is told how much of what it saw still stands.
#include <cstdint>
#include <span>
#include <vector>

#include "sample/sampler.h"
#include "tree/token_tree.h"
#include "tree/tree_builder.h"

namespace specula {

struct DraftRequest {
    std::span<const int32_t> history;    // every token so far; the last is the root of the draft
    TreeBudget budget;                   // shape and size of the draft (a chain of depth k, or a tree)
    const SamplingParams * sampling = nullptr;  // drafts follow the processed draft distribution
    Rng * rng = nullptr;
};

// What verification settled, told to the drafter after every round (and after the prompt).
struct Acceptance {
    int n_valid = 0;  // leading tokens of the sequence that are now final (last root + accepted drafts)
    // Target features for positions first_position.. (one row per position, feature_layers()
    // concatenated), for drafters that ask for them; empty otherwise.
    int first_position = 0;
    std::span<const float> features;
};

struct Draft {
    TokenTree tree;
    float mean_entropy = 0.0f;  // of the draft distributions used (nats); 0 for deterministic drafters
};

class Drafter {
public:
    virtual ~Drafter() = default;
    virtual const char * name() const = 0;
    virtual Draft draft(const DraftRequest & request) = 0;
    // After verification: anything the drafter cached past what is final must go.
    virtual void accept(const Acceptance & acceptance) = 0;
    // Target layers whose input hidden states the drafter needs (EAGLE); empty for none.
    virtual std::vector<int> feature_layers() const { return {}; }
    // Forget everything (a new sequence starts).
    virtual void reset() = 0;
};

}  // namespace specula
