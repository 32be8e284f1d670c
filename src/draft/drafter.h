#pragma once
// A drafter proposes tokens to follow the sequence; the verifier decides. The drafter never
// touches the target's cache: after each round it is told how much of what it saw still stands.
#include <cstdint>
#include <span>

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

struct Draft {
    TokenTree tree;
    float mean_entropy = 0.0f;  // of the draft distributions used (nats); 0 for deterministic drafters
};

class Drafter {
public:
    virtual ~Drafter() = default;
    virtual const char * name() const = 0;
    virtual Draft draft(const DraftRequest & request) = 0;
    // After verification: the first n_valid tokens of the sequence the last draft() saw, extended
    // by its accepted drafts, are final; anything the drafter cached past them must go.
    virtual void accept(int n_valid) = 0;
    // Forget everything (a new sequence starts).
    virtual void reset() = 0;
};

}  // namespace specula
