#include "server/openai.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string_view>

#include "common/json_limits.h"
#include "server/openai_chat.h"
#include "server/openai_fields.h"
#include "server/openai_generation.h"

namespace specula::openai {

using nlohmann::json;

json ApiError::body() const {
    json error{{"message", message},
               {"type", type},
               {"param", param.empty() ? json(nullptr) : json(param)},
               {"code", code.empty() ? json(nullptr) : json(code)}};
    if (extra.is_object()) error.update(extra);
    return json{{"error", std::move(error)}};
}

void bad(const std::string & param, const std::string & message) { throw ApiError{400, message, "invalid_request_error", param, ""}; }

namespace {

// A parser's message quotes what it last read, which can be most of the body.
std::string cut(const std::string & message) {
    constexpr size_t kShown = 200;
    return message.size() > kShown ? message.substr(0, kShown) + "..." : message;
}

}  // namespace

json body_object(const std::string & text) {
    json body;
    try {
        body = parse_json(text);
    } catch (const Error & e) {  // nested deeper than the limit
        bad("", std::string("malformed JSON in the request body: ") + e.what());
    } catch (const json::exception & e) {  // parse_error, and out_of_range for numbers such as 1E999 (fuzz_openai_request)
        bad("", "malformed JSON in the request body: " + cut(e.what()));
    }
    if (!body.is_object()) bad("", "the request body must be a JSON object, got " + json_kind(body));
    return body;
}

std::string checked_model(const json & body, const Accepted & accepted) {
    if (!has(body, "model")) return accepted.models.empty() ? "" : accepted.models.front();
    const json & model = body.at("model");
    if (!model.is_string()) must_be("model", "a string", model);
    const std::string name = model.get<std::string>();
    if (!accepted.any_model && std::find(accepted.models.begin(), accepted.models.end(), name) == accepted.models.end()) {  // OpenAI's and vLLM's answer
        std::string served;
        for (const std::string & m : accepted.models) served += (served.empty() ? "" : ", ") + json_quoted(m);
        throw ApiError{404, "the model " + json_quoted(name) + " does not exist: this server serves " + served, "invalid_request_error", "model",
                       "model_not_found"};
    }
    return name;
}

void must_be(const std::string & param, const std::string & what, const json & got) {
    bad(param, "'" + param + "' must be " + what + ", got " + json_kind(got));
}

bool boolean(const json & v, const std::string & param) {
    if (!v.is_boolean()) must_be(param, "a boolean", v);
    return v.get<bool>();
}

bool has(const json & body, const char * key) { return body.contains(key) && !body.at(key).is_null(); }

double number(const json & body, const char * key, double lo, double hi) {
    const json & v = body.at(key);
    if (!v.is_number()) must_be(key, "a number", v);
    const double x = v.get<double>();
    if (!std::isfinite(x) || x < lo || x > hi) must_be(key, "between " + json(lo).dump() + " and " + json(hi).dump(), v);
    return x;
}

int64_t integer(const json & body, const char * key, int64_t lo, int64_t hi) {
    const json & v = body.at(key);
    if (!v.is_number_integer()) must_be(key, "an integer", v);
    const bool negative = v.is_number_unsigned() ? false : v.get<int64_t>() < 0;
    if (!negative && v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(hi)) must_be(key, "at most " + std::to_string(hi), v);
    const int64_t x = v.is_number_unsigned() ? static_cast<int64_t>(v.get<uint64_t>()) : v.get<int64_t>();
    if (x < lo || x > hi) must_be(key, "between " + std::to_string(lo) + " and " + std::to_string(hi), v);
    return x;
}

void RequestDefaults::apply_sampling(SamplingParams & s, bool & seeded) const {
    if (temperature) s.temperature = *temperature;
    if (top_k) s.top_k = std::max(0, *top_k);  // <= 0 off, as a request's top_k
    if (top_p) s.top_p = *top_p;
    if (min_p) s.min_p = *min_p;
    if (repeat_penalty) s.repeat_penalty = *repeat_penalty;
    if (presence_penalty) s.presence_penalty = *presence_penalty;
    if (frequency_penalty) s.frequency_penalty = *frequency_penalty;
    if (penalty_last_n) s.penalty_last_n = *penalty_last_n;
    if (seed) s.seed = *seed, seeded = true;
}

SamplingParams openai_sampling(const RequestDefaults & defaults, bool & seeded) {
    SamplingParams s;
    s.temperature = 1.0f;  // OpenAI's default
    defaults.apply_sampling(s, seeded);
    return s;
}

namespace {

bool token_id(const json & x) { return x.is_number_integer() && x.get<int64_t>() >= 0 && x.get<int64_t>() <= std::numeric_limits<int32_t>::max(); }

bool token_ids(const json & p) { return p.is_array() && !p.empty() && std::all_of(p.begin(), p.end(), token_id); }

// One prompt of a batch, or the whole one: a string, ids, a mixed array, {"prompt_string": ...}.
// `name` is its place in the body, for the message; `field` the param of a refusal.
Prompt one_prompt(const json & x, const std::string & field, const std::string & name, bool object_allowed) {
    auto refuse = [&](const std::string & message) { throw ApiError{400, message, "invalid_request_error", field, ""}; };
    if (x.is_string()) return Prompt{x.get<std::string>(), {}, {}};
    if (token_ids(x)) return Prompt{"", x.get<std::vector<int32_t>>(), {}};
    if (x.is_array() && !x.empty() && std::all_of(x.begin(), x.end(), [](const json & e) { return e.is_string() || e.is_number(); })) {
        Prompt p;
        for (size_t i = 0; i < x.size(); ++i) {
            const json & e = x[i];
            if (e.is_string()) p.mixed.emplace_back(e.get<std::string>(), -1);
            else if (token_id(e)) p.mixed.emplace_back("", static_cast<int32_t>(e.get<int64_t>()));
            else refuse("'" + name + "[" + std::to_string(i) + "]' must be a token id (0.." + std::to_string(std::numeric_limits<int32_t>::max()) + ") or a text, got " + json_kind(e));
        }
        return p;
    }
    if (object_allowed && x.is_object()) {
        for (const auto & [key, value] : x.items()) {
            if (key == "multimodal_data") refuse("'" + name + ".multimodal_data': this server's model takes no images or audio (no multimodal projector)");
            if (key != "prompt_string") refuse("'" + name + "' has the member " + json_quoted(key.size() > 40 ? key.substr(0, 40) + "..." : key) + ", which is not read (only \"prompt_string\")");
        }
        if (!x.contains("prompt_string")) refuse("'" + name + "' must be a string, an array of token ids (and texts), or {\"prompt_string\": ...}, got an object without 'prompt_string'");
        return one_prompt(x.at("prompt_string"), field, name + ".prompt_string", false);
    }
    refuse("'" + name + "' must be a string, an array of token ids (and texts)" + (object_allowed ? ", or {\"prompt_string\": ...}" : "") + ", got " + json_kind(x));
    return {};
}

}  // namespace

std::vector<Prompt> parse_prompts(const json & p, const std::string & field, size_t max_prompts) {
    // An array holding ids at its top is one prompt, as llama-server reads it; else a batch.
    const bool batch = p.is_array() && std::none_of(p.begin(), p.end(), [](const json & x) { return x.is_number(); });
    if (!batch) return {one_prompt(p, field, field, true)};
    if (p.empty() || p.size() > max_prompts) {
        must_be(field, "a string, an array of token ids (and texts), or an array of up to " + std::to_string(max_prompts) + " of them (a batch)", p);
    }
    std::vector<Prompt> prompts;
    for (size_t k = 0; k < p.size(); ++k) prompts.push_back(one_prompt(p[k], field, field + "[" + std::to_string(k) + "]", true));
    return prompts;
}

namespace {

Request parse_body(Endpoint endpoint, const std::string & text, const Accepted & accepted) {
    const json body = body_object(text);
    Request r;
    r.ignored_fields = unknown_fields(body, endpoint);
    if (accepted.strict_fields && !r.ignored_fields.empty()) {
        const std::string & name = r.ignored_fields.front();
        bad(name, "'" + name + "' is not supported" + (endpoint == Endpoint::Completions ? " by /v1/completions" : ""));
    }
    r.endpoint = endpoint;
    r.sampling = openai_sampling(accepted.defaults, r.seeded);
    r.model = checked_model(body, accepted);
    if (endpoint == Endpoint::Chat) {
        r.chat = parse_chat(body, text);
    } else {
        if (!body.contains("prompt")) bad("prompt", "'prompt' is required");
        r.prompts = parse_prompts(body.at("prompt"), "prompt", kMaxPrompts);
    }
    // llama-server's n_predict, -1 unset, where the body has neither of OpenAI's names.
    const char * max_key = has(body, "max_completion_tokens") ? "max_completion_tokens" : has(body, "max_tokens") ? "max_tokens"
                                                                                                                  : "n_predict";
    if (accepted.defaults.max_tokens) r.max_tokens = *accepted.defaults.max_tokens, r.max_tokens_default = true;
    if (has(body, max_key)) {
        r.max_tokens_default = false;
        // Completions may ask for none: the prompt alone (its logprobs with echo, a cached prompt).
        const int64_t lo = max_key == std::string_view("n_predict") ? -1 : endpoint == Endpoint::Chat ? 1
                                                                                                      : 0;
        r.max_tokens = static_cast<int>(integer(body, max_key, lo, std::numeric_limits<int32_t>::max()));
        if (r.max_tokens == 0 && endpoint == Endpoint::Chat) must_be(max_key, "-1 (until the context is full) or at least 1", body.at(max_key));
    }
    if (has(body, "n")) r.n = static_cast<int>(integer(body, "n", 1, kMaxChoices));
    if (has(body, "temperature")) r.sampling.temperature = static_cast<float>(number(body, "temperature", 0.0, 2.0));
    if (has(body, "top_p")) r.sampling.top_p = static_cast<float>(number(body, "top_p", 0.0, 1.0));
    // top_k <= 0 is off, as llama-server reads it; vLLM's clients send -1.
    if (has(body, "top_k")) r.sampling.top_k = std::max(0, static_cast<int>(integer(body, "top_k", -1, 1 << 30)));
    if (has(body, "min_p")) r.sampling.min_p = static_cast<float>(number(body, "min_p", 0.0, 1.0));
    if (has(body, "seed")) {
        r.sampling.seed = static_cast<uint64_t>(integer(body, "seed", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()));
        r.seeded = true;
    }
    parse_generation(body, r);
    if (has(body, "ignore_eos")) r.ignore_eos = boolean(body.at("ignore_eos"), "ignore_eos");
    if (has(body, "specee")) {
        const json & v = body.at("specee");
        if (!v.is_string() || (v != "off" && v != "lossy" && v != "lossless")) must_be("specee", "\"off\", \"lossy\" or \"lossless\"", v);
        r.specee = v.get<std::string>();
    }
    if (has(body, "cache_salt")) {
        const json & v = body.at("cache_salt");
        if (!v.is_string() || v.get_ref<const std::string &>().empty()) must_be("cache_salt", "a non-empty string", v);
        r.cache_salt = v.get<std::string>();
        if (r.cache_salt.size() > kMaxCacheSaltBytes) {
            bad("cache_salt", "'cache_salt' is " + std::to_string(r.cache_salt.size()) + " bytes long, more than the limit of " + std::to_string(kMaxCacheSaltBytes));
        }
    }
    if (has(body, "specee_threshold")) r.specee_threshold = static_cast<float>(number(body, "specee_threshold", 0.0, 1.0));
    r.verbose = accepted.defaults.verbose;
    for (const auto & [key, flag] : {std::pair{"verbose", &r.verbose}, std::pair{"return_tokens", &r.return_tokens},
                                     std::pair{"timings_per_token", &r.timings_per_token}, std::pair{"post_sampling_probs", &r.post_sampling_probs},
                                     std::pair{"return_progress", &r.return_progress}}) {
        if (has(body, key)) *flag = boolean(body.at(key), key);
    }
    if (r.endpoint == Endpoint::Llama && has(body, "response_fields")) r.response_fields = parse_response_fields(body.at("response_fields"));
    if (has(body, "stream")) r.stream = boolean(body.at("stream"), "stream");
    if (has(body, "stream_options")) {
        const json & so = body.at("stream_options");
        if (!so.is_object()) must_be("stream_options", "an object", so);
        if (!r.stream) bad("stream_options", "'stream_options' is only allowed with 'stream': true");
        if (so.contains("include_usage")) r.include_usage = boolean(so.at("include_usage"), "stream_options.include_usage");
    }
    if (r.stream && r.echo && r.top_logprobs >= 0) bad("echo", "'echo' with 'logprobs' (the prompt's logprobs) is not supported in streams: set 'stream': false");
    return r;
}

}  // namespace

Request parse_request(Endpoint endpoint, const std::string & text, const Accepted & accepted) {
    try {
        return parse_body(endpoint, text, accepted);
    } catch (const json::exception & e) {  // a type error the checks above missed: still the client's, never a 500
        bad("", "the request body could not be read: " + cut(e.what()));
    }
}

int tokens_to_generate(const Request & r, size_t n_prompt, int n_ctx) {
    const int64_t room = static_cast<int64_t>(n_ctx) - static_cast<int64_t>(n_prompt);
    const bool unset = r.max_tokens < 0 || r.max_tokens_default;
    const std::string sizes = "this model's context is " + std::to_string(n_ctx) + " tokens; the prompt has " + std::to_string(n_prompt) + " tokens";
    if (room <= 0) {  // llama-server's error, whose clients read its type and sizes
        throw ApiError{400, sizes, "exceed_context_size_error", r.endpoint == Endpoint::Chat ? "messages" : "prompt", "context_length_exceeded",
                       json{{"n_prompt_tokens", n_prompt}, {"n_ctx", n_ctx}}};
    }
    if (!unset && r.max_tokens > room) {
        throw ApiError{400, sizes + " and max_tokens is " + std::to_string(r.max_tokens), "invalid_request_error", "max_tokens", "context_length_exceeded",
                       json{{"n_prompt_tokens", n_prompt}, {"n_ctx", n_ctx}}};
    }
    if (r.max_tokens_default && r.max_tokens >= 0) return static_cast<int>(std::min<int64_t>(room, r.max_tokens));
    return unset ? static_cast<int>(room) : r.max_tokens;
}

namespace {
const std::string & echo_of(const Completion & c, size_t choice) {
    static const std::string none;
    return c.echo.empty() ? none : c.echo.at(choice / c.n);
}
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
    return json{{"prompt_tokens", s.n_prompt},
                {"completion_tokens", s.n_generated},
                {"total_tokens", s.n_prompt + s.n_generated},
                {"prompt_tokens_details", {{"cached_tokens", s.n_cached}}}};
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

json timings(const GenerationStats & stats) {
    auto per_second = [](int n, double seconds) { return seconds > 0 ? n / seconds : 0.0; };
    const int prompt_n = stats.n_prompt - stats.n_cached;
    return json{{"cache_n", stats.n_cached},
                {"prompt_n", prompt_n},
                {"prompt_ms", stats.prompt_seconds * 1000},
                {"prompt_per_token_ms", prompt_n > 0 ? stats.prompt_seconds * 1000 / prompt_n : 0.0},
                {"prompt_per_second", per_second(prompt_n, stats.prompt_seconds)},
                {"predicted_n", stats.n_generated},
                {"predicted_ms", stats.generation_seconds * 1000},
                {"predicted_per_token_ms", stats.n_generated > 0 ? stats.generation_seconds * 1000 / stats.n_generated : 0.0},
                {"predicted_per_second", per_second(stats.n_generated, stats.generation_seconds)}};
}

std::vector<std::string> parse_response_fields(const json & v) {
    if (!v.is_array() || !std::all_of(v.begin(), v.end(), [](const json & x) { return x.is_string(); })) {
        must_be("response_fields", "an array of field paths (\"timings/prompt_n\")", v);
    }
    return v.get<std::vector<std::string>>();
}

json nested_values(const std::vector<std::string> & paths, const json & j) {
    json out = json::object();
    for (const std::string & path : paths) {
        const json * at = &j;
        size_t from = 0;
        for (;;) {
            const size_t slash = path.find('/', from);
            const std::string key = path.substr(from, slash == std::string::npos ? std::string::npos : slash - from);
            if (!at->is_object() || !at->contains(key)) {
                at = nullptr;
                break;
            }
            at = &at->at(key);
            if (slash == std::string::npos) break;
            from = slash + 1;
        }
        if (at) out[path] = *at;
    }
    return out;
}

// llama-server's /completion answer: the whole one (stop: true, with the counts and timings), or
// a stream's last event (its text and tokens already sent).
json llama_object(const Completion & c, const std::string & text, const std::string & finish_reason, const GenerationStats & stats, const ChoiceEnd & end,
                  bool with_prompt, size_t choice_index) {
    json j{{"index", choice_index},
           {"content", text},
           {"tokens", c.return_tokens ? json(end.tokens) : json::array()},
           {"id_slot", -1},
           {"stop", true},
           {"model", c.model},
           {"tokens_predicted", stats.n_generated},
           {"tokens_evaluated", stats.n_prompt},
           {"tokens_cached", stats.n_cached},
           {"has_new_line", text.find('\n') != std::string::npos},
           {"truncated", false},
           {"stop_type", !end.stop_type.empty() ? end.stop_type : finish_reason == "length" ? "limit"
                                                                                            : "eos"},
           {"stopping_word", end.stopping_word},
           {"generation_settings", c.generation_settings},
           {"timings", timings(stats)},
           {"speculation", speculation(stats)}};
    if (with_prompt) j["prompt"] = choice_index / c.n < c.prompt_texts.size() ? c.prompt_texts[choice_index / c.n] : "";
    return c.response_fields.empty() ? j : nested_values(c.response_fields, j);
}

json response(const Completion & c, const std::string & text, const std::string & finish_reason, const GenerationStats & stats, size_t choice_index,
              const ChoiceEnd & end) {
    if (c.endpoint == Endpoint::Llama) {
        return llama_object(c, text, finish_reason, stats, end, c.verbose, choice_index);
    }
    json j = envelope(c, false);
    json choice{{"index", choice_index}, {"finish_reason", finish_value(finish_reason)}, {"logprobs", nullptr}};
    if (c.endpoint == Endpoint::Chat) {
        choice["message"] = json{{"role", "assistant"}, {"content", text}};
    } else {
        choice["text"] = echo_of(c, choice_index) + text;
    }
    j["choices"] = json::array({choice});
    j["usage"] = usage(stats);
    j["timings"] = timings(stats);  // llama-server's, beside usage
    j["speculation"] = speculation(stats);
    if (c.verbose) {
        j["__verbose"] = llama_object(c, text, finish_reason, stats, end, true, choice_index);
    }
    return j;
}

namespace {
json chunk(const Completion & c, const std::string & text, bool first, const std::string & finish_reason, size_t choice_index = 0) {
    if (c.endpoint == Endpoint::Llama) return json{{"index", choice_index}, {"content", text}, {"tokens", json::array()}, {"stop", false}};
    json j = envelope(c, true);
    json choice{{"index", choice_index}, {"finish_reason", finish_value(finish_reason)}, {"logprobs", nullptr}};
    if (c.endpoint == Endpoint::Chat) {
        json delta = json::object();
        // The first delta is the role, its content null (llama-server's; OpenAI's "" is taken
        // by llama-server's clients for a text delta, and OpenAI's clients read null as no text).
        if (first) delta["role"] = "assistant", delta["content"] = nullptr;
        else if (!text.empty()) delta["content"] = text;
        choice["delta"] = delta;
    } else {
        choice["text"] = first ? echo_of(c, choice_index) : text;
    }
    j["choices"] = json::array({choice});
    return j;
}
}  // namespace

json chunk_start(const Completion & c, size_t choice) { return chunk(c, "", true, "", choice); }
json chunk_text(const Completion & c, const std::string & text, const json & tokens) {
    json j = chunk(c, text, false, "");
    if (tokens.is_array()) j["specula"] = json{{"tokens", tokens}};
    return j;
}
json chunk_finish(const Completion & c, const std::string & finish_reason) { return chunk(c, "", false, finish_reason); }

json chunk_progress(const Completion & c, int total, int cache, int processed, double time_ms) {
    json j = c.endpoint == Endpoint::Chat ? chunk(c, "", true, "") : chunk(c, "", false, "");
    j["prompt_progress"] = json{{"total", total}, {"cache", cache}, {"processed", processed}, {"time_ms", time_ms}};
    if (c.timings_per_token) {
        GenerationStats so_far;
        so_far.n_prompt = processed, so_far.n_cached = cache, so_far.prompt_seconds = time_ms / 1000;
        j["timings"] = timings(so_far);
    }
    return j;
}

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
