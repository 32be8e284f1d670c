#pragma once
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

namespace specula {

struct InfillVocabulary;  // sample/sampler.h

struct SamplingParams {
    float temperature = 0.0f;  // 0 = greedy (argmax)
    int top_k = 0;             // 0 = off
    float top_p = 1.0f;        // 1 = off
    float min_p = 0.0f;        // 0 = off
    uint64_t seed = 0;
    // Logit processing before the transforms above, as llama.cpp's logit-bias then penalties
    // samplers do it. The penalties count the prompt's tokens too, as llama-server does. Under
    // speculation each drafted node is scored with the tokens of its own path, so the output is
    // plain decoding's with the same settings.
    float repeat_penalty = 1.0f;                        // 1 = off: a seen token's logit divided by it (multiplied when negative)
    float presence_penalty = 0.0f;                      // subtracted once from a seen token's logit
    float frequency_penalty = 0.0f;                     // subtracted per occurrence
    int penalty_last_n = 64;                            // the last tokens the penalties look at; -1: the whole context
    std::vector<std::pair<int32_t, float>> logit_bias;  // added to the token's logit; -inf bans it
    // llama.cpp's "infill" sampler after the transforms above, at T > 0 (sample/sampler.h); null: off.
    std::shared_ptr<const InfillVocabulary> infill;

    bool greedy() const { return temperature <= 0.0f; }
};

// An emitted token's log-probability under the target's processed logits (after penalties, bias
// and grammar; before temperature and truncation), with the most likely alternatives (tokens the
// processing bans are never listed).
struct TokenLogprob {
    int32_t token = -1;
    float logprob = 0.0f;
    std::vector<std::pair<int32_t, float>> top;  // (token, logprob), most likely first
};

}  // namespace specula
