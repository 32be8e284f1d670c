#pragma once
// The verify-cost curve as the policies use it: measured once, at one depth, for the target's
// forward alone, then scaled by what verification (forward, acceptance, cache compaction) really
// costs in the running loop, learned from every round.
#include <utility>
#include <vector>

namespace specula {

class VerifyCost {
public:
    // curve_ms[b - 1]: measured cost of a target forward of b tokens.
    explicit VerifyCost(std::vector<double> curve_ms) : curve_(std::move(curve_ms)) {}

    int max_tokens() const { return static_cast<int>(curve_.size()); }
    // Expected cost of verifying n_tokens (1 <= n_tokens <= max_tokens()) now.
    double ms(int n_tokens) const { return scale_ * curve_[n_tokens - 1]; }
    // A round verified n_tokens in `measured_ms`.
    void observe(int n_tokens, double measured_ms) {
        if (n_tokens < 1 || n_tokens > max_tokens() || curve_[n_tokens - 1] <= 0) return;
        scale_ = 0.9 * scale_ + 0.1 * (measured_ms / curve_[n_tokens - 1]);
    }

private:
    std::vector<double> curve_;
    double scale_ = 1.0;
};

}  // namespace specula
