#pragma once
// The verify-cost curve as the policies use it: measured once, at one depth, for the target's
// forward alone, then fitted to what verification (forward, acceptance, cache compaction) costs in
// the running loop, learned from every round. Past the measured sizes (a step that carries several
// sequences' rows) the curve goes on linearly with the slope of its upper half.
//
// Every row of a verify block attends over the whole context, so past the measured depth an extra
// row costs more in proportion to the added depth, while the one-row forward grows by less than
// that times its rows: one scale of the curve cannot follow both. A round of n rows at depth d is
//     scale * curve(n) + row_depth_ms * (n - 1) * max(0, d - measured depth)
// with both terms fitted by decayed least squares over the rounds from priors of 1 and the growth
// measured by timing the same rows deeper (ModelBundle::measure_verify_cost_once; else 0). Rounds
// that all verify the same rows at one depth fit any split of their time between the two terms;
// the measured prior keeps the depth term there, so an extra row deep in a long context is not
// priced as cheap as at the measured depth.
// The curve's shape is timed once, in a few repetitions, and can be wrong where the rounds run (a
// neighbour's burst at startup can make 2 rows look as cheap as 1 where rounds of 2 rows cost
// nearly what rounds of 5 do): fitted with rounds of one size only, the scale then prices every
// other size by that size's error. So each size the rounds verify keeps what its rounds cost
// against what the fit predicts for them, and is priced by that ratio, weighed against
// kShapePriorRounds rounds at the fit's price; the sizes no round verified keep the fit.
// The terms (round, step, row, plain step, StepShare, promised, gamma, free draft, explore, skip,
// probe, gate, ...) are those defined at the top of policy/round_policy.h.
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
    // curve_ms[b - 1]: measured cost of a target forward of b tokens (made non-decreasing) at
    // `measured_depth` tokens of context.
    // row_depth_ms: the prior cost of a row past the first per token of context past that depth.
    explicit VerifyCost(const std::vector<double> & curve_ms, int measured_depth = 0, double row_depth_ms = 0.0)
        : curve_(non_decreasing(curve_ms)),
          measured_depth_(std::max(0, measured_depth)),
          depth_(measured_depth_),
          row_depth_ms_(std::max(0.0, row_depth_ms)),
          row_depth_prior_ms_(row_depth_ms_),
          sizes_(curve_.size()) {
        if (!curve_.empty()) s11_ = s1y_ = curve_[0] * curve_[0];  // the prior scale 1 as one round, fading with the rest
    }

    int max_tokens() const { return static_cast<int>(curve_.size()); }
    // The context the next rounds verify at (tokens already in the cache).
    void at_depth(int tokens) { depth_ = std::max(0, tokens); }
    // Expected cost of verifying n_tokens (>= 1) now.
    double ms(int n_tokens) const {
        const double fitted = scale_ * curve(n_tokens) + row_depth_ms_ * (n_tokens - 1) * added_depth();
        if (n_tokens > max_tokens()) return fitted;
        const SizeRounds & r = sizes_[n_tokens - 1];
        const double predicted = scale_ * r.x1 + row_depth_ms_ * r.x2;
        if (r.weight <= 0.0 || predicted <= 0.0) return fitted;
        return fitted * (kShapePriorRounds + r.weight * (r.ms / predicted)) / (kShapePriorRounds + r.weight);
    }
    // A round (or a step) verified n_tokens in `measured_ms` at the current depth.
    void observe(int n_tokens, double measured_ms) {
        if (n_tokens < 1 || curve_.empty() || curve(n_tokens) <= 0) return;
        constexpr double kKeep = 0.9;
        // row_depth_ms's prior weighs as a round one row and this many tokens deeper than
        // measured: it holds until rounds of several sizes well past the measured depth arrive.
        constexpr double kPriorDepth = 256.0;
        const double x1 = curve(n_tokens), x2 = double(n_tokens - 1) * added_depth();
        if (n_tokens <= max_tokens()) {
            constexpr double kKeepSize = 0.95;  // per round of that size: the last few dozen count
            SizeRounds & r = sizes_[n_tokens - 1];
            r.weight = kKeepSize * r.weight + 1.0;
            r.ms = kKeepSize * r.ms + measured_ms, r.x1 = kKeepSize * r.x1 + x1, r.x2 = kKeepSize * r.x2 + x2;
        }
        s11_ = kKeep * s11_ + x1 * x1, s12_ = kKeep * s12_ + x1 * x2, s22_ = kKeep * s22_ + x2 * x2;
        s1y_ = kKeep * s1y_ + x1 * measured_ms, s2y_ = kKeep * s2y_ + x2 * measured_ms;
        const double p22 = s22_ + kPriorDepth * kPriorDepth, p2y = s2y_ + kPriorDepth * kPriorDepth * row_depth_prior_ms_;
        const double det = s11_ * p22 - s12_ * s12_;
        row_depth_ms_ = det > 0.0 ? std::max(0.0, (s11_ * p2y - s12_ * s1y_) / det) : row_depth_prior_ms_;
        scale_ = std::max(0.05, (s1y_ - s12_ * row_depth_ms_) / s11_);
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
    static constexpr double kShapePriorRounds = 2.0;
    // Rounds of one size, decayed: their count, time, and the fit's basis terms (curve, depth).
    struct SizeRounds {
        double weight = 0.0, ms = 0.0, x1 = 0.0, x2 = 0.0;
    };

    double curve(int n) const {
        const int m = max_tokens();
        if (n <= m) return curve_[n - 1];
        const int lo = (m + 1) / 2;
        const double slope = m > lo ? std::max(0.0, (curve_[m - 1] - curve_[lo - 1]) / (m - lo)) : 0.0;
        return curve_[m - 1] + slope * (n - m);
    }
    double added_depth() const { return std::max(0, depth_ - measured_depth_); }

    std::vector<double> curve_;
    int measured_depth_ = 0, depth_ = 0;
    double scale_ = 1.0, row_depth_ms_ = 0.0, row_depth_prior_ms_ = 0.0;
    double s11_ = 0.0, s12_ = 0.0, s22_ = 0.0, s1y_ = 0.0, s2y_ = 0.0;  // decayed sums over observed rounds
    double w_ = 0.0, sx_ = 0.0, sy_ = 0.0, sxx_ = 0.0, sxy_ = 0.0;      // decayed sums over observed steps
    std::vector<SizeRounds> sizes_;                                     // [n - 1]: the rounds of n rows
};

}  // namespace specula
