#pragma once
// The verify-cost curve as the policies use it: measured once, at one depth, for the target's
// forward alone, then scaled by what verification (forward, acceptance, cache compaction) really
// costs in the running loop, learned from every round. Past the measured sizes (a step that
// carries several sequences' rows) the curve goes on linearly with the slope of its upper half.
#include <algorithm>
#include <utility>
#include <vector>

namespace specula {

class VerifyCost {
public:
    // curve_ms[b - 1]: measured cost of a target forward of b tokens.
    explicit VerifyCost(std::vector<double> curve_ms) : curve_(std::move(curve_ms)) {}

    int max_tokens() const { return static_cast<int>(curve_.size()); }
    // Expected cost of verifying n_tokens (>= 1) now.
    double ms(int n_tokens) const { return scale_ * curve(n_tokens); }
    // A round (or a step) verified n_tokens in `measured_ms`.
    void observe(int n_tokens, double measured_ms) {
        if (n_tokens < 1 || curve_.empty() || curve(n_tokens) <= 0) return;
        scale_ = 0.9 * scale_ + 0.1 * (measured_ms / curve(n_tokens));
    }

private:
    double curve(int n) const {
        const int m = max_tokens();
        if (n <= m) return curve_[n - 1];
        const int lo = (m + 1) / 2;
        const double slope = m > lo ? std::max(0.0, (curve_[m - 1] - curve_[lo - 1]) / (m - lo)) : 0.0;
        return curve_[m - 1] + slope * (n - m);
    }

    std::vector<double> curve_;
    double scale_ = 1.0;
};

}  // namespace specula
