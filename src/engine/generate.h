#pragma once
// Plain autoregressive decoding with specula's runtime: the baseline every speculative mode must
// reproduce token for token at temperature 0.
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "specula/specula.h"

namespace specula {

class KvCache;
class LogitsState;
class ModelRunner;
class Tokenizer;

// What `options` asks of the target's logits after `history` (the whole prompt): penalties and
// logit bias, then the grammar over `tokenizer`'s vocabulary, and the end tokens banned for the
// first options.min_tokens tokens. nullptr when nothing is asked.
// Throws Error for options out of range (top_logprobs too) and for a grammar that does not parse.
// options.grammar (lazy or not, with its triggers) compiled over `tokenizer`'s vocabulary, the state
// at its start; nullptr without a grammar. Throws Error naming the problem (a limit of
// constrain/grammar_guard.h, a syntax error, triggers without a lazy grammar).
std::shared_ptr<const LogitsState> compile_grammar(const GenerationOptions & options, const Tokenizer * tokenizer);
// options.compiled_grammar is cloned where set, else the grammar is compiled here.
std::unique_ptr<LogitsState> logits_processing(const GenerationOptions & options, std::span<const int32_t> history, const Tokenizer * tokenizer);
// Whether `token` ends a generation under `options` (read with stop_at_end_of_generation): one
// of `tokenizer`'s end-of-generation tokens or of options.stop_tokens.
bool ends_generation(const GenerationOptions & options, const Tokenizer & tokenizer, int32_t token);
// SpecEE's lossy mode emits exited tokens from no processed target row: throws Error naming what
// `options` asks that it cannot honour (penalties, logit bias, a grammar, logprobs).
void check_lossy_early_exit_options(const GenerationOptions & options);
// Calls options.on_logprob, when set, with `token` and its log-probability in `row`, the
// processed row it was drawn from: plain and speculative decoding report through this alone.
void report_logprob(const GenerationOptions & options, std::span<const float> row, int32_t token, std::vector<float> & scratch);

// Feeds the prompt in chunks into an empty `cache`, returns the logits of its last token.
std::vector<float> prefill(ModelRunner & runner, KvCache & cache, std::span<const int32_t> prompt, int chunk = 512);

// Decodes up to options.n_predict tokens after `prompt` (cache must be empty).
// is_end(token) ends generation when options.stop_at_end_of_generation is set. `processing`:
// logits_processing() of the whole prompt (nullptr: none), advanced with each token.
GenerationStats generate_plain(ModelRunner & runner, KvCache & cache, std::span<const int32_t> prompt,
                               const GenerationOptions & options, const std::function<bool(int32_t)> & is_end,
                               const TokenSink & sink, LogitsState * processing = nullptr);

}  // namespace specula
