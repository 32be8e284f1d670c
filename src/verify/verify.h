#pragma once
// Verification of a draft against the target's logits from one forward over [root, nodes...].
//
// Terms (as in vLLM's rejection sampler):
//   accepted   - a drafted token the target keeps;
//   rejected   - a drafted token the target refuses;
//   correction - the target's token emitted where a draft was refused (drawn from the residual);
//   bonus      - the target's token emitted after a fully accepted path (drawn from p).
// Every round therefore emits accepted.size() + 1 tokens.
//
// The verifier knows nothing about which drafter made the draft: it sees a TokenTree and, per
// expanded node, the draft distribution q its children were proposed from (or none: one-hot).
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "sample/sampler.h"
#include "specula/report.h"
#include "tree/token_tree.h"

namespace specula {

struct VerifyResult {
    std::vector<int> accepted;  // accepted nodes, root-exclusive, top-down
    int32_t next_token = -1;    // correction or bonus
    bool bonus = false;
    std::vector<VerifyEvent> events;
};

// Target logits, row 0 for the root and row i + 1 for node i, each n_vocab wide; or, where the
// request processes logits (verify/path_logits.h), the rows `processed_row` gives.
struct TargetLogits {
    std::span<const float> data;
    int n_vocab = 0;
    std::function<std::span<const float>(int node)> processed_row = {};
    std::function<int32_t(int node)> processed_argmax = {};  // with processed_row: its argmax, cheaper than the row
    std::span<const float> row_of(int node) const {
        if (processed_row) return processed_row(node);
        return data.subspan(static_cast<size_t>(node + 1) * n_vocab, n_vocab);
    }
    int32_t argmax_of(int node) const { return processed_argmax ? processed_argmax(node) : argmax(row_of(node)); }
};

// Temperature 0: follow the target's argmax through the tree as far as a child matches.
VerifyResult verify_greedy(const TokenTree & tree, const TargetLogits & logits);

// Temperature > 0: lossless multi-draft rejection sampling. At each node the children drawn from
// the drafter's q are tried first, in tree order: accept child c with min(1, p(c)/q(c)); on
// rejection p <- norm(max(p - q, 0)) and c is removed from q (children are proposals without
// replacement). If none is accepted, what is left of p is drawn at the keyed uniform of the token's
// position (Rng::at; root_position + depth), and a child proposed one-hot (a lookup token, grafted
// or alone, TokenTree::one_hot) is accepted if it is the token drawn; else that token is the
// correction or bonus. A one-hot child x is thus accepted with what is left of p(x), as rejection
// sampling would, and the output follows the target's processed distribution exactly. Where no
// drawn child is tried (no drafter with a q: lookup, the suffix cache, plain rounds), the token at
// each position is the one plain decoding draws there with the same seed: the text is the same
// whatever was drafted.
VerifyResult verify_sampled(const TokenTree & tree, const TargetLogits & logits, const SamplingParams & params, Rng & rng,
                            int64_t root_position);

}  // namespace specula
