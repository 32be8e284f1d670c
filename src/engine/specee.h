#pragma once
// SpecEE's lossy mode (docs/specee.md): tokens emitted where the target's layers exit early
// (draft/early_exit.h), unverified, as steps a server interleaves with other sequences; and the
// teacher-forced agreement that measures how often an exit agrees with full decoding.
#include <chrono>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "draft/drafter.h"
#include "draft/early_exit.h"
#include "runtime/forward.h"
#include "specula/specula.h"

namespace specula {

class KvCache;

// SpecEE's lossy mode, greedy: each token is the best candidate at the first confident layer, or
// the full model's argmax. Prefill gives no prediction; every decode step takes the drafter's
// candidates (EAGLE-3: fed the target's token and the features each step computed, exit states
// standing in for layers an exit skipped). As steps, one prompt chunk or one token each, so that
// a server's worker interleaves it with other sequences; generate_early_exit runs it to the end.
class EarlyExitSequence {
public:
    // `cache` must be empty; the drafter is reset. Throws Error at T > 0, on an empty prompt or
    // one longer than the cache.
    EarlyExitSequence(EarlyExitDecoder & decoder, ModelRunner & runner, KvCache & cache, Drafter & drafter,
                      std::span<const int32_t> prompt, const GenerationOptions & options, float threshold,
                      std::function<bool(int32_t)> is_end, int prefill_chunk = 512);
    bool done() const;
    bool prefilling() const { return prefilled_ + 1 < static_cast<int>(history_.size()) && n_generated() == 0; }
    int prefilled() const { return prefilled_; }  // prompt tokens in the cache
    // The next prompt chunk (nullptr returned), or one decoded token, given to `sink` (false stops
    // the sequence) and returned with where it exited.
    const ExitStep * step(const TokenSink & sink);
    const GenerationStats & stats() const { return stats_; }
    const EarlyExitStats & exit_stats() const { return exit_stats_; }
    int n_generated() const { return stats_.n_generated; }

private:
    EarlyExitDecoder & decoder_;
    ModelRunner & runner_;
    KvCache & cache_;
    Drafter & drafter_;
    GenerationOptions options_;
    float threshold_;
    std::function<bool(int32_t)> is_end_;
    int chunk_;
    int n_layer_;
    std::vector<int> feature_layers_;
    std::vector<int32_t> history_;
    int prefilled_ = 0;
    bool stopped_ = false;
    ExitStep last_;
    GenerationStats stats_;
    EarlyExitStats exit_stats_;
    std::chrono::steady_clock::time_point t_decode_{};
};

// Every prompt token but the last through the target at full depth into the empty `cache`, the
// drafter (reset) given their features: where a SpecEE decode of the last prompt token starts.
void prefill_for_drafter(ModelRunner & runner, KvCache & cache, Drafter & drafter, std::span<const int32_t> prompt);

// Teacher-forced agreement: `reference` (plain greedy decoding's reply to `prompt`) fed back token
// by token, each step exiting as the lossy mode would; an exited token is compared with the
// reference's token there. `cache` must be empty.
struct TeacherForcedExits {
    EarlyExitStats stats;
    int exited = 0;  // tokens that exited
    int agree = 0;   // of them, equal to the reference
};
TeacherForcedExits teacher_forced_exits(EarlyExitDecoder & decoder, ModelRunner & runner, KvCache & cache, Drafter & drafter,
                                        std::span<const int32_t> prompt, std::span<const int32_t> reference, float threshold);

GenerationStats generate_early_exit(EarlyExitDecoder & decoder, ModelRunner & runner, KvCache & cache, Drafter & drafter,
                                    std::span<const int32_t> prompt, const GenerationOptions & options, float threshold,
                                    const std::function<bool(int32_t)> & is_end, const TokenSink & sink,
                                    EarlyExitStats & exit_stats, const std::function<void(const ExitStep &)> & on_token = {});
}  // namespace specula
