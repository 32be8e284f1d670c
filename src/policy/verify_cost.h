#pragma once
// The verify-cost curve as the policies use it: measured once, at one depth, for the target's
// forward alone, then scaled by what verification (forward, acceptance, cache compaction) really
// costs in the running loop, learned from every round. Past the measured sizes (a step that
// carries several sequences' rows) the curve goes on linearly with the slope of its upper half.
#include <algorithm>
#include <cstddef>
#include <vector>

namespace specula {

// The closest non-decreasing curve in least squares (pool adjacent violators). A forward of more
// tokens never costs less than one of fewer; a timed curve can say so (a slow sample at 3 tokens,
// a lucky one at 8), and the policies would then prefer whichever size was timed lucky.
inline std::vector<double> non_decreasing(const std::vector<double> & curve) {
    std::vector<double> mean;  // pooled blocks: mean and size
    std::vector<size_t> size;
    for (double v : curve) {
        mean.push_back(v), size.push_back(1);
        while (mean.size() > 1 && mean[mean.size() - 2] > mean.back()) {
            const size_t n = size[size.size() - 2] + size.back();
            const double m = (mean[mean.size() - 2] * size[size.size() - 2] + mean.back() * size.back()) / n;
            mean.pop_back(), size.pop_back();
            mean.back() = m, size.back() = n;
        }
    }
    std::vector<double> out;
    for (size_t b = 0; b < mean.size(); ++b) out.insert(out.end(), size[b], mean[b]);
    return out;
}

class VerifyCost {
public:
    // curve_ms[b - 1]: measured cost of a target forward of b tokens (made non-decreasing).
    explicit VerifyCost(const std::vector<double> & curve_ms) : curve_(non_decreasing(curve_ms)) {}

    int max_tokens() const { return static_cast<int>(curve_.size()); }
    // Expected cost of verifying n_tokens (>= 1) now.
    double ms(int n_tokens) const { return scale_ * curve(n_tokens); }
    // A round (or a step) verified n_tokens in `measured_ms`.
    void observe(int n_tokens, double measured_ms) {
        if (n_tokens < 1 || curve_.empty() || curve(n_tokens) <= 0) return;
        scale_ = 0.9 * scale_ + 0.1 * (measured_ms / curve(n_tokens));
    }

    // A shared step of `rows` verify rows (no prefill chunks) took `measured_ms`. Steps of many
    // sequences cost more per extra row than one sequence's verify block of the same size (each
    // sequence's row reads its own cached keys), so the line through these steps prices rows
    // beyond a busy step's own.
    void observe_step(int rows, double measured_ms) {
        constexpr double kKeep = 0.99;
        w_ = kKeep * w_ + 1.0, sx_ = kKeep * sx_ + rows, sy_ = kKeep * sy_ + measured_ms;
        sxx_ = kKeep * sxx_ + double(rows) * rows, sxy_ = kKeep * sxy_ + rows * measured_ms;
    }
    // Cost of n more rows in a forward of `rows` rows: the curve's, or, once the steps seen so far
    // vary enough in size to give a slope, the step line's if that is higher.
    double extra_ms(int rows, int n) const {
        const double from_curve = ms(rows + n) - ms(rows);
        const double var = w_ > 0 ? sxx_ / w_ - (sx_ / w_) * (sx_ / w_) : 0.0;
        if (w_ < 20.0 || var < 0.25) return from_curve;
        const double slope = (sxy_ / w_ - (sx_ / w_) * (sy_ / w_)) / var;
        return std::max(from_curve, slope * n);
    }

    // Whether a chain of n drafted tokens, all accepted, could beat `plain_rate` (tokens per ms of
    // the step without the draft, whose rows are `plain_rows`) for some n <= max_n: n tokens for n
    // drafts of `draft_ms_per_token` and n more verify rows. Where none could, no draft is worth
    // making, not even to explore. (The curve is not straight: the first extra row can cost more
    // than the next few, so every n is tried.)
    bool some_chain_pays(int plain_rows, double plain_rate, double draft_ms_per_token, int max_n) const {
        for (int n = 1; n <= max_n; ++n) {
            if (n / (n * draft_ms_per_token + extra_ms(plain_rows, n)) > plain_rate) return true;
        }
        return false;
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
    double w_ = 0.0, sx_ = 0.0, sy_ = 0.0, sxx_ = 0.0, sxy_ = 0.0;  // decayed sums over observed steps
};

}  // namespace specula
