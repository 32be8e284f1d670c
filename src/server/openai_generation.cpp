#include "server/openai_generation.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <string_view>

#include "common/json_limits.h"
#include "constrain/grammar.h"
#include "server/openai_fields.h"
#include "specula/error.h"
#include "tokenizer/tokenizer.h"

namespace specula::openai {

using nlohmann::json;

namespace {

// OpenAI's limit is 4; llama-server and vLLM take any number, and lm-eval's tasks send more.
constexpr size_t kMaxStops = 16;
constexpr size_t kMaxStopTokenIds = 64;
// The held-back text can grow to a stop string's length, and matching costs up to its square per
// token: a bound keeps a hostile stop string cheap.
constexpr size_t kMaxStopBytes = 1024;

void parse_stop(const json & body, Request & r) {
    const json & s = body.at("stop");
    if (s.is_string()) {
        r.stop = {s.get<std::string>()};
    } else if (s.is_array() && s.size() <= kMaxStops && std::all_of(s.begin(), s.end(), [](const json & x) { return x.is_string(); })) {
        r.stop = s.get<std::vector<std::string>>();
    } else {
        must_be("stop", "a string or an array of up to " + std::to_string(kMaxStops) + " strings", s);
    }
    for (const std::string & stop : r.stop) {
        if (stop.empty()) bad("stop", "'stop' strings must not be empty");
        if (stop.size() > kMaxStopBytes) bad("stop", "'stop' strings must be at most " + std::to_string(kMaxStopBytes) + " bytes");
    }
}

// OpenAI's {"token id": bias} (ids as decimal strings), or llama-server's [[id, bias], ...] where
// a bias of false bans the token; in either, llama-server's text in place of an id biases each
// token of the text (Request::logit_bias_texts). Biases within -100..100; the ids are checked
// against the vocabulary, and the texts tokenized, where the tokenizer is known (check_generation).
void parse_logit_bias(const json & body, Request & r) {
    const json & v = body.at("logit_bias");
    if (!v.is_object() && !v.is_array()) must_be("logit_bias", "an object of token ids (or texts) to biases, or [[id or text, bias], ...]", v);
    std::map<int32_t, float> seen;  // id -> its bias: a repeat with the same bias is one entry (llama-server's lists repeat ids)
    auto value = [](const json & bias, const std::string & param) {
        if (bias == false) return -std::numeric_limits<float>::infinity();
        if (!bias.is_number() || !std::isfinite(bias.get<double>()) || std::fabs(bias.get<double>()) > 100.0) {
            bad("logit_bias", "'" + param + "' must be a number between -100 and 100 (or false), got " + json_kind(bias));
        }
        return bias.get<float>();
    };
    auto add_id = [&](uint64_t id, const json & bias, const std::string & param) {
        if (id > std::numeric_limits<int32_t>::max()) bad("logit_bias", "'" + param + "' names the token " + std::to_string(id) + ", outside any vocabulary");
        const float b = value(bias, param);
        const auto [at, added] = seen.emplace(static_cast<int32_t>(id), b);
        if (!added && at->second != b) bad("logit_bias", "'logit_bias' gives the token " + std::to_string(id) + " two biases");
        if (added) r.sampling.logit_bias.emplace_back(static_cast<int32_t>(id), b);
    };
    auto add_text = [&](const std::string & text, const json & bias, const std::string & param) {
        if (text.empty()) bad("logit_bias", "'" + param + "' names an empty text, which has no tokens");
        r.logit_bias_texts.emplace_back(text, value(bias, param));
    };
    if (v.is_array()) {
        for (size_t i = 0; i < v.size(); ++i) {
            const std::string param = "logit_bias[" + std::to_string(i) + "]";
            const json & pair = v[i];
            if (!pair.is_array() || pair.size() != 2 || !(pair[0].is_string() || pair[0].is_number_unsigned())) {
                bad("logit_bias", "'" + param + "' must be [token id or text, bias], got " + json_kind(pair));
            }
            if (pair[0].is_string()) add_text(pair[0].get<std::string>(), pair[1], param);
            else add_id(pair[0].get<uint64_t>(), pair[1], param);
        }
        return;
    }
    for (const auto & [key, bias] : v.items()) {
        const std::string param = "logit_bias[" + json_quoted(key) + "]";
        const bool digits = !key.empty() && std::all_of(key.begin(), key.end(), [](char c) { return c >= '0' && c <= '9'; });
        if (!digits) add_text(key, bias, param);
        else add_id(key.size() > 10 ? std::numeric_limits<uint64_t>::max() : std::stoull(key), bias, param);
    }
}

// Chat: logprobs (bool) and top_logprobs (0..20, only with logprobs); completions: logprobs (0..5).
// llama-server's n_probs (0: none, else 1..20 alternatives) where neither is given.
void parse_logprobs(const json & body, Endpoint endpoint, Request & r) {
    if (has(body, "n_probs") && !has(body, "logprobs")) {
        const int n = static_cast<int>(integer(body, "n_probs", 0, 20));
        if (n > 0) r.top_logprobs = n;
        return;
    }
    if (endpoint == Endpoint::Completions) {
        if (has(body, "logprobs")) r.top_logprobs = static_cast<int>(integer(body, "logprobs", 0, 5));
        return;
    }
    const bool on = has(body, "logprobs") && boolean(body.at("logprobs"), "logprobs");
    if (has(body, "top_logprobs")) {
        const int n = static_cast<int>(integer(body, "top_logprobs", 0, 20));
        if (!on) bad("top_logprobs", "'top_logprobs' needs 'logprobs': true");
        r.top_logprobs = n;
    } else if (on) {
        r.top_logprobs = 0;
    }
}

// {"type": "text"} | {"type": "json_object"} (llama-server's: with a "schema" beside it) |
// {"type": "json_schema", "json_schema": {"name", "schema", "strict"}}.
void parse_response_format(const json & body, Request & r) {
    const json & f = body.at("response_format");
    if (!f.is_object()) must_be("response_format", "an object with a 'type'", f);
    const json type = f.value("type", json());
    json schema;
    if (type == "text") {
        return;
    } else if (type == "json_object") {
        schema = json{{"type", "object"}};
        if (has(f, "schema")) {  // llama-server's: a schema beside json_object
            schema = f.at("schema");
            if (!schema.is_object() && !schema.is_boolean()) must_be("response_format.schema", "a JSON schema (an object)", schema);
        }
    } else if (type == "json_schema") {
        const json spec = f.value("json_schema", json());
        if (!spec.is_object()) must_be("response_format.json_schema", "an object with a 'schema'", spec);
        if (spec.contains("name") && !spec.at("name").is_string()) must_be("response_format.json_schema.name", "a string", spec.at("name"));
        if (spec.contains("strict") && !spec.at("strict").is_null()) boolean(spec.at("strict"), "response_format.json_schema.strict");
        schema = spec.value("schema", json::object());
        if (!schema.is_object() && !schema.is_boolean()) must_be("response_format.json_schema.schema", "a JSON schema (an object)", schema);
    } else {
        must_be("response_format.type", "\"text\", \"json_object\" or \"json_schema\"", type);
    }
    if (!r.grammar.empty()) bad("response_format", "'response_format' and 'grammar' cannot be combined");
    try {
        r.grammar = json_schema_to_gbnf(schema);
        r.grammar_field = "response_format";
    } catch (const Error & e) {
        bad("response_format", std::string("'response_format': ") + e.what());
    }
}

}  // namespace

void parse_generation(const json & body, Request & r) {
    for (const char * key : {"presence_penalty", "frequency_penalty"}) {
        if (!has(body, key)) continue;
        const float x = static_cast<float>(number(body, key, -2.0, 2.0));
        (key == std::string_view("presence_penalty") ? r.sampling.presence_penalty : r.sampling.frequency_penalty) = x;
    }
    // llama-server's repeat_penalty over the last repeat_last_n tokens, or vLLM's repetition_penalty,
    // the same penalty over the whole context.
    if (has(body, "repeat_penalty") && has(body, "repetition_penalty")) bad("repetition_penalty", "'repetition_penalty' and 'repeat_penalty' cannot be combined");
    for (const char * key : {"repeat_penalty", "repetition_penalty"}) {
        if (!has(body, key)) continue;
        r.sampling.repeat_penalty = static_cast<float>(number(body, key, 0.0, 10.0));
        if (r.sampling.repeat_penalty <= 0.0f) must_be(key, "above 0 (1: off)", body.at(key));
        if (key == std::string_view("repetition_penalty")) r.sampling.penalty_last_n = -1;
    }
    if (has(body, "repeat_last_n")) r.sampling.penalty_last_n = static_cast<int>(integer(body, "repeat_last_n", -1, std::numeric_limits<int32_t>::max()));
    if (has(body, "logit_bias")) parse_logit_bias(body, r);
    if (has(body, "stop")) parse_stop(body, r);
    parse_logprobs(body, r.endpoint, r);
    if (has(body, "grammar")) {
        const json & g = body.at("grammar");
        if (!g.is_string()) must_be("grammar", "a GBNF grammar (a string)", g);
        r.grammar = g.get<std::string>();
        r.grammar_field = "grammar";
    }
    if (has(body, "response_format")) parse_response_format(body, r);
    if (has(body, "json_schema")) {  // llama-server's: the schema itself, without response_format's wrapping
        const json & schema = body.at("json_schema");
        if (!schema.is_object() && !schema.is_boolean()) must_be("json_schema", "a JSON schema (an object)", schema);
        if (!r.grammar.empty()) bad("json_schema", "'json_schema' and '" + r.grammar_field + "' cannot be combined");
        try {
            r.grammar = json_schema_to_gbnf(schema);
            r.grammar_field = "json_schema";
        } catch (const Error & e) {
            bad("json_schema", std::string("'json_schema': ") + e.what());
        }
    }
    if (has(body, "min_tokens")) r.min_tokens = static_cast<int>(integer(body, "min_tokens", 0, std::numeric_limits<int32_t>::max()));
    if (r.max_tokens >= 0 && !r.max_tokens_default && r.min_tokens > r.max_tokens) {
        bad("min_tokens", "'min_tokens' (" + std::to_string(r.min_tokens) + ") is more than the most tokens asked for (" + std::to_string(r.max_tokens) + ")");
    }
    if (has(body, "stop_token_ids")) {
        const json & ids = body.at("stop_token_ids");
        if (!ids.is_array() || ids.size() > kMaxStopTokenIds) must_be("stop_token_ids", "an array of up to " + std::to_string(kMaxStopTokenIds) + " token ids", ids);
        for (size_t i = 0; i < ids.size(); ++i) {
            const json & id = ids[i];
            if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > std::numeric_limits<int32_t>::max()) {
                must_be("stop_token_ids[" + std::to_string(i) + "]", "a token id", id);
            }
            r.stop_token_ids.push_back(static_cast<int32_t>(id.get<int64_t>()));
        }
    }
    // vLLM's default: the reply's text holds no control token's text; false renders them (never the end token's).
    if (has(body, "skip_special_tokens")) r.special_token_text = !boolean(body.at("skip_special_tokens"), "skip_special_tokens");
    if (r.endpoint == Endpoint::Completions && has(body, "echo")) r.echo = boolean(body.at("echo"), "echo");
}

std::shared_ptr<const LogitsState> check_generation(Request & r, const Tokenizer & tokenizer) {
    // As llama-server's: the text tokenized as a prompt without BOS, its special-token text as
    // text; a token that several texts hold gets each text's bias.
    for (const auto & [text, bias] : r.logit_bias_texts) {
        std::set<int32_t> tokens;
        for (const int32_t id : tokenizer.tokenize(text, false, SpecialTokens::Text)) {
            if (tokens.insert(id).second) r.sampling.logit_bias.emplace_back(id, bias);
        }
    }
    r.logit_bias_texts.clear();
    for (const auto & [id, bias] : r.sampling.logit_bias) {
        if (id >= tokenizer.n_vocab()) {
            bad("logit_bias", "'logit_bias' names the token " + std::to_string(id) + ", outside the vocabulary (0.." + std::to_string(tokenizer.n_vocab() - 1) + ")");
        }
    }
    for (size_t k = 0; k < r.prompts.size(); ++k) {
        std::vector<int32_t> ids = r.prompts[k].tokens;
        for (const auto & [text, id] : r.prompts[k].mixed) ids.push_back(id);  // a text's place (-1) keeps the ids' indices
        const std::string name = r.prompts.size() > 1 ? "prompt[" + std::to_string(k) + "]" : "prompt";
        for (size_t i = 0; i < ids.size(); ++i) {
            if (ids[i] >= tokenizer.n_vocab()) {
                bad("prompt", "'" + name + "[" + std::to_string(i) + "]' is the token " + std::to_string(ids[i]) + ", outside the vocabulary (0.." +
                                  std::to_string(tokenizer.n_vocab() - 1) + ")");
            }
        }
    }
    for (int32_t id : r.stop_token_ids) {
        if (id >= tokenizer.n_vocab()) {
            bad("stop_token_ids", "'stop_token_ids' names the token " + std::to_string(id) + ", outside the vocabulary (0.." + std::to_string(tokenizer.n_vocab() - 1) + ")");
        }
    }
    if (r.grammar.empty()) return nullptr;
    try {
        return make_grammar_state(tokenizer, r.grammar);
    } catch (const Error & e) {
        bad(r.grammar_field, "'" + r.grammar_field + "': " + e.what());
    }
}

std::vector<int32_t> prompt_tokens(const Prompt & prompt, const Tokenizer & tokenizer, SpecialTokens specials) {
    if (prompt.mixed.empty()) return prompt.tokens.empty() ? tokenizer.tokenize(prompt.text, true, specials) : prompt.tokens;
    std::vector<int32_t> tokens;
    for (size_t i = 0; i < prompt.mixed.size(); ++i) {
        const auto & [text, id] = prompt.mixed[i];
        if (id >= 0) {
            tokens.push_back(id);
            continue;
        }
        const std::vector<int32_t> more = tokenizer.tokenize(text, i == 0, specials);
        tokens.insert(tokens.end(), more.begin(), more.end());
    }
    return tokens;
}

std::vector<std::string> unknown_fields(const json & body, Endpoint endpoint) {
    // Read by parse_request (openai.cpp, openai_chat.cpp and the functions above).
    static const std::set<std::string, std::less<>> common = {
        "model", "max_tokens", "max_completion_tokens", "n_predict", "n", "temperature", "top_p", "top_k", "min_p", "seed",
        "presence_penalty", "frequency_penalty", "repeat_penalty", "repeat_last_n", "repetition_penalty", "logit_bias", "stop", "logprobs",
        "n_probs", "grammar", "response_format", "json_schema", "min_tokens", "stop_token_ids", "skip_special_tokens", "ignore_eos", "specee",
        "specee_threshold", "stream", "stream_options", "cache_salt", "verbose", "return_tokens", "timings_per_token", "post_sampling_probs", "return_progress",
        // Metadata: accepted, with no effect on the generation (docs/server.md).
        "user", "metadata", "store", "service_tier", "prompt_cache_key", "safety_identifier",
        // llama-server's: every request reuses what a slot's cache holds (server/slot_prefix.h), with the same output.
        "cache_prompt"};
    static const std::set<std::string, std::less<>> chat = {"messages", "top_logprobs", "tools", "tool_choice", "parallel_tool_calls",
                                                            "chat_template_kwargs", "reasoning_effort", "continue_final_message",
                                                            "add_generation_prompt"};
    static const std::set<std::string, std::less<>> completions = {"prompt", "echo"};
    static const std::set<std::string, std::less<>> llama = {"prompt", "response_fields"};
    const auto & own = endpoint == Endpoint::Chat ? chat : endpoint == Endpoint::Completions ? completions
                                                                                             : llama;
    std::vector<std::string> unknown;
    for (const auto & [key, value] : body.items()) {
        if (common.count(key) || own.count(key)) continue;
        if (value.is_null()) continue;  // OpenAI's clients send unset fields as null
        unknown.push_back(key.size() > 40 ? key.substr(0, 40) + "..." : key);
    }
    return unknown;
}

}  // namespace specula::openai
