#include "server/openai_logprobs.h"

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

json chat_entry(const Completion & c, int32_t token, float logprob) {
    const std::string text = c.token_text(token);
    return json{{"token", text}, {"logprob", logprob}, {"bytes", bytes_of(text)}};
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
            entry["top_logprobs"] = std::move(top);
            content.push_back(std::move(entry));
        }
        return json{{"content", std::move(content)}, {"refusal", nullptr}};
    }
    json texts = json::array(), values = json::array(), tops = json::array(), offsets = json::array();
    for (const TokenLogprob & t : tokens) {
        const std::string text = c.token_text(t.token);
        texts.push_back(text);
        values.push_back(t.logprob);
        json top = json::object();
        for (const auto & [id, logprob] : t.top) top.emplace(c.token_text(id), logprob);  // first (most likely) of equal texts kept
        tops.push_back(std::move(top));
        offsets.push_back(text_offset);
        text_offset += characters(text);
    }
    return json{{"tokens", std::move(texts)}, {"token_logprobs", std::move(values)}, {"top_logprobs", std::move(tops)}, {"text_offset", std::move(offsets)}};
}

}  // namespace specula::openai
