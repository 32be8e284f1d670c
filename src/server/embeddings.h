#pragma once
// Embeddings (`serve --embeddings`): OpenAI's /v1/embeddings request and response, and the pooling
// of the target's final hidden states (after its output norm) into one L2-normalised vector per
// input, as llama-server pools them (docs/server.md, "Embeddings").
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/openai.h"
#include "tokenizer/tokenizer.h"

namespace specula::embeddings {

// How a sequence's rows become one vector: their mean, the last row (what a causal model's last
// token saw: all of it) or the first (a BERT-style [CLS] token's).
enum class Pooling {
    Mean,
    Last,
    Cls,
};
// "mean" | "last" | "cls"; throws Error naming the others.
Pooling pooling_from_name(const std::string & name);
const char * pooling_name(Pooling pooling);

// rows: [n, width] hidden states, each already through the output norm. The pooled vector,
// L2-normalised (a zero vector stays zero).
std::vector<float> pool(std::span<const float> rows, int width, Pooling pooling);

struct Request {
    std::vector<std::vector<int32_t>> inputs;  // each input's tokens
    bool base64 = false;                       // encoding_format "base64": each vector's float32 bytes (little-endian) in base64
    std::string model;
    std::vector<std::string> ignored_fields;  // as openai::Request's
};

// Most inputs a request may hold.
inline constexpr size_t kMaxInputs = 2048;

// `input`: a string, an array of strings, an array of token ids or an array of such arrays (up to
// kMaxInputs); `encoding_format` "float" (default) or "base64"; `model` as the completions routes
// take it; `user` metadata; another field ignored and named (refused when strict), as on those
// routes. Each input is tokenized as a completions prompt (BOS as the vocabulary asks,
// special-token text as text unless `specials`); an empty input, one longer than n_ctx tokens or
// an id outside the vocabulary: 400 naming `input[i]`. Throws openai::ApiError.
Request parse(const std::string & body, const openai::Accepted & accepted, const Tokenizer & tokenizer, SpecialTokens specials, int n_ctx);

// OpenAI's response: {"object": "list", "data": [{"object": "embedding", "index", "embedding"}],
// "model", "usage": {"prompt_tokens", "total_tokens"}}.
nlohmann::json response(const Request & r, const std::vector<std::vector<float>> & vectors);

}  // namespace specula::embeddings
