#pragma once
// The generation fields of a request body beyond its prompt and sampling transforms: penalties,
// logit_bias, stop, logprobs, grammar and response_format; and the rule that every top-level field
// is read, accepted as metadata (docs/server.md), or named as ignored (refused with --strict-fields).
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/openai.h"

namespace specula {
class Tokenizer;
enum class SpecialTokens;
}  // namespace specula

namespace specula::openai {

// Reads the fields into `r` (r.sampling, r.stop, r.top_logprobs, r.grammar); throws ApiError 400
// naming the field. A JSON schema that does not compile is refused with the reason.
void parse_generation(const nlohmann::json & body, Request & r);

// What needs the served model's vocabulary: logit_bias texts tokenized into r.sampling.logit_bias,
// logit_bias ids within it, the grammar compiled over it, once per request
// (GenerationOptions::compiled_grammar; nullptr without a grammar). Throws ApiError 400 naming the
// id, or the grammar's problem.
std::shared_ptr<const LogitsState> check_generation(Request & r, const Tokenizer & tokenizer);

// A prompt's tokens: a text's with BOS as the vocabulary asks, ids as given; a mixed prompt's
// texts each tokenized without BOS unless it comes first (llama-server's tokenize_mixed).
std::vector<int32_t> prompt_tokens(const Prompt & prompt, const Tokenizer & tokenizer, SpecialTokens specials);

// The top-level fields that are neither read by parse_request nor metadata without effect on the
// generation (`user`, `metadata`, `store`, ...), in the body's order (names cut to 40 bytes).
std::vector<std::string> unknown_fields(const nlohmann::json & body, Endpoint endpoint);

}  // namespace specula::openai
