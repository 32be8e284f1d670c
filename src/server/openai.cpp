#include "server/openai.h"

#include <cmath>
#include <limits>

namespace specula::openai {

using nlohmann::json;

json ApiError::body() const {
    return json{{"error",
                 {{"message", message},
                  {"type", type},
                  {"param", param.empty() ? json(nullptr) : json(param)},
                  {"code", code.empty() ? json(nullptr) : json(code)}}}};
}

namespace {

[[noreturn]] void bad(const std::string & param, const std::string & message) {
    throw ApiError{400, message, "invalid_request_error", param, ""};
}

double number(const json & body, const char * key, double lo, double hi) {
    const json & v = body.at(key);
    if (!v.is_number()) bad(key, std::string("'") + key + "' must be a number");
    const double x = v.get<double>();
    if (!std::isfinite(x) || x < lo || x > hi) {
        bad(key, std::string("'") + key + "' must be between " + json(lo).dump() + " and " + json(hi).dump() + ", got " + v.dump());
    }
    return x;
}

int64_t integer(const json & body, const char * key, int64_t lo, int64_t hi) {
    const json & v = body.at(key);
    if (!v.is_number_integer()) bad(key, std::string("'") + key + "' must be an integer");
    const bool negative = v.is_number_unsigned() ? false : v.get<int64_t>() < 0;
    if (!negative && v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(hi)) {
        bad(key, std::string("'") + key + "' must be at most " + std::to_string(hi) + ", got " + v.dump());
    }
    const int64_t x = v.is_number_unsigned() ? static_cast<int64_t>(v.get<uint64_t>()) : v.get<int64_t>();
    if (x < lo || x > hi) {
        bad(key, std::string("'") + key + "' must be between " + std::to_string(lo) + " and " + std::to_string(hi) + ", got " + v.dump());
    }
    return x;
}

bool has(const json & body, const char * key) { return body.contains(key) && !body.at(key).is_null(); }

std::string message_content(const json & content, size_t i) {
    const std::string param = "messages[" + std::to_string(i) + "].content";
    if (content.is_string()) return content.get<std::string>();
    if (!content.is_array()) bad(param, "'" + param + "' must be a string or an array of text parts");
    std::string text;
    for (const json & part : content) {
        if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") || !part.at("text").is_string()) {
            bad(param, "'" + param + "': only text parts ({\"type\": \"text\", \"text\": ...}) are supported");
        }
        text += part.at("text").get<std::string>();
    }
    return text;
}

}  // namespace

int tokens_to_generate(const Request & r, size_t n_prompt, int n_ctx) {
    const int64_t room = static_cast<int64_t>(n_ctx) - static_cast<int64_t>(n_prompt);
    const bool unset = r.max_tokens < 0;
    if (unset ? room <= 0 : r.max_tokens > room) {
        throw ApiError{400,
                       "this model's context is " + std::to_string(n_ctx) + " tokens; the prompt has " + std::to_string(n_prompt) + " tokens" +
                           (unset ? "" : " and max_tokens is " + std::to_string(r.max_tokens)),
                       "invalid_request_error", unset ? (r.endpoint == Endpoint::Chat ? "messages" : "prompt") : "max_tokens",
                       "context_length_exceeded"};
    }
    return unset ? static_cast<int>(room) : r.max_tokens;
}

Request parse_request(Endpoint endpoint, const std::string & text, const std::string & model_id) {
    json body;
    try {
        body = json::parse(text);
    } catch (const json::exception & e) {  // parse_error, and out_of_range for numbers such as 1E999 (fuzz_openai_request)
        bad("", std::string("malformed JSON in the request body: ") + e.what());
    }
    if (!body.is_object()) bad("", "the request body must be a JSON object");
    Request r;
    r.endpoint = endpoint;
    r.sampling.temperature = 1.0f;  // OpenAI's default
    if (has(body, "model")) {
        if (!body.at("model").is_string()) bad("model", "'model' must be a string");
        if (body.at("model").get<std::string>() != model_id) {
            throw ApiError{400, "unknown model '" + body.at("model").get<std::string>() + "': this server serves '" + model_id + "'",
                           "invalid_request_error", "model", "model_not_found"};
        }
    }
    if (endpoint == Endpoint::Chat) {
        if (!body.contains("messages") || !body.at("messages").is_array() || body.at("messages").empty()) {
            bad("messages", "'messages' must be a non-empty array");
        }
        const json & messages = body.at("messages");
        for (size_t i = 0; i < messages.size(); ++i) {
            const json & m = messages[i];
            if (!m.is_object() || !m.contains("role") || !m.at("role").is_string()) {
                bad("messages[" + std::to_string(i) + "].role", "each message needs a string 'role'");
            }
            const std::string role = m.at("role").get<std::string>();
            if (role != "system" && role != "user" && role != "assistant" && role != "developer") {
                bad("messages[" + std::to_string(i) + "].role", "unsupported role '" + role + "'");
            }
            if (!m.contains("content")) bad("messages[" + std::to_string(i) + "].content", "each message needs 'content'");
            r.messages.emplace_back(role == "developer" ? "system" : role, message_content(m.at("content"), i));
        }
    } else {
        if (!body.contains("prompt")) bad("prompt", "'prompt' is required");
        const json & p = body.at("prompt");
        if (p.is_string()) {
            r.prompt = p.get<std::string>();
        } else if (p.is_array() && p.size() == 1 && p[0].is_string()) {
            r.prompt = p[0].get<std::string>();
        } else {
            bad("prompt", "'prompt' must be a string (one prompt per request)");
        }
    }
    const char * max_key = has(body, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
    if (has(body, max_key)) r.max_tokens = static_cast<int>(integer(body, max_key, 1, std::numeric_limits<int32_t>::max()));
    if (has(body, "n") && integer(body, "n", 1, 1000) != 1) bad("n", "'n' must be 1: one choice per request");
    if (has(body, "temperature")) r.sampling.temperature = static_cast<float>(number(body, "temperature", 0.0, 2.0));
    if (has(body, "top_p")) r.sampling.top_p = static_cast<float>(number(body, "top_p", 0.0, 1.0));
    if (has(body, "top_k")) r.sampling.top_k = static_cast<int>(integer(body, "top_k", 0, 1 << 30));
    if (has(body, "min_p")) r.sampling.min_p = static_cast<float>(number(body, "min_p", 0.0, 1.0));
    if (has(body, "seed")) {
        r.sampling.seed = static_cast<uint64_t>(integer(body, "seed", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()));
        r.seeded = true;
    }
    for (const char * key : {"presence_penalty", "frequency_penalty"}) {
        if (has(body, key) && number(body, key, -2.0, 2.0) != 0.0) bad(key, std::string("'") + key + "' is not supported");
    }
    if (has(body, "stop")) {
        const json & s = body.at("stop");
        if (!(s.is_array() && s.empty())) bad("stop", "'stop' sequences are not supported");
    }
    if (has(body, "logprobs") && !(body.at("logprobs").is_boolean() && !body.at("logprobs").get<bool>())) {
        bad("logprobs", "'logprobs' is not supported");
    }
    if (has(body, "ignore_eos")) {
        if (!body.at("ignore_eos").is_boolean()) bad("ignore_eos", "'ignore_eos' must be a boolean");
        r.ignore_eos = body.at("ignore_eos").get<bool>();
    }
    if (has(body, "specee")) {
        const json & v = body.at("specee");
        if (!v.is_string() || (v != "off" && v != "lossy" && v != "lossless")) {
            bad("specee", "'specee' must be \"off\", \"lossy\" or \"lossless\", got " + v.dump());
        }
        r.specee = v.get<std::string>();
    }
    if (has(body, "specee_threshold")) r.specee_threshold = static_cast<float>(number(body, "specee_threshold", 0.0, 1.0));
    if (has(body, "stream")) {
        if (!body.at("stream").is_boolean()) bad("stream", "'stream' must be a boolean");
        r.stream = body.at("stream").get<bool>();
    }
    if (has(body, "stream_options")) {
        const json & so = body.at("stream_options");
        if (!so.is_object()) bad("stream_options", "'stream_options' must be an object");
        if (!r.stream) bad("stream_options", "'stream_options' is only allowed with 'stream': true");
        if (so.contains("include_usage")) {
            if (!so.at("include_usage").is_boolean()) bad("stream_options.include_usage", "'include_usage' must be a boolean");
            r.include_usage = so.at("include_usage").get<bool>();
        }
    }
    return r;
}

namespace {
const char * object_name(Endpoint e, bool chunk) {
    if (e == Endpoint::Chat) return chunk ? "chat.completion.chunk" : "chat.completion";
    return "text_completion";
}
json envelope(const Completion & c, bool chunk) {
    return json{{"id", c.id}, {"object", object_name(c.endpoint, chunk)}, {"created", c.created}, {"model", c.model}};
}
json finish_value(const std::string & reason) { return reason.empty() ? json(nullptr) : json(reason); }
}  // namespace

json usage(const GenerationStats & s) {
    return json{{"prompt_tokens", s.n_prompt}, {"completion_tokens", s.n_generated}, {"total_tokens", s.n_prompt + s.n_generated}};
}

json speculation(const GenerationStats & s) {
    const SpeculationStats & sp = s.speculation;
    json at = json::array();
    for (size_t d = 0; d < sp.reached_at.size(); ++d) at.push_back(sp.acceptance_at(d));
    json j{{"rounds", sp.rounds},
           {"drafted", sp.drafted},
           {"accepted", sp.accepted},
           {"acceptance_rate", sp.acceptance_rate()},
           {"mean_accepted_length", sp.mean_accepted_length()},
           {"acceptance_at", at}};
    if (!s.early_exit.empty()) j["early_exit"] = s.early_exit;  // SpecEE requests: where tokens exited
    return j;
}

json response(const Completion & c, const std::string & text, const std::string & finish_reason, const GenerationStats & stats) {
    json j = envelope(c, false);
    json choice{{"index", 0}, {"finish_reason", finish_value(finish_reason)}, {"logprobs", nullptr}};
    if (c.endpoint == Endpoint::Chat) {
        choice["message"] = json{{"role", "assistant"}, {"content", text}};
    } else {
        choice["text"] = text;
    }
    j["choices"] = json::array({choice});
    j["usage"] = usage(stats);
    j["speculation"] = speculation(stats);
    return j;
}

namespace {
json chunk(const Completion & c, const std::string & text, bool first, const std::string & finish_reason) {
    json j = envelope(c, true);
    json choice{{"index", 0}, {"finish_reason", finish_value(finish_reason)}, {"logprobs", nullptr}};
    if (c.endpoint == Endpoint::Chat) {
        json delta = json::object();
        if (first) delta["role"] = "assistant";
        if (first || !text.empty()) delta["content"] = text;
        choice["delta"] = delta;
    } else {
        choice["text"] = text;
    }
    j["choices"] = json::array({choice});
    return j;
}
}  // namespace

json chunk_start(const Completion & c) { return chunk(c, "", true, ""); }
json chunk_text(const Completion & c, const std::string & text, const json & tokens) {
    json j = chunk(c, text, false, "");
    if (tokens.is_array()) j["specula"] = json{{"tokens", tokens}};
    return j;
}
json chunk_finish(const Completion & c, const std::string & finish_reason) { return chunk(c, "", false, finish_reason); }

json chunk_usage(const Completion & c, const GenerationStats & stats) {
    json j = envelope(c, true);
    j["choices"] = json::array();
    j["usage"] = usage(stats);
    j["speculation"] = speculation(stats);
    return j;
}

std::string wire(const json & j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string sse(const json & j) { return "data: " + wire(j) + "\n\n"; }

}  // namespace specula::openai
