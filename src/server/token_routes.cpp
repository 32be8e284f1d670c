#include "server/token_routes.h"

#include <set>

#include "common/json_limits.h"
#include "server/openai.h"
#include "server/openai_fields.h"
#include "specula/error.h"
#include "tokenizer/tokenizer.h"

namespace specula::openai {

using nlohmann::json;

namespace {

// The body as an object holding no field but `fields`.
json body_object(const std::string & text, const std::set<std::string> & fields) {
    json body = openai::body_object(text);
    for (const auto & [key, value] : body.items()) {
        if (!fields.count(key)) bad(key.substr(0, 40), "'" + key.substr(0, 40) + "' is not supported");
    }
    return body;
}

bool valid_utf8(const std::string & s) {
    try {
        (void)json(s).dump();  // nlohmann's strict serializer throws on bytes that are not UTF-8
        return true;
    } catch (const json::type_error &) {
        return false;
    }
}

}  // namespace

json tokenize(const Tokenizer & tokenizer, const std::string & text) {
    const json body = body_object(text, {"content", "add_special", "parse_special", "with_pieces"});
    if (!body.contains("content")) bad("content", "'content' is required");
    if (!body.at("content").is_string()) must_be("content", "a string", body.at("content"));
    const bool add_special = has(body, "add_special") && boolean(body.at("add_special"), "add_special");
    const bool parse_special = !has(body, "parse_special") || boolean(body.at("parse_special"), "parse_special");
    const bool with_pieces = has(body, "with_pieces") && boolean(body.at("with_pieces"), "with_pieces");
    std::vector<int32_t> ids;
    try {
        ids = tokenizer.tokenize(body.at("content").get<std::string>(), add_special, parse_special ? SpecialTokens::Parse : SpecialTokens::Text);
    } catch (const Error & e) {
        bad("content", std::string("cannot tokenize 'content': ") + e.what());
    }
    if (!with_pieces) return json{{"tokens", ids}};
    json tokens = json::array();
    for (int32_t id : ids) {
        const std::string piece = tokenizer.piece(id);
        json shown = piece;
        if (!valid_utf8(piece)) {
            shown = json::array();
            for (unsigned char b : piece) shown.push_back(b);
        }
        tokens.push_back({{"id", id}, {"piece", std::move(shown)}});
    }
    return json{{"tokens", std::move(tokens)}};
}

json detokenize(const Tokenizer & tokenizer, const std::string & text) {
    const json body = body_object(text, {"tokens"});
    if (!body.contains("tokens")) bad("tokens", "'tokens' is required");
    const json & v = body.at("tokens");
    if (!v.is_array()) must_be("tokens", "an array of token ids", v);
    std::string content;
    for (size_t i = 0; i < v.size(); ++i) {
        const std::string param = "tokens[" + std::to_string(i) + "]";
        if (!v[i].is_number_integer() || v[i].get<int64_t>() < 0 || v[i].get<int64_t>() >= tokenizer.n_vocab()) {
            must_be(param, "a token id of the vocabulary (0.." + std::to_string(tokenizer.n_vocab() - 1) + ")", v[i]);
        }
        content += tokenizer.piece(static_cast<int32_t>(v[i].get<int64_t>()));
    }
    return json{{"content", std::move(content)}};
}

}  // namespace specula::openai
