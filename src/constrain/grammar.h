#pragma once
// Output constraints as logit processing (sample/logits_state.h): a GBNF grammar through
// libllama's grammar sampler over the model's vocabulary, and JSON schemas compiled to GBNF by
// llama.cpp's common library, as llama-server does for response_format.
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include <nlohmann/json.hpp>

#include "sample/logits_state.h"

namespace specula {

class Tokenizer;

// The grammar's state at the start of the output ("root" rule). Throws Error naming the problem
// when the GBNF does not parse. Tokens past the tokenizer's vocabulary (an embedding matrix
// padded beyond it) are banned.
std::unique_ptr<LogitsState> make_grammar_state(const Tokenizer & tokenizer, const std::string & gbnf);

// Advances `state` (made by make_grammar_state) by `piece`: the part of `token`'s piece from where
// a lazy grammar's trigger matched on, as libllama's lazy grammar takes it, with no end-of-
// generation check. Throws Error as accept() does.
void accept_grammar_text(LogitsState & state, int32_t token, const std::string & piece);

// GBNF accepting the JSON texts the schema describes (as JSON text, or parsed). Throws Error with
// the reason for a schema it cannot compile. The schema crosses as text: llama.cpp's converter
// reads its own JSON type (common_json).
std::string json_schema_to_gbnf(const std::string & schema_json);
inline std::string json_schema_to_gbnf(const nlohmann::json & schema) { return json_schema_to_gbnf(schema.dump()); }

// Everything GenerationOptions asks of the target's logits after `history` (the prompt): the
// penalties and logit bias of `params`, then `gbnf` when not empty (which needs `tokenizer`;
// biased tokens are checked against its vocabulary). nullptr when nothing is asked.
std::unique_ptr<LogitsState> make_logits_state(const SamplingParams & params, const std::string & gbnf, std::span<const int32_t> history,
                                               const Tokenizer * tokenizer);

}  // namespace specula
