#include "engine/verify_cost_probe.h"

#include <algorithm>
#include <chrono>

#include "specula/error.h"
#include "common/stats.h"
#include "engine/generate.h"
#include "runtime/forward.h"
#include "runtime/kv_cache.h"

namespace specula {

namespace {
using clock_type = std::chrono::steady_clock;
double ms_since(clock_type::time_point t0) { return std::chrono::duration<double, std::milli>(clock_type::now() - t0).count(); }
}  // namespace

void retime_stalled_sizes(std::span<const int> timed, std::vector<double> & ms, const std::function<double(int)> & time_size) {
    for (int attempt = 0; attempt < 3 && !timed.empty(); ++attempt) {
        bool retimed = false;
        double cheapest_above = ms[timed.back() - 1];
        for (size_t k = timed.size() - 1; k-- > 0;) {
            const int b = timed[k];
            if (ms[b - 1] > kStalledAbove * cheapest_above) ms[b - 1] = time_size(b), retimed = true;
            cheapest_above = std::min(cheapest_above, ms[b - 1]);
        }
        if (!retimed) return;
    }
}

double time_forward(ModelRunner & target, KvCache & cache, std::span<const int32_t> tokens, int rows, int reps, std::span<const int> tap_layers) {
    if (rows < 1 || static_cast<int>(tokens.size()) < rows) throw Error("time_forward: not enough tokens");
    const int base = cache.size();
    if (base + rows > cache.capacity()) throw Error("time_forward: context too small");
    // An untimed first run: more sizes than the runner keeps graphs for would otherwise time a
    // graph build with every forward. The median, not the best: the curve predicts what forwards
    // cost inside a generation loop, where they are not the best case.
    std::vector<int32_t> logit_rows(rows);
    for (int i = 0; i < rows; ++i) logit_rows[i] = i;
    ForwardBatch batch = ForwardBatch::causal(tokens.first(rows), base, logit_rows);
    batch.tap_layers.assign(tap_layers.begin(), tap_layers.end());
    ForwardOutput out;
    std::vector<double> samples;
    for (int r = 0; r <= std::max(1, reps); ++r) {
        const auto t0 = clock_type::now();
        target.forward(batch, cache, out);
        if (r > 0) samples.push_back(ms_since(t0));
        cache.rollback(base);
    }
    return median(std::move(samples));
}

std::vector<double> measure_verify_cost(ModelRunner & target, KvCache & cache, std::span<const int32_t> tokens, int max_tokens, int reps,
                                        std::span<const int> tap_layers) {
    if (static_cast<int>(tokens.size()) < max_tokens) throw Error("measure_verify_cost: not enough tokens");
    const int base = cache.size();
    if (base + max_tokens > cache.capacity()) throw Error("measure_verify_cost: context too small");
    if (reps < 1) throw Error("measure_verify_cost: reps must be positive");
    std::vector<double> ms(max_tokens);
    ForwardOutput out;
    // Warm up first: right after loading, a model's first forwards run slower (its weights are
    // not yet in the caches), and timed then they would make the small sizes, which come first,
    // look dear and so verification and drafting look cheap (docs/policies.md).
    {
        ForwardBatch one = ForwardBatch::causal(tokens.first(1), base, {0});
        one.tap_layers.assign(tap_layers.begin(), tap_layers.end());
        const auto t0 = clock_type::now();
        for (int i = 0; i < 8 || ms_since(t0) < 250.0; ++i) {
            target.forward(one, cache, out);
            cache.rollback(base);
        }
    }
    // Every size up to 8 (where a single sequence's drafts are sized), then sizes about a quarter
    // apart, the rest interpolated: past a few rows the curve is close to linear, and timing all
    // of the 33-64 sizes a server asks for took seconds before the first token.
    std::vector<int> timed;
    for (int b = 1; b <= max_tokens; b = b < 8 ? b + 1 : std::max(b + 1, b + b / 4)) timed.push_back(b);
    if (timed.back() != max_tokens) {
        if (timed.back() > 8 && max_tokens - timed.back() < timed.back() / 4) timed.pop_back();  // 63 and 64: one will do
        timed.push_back(max_tokens);
    }
    auto time_size = [&](int b) { return time_forward(target, cache, tokens, b, reps, tap_layers); };
    for (int b : timed) ms[b - 1] = time_size(b);
    retime_stalled_sizes(timed, ms, time_size);
    for (size_t k = 1; k < timed.size(); ++k) {
        const int a = timed[k - 1], b = timed[k];
        for (int m = a + 1; m < b; ++m) ms[m - 1] = ms[a - 1] + (ms[b - 1] - ms[a - 1]) * (m - a) / (b - a);
    }
    return ms;
}

double measure_row_depth_ms(ModelRunner & target, KvCache & cache, std::span<const int32_t> tokens, std::span<const double> curve, int rows,
                            int deeper, int reps) {
    if (rows < 2 || static_cast<int>(curve.size()) < rows) throw Error("measure_row_depth_ms: the curve must cover the rows, at least 2");
    if (deeper < 1 || static_cast<int>(tokens.size()) < deeper + rows) throw Error("measure_row_depth_ms: not enough tokens");
    const int base = cache.size();
    prefill(target, cache, tokens.first(deeper));
    const std::span<const int32_t> next = tokens.subspan(deeper);
    const double grown = (time_forward(target, cache, next, rows, reps) - time_forward(target, cache, next, 1, reps)) - (curve[rows - 1] - curve[0]);
    cache.rollback(base);
    return std::max(0.0, grown / ((rows - 1) * static_cast<double>(deeper)));
}

}  // namespace specula
