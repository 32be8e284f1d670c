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

// Temperature > 0: lossless multi-draft rejection sampling. At each node the children are tried
// in order: accept child c with min(1, p(c)/q(c)); on rejection p <- norm(max(p - q, 0)) and c is
// removed from q (children are proposals without replacement); if every child is refused, the
// next token is drawn from what is left of p. Children proposed one-hot (grafted lookup tokens
// beside the drafter's samples, TokenTree::one_hot) are tried after the drawn ones, each accepted
// with what is left of p(t) and, rejected, leaving p without t. With one child per node this is
// the classic speculative-sampling rule; the output then follows the target's processed
// distribution exactly.
VerifyResult verify_sampled(const TokenTree & tree, const TargetLogits & logits, const SamplingParams & params, Rng & rng);

}  // namespace specula
