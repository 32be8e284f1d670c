#include "engine/specee.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>

#include "runtime/kv_cache.h"
#include "runtime/model.h"
#include "sample/sampler.h"
#include "specula/error.h"

namespace specula {

EarlyExitSequence::EarlyExitSequence(EarlyExitDecoder & decoder, ModelRunner & runner, KvCache & cache, Drafter & drafter,
                                     std::span<const int32_t> prompt, const GenerationOptions & options, float threshold,
                                     std::function<bool(int32_t)> is_end, int prefill_chunk)
    : decoder_(decoder),
      runner_(runner),
      cache_(cache),
      drafter_(drafter),
      options_(options),
      threshold_(threshold),
      is_end_(std::move(is_end)),
      chunk_(prefill_chunk),
      n_layer_(static_cast<const Model &>(runner.network()).config().n_layer),
      feature_layers_(drafter.feature_layers()),
      history_(prompt.begin(), prompt.end()) {
    if (!options.sampling.greedy()) throw Error("SpecEE's lossy mode decodes greedily: use temperature 0 (the lossless mode samples)");
    if (prompt.empty()) throw Error("empty prompt");
    if (static_cast<int>(prompt.size()) > cache.capacity()) {
        throw Error("prompt is " + std::to_string(prompt.size()) + " tokens, longer than the " + std::to_string(cache.capacity()) + "-token context");
    }
    if (chunk_ < 1) throw Error("the prefill chunk must be at least 1 token");
    stats_.n_prompt = static_cast<int>(prompt.size());
    drafter_.reset();
    decoder_.begin_sequence();
}

bool EarlyExitSequence::done() const {
    return stopped_ || (!prefilling() && (stats_.n_generated >= options_.n_predict || cache_.size() >= cache_.capacity()));
}

const ExitStep * EarlyExitSequence::step(const TokenSink & sink) {
    using clock = std::chrono::steady_clock;
    const auto t0 = clock::now();
    if (prefilling()) {
        // Every prompt token but the last, which the first decode step takes: its features feed
        // the drafter, which then predicts the first generated token.
        const int n = std::min(chunk_, static_cast<int>(history_.size()) - 1 - prefilled_);
        ForwardBatch b = ForwardBatch::causal(std::span(history_).subspan(prefilled_, n), cache_.size(), {});
        b.tap_layers = feature_layers_;
        ForwardOutput out;
        runner_.forward(b, cache_, out);
        std::vector<float> features;
        out.append_tap_rows(0, n, features);
        drafter_.accept(Acceptance{prefilled_ + n, prefilled_, features});
        prefilled_ += n;
        stats_.prompt_seconds += std::chrono::duration<double>(clock::now() - t0).count();
        return nullptr;
    }
    if (stats_.n_generated == 0) t_decode_ = t0;
    const int position = static_cast<int>(history_.size()) - 1;
    const std::vector<int32_t> candidates = top_candidates(drafter_, history_);
    last_ = decoder_.step(cache_, history_.back(), position, candidates, threshold_, feature_layers_);
    drafter_.accept(Acceptance{position + 1, position, last_.features});
    if (!candidates.empty()) ++exit_stats_.probed;
    exit_stats_.add(last_.exit_layer, n_layer_, static_cast<int>(decoder_.probe_logits().size()));
    history_.push_back(last_.token);
    ++stats_.n_generated;
    if (!sink(last_.token)) stopped_ = true;
    if (options_.stop_at_end_of_generation && is_end_(last_.token)) stopped_ = true;
    stats_.generation_seconds = std::chrono::duration<double>(clock::now() - t_decode_).count();
    return &last_;
}

void prefill_for_drafter(ModelRunner & runner, KvCache & cache, Drafter & drafter, std::span<const int32_t> prompt) {
    drafter.reset();
    if (prompt.size() < 2) return;
    ForwardBatch b = ForwardBatch::causal(prompt.first(prompt.size() - 1), 0, {});
    b.tap_layers = drafter.feature_layers();
    ForwardOutput out = runner.forward(b, cache);
    std::vector<float> features;
    out.append_tap_rows(0, b.n_tokens(), features);
    drafter.accept(Acceptance{b.n_tokens(), 0, features});
}

TeacherForcedExits teacher_forced_exits(EarlyExitDecoder & decoder, ModelRunner & runner, KvCache & cache, Drafter & drafter,
                                        std::span<const int32_t> prompt, std::span<const int32_t> reference, float threshold) {
    const int L = static_cast<const Model &>(runner.network()).config().n_layer;
    const std::vector<int> feature_layers = drafter.feature_layers();
    prefill_for_drafter(runner, cache, drafter, prompt);
    decoder.begin_sequence();
    TeacherForcedExits r;
    std::vector<int32_t> history(prompt.begin(), prompt.end());
    for (int32_t want : reference) {
        const int position = static_cast<int>(history.size()) - 1;
        const std::vector<int32_t> candidates = top_candidates(drafter, history);
        const ExitStep s = decoder.step(cache, history.back(), position, candidates, threshold, feature_layers);
        drafter.accept(Acceptance{position + 1, position, s.features});
        r.stats.add(s.exit_layer, L, static_cast<int>(decoder.probe_logits().size()));
        if (s.exit_layer >= 0) {
            ++r.exited;
            r.agree += s.token == want;
        }
        history.push_back(want);
    }
    return r;
}

GenerationStats generate_early_exit(EarlyExitDecoder & decoder, ModelRunner & runner, KvCache & cache, Drafter & drafter,
                                    std::span<const int32_t> prompt, const GenerationOptions & options, float threshold,
                                    const std::function<bool(int32_t)> & is_end, const TokenSink & sink,
                                    EarlyExitStats & exit_stats, const std::function<void(const ExitStep &)> & on_token) {
    EarlyExitSequence sequence(decoder, runner, cache, drafter, prompt, options, threshold, is_end);
    while (!sequence.done()) {
        const ExitStep * step = sequence.step(sink);
        if (step && on_token) on_token(*step);
    }
    exit_stats.merge(sequence.exit_stats());
    return sequence.stats();
}
}  // namespace specula
