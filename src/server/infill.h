#pragma once
// llama-server's POST /infill for `specula serve`: the fill-in-the-middle requests of editor
// plugins (llama.vscode, llama.vim). The prompt is llama-server's repo-level layout
// (format_prompt_infill) over the model's FIM tokens; the reply is llama-server's completion JSON
// (content, tokens_predicted, tokens_evaluated, timings, truncated, stop_type, ...), whole or
// streamed. Sampling follows llama-server's defaults and its `samplers` list where specula's
// pipeline computes it; n_indent and the time limits stop the text at the token that breaks them
// (TextLimits, server/scheduler.h). Refusals are openai::ApiError 400s naming the field; a
// top-level field it does not read is named, as the OpenAI routes name theirs.
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <httplib.h>

#include <nlohmann/json.hpp>

#include "server/openai.h"
#include "server/scheduler.h"
#include "specula/specula.h"
#include "tokenizer/tokenizer.h"

namespace specula {

struct ModelBundle;
struct InfillVocabulary;

namespace infill {

struct Chunk {
    std::string filename = "tmp";  // llama-server's name for a chunk without one
    std::string text;
};

struct Request {
    std::string input_prefix, input_suffix, prompt;
    std::vector<Chunk> input_extra;
    int n_predict = -1;              // -1: until the context is full
    bool n_predict_default = false;  // the server's (serve --n-predict): cut to the room left, not refused
    SamplingParams sampling;
    bool seeded = false;
    bool infill_sampler = false;  // "infill" in `samplers`
    TextLimits limits;
    bool ignore_eos = false;
    bool stream = false;
    int id_slot = -1;
    std::vector<std::string> stop;
    std::vector<std::pair<std::string, float>> logit_bias_texts;  // openai::Request's: tokenized by prepare()
    std::string grammar;
    std::string model;                         // the name the reply echoes
    std::vector<std::string> ignored_fields;   // top-level fields not read (refused with --strict-fields)
    std::vector<std::string> response_fields;  // llama-server's "a/b" paths; empty: every field
    bool return_prompt_tokens = false;         // extension: the prompt's token ids in "prompt_tokens"
};

// Parses and checks a body (throws openai::ApiError 400 naming the field; 404 for a model not
// served). A top-level field /infill does not read is named in ignored_fields, or refused with
// `accepted.strict_fields`; `lora` (adapters) is always refused, its output being another model's.
Request parse_request(const std::string & body, const openai::Accepted & accepted);

// The model's FIM tokens, as libllama reads them from the GGUF (llama_vocab_fim_pre and the rest);
// -1 where the vocabulary has none.
struct FimTokens {
    int32_t pre = -1, suf = -1, mid = -1, rep = -1, sep = -1;
};
FimTokens fim_tokens(const Tokenizer & tokenizer);

// llama-server's format_prompt_infill, with its default batch of 2048 tokens (at most n_ctx):
// [BOS] [FIM_REP]myproject\n ([FIM_SEP]filename\n text)... [FIM_SEP]filename\n
// [FIM_PRE]prefix prompt [FIM_SUF]suffix [FIM_MID], the extra context's tail as room allows, the
// prefix's tail and the suffix's head cut to the batch's 3:1 shares. Throws ApiError 400 when the
// vocabulary lacks the prefix, suffix or middle token.
std::vector<int32_t> build_prompt(const Tokenizer & tokenizer, const Request & r, SpecialTokens prompt_specials, int n_ctx);

// The vocabulary's pieces and end-of-generation tokens for the "infill" sampler.
std::shared_ptr<const InfillVocabulary> make_vocabulary(const Tokenizer & tokenizer);

// What the route needs of the server.
struct Server {
    Scheduler & scheduler;
    ModelBundle & target;
    const openai::Accepted & accepted;
    SpecialTokens prompt_specials;
    Tenancy tenancy;
    const std::atomic<bool> & ending;  // the shutdown's grace is over
    // The vocabulary's pieces for the "infill" sampler, built on first use.
    std::function<std::shared_ptr<const InfillVocabulary>()> infill_vocabulary;
};

// The request's checked fields, prompt and generation options (throws openai::ApiError): the part
// the server runs within the request's deadline (HttpServer's within_deadline).
struct Prepared {
    Request request;
    std::vector<int32_t> prompt;
    GenerationOptions generation;
};
Prepared prepare(const std::string & body, const Server & server);
// Submits it and answers, whole or streamed.
void answer(const httplib::Request & req, httplib::Response & res, const Server & server, Prepared prepared);

}  // namespace infill
}  // namespace specula
