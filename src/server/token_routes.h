#pragma once
// llama-server's /tokenize and /detokenize for `specula serve`: the request body in, the response
// JSON out, or ApiError 400 naming the field (an unknown field too; token ids are checked against
// the vocabulary).
#include <string>

#include <nlohmann/json.hpp>

namespace specula {

class Tokenizer;

namespace openai {

// {"content": TEXT, "add_special": false, "parse_special": true, "with_pieces": false} ->
// {"tokens": [ids]}, or with_pieces [{"id", "piece"}] (the piece a string when it is UTF-8, else
// its bytes). add_special: BOS as the vocabulary asks; parse_special: text spelling a control token
// becomes it.
nlohmann::json tokenize(const Tokenizer & tokenizer, const std::string & body);
// {"tokens": [ids]} -> {"content": TEXT}: the tokens' pieces concatenated, as llama-server and
// streams do (the pieces of /tokenize's tokens give back its content).
nlohmann::json detokenize(const Tokenizer & tokenizer, const std::string & body);

}  // namespace openai
}  // namespace specula
