#pragma once
// The generation fields of a request body beyond its prompt and sampling transforms: penalties,
// logit_bias, stop, logprobs, grammar and response_format; and the rule that every top-level field
// is read, accepted as metadata (docs/server.md) or refused, never silently ignored.
#include <nlohmann/json.hpp>

#include "server/openai.h"

namespace specula {
class Tokenizer;
}

namespace specula::openai {

// Reads the fields into `r` (r.sampling, r.stop, r.top_logprobs, r.grammar); throws ApiError 400
// naming the field. A JSON schema that does not compile is refused with the reason.
void parse_generation(const nlohmann::json & body, Request & r);

// What needs the served model's vocabulary: logit_bias ids within it, the grammar compiled over
// it. Throws ApiError 400 naming the id, or the grammar's problem.
void check_generation(const Request & r, const Tokenizer & tokenizer);

// Throws ApiError 400 "'FIELD' is not supported" for a top-level field that is neither read by
// parse_request nor metadata without effect on the generation (`user`, `metadata`, `store`, ...).
void refuse_unknown_fields(const nlohmann::json & body, Endpoint endpoint);

}  // namespace specula::openai
