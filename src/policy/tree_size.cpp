#include "policy/tree_size.h"

#include <algorithm>

#include "specula/error.h"

namespace specula {

TreeSizePolicy::TreeSizePolicy(std::vector<double> verify_cost_ms, int measured_depth, double row_depth_ms)
    : verify_(verify_cost_ms, measured_depth, row_depth_ms) {
    if (verify_.max_tokens() < 2) throw Error("tree size policy: verify cost curve too short");
}

int TreeSizePolicy::choose(std::span<const double> path_probs, double draft_ms, const StepShare & step, int min_nodes) {
    const Choice c = best_prefix(path_probs, draft_ms, step, min_nodes);
    chosen_rate_ = c.rate;
    return c.nodes;
}

TreeSizePolicy::Choice TreeSizePolicy::best_prefix(std::span<const double> path_probs, double draft_ms, const StepShare & step,
                                                   int min_nodes) const {
    const double gamma = this->gamma();
    const int others = std::max(0, step.other_rows);
    const double other_tokens = std::max(0.0, step.other_tokens);
    Choice best{min_nodes, 0.0};
    double promised = 0.0;
    const int n_max = std::min<int>(static_cast<int>(path_probs.size()), max_nodes());
    for (int n = 0; n <= n_max; ++n) {
        if (n > 0) promised += path_probs[n - 1];
        if (n < min_nodes) continue;
        const double rate = (1.0 + gamma * promised + other_tokens) / (draft_ms + verify_.ms(others + 1) + verify_.extra_ms(others + 1, n));
        if (rate > best.rate) best = Choice{n, rate};
    }
    return best;
}

std::vector<float> TreeSizePolicy::rank_bars(const StepShare & step) const {
    std::vector<float> bars;
    if (chosen_rate_ <= 0.0) return bars;
    const double gamma = this->gamma();
    const int rows = std::max(0, step.other_rows) + 1;
    for (int k = 0; k < max_nodes(); ++k) {
        const double row_ms = verify_.extra_ms(rows, k + 1) - verify_.extra_ms(rows, k);
        bars.push_back(static_cast<float>(chosen_rate_ * std::max(0.0, row_ms) / gamma));
    }
    return bars;
}

double TreeSizePolicy::observe_draft(double draft_ms, int levels, std::span<const double> level_ms) {
    if (levels <= 0) return draft_ms;
    if (!time_next_draft_) {
        time_next_draft_ = true;
        if (level_ms_ == 0.0) {  // with nothing timed yet, the catch-up round's fastest ordinary level gives the first figure
            if (level_ms.empty()) level_ms_ = draft_ms / levels;
            else if (level_ms.size() >= 2) level_ms_ = *std::min_element(level_ms.begin() + 1, level_ms.end());
        }
        return level_ms_ > 0.0 ? level_ms_ * levels : draft_ms;
    }
    const double per_level = draft_ms / levels;
    const double weight = per_level < level_ms_ ? 0.5 : 0.1;
    level_ms_ = level_ms_ == 0.0 ? per_level : (1.0 - weight) * level_ms_ + weight * per_level;
    return draft_ms;
}

double TreeSizePolicy::plain_rate(const StepShare & step) const {
    return (1.0 + std::max(0.0, step.other_tokens)) / verify_.ms(std::max(0, step.other_rows) + 1);
}

bool TreeSizePolicy::can_pay(const StepShare & step) const {
    if (level_ms_ == 0.0) return true;  // no drafting round timed yet
    return verify_.some_chain_pays(std::max(0, step.other_rows) + 1, plain_rate(step), level_ms_, max_nodes());
}

TreeSizePolicy::Round TreeSizePolicy::plan_round(const StepShare & step, double free_rate) {
    last_plan_ = decide_round(step, free_rate);
    if (last_plan_ == Round::Skip) {
        ++skipped_;
        time_next_draft_ = false;  // the next drafting round catches up on this one's tokens
    } else {
        skipped_ = 0;
    }
    return last_plan_;
}

TreeSizePolicy::Round TreeSizePolicy::decide_round(const StepShare & step, double free_rate) const {
    if (!can_pay(step)) return Round::Skip;
    if (reached_[0] == 0.0) return Round::Draft;
    const int plain_rows = std::max(0, step.other_rows) + 1;
    const double other_tokens = std::max(0.0, step.other_tokens);
    const double bar = std::max(plain_rate(step), free_rate);  // what the round gives without a model draft
    const double nodes_per_level = levels_ > 0.0 ? std::max(1.0, level_nodes_ / levels_) : 1.0;
    double tokens = 1.0, reach = 1.0;
    for (int depth = 1; depth <= kMaxDepth && reached_[depth - 1] > 0.0; ++depth) {
        const int d = depth - 1;
        reach *= (accepted_at_[d] + kPriorAcceptance * kPriorRounds) / (reached_[d] + kPriorRounds);
        tokens += reach;
        const int nodes = std::min(max_nodes(), std::max(depth, static_cast<int>(nodes_per_level * depth + 0.5)));
        const double ms = depth * level_ms_ + verify_.ms(plain_rows) + verify_.extra_ms(plain_rows, nodes);
        if ((tokens + other_tokens) / ms > bar) return Round::Draft;
    }
    // Exploring costs a drafter level and a verify row, and the whole step pays for them, so a
    // step of several sequences explores about as often as one sequence alone: each sequence
    // every kExploreEvery x (sequences in the step) skips, or less often where one exploration
    // would cost more than kExploreShare of the plain rounds before it (deep in a long context a
    // verify row costs up to half a forward).
    const double explore_ms = level_ms_ + verify_.extra_ms(plain_rows, 1);
    const double every = std::max<double>(kExploreEvery, explore_ms / (kExploreShare * verify_.ms(plain_rows)));
    if (skipped_ + 1 >= every * (1 + std::max(0, step.other_sequences))) return Round::Explore;
    return Round::Skip;
}

double TreeSizePolicy::min_path_prob(const StepShare & step) const {
    const double gamma = this->gamma();
    return level_ms_ * plain_rate(step) / gamma;
}

void TreeSizePolicy::observe_step(int rows, double forward_ms) { verify_.observe_step(rows, forward_ms); }

void TreeSizePolicy::observe(double promised, int accepted, int n_verified, int depth, double verify_ms, int step_rows) {
    // Forget slowly: the text, and with it the draft's calibration, drifts during a generation.
    constexpr double kKeep = 0.95;
    promised_ = kKeep * promised_ + promised;
    accepted_ = kKeep * accepted_ + accepted;
    for (int d = 0; d < kMaxDepth; ++d) reached_[d] *= kKeep, accepted_at_[d] *= kKeep;
    for (int d = 0; d < std::min(depth, kMaxDepth); ++d) {
        reached_[d] += 1.0;
        if (d >= accepted) break;
        accepted_at_[d] += 1.0;
    }
    if (last_plan_ == Round::Draft && depth > 0) levels_ = kKeep * levels_ + depth, level_nodes_ = kKeep * level_nodes_ + n_verified;
    verify_.observe(step_rows < 0 ? n_verified + 1 : step_rows, verify_ms);
}

}  // namespace specula
