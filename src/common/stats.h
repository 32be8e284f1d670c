#pragma once
// Small statistics shared by the engine's cost probes and the benchmarks.
#include <algorithm>
#include <vector>

namespace specula {

// Median of `samples` (mean of the middle two for an even count); 0 for none.
inline double median(std::vector<double> samples) {
    if (samples.empty()) return 0.0;
    std::sort(samples.begin(), samples.end());
    const size_t mid = samples.size() / 2;
    return samples.size() % 2 ? samples[mid] : 0.5 * (samples[mid - 1] + samples[mid]);
}

}  // namespace specula
