#pragma once
// llama.cpp's lazy grammars (its chat layer's grammar for tool calls the model may or may not
// start) as logit processing: the output is free until a trigger, then follows the grammar.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "sample/logits_state.h"

namespace specula {

class Tokenizer;

// A lazy grammar as libllama's lazy grammar sampler (llama_sampler_init_grammar_lazy_patterns)
// triggers it: free while it awaits a trigger (the output's text matching one of
// `trigger_patterns`, or one of `trigger_tokens`), constrained by `gbnf` from the trigger on as a
// make_grammar_state grammar (its stacks limit and budgeted mask). A clone keeps the awaiting state and the text seen, so
// each drafted path triggers where plain decoding would. Throws Error when the GBNF or a pattern
// does not parse, or when no trigger is given.
std::unique_ptr<LogitsState> make_lazy_grammar_state(const Tokenizer & tokenizer, const std::string & gbnf, const std::vector<std::string> & trigger_patterns,
                                                     const std::vector<int32_t> & trigger_tokens);

}  // namespace specula
