#pragma once
// Per-request logit processing that depends on the tokens so far: penalties, logit bias, and
// (src/constrain/) grammars. A state is the processing after some sequence of tokens; under
// speculation each drafted path gets its own (clone, then accept the path's tokens), so a node's
// row is processed exactly as plain decoding would process it at that point.
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "specula/sampling.h"

namespace specula {

class LogitsState {
public:
    virtual ~LogitsState() = default;
    virtual std::unique_ptr<LogitsState> clone() const = 0;
    // Processes a full-vocabulary row of raw logits in place (a banned token becomes -inf): the
    // values (penalties, bias), then the bans (a grammar's), which change nothing else.
    void apply(std::span<float> logits) const {
        apply_values(logits);
        apply_bans(logits);
    }
    virtual void apply_values(std::span<float> logits) const = 0;
    virtual void apply_bans(std::span<float> logits) const = 0;  // throws Error when nothing is left to draw
    // Whether apply() leaves `token` above -inf: cheap, without a row.
    virtual bool allows(int32_t token) const = 0;
    // The sequence continues with `token`.
    virtual void accept(int32_t token) = 0;
    // Up to max_tokens tokens that spell the text the processing forces next (a grammar whose next
    // characters are fixed: a JSON schema's keys, braces and quotes), each allowed after the ones
    // before it; empty when nothing is forced. Drafts, never decisions: the target verifies them.
    virtual std::vector<int32_t> forced_tokens(int max_tokens) const {
        (void)max_tokens;
        return {};
    }
};

// Logit bias, then llama.cpp's repeat / presence / frequency penalties over the last
// penalty_last_n tokens (-1: all of them) of `history` and what is accepted after it. Throws
// Error for settings that name no token of the n_vocab-token vocabulary or are not numbers (and
// apply() for a biased token past its row); nullptr when the settings process nothing.
std::unique_ptr<LogitsState> make_penalty_state(const SamplingParams & params, std::span<const int32_t> history, int n_vocab);

// Bans `tokens` (a sequence's end tokens) until min_tokens tokens are accepted after the history.
std::unique_ptr<LogitsState> make_min_tokens_state(std::vector<int32_t> tokens, int min_tokens);

// The argmax of apply(logits), `logits` the raw row (overwritten), without banning over the whole
// row where it can: the values processed, the likeliest tokens are tried against allows() in turn
// (bans only lower tokens to -inf, so the first allowed is the processed row's argmax, ties by
// id). Only after kArgmaxTries banned ones is the whole row banned: a grammar over a 262k-token
// vocabulary costs milliseconds per row, a token's check microseconds.
inline constexpr int kArgmaxTries = 16;
int32_t processed_argmax(const LogitsState & state, std::span<float> logits);

// Several states applied in order as one.
class LogitsStates final : public LogitsState {
public:
    explicit LogitsStates(std::vector<std::unique_ptr<LogitsState>> states) : states_(std::move(states)) {}
    std::unique_ptr<LogitsState> clone() const override;
    void apply_values(std::span<float> logits) const override;
    void apply_bans(std::span<float> logits) const override;
    bool allows(int32_t token) const override;
    void accept(int32_t token) override;
    // The first state's forced tokens that forces any, as far as every state allows them.
    std::vector<int32_t> forced_tokens(int max_tokens) const override;

private:
    std::vector<std::unique_ptr<LogitsState>> states_;
};

// The states after the paths of a tree of tokens (node i: parent[i], -1 for the root's children,
// and token[i]), each made once, when first asked for: the parent's cloned, the node's token
// accepted. The drafter's proposals and the verifier's rows see them.
class PathStates {
public:
    // A new tree from `root` (nullptr: no processing, every state is nullptr).
    void reset(const LogitsState * root) {
        root_ = root;
        states_.clear();
    }
    const LogitsState * after(int node, std::span<const int> parent, std::span<const int32_t> token);

private:
    const LogitsState * root_ = nullptr;
    std::vector<std::unique_ptr<LogitsState>> states_;
};

// `token`'s log-probability in `logits` (a processed row) at temperature 1, and the n_top most
// likely tokens with theirs (banned ones left out).
TokenLogprob token_logprob(std::span<const float> logits, int32_t token, int n_top, std::vector<float> & scratch);
// The same after the sampler chain (llama-server's post_sampling_probs): `token`'s log-probability
// in processed_probs(logits, params), the distribution it was drawn from (truncation and
// temperature applied; greedy params: 1 at the argmax), and the n_top most likely tokens of it,
// those of probability 0 left out (at T = 0 the argmax alone).
TokenLogprob token_post_sampling_logprob(std::span<const float> logits, int32_t token, int n_top, const SamplingParams & params, std::vector<float> & scratch);

}  // namespace specula
