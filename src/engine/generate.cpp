#include "engine/generate.h"

#include <algorithm>
#include <chrono>
#include <string>

#include "specula/error.h"
#include "runtime/kv_cache.h"
#include "runtime/forward.h"
#include "constrain/grammar.h"
#include "constrain/lazy_grammar.h"
#include "sample/logits_state.h"
#include "sample/sampler.h"
#include "tokenizer/tokenizer.h"

namespace specula {

namespace {
double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

std::shared_ptr<const LogitsState> compile_grammar(const GenerationOptions & options, const Tokenizer * tokenizer) {
    if (!options.grammar_lazy && (!options.grammar_trigger_patterns.empty() || !options.grammar_trigger_tokens.empty())) {
        throw Error("grammar triggers are given but the grammar is not lazy");
    }
    if (options.grammar.empty()) {
        if (options.grammar_lazy) throw Error("a lazy grammar is asked for without a grammar");
        return nullptr;
    }
    if (!tokenizer) throw Error("a grammar needs the model's vocabulary: this generation has no tokenizer");
    if (!options.grammar_lazy) return make_grammar_state(*tokenizer, options.grammar);
    return make_lazy_grammar_state(*tokenizer, options.grammar, options.grammar_trigger_patterns, options.grammar_trigger_tokens);
}

std::unique_ptr<LogitsState> logits_processing(const GenerationOptions & options, std::span<const int32_t> history, const Tokenizer * tokenizer) {
    if (options.top_logprobs < -1 || options.top_logprobs > kMaxTopLogprobs) {
        throw Error("top_logprobs must be -1 (none) or 0.." + std::to_string(kMaxTopLogprobs) + ", not " + std::to_string(options.top_logprobs));
    }
    if (options.prompt_logprobs < -1 || options.prompt_logprobs > kMaxTopLogprobs) {
        throw Error("prompt_logprobs must be -1 (none) or 0.." + std::to_string(kMaxTopLogprobs) + ", not " + std::to_string(options.prompt_logprobs));
    }
    std::vector<std::unique_ptr<LogitsState>> states;
    if (auto values = make_logits_state(options.sampling, "", history, tokenizer)) states.push_back(std::move(values));
    const std::shared_ptr<const LogitsState> grammar = options.compiled_grammar ? options.compiled_grammar : compile_grammar(options, tokenizer);
    if (grammar) states.push_back(grammar->clone());
    if (options.min_tokens > 0 && options.stop_at_end_of_generation) {
        if (!tokenizer) throw Error("min_tokens needs the model's vocabulary: this generation has no tokenizer");
        std::vector<int32_t> ends = tokenizer->end_of_generation_tokens();
        ends.insert(ends.end(), options.stop_tokens.begin(), options.stop_tokens.end());
        states.push_back(make_min_tokens_state(std::move(ends), options.min_tokens));
    }
    if (states.empty()) return nullptr;
    if (states.size() == 1) return std::move(states.front());
    return std::make_unique<LogitsStates>(std::move(states));
}

bool ends_generation(const GenerationOptions & options, const Tokenizer & tokenizer, int32_t token) {
    return tokenizer.is_end_of_generation(token) || std::find(options.stop_tokens.begin(), options.stop_tokens.end(), token) != options.stop_tokens.end();
}

void check_lossy_early_exit_options(const GenerationOptions & options) {
    const SamplingParams & s = options.sampling;
    const char * asked = !options.grammar.empty()                                                                ? "a grammar"
                         : !s.logit_bias.empty()                                                                 ? "logit bias"
                         : s.repeat_penalty != 1.0f || s.presence_penalty != 0.0f || s.frequency_penalty != 0.0f ? "penalties"
                         : options.top_logprobs >= 0 || options.on_logprob || options.prompt_logprobs >= 0       ? "logprobs"
                         : options.min_tokens > 0                                                                ? "min_tokens"
                                                                                                                 : nullptr;
    if (asked) throw Error(std::string("SpecEE's lossy mode does not support ") + asked + ": use the lossless mode");
}

void report_logprob(const GenerationOptions & options, std::span<const float> row, int32_t token, std::vector<float> & scratch) {
    if (!options.on_logprob) return;
    const int n_top = std::max(0, options.top_logprobs);
    options.on_logprob(options.post_sampling_logprobs ? token_post_sampling_logprob(row, token, n_top, options.sampling, scratch)
                                                      : token_logprob(row, token, n_top, scratch));
}

std::vector<float> prefill(ModelRunner & runner, KvCache & cache, std::span<const int32_t> prompt, int chunk) {
    if (prompt.empty()) throw Error("empty prompt");
    if (static_cast<int>(prompt.size()) > cache.capacity() - cache.size()) {
        throw Error("prompt is " + std::to_string(prompt.size()) + " tokens, longer than the " +
                    std::to_string(cache.capacity()) + "-token context");
    }
    ForwardOutput out;
    for (size_t start = 0; start < prompt.size(); start += chunk) {
        const size_t n = std::min<size_t>(chunk, prompt.size() - start);
        const bool last = start + n == prompt.size();
        runner.forward(ForwardBatch::causal(prompt.subspan(start, n), cache.size(), last ? std::vector<int32_t>{int32_t(n - 1)} : std::vector<int32_t>{}),
                       cache, out);
    }
    return out.logits;
}

GenerationStats generate_plain(ModelRunner & runner, KvCache & cache, std::span<const int32_t> prompt,
                               const GenerationOptions & options, const std::function<bool(int32_t)> & is_end,
                               const TokenSink & sink, LogitsState * processing) {
    GenerationStats stats;
    stats.n_prompt = static_cast<int>(prompt.size());
    Rng rng(options.sampling.seed);
    std::vector<float> probs, processed, scratch;
    auto pick = [&](std::span<const float> logits) {
        int32_t token = 0;
        if (processing && options.sampling.greedy() && !options.on_logprob) {  // as verify_greedy reads a node's row
            processed.assign(logits.begin(), logits.end());
            token = processed_argmax(*processing, processed);
        } else {
            if (processing) {
                processed.assign(logits.begin(), logits.end());
                processing->apply(processed);
                logits = processed;
            }
            if (options.sampling.greedy()) {
                token = argmax(logits);
            } else {
                processed_probs(logits, options.sampling, probs);
                token = sample_at(probs, rng.at(cache.size()));  // the position it takes: as Sequence draws it
            }
            report_logprob(options, logits, token, scratch);
        }
        if (processing) processing->accept(token);
        return token;
    };

    auto t0 = std::chrono::steady_clock::now();
    std::vector<float> logits = prefill(runner, cache, prompt);
    stats.prompt_seconds = seconds_since(t0);

    t0 = std::chrono::steady_clock::now();
    ForwardOutput out;
    int32_t token = pick(logits);
    for (int i = 0; i < options.n_predict; ++i) {
        ++stats.n_generated;
        if (!sink(token)) break;
        if (options.stop_at_end_of_generation && is_end(token)) break;
        if (i + 1 == options.n_predict) break;
        if (cache.size() >= cache.capacity()) break;  // context full: stop, as llama.cpp does
        const int32_t one[1] = {token};
        runner.forward(ForwardBatch::causal(one, cache.size(), {0}), cache, out);
        token = pick(out.logits_row(0));
    }
    stats.generation_seconds = seconds_since(t0);
    return stats;
}

}  // namespace specula
