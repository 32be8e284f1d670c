#pragma once
// The field checks of request bodies (server/openai.cpp, server/openai_chat.cpp): each refusal is
// an ApiError 400 naming the field, the value shown by its JSON type, never dumped.
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace specula::openai {

[[noreturn]] void bad(const std::string & param, const std::string & message);
// A request body that must be a JSON object (the routes beside the OpenAI ones): malformed JSON
// or another JSON type is a 400.
nlohmann::json body_object(const std::string & text);
// A field of the wrong type or value: "'param' must be WHAT, got KIND".
[[noreturn]] void must_be(const std::string & param, const std::string & what, const nlohmann::json & got);
bool boolean(const nlohmann::json & v, const std::string & param);
bool has(const nlohmann::json & body, const char * key);  // present and not null
struct Accepted;
// The request's `model`, one of the served names (none given: the first); another: 404
// model_not_found, as OpenAI and vLLM answer, or with accepted.any_model that name, echoed.
std::string checked_model(const nlohmann::json & body, const Accepted & accepted);
// body[key] as a finite number within lo..hi, or an integer within lo..hi.
double number(const nlohmann::json & body, const char * key, double lo, double hi);
int64_t integer(const nlohmann::json & body, const char * key, int64_t lo, int64_t hi);

}  // namespace specula::openai
