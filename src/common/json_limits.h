#pragma once
// JSON from outside (request bodies, checkpoint files) parsed with a nesting limit, and described
// in errors by its type, never dumped. nlohmann's parser is iterative, but dump() and copies of a
// value recurse once per level: a 2 MB body nested 10^6 arrays deep overflowed the stack when an
// error message dumped it. Text deeper than the limit is refused before any value is built.
#include <istream>
#include <iterator>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "specula/error.h"

namespace specula {

// Deeper than any OpenAI request or HF config.json nests.
inline constexpr int kJsonMaxDepth = 64;

// Parses `text`, nested at most `max_depth` arrays and objects deep. Throws Error ("JSON nested
// more than 64 levels deep (at byte N)") for deeper text, nlohmann::json::exception for text that
// is not JSON (parse_error; out_of_range for numbers such as 1E999).
inline nlohmann::json parse_json(std::string_view text, int max_depth = kJsonMaxDepth) {
    int depth = 0;
    bool in_string = false;
    for (size_t i = 0; i < text.size(); ++i) {
        const char c = text[i];
        if (in_string) {
            if (c == '\\') ++i;  // the escaped character cannot end the string
            else if (c == '"') in_string = false;
        } else if (c == '"') {
            in_string = true;
        } else if (c == '[' || c == '{') {
            if (++depth > max_depth) {
                throw Error("JSON nested more than " + std::to_string(max_depth) + " levels deep (at byte " + std::to_string(i) + ")");
            }
        } else if (c == ']' || c == '}') {
            --depth;  // unbalanced text is the parser's to refuse
        }
    }
    return nlohmann::json::parse(text);
}

// The rest of `in`, parsed as parse_json does.
inline nlohmann::json parse_json(std::istream & in, int max_depth = kJsonMaxDepth) {
    const std::string text(std::istreambuf_iterator<char>(in), {});
    return parse_json(text, max_depth);
}

// A client's string as an error message quotes it: JSON-quoted, cut after 40 bytes ("...").
inline std::string json_quoted(const std::string & s) {
    constexpr size_t kShown = 40;
    // A cut inside a UTF-8 character is replaced (U+FFFD), not thrown.
    const std::string shown = nlohmann::json(s.substr(0, kShown)).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    return s.size() > kShown ? shown.substr(0, shown.size() - 1) + "...\"" : shown;
}

// A value as an error message names it: its JSON type ("an array", "an object", "null"), a
// boolean or number as written, a string quoted and cut (json_quoted).
inline std::string json_kind(const nlohmann::json & v) {
    switch (v.type()) {
        case nlohmann::json::value_t::array: return "an array";
        case nlohmann::json::value_t::object: return "an object";
        case nlohmann::json::value_t::string: return "the string " + json_quoted(v.get_ref<const std::string &>());
        default: return v.dump();  // null, a boolean or a number: a few characters
    }
}

}  // namespace specula
