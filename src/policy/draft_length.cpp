#include "policy/draft_length.h"

#include <algorithm>

#include "specula/error.h"
#include "policy/verify_cost.h"

namespace specula {

double expected_tokens(const std::vector<double> & alpha, int k) {
    double e = 1.0, reach = 1.0;
    for (int i = 0; i < k && i < static_cast<int>(alpha.size()); ++i) e += (reach *= alpha[i]);
    return e;
}

StepShare estimate_step_share(int previous_verify_rows, int previous_tokens, int own_rows, int own_tokens, int other_sequences,
                              int other_decoding) {
    return StepShare{std::max({0, previous_verify_rows - own_rows, other_decoding}),
                     std::max({0.0, double(previous_tokens - own_tokens), double(other_decoding)}), std::max(0, other_sequences)};
}

namespace {

class FixedPolicy : public DraftLengthPolicy {
public:
    explicit FixedPolicy(int k) : k_(k) {}
    const char * name() const override { return "fixed"; }
    int next_length() override { return k_; }
    void observe(const RoundObservation &) override {}

private:
    int k_;
};

class HeuristicPolicy : public DraftLengthPolicy {
public:
    explicit HeuristicPolicy(int k_max) : k_max_(k_max), k_(std::max(1, k_max / 2)) {}
    const char * name() const override { return "heuristic"; }
    void begin_sequence() override { k_ = std::max(1, k_max_ / 2); }
    int next_length() override { return k_; }
    void observe(const RoundObservation & r) override {
        if (r.drafted == 0) return;
        const double rate = double(r.accepted) / r.drafted;
        if (rate > 0.8) k_ = std::min(k_ + 1, k_max_);
        else if (rate < 0.3) k_ = std::max(k_ - 1, 1);
        if (r.mean_entropy < 2.0f && rate >= 0.5) k_ = std::min(k_ + 1, k_max_);
    }

private:
    int k_max_, k_;
};

class CostPolicy : public DraftLengthPolicy {
public:
    CostPolicy(int k_max, std::vector<double> verify_ms, int measured_depth, double row_depth_ms)
        : k_max_(k_max), verify_(verify_ms, measured_depth, row_depth_ms), reached_(k_max, 0.0), accepted_(k_max, 0.0) {
        if (verify_.max_tokens() < k_max + 1) throw Error("cost policy: verify cost curve too short");
    }
    const char * name() const override { return "cost"; }

    int next_length() override { return next_length_in(StepShare{}); }

    int next_length_in(const StepShare & step) override {
        // Acceptance per position with a weak optimistic prior (so untried depths get tried).
        std::vector<double> alpha(k_max_);
        for (int i = 0; i < k_max_; ++i) alpha[i] = (accepted_[i] + 0.8 * kPrior) / (reached_[i] + kPrior);
        // Tokens per second of the whole step: a longer draft makes every sequence in it wait.
        const StepRate step_rate = rate_of(step);
        const double plain_rate = step_rate.tokens / step_rate.plain_ms;
        int best = 0;
        double best_rate = plain_rate;
        for (int k = 1; k <= k_max_; ++k) {
            const double draft_ms = k * draft_ms_per_token_ + lag_ * catch_up_ms_per_token_;
            const double rate = (expected_tokens(alpha, k) + step_rate.tokens - 1.0) / (draft_ms + step_rate.ms(k));
            if (rate > best_rate) best_rate = rate, best = k;
        }
        model_rate_ = best_rate;
        const int plain_rows = step_rate.plain_rows;
        // A probe delays every sequence in the step: about as often per step as alone.
        if (best > 0) {
            plain_streak_ = 0;
        } else if (verify_.some_chain_pays(plain_rows, plain_rate, draft_ms_per_token_, k_max_) &&
                   ++plain_streak_ >= kProbeEvery * (1 + std::max(0, step.other_sequences))) {
            plain_streak_ = 0;
            probing_ = true;
            return 1;
        }
        probing_ = false;
        return best;
    }

    // The acceptance seen so far stays too, as the new text's prior (it decays within a few dozen
    // rounds); its first drafting round catches the drafter up on the prompt and is not timed.
    void begin_sequence() override { n_drafting_rounds_ = 0, plain_streak_ = 0, lag_ = 0, probing_ = false; }

    int free_chain_length(std::span<const double> path_probs, const StepShare & step, bool model_may_draft) override {
        const StepRate step_rate = rate_of(step);
        double best_rate = model_may_draft ? model_rate_ : step_rate.tokens / step_rate.plain_ms;
        double expected = step_rate.tokens;
        int best = 0;
        for (int n = 1; n <= k_max_ && n <= static_cast<int>(path_probs.size()); ++n) {
            expected += path_probs[n - 1];
            const double rate = expected / step_rate.ms(n);
            if (rate > best_rate) best_rate = rate, best = n;
        }
        return best;
    }

    void observe(const RoundObservation & r) override {
        verify_.observe(r.verify_tokens, 1000.0 * r.verify_seconds);
        // A free chain tells nothing of the model's acceptance or drafting time. The model's next
        // draft first reads the tokens the free chains emitted: that time is the catch-up's.
        if (r.free_draft) {
            lag_ += r.accepted + 1;
            return;
        }
        // Recent rounds count more: acceptance drifts with the text.
        for (int i = 0; i < k_max_; ++i) reached_[i] *= kKeep, accepted_[i] *= kKeep;
        // Position i was reached if every earlier draft was accepted.
        for (int i = 0; i < r.drafted && i < k_max_; ++i) {
            reached_[i] += 1.0;
            if (i < r.accepted) accepted_[i] += 1.0;
            if (i >= r.accepted) break;
        }
        // Draft time per token, except where it pays for catching up: the first drafting round
        // (the drafter's pass over the prompt) and probes after plain steps (the tokens it skipped).
        if (r.drafted > 0 && n_drafting_rounds_++ > 0 && !probing_) {
            const double ms = 1000.0 * r.draft_seconds;
            if (lag_ > 0) {
                const double per_token = std::max(0.0, ms - r.drafted * draft_ms_per_token_) / lag_;
                catch_up_ms_per_token_ = catch_up_ms_per_token_ == 0.0 ? per_token : 0.8 * catch_up_ms_per_token_ + 0.2 * per_token;
            } else {
                const double per_token = ms / r.drafted;
                draft_ms_per_token_ = draft_ms_per_token_ == 0.0 ? per_token : 0.9 * draft_ms_per_token_ + 0.1 * per_token;
            }
        }
        if (r.drafted > 0) lag_ = 0;
    }
    void observe_step(int rows, double forward_ms) override { verify_.observe_step(rows, forward_ms); }
    void at_depth(int tokens) override { verify_.at_depth(tokens); }

private:
    // The step's tokens every round emits (this sequence's root and the others' expected ones),
    // the time of its plain forward, and of one verifying n more rows.
    struct StepRate {
        const VerifyCost * verify;
        int plain_rows;
        double tokens, plain_ms;
        double ms(int n) const { return plain_ms + verify->extra_ms(plain_rows, n); }
    };
    StepRate rate_of(const StepShare & step) const {
        const int plain_rows = std::max(0, step.other_rows) + 1;
        return StepRate{&verify_, plain_rows, 1.0 + std::max(0.0, step.other_tokens), verify_.ms(plain_rows)};
    }

    static constexpr double kPrior = 2.0;
    static constexpr double kKeep = 0.98;
    static constexpr int kProbeEvery = 8;
    int k_max_;
    VerifyCost verify_;
    std::vector<double> reached_, accepted_;
    double draft_ms_per_token_ = 0.0;
    int n_drafting_rounds_ = 0;
    int plain_streak_ = 0;
    bool probing_ = false;
    // Tokens the free chains emitted since the model's last draft, which its next one reads first,
    // at the catch-up's measured ms per token (0 until measured).
    int lag_ = 0;
    double catch_up_ms_per_token_ = 0.0;
    double model_rate_ = 0.0;  // the best rate next_length_in() found: the model's or the plain step's
};

}  // namespace

std::unique_ptr<DraftLengthPolicy> make_draft_policy(DraftPolicyKind kind, int k_max, std::vector<double> verify_cost_ms,
                                                     int measured_depth, double row_depth_ms) {
    if (k_max < 1) throw Error("--draft-max must be at least 1");
    switch (kind) {
        case DraftPolicyKind::Fixed: return std::make_unique<FixedPolicy>(k_max);
        case DraftPolicyKind::Heuristic: return std::make_unique<HeuristicPolicy>(k_max);
        case DraftPolicyKind::Cost: return std::make_unique<CostPolicy>(k_max, std::move(verify_cost_ms), measured_depth, row_depth_ms);
    }
    throw Error("unknown draft policy");
}

}  // namespace specula
