#include "server/openai_logprobs.h"

#include <cmath>

namespace specula::openai {

using nlohmann::json;

namespace {

json bytes_of(const std::string & text) {
    json bytes = json::array();
    for (unsigned char b : text) bytes.push_back(b);
    return bytes;
}

// Characters as Python and JavaScript index a decoded string: every byte that does not continue a
// UTF-8 sequence starts one.
size_t characters(const std::string & text) {
    size_t n = 0;
    for (unsigned char b : text) n += (b & 0xC0) != 0x80;
    return n;
}

// With post_sampling_probs, llama-server's `prob` (of the distribution after the sampler chain) in place of `logprob`.
json chat_entry(const Completion & c, int32_t token, float logprob) {
    const std::string text = c.token_text(token);
    if (c.post_sampling) return json{{"token", text}, {"prob", std::exp(logprob)}, {"bytes", bytes_of(text)}};
    return json{{"token", text}, {"logprob", logprob}, {"bytes", bytes_of(text)}};
}

// A token's entries in a completion's logprobs; without its logprob (a prompt's first token,
// which no row predicts) they are null.
void add_completion_entry(const Completion & c, json & j, int32_t token, const TokenLogprob * t, size_t & text_offset) {
    const std::string text = c.token_text(token);
    j["tokens"].push_back(text);
    j["token_logprobs"].push_back(t ? json(t->logprob) : json(nullptr));
    json top = t ? json::object() : json(nullptr);
    if (t) {
        for (const auto & [id, logprob] : t->top) top.emplace(c.token_text(id), logprob);  // first (most likely) of equal texts kept
    }
    j["top_logprobs"].push_back(std::move(top));
    j["text_offset"].push_back(text_offset);
    text_offset += characters(text);
}

}  // namespace

json logprobs(const Completion & c, const std::vector<TokenLogprob> & tokens, size_t & text_offset) {
    if (c.endpoint != Endpoint::Completions) {
        // llama-server's /completion: the same entries with each token's id.
        auto entry_of = [&](int32_t id, float logprob) {
            json e = chat_entry(c, id, logprob);
            if (c.endpoint == Endpoint::Llama) e["id"] = id;
            return e;
        };
        json content = json::array();
        for (const TokenLogprob & t : tokens) {
            json entry = entry_of(t.token, t.logprob);
            json top = json::array();
            for (const auto & [id, logprob] : t.top) top.push_back(entry_of(id, logprob));
            entry[c.post_sampling ? "top_probs" : "top_logprobs"] = std::move(top);
            content.push_back(std::move(entry));
        }
        return json{{"content", std::move(content)}, {"refusal", nullptr}};
    }
    json j = json{{"tokens", json::array()}, {"token_logprobs", json::array()}, {"top_logprobs", json::array()}, {"text_offset", json::array()}};
    for (const TokenLogprob & t : tokens) add_completion_entry(c, j, t.token, &t, text_offset);
    return j;
}

json prompt_logprobs(const Completion & c, std::span<const int32_t> prompt, const std::vector<TokenLogprob> & logprobs, size_t & text_offset) {
    json j = json{{"tokens", json::array()}, {"token_logprobs", json::array()}, {"top_logprobs", json::array()}, {"text_offset", json::array()}};
    for (size_t i = 0; i < prompt.size(); ++i) add_completion_entry(c, j, prompt[i], i > 0 && i - 1 < logprobs.size() ? &logprobs[i - 1] : nullptr, text_offset);
    return j;
}

void append_logprobs(json & into, const json & more) {
    for (const char * key : {"tokens", "token_logprobs", "top_logprobs", "text_offset"}) {
        for (const json & x : more.at(key)) into.at(key).push_back(x);
    }
}

}  // namespace specula::openai
