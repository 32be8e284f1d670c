#include "sample/logits_state.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <string>
#include <unordered_map>

#include "sample/sampler.h"
#include "specula/error.h"

namespace specula {

namespace {

// llama.cpp's llama_sampler_logit_bias then llama_sampler_penalties, over one sequence's tokens.
class PenaltyState final : public LogitsState {
public:
    PenaltyState(const SamplingParams & p, std::span<const int32_t> history)
        : repeat_(p.repeat_penalty),
          presence_(p.presence_penalty),
          frequency_(p.frequency_penalty),
          last_n_(p.penalty_last_n < 0 ? std::numeric_limits<size_t>::max() : static_cast<size_t>(p.penalty_last_n)),
          bias_(p.logit_bias) {
        penalizes_ = last_n_ > 0 && (repeat_ != 1.0f || presence_ != 0.0f || frequency_ != 0.0f);
        for (int32_t t : history) accept(t);
    }
    std::unique_ptr<LogitsState> clone() const override { return std::make_unique<PenaltyState>(*this); }

    void apply_values(std::span<float> logits) const override {
        for (const auto & [token, bias] : bias_) {
            if (static_cast<size_t>(token) >= logits.size()) {
                throw Error("logit_bias names token " + std::to_string(token) + ", outside the " + std::to_string(logits.size()) + "-token vocabulary");
            }
            logits[token] += bias;
        }
        for (const auto & [token, count] : count_) {
            float & l = logits[token];
            // Dividing a negative logit would raise it: llama.cpp multiplies those instead.
            l = l <= 0.0f ? l * repeat_ : l / repeat_;
            l -= static_cast<float>(count) * frequency_ + presence_;
        }
    }

    void apply_bans(std::span<float>) const override {}  // a bias of -inf is a value

    bool allows(int32_t token) const override {
        for (const auto & [t, bias] : bias_) {
            if (t == token && bias == -INFINITY) return false;
        }
        return true;
    }

    void accept(int32_t token) override {
        if (!penalizes_) return;
        ++count_[token];
        if (window_.size() >= last_n_) {
            const int32_t old = window_.front();
            window_.pop_front();
            if (--count_[old] == 0) count_.erase(old);
        }
        window_.push_back(token);
    }

private:
    float repeat_, presence_, frequency_;
    size_t last_n_;
    bool penalizes_ = false;
    std::vector<std::pair<int32_t, float>> bias_;
    std::deque<int32_t> window_;              // the last last_n_ tokens
    std::unordered_map<int32_t, int> count_;  // occurrences in window_
};

class MinTokensState final : public LogitsState {
public:
    MinTokensState(std::vector<int32_t> tokens, int min_tokens) : tokens_(std::move(tokens)), left_(min_tokens) {}
    std::unique_ptr<LogitsState> clone() const override { return std::make_unique<MinTokensState>(*this); }
    void apply_values(std::span<float>) const override {}
    void apply_bans(std::span<float> logits) const override {
        if (left_ <= 0) return;
        for (int32_t t : tokens_) {
            if (t >= 0 && static_cast<size_t>(t) < logits.size()) logits[t] = -INFINITY;
        }
    }
    bool allows(int32_t token) const override { return left_ <= 0 || std::find(tokens_.begin(), tokens_.end(), token) == tokens_.end(); }
    void accept(int32_t) override { --left_; }

private:
    std::vector<int32_t> tokens_;
    int left_;  // tokens still to accept before the ban lifts
};

void check_finite(float value, const char * name) {
    if (!std::isfinite(value)) throw Error(std::string(name) + " must be a finite number");
}

}  // namespace

std::unique_ptr<LogitsState> make_min_tokens_state(std::vector<int32_t> tokens, int min_tokens) {
    return std::make_unique<MinTokensState>(std::move(tokens), min_tokens);
}

std::unique_ptr<LogitsState> make_penalty_state(const SamplingParams & p, std::span<const int32_t> history, int n_vocab) {
    check_finite(p.repeat_penalty, "repeat_penalty");
    check_finite(p.presence_penalty, "presence_penalty");
    check_finite(p.frequency_penalty, "frequency_penalty");
    if (p.repeat_penalty <= 0.0f) throw Error("repeat_penalty must be positive (1 = off), not " + std::to_string(p.repeat_penalty));
    if (p.penalty_last_n < -1) throw Error("penalty_last_n must be -1 (the whole context), 0 (off) or positive");
    for (const auto & [token, bias] : p.logit_bias) {
        if (token < 0 || token >= n_vocab) {
            throw Error("logit_bias names token " + std::to_string(token) + ", outside the " + std::to_string(n_vocab) + "-token vocabulary");
        }
        if (std::isnan(bias) || bias == INFINITY) throw Error("logit_bias of token " + std::to_string(token) + " must be a number or -inf");
    }
    const bool penalizes = p.penalty_last_n != 0 && (p.repeat_penalty != 1.0f || p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f);
    if (!penalizes && p.logit_bias.empty()) return nullptr;
    return std::make_unique<PenaltyState>(p, history);
}

std::unique_ptr<LogitsState> LogitsStates::clone() const {
    std::vector<std::unique_ptr<LogitsState>> copies;
    for (const auto & s : states_) copies.push_back(s->clone());
    return std::make_unique<LogitsStates>(std::move(copies));
}

void LogitsStates::apply_values(std::span<float> logits) const {
    for (const auto & s : states_) s->apply_values(logits);
}

void LogitsStates::apply_bans(std::span<float> logits) const {
    for (const auto & s : states_) s->apply_bans(logits);
}

int32_t processed_argmax(const LogitsState & state, std::span<float> logits) {
    state.apply_values(logits);
    for (int i = 0; i < kArgmaxTries; ++i) {
        const int32_t best = argmax(logits);
        if (!(logits[best] > -INFINITY)) break;  // nothing left above -inf: the bans decide (and may throw)
        if (state.allows(best)) return best;
        logits[best] = -INFINITY;
    }
    state.apply_bans(logits);
    return argmax(logits);
}

bool LogitsStates::allows(int32_t token) const {
    for (const auto & s : states_) {
        if (!s->allows(token)) return false;
    }
    return true;
}

void LogitsStates::accept(int32_t token) {
    for (const auto & s : states_) s->accept(token);
}

std::vector<int32_t> LogitsStates::forced_tokens(int max_tokens) const {
    for (const auto & s : states_) {
        std::vector<int32_t> forced = s->forced_tokens(max_tokens);
        if (forced.empty()) continue;
        const auto walk = clone();
        for (size_t i = 0; i < forced.size(); ++i) {
            if (!walk->allows(forced[i])) {
                forced.resize(i);
                break;
            }
            walk->accept(forced[i]);
        }
        return forced;
    }
    return {};
}

const LogitsState * PathStates::after(int node, std::span<const int> parent, std::span<const int32_t> token) {
    if (!root_ || node < 0) return root_;
    if (states_.size() <= static_cast<size_t>(node)) states_.resize(node + 1);
    std::unique_ptr<LogitsState> & s = states_[node];
    if (!s) {
        s = after(parent[node], parent, token)->clone();
        s->accept(token[node]);
    }
    return s.get();
}

TokenLogprob token_logprob(std::span<const float> logits, int32_t token, int n_top, std::vector<float> & scratch) {
    const SoftmaxStats st = softmax_stats(logits, scratch);
    TokenLogprob r{token, st.log_prob(logits[token]), {}};
    for (int32_t t : top_k_ids(logits, n_top)) {
        const float lp = st.log_prob(logits[t]);
        if (lp == -INFINITY) break;  // ranked last: banned from here on
        r.top.emplace_back(t, lp);
    }
    return r;
}

TokenLogprob token_post_sampling_logprob(std::span<const float> logits, int32_t token, int n_top, const SamplingParams & params, std::vector<float> & scratch) {
    processed_probs(logits, params, scratch);
    TokenLogprob r{token, std::log(scratch[token]), {}};
    for (int32_t t : top_k_ids(scratch, n_top)) {
        if (!(scratch[t] > 0.0f)) break;  // ranked last: off the distribution's support from here on
        r.top.emplace_back(t, std::log(scratch[t]));
    }
    return r;
}

}  // namespace specula
