#pragma once
// OpenAI's wire format for `specula serve`: parsing and checking request bodies, and the JSON of
// responses, stream chunks and errors. No HTTP here (server/http_server.cpp), no scheduling.
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "specula/specula.h"
#include "tokenizer/chat_template.h"

namespace specula::openai {

// A request the server refuses: HTTP status and OpenAI's error object.
struct ApiError {
    int status = 400;
    std::string message;
    std::string type = "invalid_request_error";
    std::string param;  // the offending field, or empty
    std::string code;   // e.g. "context_length_exceeded", or empty
    // More members of the error object (llama-server's n_prompt_tokens and n_ctx); null: none.
    nlohmann::json extra = nullptr;
    nlohmann::json body() const;
};

enum class Endpoint {
    Chat,
    Completions,
    Llama,  // llama-server's /completion: a completions request answered in its own shape
};

// Most choices a request may ask for ('n'): each takes a slot (server/choices.h).
inline constexpr int kMaxChoices = 8;
// Most prompts in a completions batch; their choices together must also fit the slots and queue.
inline constexpr size_t kMaxPrompts = 256;

// A completions prompt: a text, or token ids (`tokens` non-empty), or llama-server's mixed
// prompt (`mixed` non-empty): texts and ids in order ([12, 34, "text", 56]), each text (id -1)
// tokenized on its own, with BOS only when it comes first (prompt_tokens).
struct Prompt {
    std::string text;
    std::vector<int32_t> tokens;
    std::vector<std::pair<std::string, int32_t>> mixed;  // (text, -1) or ("", id)
};
// The shapes of prompts llama-server reads (its /completion's `prompt`, /embeddings' `input`): a
// string; token ids; a mixed array of ids and strings; {"prompt_string": any of these}; or a batch,
// an array (without ids at its top) of up to `max_prompts` of those. Throws ApiError 400 naming
// `field`: another shape, an id that is negative or beyond int32, an empty array, an object with
// other members (`multimodal_data`: this server takes no images or audio).
std::vector<Prompt> parse_prompts(const nlohmann::json & p, const std::string & field, size_t max_prompts);

struct Request {
    Endpoint endpoint = Endpoint::Completions;
    int n = 1;       // choices; choice i is sampled with seed + i
    ChatInput chat;  // chat: messages, tools, tool_choice
    // Completions: the prompts (one, or OpenAI's batch), each answered with n choices, and whether
    // each choice's text starts with its prompt's (echo; with logprobs, the prompt's tokens get theirs).
    std::vector<Prompt> prompts;
    bool echo = false;
    int max_tokens = -1;  // -1: until the context is full; 0 (completions): the prompt alone
    // max_tokens is the server's default (RequestDefaults::max_tokens), which a long prompt cuts
    // to the room left rather than being refused for it.
    bool max_tokens_default = false;
    SamplingParams sampling;
    bool seeded = false;              // the client gave a seed
    bool ignore_eos = false;          // extension: keep generating past end-of-generation tokens
    bool special_token_text = false;  // vLLM's skip_special_tokens: false (GenerationOptions::special_token_text)
    bool stream = false;
    bool include_usage = false;
    // Extension (docs/specee.md): SpecEE per request. "" (unset: the server's default), "off",
    // "lossy" or "lossless"; the threshold within 0..1, or < 0 when unset (the predictors' own).
    std::string specee;
    float specee_threshold = -1.0f;
    // server/openai_generation.h: stop strings (up to 16, none empty); logprobs: -1 none, else the
    // alternatives per token (chat top_logprobs 0..20, completions logprobs 0..5); the GBNF of
    // `grammar` or of response_format's schema.
    std::vector<std::string> stop;
    // llama-server's logit_bias keyed by text ([["text", bias]], {"text": bias}): each of the text's
    // tokens gets the bias, once the tokenizer is known (check_generation moves them into sampling).
    std::vector<std::pair<std::string, float>> logit_bias_texts;
    int top_logprobs = -1;
    std::string grammar;
    std::string grammar_field;  // "grammar", "response_format" or "json_schema": where the grammar came from
    // vLLM's: the request reuses only cached prefixes and texts of requests of its tenant with the
    // same salt (server/scheduler.h, Tenancy); "" without one. At most kMaxCacheSaltBytes.
    std::string cache_salt;
    // The name the response's `model` echoes: the one the request gave, else the first served.
    std::string model;
    // vLLM's: end tokens are banned until min_tokens tokens are generated; stop_token_ids end the
    // generation as the model's own end tokens do (their text not in the reply).
    int min_tokens = 0;
    std::vector<int32_t> stop_token_ids;
    // llama-server's: `__verbose` (its /completion object of the answer, with the prompt's text) in
    // the response; the generated token ids in /completion's `tokens`; `timings` in every stream
    // chunk; logprobs of the distribution each token was drawn from (after the sampler chain:
    // GenerationOptions::post_sampling_logprobs), in its shape (`prob`, `top_probs`).
    bool verbose = false, return_tokens = false, timings_per_token = false, post_sampling_probs = false;
    // llama-server's return_progress: a stream's prompt progress events (chunk_progress).
    bool return_progress = false;
    // llama-server's response_fields (/completion): the answer reduced to these field paths.
    std::vector<std::string> response_fields;
    // Top-level fields the server does not read, accepted unless --strict-fields (parse_request):
    // the server names them in its log and in the X-Specula-Ignored-Fields header.
    std::vector<std::string> ignored_fields;
};
inline constexpr size_t kMaxCacheSaltBytes = 1024;

// The server-wide request defaults (`serve --temp`, `--top-k`, `--top-p`, `--min-p`, `--seed`,
// the penalties and `--n-predict`, as llama-server's flags): what a request that omits the field
// gets, in place of its route's own default (OpenAI's on the OpenAI routes, llama-server's on
// /infill). An unset one leaves the route's. They only choose the request's sampling options and
// length: speculation stays exact under them as under the request's own.
struct RequestDefaults {
    std::optional<float> temperature, top_p, min_p, repeat_penalty, presence_penalty, frequency_penalty;
    std::optional<int> top_k, penalty_last_n;
    std::optional<uint64_t> seed;  // a request without its own seed is then seeded with it (choice i: seed + i)
    // The most tokens a request that names none generates, cut to the room its context leaves
    // (llama-server's --n-predict); unset: until the context is full.
    std::optional<int> max_tokens;
    // llama-server's `verbose` of a request that omits it (serve --verbose: HttpServer::set_verbose).
    bool verbose = false;
    // Sets the sampling fields given on `s`; `seeded` when a seed is.
    void apply_sampling(SamplingParams & s, bool & seeded) const;
};

// What a server accepts: the names its model answers to (`serve --alias`; the first is the
// default), whether a field it does not read is refused (`serve --strict-fields`) or ignored
// and named in Request::ignored_fields, and what a request omitting a sampling field or its length gets.
struct Accepted {
    std::vector<std::string> models;
    bool strict_fields = false;
    bool any_model = false;  // serve --any-model: a name not among `models` is answered too, as llama-server answers any
    RequestDefaults defaults = {};
};

// The sampling an OpenAI route's request starts from before its own fields: OpenAI's temperature
// 1, the rest off, then the server's defaults; `seeded` when they give a seed.
SamplingParams openai_sampling(const RequestDefaults & defaults, bool & seeded);

// Parses and checks a body; throws ApiError naming the field: 400 for malformed JSON (nested more
// than kJsonMaxDepth levels too, refused before it is built), fields of the wrong type or value and
// (strict_fields) fields it does not read, 404 model_not_found for a model not among
// `accepted.models` (a request may omit it).
Request parse_request(Endpoint endpoint, const std::string & body, const Accepted & accepted);

// The tokens the request may generate with a prompt of n_prompt tokens in a context of n_ctx:
// max_tokens (the server's default cut to the room left), or when unset the rest of the context.
// Throws a 400 naming both lengths when they do not fit (computed without overflow for every int
// max_tokens and any prompt size): a prompt that fills the context is llama-server's
// `exceed_context_size_error` (with its n_prompt_tokens and n_ctx), a max_tokens beyond the room
// left an invalid_request_error naming max_tokens; both with OpenAI's code context_length_exceeded.
int tokens_to_generate(const Request & r, size_t n_prompt, int n_ctx);

// The completed request's response, its stream chunks, and the usage/speculation objects.
struct Completion {
    Endpoint endpoint = Endpoint::Completions;
    std::string id;
    int64_t created = 0;
    std::string model;
    // Completions: choice k answers prompt k / n; with echo, echo[p] is the text prompt p's
    // choices' texts start with, and with echo_logprobs their logprobs start with the prompt's.
    int n = 1;
    std::vector<std::string> echo;
    bool echo_logprobs = false;
    // A token's text, for the logprobs of a request that asked for them (server/openai_logprobs.h);
    // empty: it did not.
    std::function<std::string(int32_t)> token_text;
    // Request's verbose, return_tokens, timings_per_token and post_sampling_probs; with verbose,
    // each prompt's text (its tokens' pieces, control tokens' text included).
    bool verbose = false, return_tokens = false, timings_per_token = false, post_sampling = false;
    bool return_progress = false;
    std::vector<std::string> prompt_texts;
    // /completion: the request's settings as llama-server's generation_settings reports them, and
    // its response_fields (empty: the whole answer).
    nlohmann::json generation_settings = nlohmann::json::object();
    std::vector<std::string> response_fields;
};
// How a choice ended, beyond its finish reason: llama-server's stop_type ("eos" | "word" | "limit";
// empty: from the finish reason) and stopping_word, and its generated token ids (return_tokens).
struct ChoiceEnd {
    std::string stop_type, stopping_word;
    std::vector<int32_t> tokens;
};
// llama-server's response_fields: the field paths ("timings/prompt_n", "a/b" for j["a"]["b"]) an
// answer is reduced to, each under its path (its json_get_nested_values; a path that names nothing
// is left out). Throws ApiError 400 for another shape than an array of strings.
std::vector<std::string> parse_response_fields(const nlohmann::json & value);
nlohmann::json nested_values(const std::vector<std::string> & paths, const nlohmann::json & j);
// llama-server's timings object of a generation (its figures so far, or its whole).
nlohmann::json timings(const GenerationStats & stats);
nlohmann::json usage(const GenerationStats & stats);
nlohmann::json speculation(const GenerationStats & stats);
// The response of choice `choice` (its index; llama-server's /completion: its object).
// llama-server's `timings` beside OpenAI's fields; with c.verbose its `__verbose`.
nlohmann::json response(const Completion & c, const std::string & text, const std::string & finish_reason, const GenerationStats & stats,
                        size_t choice = 0, const ChoiceEnd & end = {});
// llama-server's /completion object (`__verbose` with the prompt's text).
nlohmann::json llama_object(const Completion & c, const std::string & text, const std::string & finish_reason, const GenerationStats & stats,
                            const ChoiceEnd & end, bool with_prompt, size_t choice = 0);
// First chunk (chat: the role; completions: the echo of choice `choice`'s prompt), a text delta,
// the last chunk of the choice, the usage chunk.
// A text delta carries the extension {"specula": {"tokens": tokens}} (docs/server.md) when
// `tokens` is an array: each token's text and origin; OpenAI clients ignore the field.
nlohmann::json chunk_start(const Completion & c, size_t choice = 0);
nlohmann::json chunk_text(const Completion & c, const std::string & text, const nlohmann::json & tokens = nullptr);
nlohmann::json chunk_finish(const Completion & c, const std::string & finish_reason);
// llama-server's prompt progress event (return_progress): a chunk without text (a chat's with the
// role delta of its opening chunk) with `prompt_progress` {total, cache, processed, time_ms}, and
// with timings_per_token the prompt's timings so far (prompt_n: the tokens processed beyond the cache).
nlohmann::json chunk_progress(const Completion & c, int total, int cache, int processed, double time_ms);
nlohmann::json chunk_usage(const Completion & c, const GenerationStats & stats);
// JSON as the server sends it: a model can emit bytes that are not UTF-8 (a token that ends
// inside a character), which are replaced (U+FFFD) rather than failing the response.
std::string wire(const nlohmann::json & j);
// One server-sent event: "data: <json>\n\n".
std::string sse(const nlohmann::json & j);

}  // namespace specula::openai
