#pragma once
#include <cstdint>

namespace specula {

struct SamplingParams {
    float temperature = 0.0f;  // 0 = greedy (argmax)
    int top_k = 0;             // 0 = off
    float top_p = 1.0f;        // 1 = off
    float min_p = 0.0f;        // 0 = off
    uint64_t seed = 0;

    bool greedy() const { return temperature <= 0.0f; }
};

}  // namespace specula
