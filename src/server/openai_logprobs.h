#pragma once
// Logprobs in OpenAI's shapes: a chat choice's {"content": [{token, logprob, bytes, top_logprobs:
// [{token, logprob, bytes}]}]}, a completion choice's {tokens, token_logprobs, top_logprobs:
// [{text: logprob}], text_offset}. A stream chunk carries its own tokens' entries. With
// Completion::post_sampling the values are of the distribution after the sampler chain: in the
// chat and /completion shapes as llama-server's `prob` and `top_probs`, in the completions shape
// as logprobs.
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/openai.h"

namespace specula::openai {

// The logprobs object for `tokens` (in order, named by c.token_text). Completions' text_offset
// counts characters from `text_offset`, the length of the choice's text before these tokens,
// which it advances past them (a stream's chunks continue where the last one ended).
nlohmann::json logprobs(const Completion & c, const std::vector<TokenLogprob> & tokens, size_t & text_offset);
// Completions' logprobs of a prompt's tokens (echo with logprobs): the first token's null (no row
// predicts it), each later one's from `logprobs` (GenerationOptions::prompt_logprobs' order).
nlohmann::json prompt_logprobs(const Completion & c, std::span<const int32_t> prompt, const std::vector<TokenLogprob> & logprobs, size_t & text_offset);
// Completions' logprobs: `more`'s tokens after `into`'s.
void append_logprobs(nlohmann::json & into, const nlohmann::json & more);

}  // namespace specula::openai
