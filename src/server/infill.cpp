#include "server/infill.h"

#include <algorithm>
#include <limits>
#include <random>
#include <set>

#include "common/json_limits.h"
#include "engine/model_bundle.h"
#include "llama.h"
#include "sample/sampler.h"
#include "server/choices.h"
#include "server/http_reply.h"
#include "server/openai.h"
#include "server/openai_fields.h"
#include "server/openai_generation.h"

namespace specula::infill {

using nlohmann::json;
using openai::ApiError;
using openai::bad;
using openai::boolean;
using openai::has;
using openai::integer;
using openai::must_be;
using openai::number;

namespace {

// llama-server's sampler names that specula's pipeline computes, in the order it applies them
// (sample/sampler.h: penalties on the logits, top-k, top-p, min-p, temperature, then infill).
const std::vector<std::string> kSamplerOrder = {"penalties", "top_k", "top_p", "min_p", "temperature", "infill"};
// The fields each of them reads: one sent while its sampler is left out of `samplers` would have no effect.
const std::vector<std::pair<std::string, std::vector<const char *>>> kSamplerFields = {
    {"penalties", {"repeat_penalty", "presence_penalty", "frequency_penalty", "repeat_last_n"}},
    {"top_k", {"top_k"}},
    {"top_p", {"top_p"}},
    {"min_p", {"min_p"}},
    {"temperature", {"temperature"}},
};
constexpr int kBatch = 2048;  // llama-server's default -b, which its layout divides

std::string text_field(const json & body, const char * key, bool required) {
    if (!body.contains(key) || body.at(key).is_null()) {
        if (required) bad(key, std::string("'") + key + "' is required");
        return "";
    }
    if (!body.at(key).is_string()) must_be(key, "a string", body.at(key));
    return body.at(key).get<std::string>();
}

void parse_extra(const json & v, Request & r) {
    if (!v.is_array()) must_be("input_extra", "an array of {\"filename\": string, \"text\": string}", v);
    for (size_t i = 0; i < v.size(); ++i) {
        const std::string param = "input_extra[" + std::to_string(i) + "]";
        const json & c = v[i];
        if (!c.is_object()) must_be(param, "an object {\"filename\": string, \"text\": string}", c);
        Chunk chunk;
        for (const auto & [key, value] : c.items()) {
            if (key == "text") {
                if (!value.is_string()) must_be(param + ".text", "a string", value);
                chunk.text = value.get<std::string>();
            } else if (key == "filename") {
                if (!value.is_string()) must_be(param + ".filename", "a string", value);
                chunk.filename = value.get<std::string>();
            } else if (key != "time") {  // llama.vim's: when the chunk was picked, read by no server
                const std::string name = key.size() > 40 ? key.substr(0, 40) + "..." : key;
                bad(param + "." + name, "'" + param + "." + name + "' is not supported (a chunk is {\"filename\", \"text\"})");
            }
        }
        if (!c.contains("text")) bad(param + ".text", "'" + param + ".text' is required");
        r.input_extra.push_back(std::move(chunk));
    }
}

// llama-server's defaults (temperature 0.8, top-k 40, top-p 0.95, min-p 0.05 over the last 64
// tokens' penalties), then the server's (serve --temp ...), then the request's values, then
// `samplers`: a sampler it leaves out is off.
void parse_sampling(const json & body, const openai::RequestDefaults & defaults, Request & r) {
    SamplingParams & s = r.sampling;
    s.temperature = 0.8f;
    s.top_k = 40;
    s.top_p = 0.95f;
    s.min_p = 0.05f;
    defaults.apply_sampling(s, r.seeded);
    if (has(body, "temperature")) s.temperature = static_cast<float>(number(body, "temperature", 0.0, 100.0));
    if (has(body, "top_k")) s.top_k = std::max(0, static_cast<int>(integer(body, "top_k", -1, 1 << 30)));
    if (has(body, "top_p")) s.top_p = static_cast<float>(number(body, "top_p", 0.0, 1.0));
    if (has(body, "min_p")) s.min_p = static_cast<float>(number(body, "min_p", 0.0, 1.0));
    if (has(body, "seed")) {
        const int64_t seed = integer(body, "seed", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max());
        r.seeded = seed != -1;  // llama-server's -1: a random seed
        s.seed = static_cast<uint64_t>(seed);
    }
    if (!has(body, "samplers")) return;
    const json & v = body.at("samplers");
    if (!v.is_array() || !std::all_of(v.begin(), v.end(), [](const json & x) { return x.is_string(); })) {
        must_be("samplers", "an array of sampler names", v);
    }
    size_t next = 0;  // in kSamplerOrder
    std::set<std::string> listed;
    for (const json & x : v) {
        const std::string name = x.get<std::string>();
        const auto at = std::find(kSamplerOrder.begin(), kSamplerOrder.end(), name);
        if (at == kSamplerOrder.end()) {
            bad("samplers", "'samplers': " + json_quoted(name.substr(0, 40)) +
                                " is not supported; specula samples with \"penalties\", \"top_k\", \"top_p\", \"min_p\", \"temperature\" and \"infill\"");
        }
        const size_t i = static_cast<size_t>(at - kSamplerOrder.begin());
        if (i < next) {
            bad("samplers", "'samplers' must list its samplers in the order specula applies them: penalties, top_k, top_p, min_p, temperature, infill");
        }
        next = i + 1;
        listed.insert(name);
    }
    // A sampling field whose sampler is off would have no effect: refused, unless nothing is sampled.
    for (const auto & [sampler, fields] : kSamplerFields) {
        if (listed.count(sampler)) continue;
        for (const char * field : fields) {
            if (has(body, field) && r.n_predict != 0) {
                bad(field, std::string("'") + field + "' has no effect: 'samplers' does not list \"" + sampler + "\"");
            }
        }
    }
    if (!listed.count("top_k")) s.top_k = 0;
    if (!listed.count("top_p")) s.top_p = 1.0f;
    if (!listed.count("min_p")) s.min_p = 0.0f;
    if (!listed.count("temperature")) s.temperature = 1.0f;  // llama-server's chain without it: the logits as they are
    if (!listed.count("penalties")) s.repeat_penalty = 1.0f, s.presence_penalty = 0.0f, s.frequency_penalty = 0.0f;
    r.infill_sampler = listed.count("infill") > 0;
    if (r.infill_sampler && !s.greedy() && (s.top_k < 1 || s.top_k > InfillVocabulary::kMaxInfillCandidates) && r.n_predict != 0) {
        bad("samplers", "'samplers': \"infill\" compares its candidates pairwise: list \"top_k\" before it with 'top_k' between 1 and " +
                            std::to_string(InfillVocabulary::kMaxInfillCandidates));
    }
}

Request parse_body(const std::string & text, const openai::Accepted & accepted) {
    const json body = openai::body_object(text);
    static const std::set<std::string, std::less<>> fields = {
        "input_prefix", "input_suffix", "input_extra", "prompt", "n_predict", "max_tokens", "n_indent", "t_max_prompt_ms",
        "t_max_predict_ms", "samplers", "cache_prompt", "stream", "id_slot", "temperature", "top_k", "top_p", "min_p", "seed",
        "repeat_penalty", "presence_penalty", "frequency_penalty", "repeat_last_n", "logit_bias", "stop", "grammar", "ignore_eos",
        "response_fields", "model", "return_prompt_tokens"};
    Request r;
    if (has(body, "lora")) bad("lora", "'lora' is not supported: specula serves the model without adapters");
    for (const auto & [key, value] : body.items()) {
        if (fields.count(key) || value.is_null()) continue;
        const std::string name = key.size() > 40 ? key.substr(0, 40) + "..." : key;
        if (accepted.strict_fields) bad(name, "'" + name + "' is not supported by /infill");
        r.ignored_fields.push_back(name);
    }
    r.model = checked_model(body, accepted);
    r.input_prefix = text_field(body, "input_prefix", true);
    r.input_suffix = text_field(body, "input_suffix", true);
    r.prompt = text_field(body, "prompt", false);
    if (has(body, "input_extra")) parse_extra(body.at("input_extra"), r);
    if (has(body, "n_predict") && has(body, "max_tokens")) bad("max_tokens", "'max_tokens' and 'n_predict' cannot be combined");
    if (accepted.defaults.max_tokens) r.n_predict = *accepted.defaults.max_tokens, r.n_predict_default = true;
    for (const char * key : {"n_predict", "max_tokens"}) {
        if (has(body, key)) r.n_predict = static_cast<int>(integer(body, key, -1, std::numeric_limits<int32_t>::max())), r.n_predict_default = false;
    }
    if (has(body, "n_indent")) r.limits.n_indent = static_cast<int>(integer(body, "n_indent", 0, 1 << 20));
    // llama-server's -1 (and 0): no limit.
    const int64_t day_ms = 86400000;
    if (has(body, "t_max_predict_ms")) r.limits.max_predict = std::chrono::milliseconds(std::max<int64_t>(0, integer(body, "t_max_predict_ms", -1, day_ms)));
    if (has(body, "t_max_prompt_ms")) r.limits.max_prompt = std::chrono::milliseconds(std::max<int64_t>(0, integer(body, "t_max_prompt_ms", -1, day_ms)));
    parse_sampling(body, accepted.defaults, r);
    openai::Request generation;  // penalties, logit_bias, stop and grammar, read as /v1/completions reads them
    generation.endpoint = openai::Endpoint::Completions;
    generation.sampling = r.sampling;
    openai::parse_generation(body, generation);
    r.sampling = generation.sampling;
    r.stop = generation.stop;
    r.logit_bias_texts = generation.logit_bias_texts;
    r.grammar = generation.grammar;
    if (has(body, "cache_prompt")) boolean(body.at("cache_prompt"), "cache_prompt");  // every request reuses cached rows (server/slot_prefix.h)
    if (has(body, "stream")) r.stream = boolean(body.at("stream"), "stream");
    if (has(body, "ignore_eos")) r.ignore_eos = boolean(body.at("ignore_eos"), "ignore_eos");
    if (has(body, "return_prompt_tokens")) r.return_prompt_tokens = boolean(body.at("return_prompt_tokens"), "return_prompt_tokens");
    if (has(body, "id_slot")) r.id_slot = static_cast<int>(integer(body, "id_slot", -1, 1 << 20));
    if (has(body, "response_fields")) r.response_fields = openai::parse_response_fields(body.at("response_fields"));
    return r;
}

json timings(const GenerationStats & s) {
    const int evaluated = s.n_prompt - s.n_cached;
    const double prompt_ms = s.prompt_seconds * 1000.0, predicted_ms = s.generation_seconds * 1000.0;
    return json{{"cache_n", s.n_cached},
                {"prompt_n", evaluated},
                {"prompt_ms", prompt_ms},
                {"prompt_per_token_ms", evaluated > 0 ? prompt_ms / evaluated : 0.0},
                {"prompt_per_second", prompt_ms > 0 ? 1000.0 * evaluated / prompt_ms : 0.0},
                {"predicted_n", s.n_generated},
                {"predicted_ms", predicted_ms},
                {"predicted_per_token_ms", s.n_generated > 0 ? predicted_ms / s.n_generated : 0.0},
                {"predicted_per_second", predicted_ms > 0 ? 1000.0 * s.n_generated / predicted_ms : 0.0}};
}

}  // namespace

Request parse_request(const std::string & body, const openai::Accepted & accepted) {
    try {
        return parse_body(body, accepted);
    } catch (const json::exception & e) {  // a type error the checks missed: still the client's
        bad("", std::string("the request body could not be read: ") + std::string(e.what()).substr(0, 200));
    }
}

FimTokens fim_tokens(const Tokenizer & tokenizer) {
    const llama_vocab * v = tokenizer.vocabulary();
    auto id = [](llama_token t) { return t == LLAMA_TOKEN_NULL ? -1 : static_cast<int32_t>(t); };
    return FimTokens{id(llama_vocab_fim_pre(v)), id(llama_vocab_fim_suf(v)), id(llama_vocab_fim_mid(v)), id(llama_vocab_fim_rep(v)),
                     id(llama_vocab_fim_sep(v))};
}

std::shared_ptr<const InfillVocabulary> make_vocabulary(const Tokenizer & tok) {
    auto v = std::make_shared<InfillVocabulary>();
    for (int32_t id = 0; id < tok.n_vocab(); ++id) {
        v->pieces.push_back(tok.piece(id));
        v->end_of_generation.push_back(tok.is_end_of_generation(id));
    }
    const llama_vocab * vocab = tok.vocabulary();
    v->end_token = llama_vocab_eot(vocab) != LLAMA_TOKEN_NULL ? llama_vocab_eot(vocab) : llama_vocab_eos(vocab);
    return v;
}

std::vector<int32_t> build_prompt(const Tokenizer & tok, const Request & r, SpecialTokens prompt_specials, int n_ctx) {
    const FimTokens fim = fim_tokens(tok);
    std::string missing;
    if (fim.pre < 0) missing += " prefix";
    if (fim.suf < 0) missing += " suffix";
    if (fim.mid < 0) missing += " middle";
    if (!missing.empty()) {
        throw ApiError{400, "/infill needs a model with fill-in-the-middle tokens; this model's vocabulary has no FIM" + missing + " token",
                       "invalid_request_error", "", "infill_not_supported"};
    }
    auto text = [&tok](const std::string & s) { return tok.tokenize(s, false, SpecialTokens::Text); };
    std::vector<int32_t> extra;
    if (fim.rep >= 0) {
        extra.push_back(fim.rep);
        const auto project = text("myproject\n");
        extra.insert(extra.end(), project.begin(), project.end());
    }
    for (const Chunk & c : r.input_extra) {
        if (fim.sep >= 0) {
            extra.push_back(fim.sep);
            const auto name = text(c.filename + "\n");
            extra.insert(extra.end(), name.begin(), name.end());
        } else {
            const auto separator = text("\n\n--- snippet ---\n\n");
            extra.insert(extra.end(), separator.begin(), separator.end());
        }
        const auto chunk = text(c.text);
        extra.insert(extra.end(), chunk.begin(), chunk.end());
    }
    if (fim.sep >= 0) {
        extra.push_back(fim.sep);
        const auto name = text("filename\n");
        extra.insert(extra.end(), name.begin(), name.end());
    }
    std::vector<int32_t> prefix = text(r.input_prefix), suffix = text(r.input_suffix);
    const std::vector<int32_t> middle = tok.tokenize(r.prompt, false, prompt_specials);
    const int batch = std::min(kBatch, n_ctx);
    const int n_prefix = std::min<int>(static_cast<int>(prefix.size()), 3 * (batch / 4));
    const int n_suffix = std::min<int>(static_cast<int>(suffix.size()), std::max<int>(0, batch / 4 - (2 + static_cast<int>(middle.size()))));
    // llama-server's server-wide n_predict (-1 unless set) reserves 2 * n_predict.
    const int n_extra = std::min<int>(std::max(0, n_ctx - batch + 2), static_cast<int>(extra.size()));

    std::vector<int32_t> out;
    const llama_vocab * v = tok.vocabulary();
    if (llama_vocab_get_add_bos(v)) out.push_back(llama_vocab_bos(v));
    out.insert(out.begin(), extra.end() - n_extra, extra.end());  // before the BOS, where llama-server puts it
    out.push_back(fim.pre);
    out.insert(out.end(), prefix.end() - n_prefix, prefix.end());
    out.insert(out.end(), middle.begin(), middle.end());
    out.push_back(fim.suf);
    out.insert(out.end(), suffix.begin(), suffix.begin() + n_suffix);
    out.push_back(fim.mid);
    return out;
}

Prepared prepare(const std::string & body, const Server & s) {
    Tokenizer & tok = *s.target.tokenizer;
    Prepared p;
    Request & r = p.request;
    GenerationOptions & gen = p.generation;
    r = parse_request(body, s.accepted);
    p.prompt = build_prompt(tok, r, s.prompt_specials, s.scheduler.context_size());
    openai::Request sized;
    sized.max_tokens = r.n_predict < 0 ? -1 : std::max(r.n_predict, 1);  // the check needs room for one token at least
    sized.max_tokens_default = r.n_predict_default;
    const int n = openai::tokens_to_generate(sized, p.prompt.size(), s.scheduler.context_size());
    gen.n_predict = r.n_predict == 0 ? 0 : n;
    openai::Request checked;
    checked.sampling = r.sampling;
    checked.logit_bias_texts = r.logit_bias_texts;
    checked.grammar = r.grammar;
    checked.grammar_field = "grammar";
    openai::check_generation(checked, tok);
    gen.sampling = checked.sampling;  // with the texts' biases
    if (r.infill_sampler) gen.sampling.infill = s.infill_vocabulary();
    const int slots = s.scheduler.metrics().slots;
    if (r.id_slot >= slots) {
        bad("id_slot", "'id_slot' is " + std::to_string(r.id_slot) + ": this server has " + std::to_string(slots) + " slots (--parallel), 0.." +
                           std::to_string(slots - 1) + " or -1 for any");
    }
    if (!r.seeded) gen.sampling.seed = std::random_device{}();
    gen.stop_at_end_of_generation = !r.ignore_eos;
    gen.grammar = r.grammar;
    return p;
}

void answer(const httplib::Request & req, httplib::Response & res, const Server & s, Prepared p) {
    Tokenizer & tok = *s.target.tokenizer;
    const Request & r = p.request;
    const GenerationOptions & gen = p.generation;
    std::vector<int32_t> & prompt = p.prompt;
    std::shared_ptr<Job> job;
    try {
        job = s.scheduler.submit(prompt, gen, {}, r.stop, s.tenancy, r.limits, r.id_slot);
    } catch (const Error & e) {
        return send_error(res, ApiError{400, e.what(), "invalid_request_error", "", ""});
    }
    if (!job) return send_error(res, ApiError{503, "the server is busy: every slot and the queue are full", "server_error", "", "queue_full"});

    const int n_ctx = s.scheduler.context_size();
    if (!r.ignored_fields.empty()) note_ignored(req, res, r.ignored_fields);
    auto final_json = [r, prompt = std::move(prompt), model = r.model, n_ctx, &tok](const std::string & content, const Job::Result & result) {
        const GenerationStats & st = result.stats;
        std::string prompt_text;
        for (int32_t t : prompt) prompt_text += tok.piece(t, /*special=*/true);
        json j{{"index", 0},
               {"content", content},
               {"tokens", json::array()},
               {"id_slot", result.slot},
               {"stop", true},
               {"model", model},
               {"tokens_predicted", st.n_generated},
               {"tokens_evaluated", st.n_prompt},
               {"generation_settings",
                {{"n_predict", r.n_predict},
                 {"temperature", r.sampling.temperature},
                 {"top_k", r.sampling.top_k},
                 {"top_p", r.sampling.top_p},
                 {"min_p", r.sampling.min_p},
                 {"n_indent", r.limits.n_indent},
                 {"t_max_prompt_ms", r.limits.max_prompt.count()},
                 {"t_max_predict_ms", r.limits.max_predict.count()},
                 {"stop", r.stop}}},
               {"prompt", prompt_text},
               {"has_new_line", content.find('\n') != std::string::npos},
               {"truncated", st.n_prompt + st.n_generated >= n_ctx},
               {"stop_type", result.stop_type},
               {"stopping_word", result.stopping_word},
               {"tokens_cached", st.n_prompt + st.n_generated},
               {"timings", timings(st)},
               {"speculation", openai::speculation(st)}};
        if (r.return_prompt_tokens) j["prompt_tokens"] = prompt;
        return r.response_fields.empty() ? j : openai::nested_values(r.response_fields, j);
    };

    if (!r.stream) {
        std::string text;
        while (job->next(text) != Job::Wait::Ended) {
            if (s.ending) {
                job->cancel();
                return send_error(res, shutting_down_error());
            }
            if (req.is_connection_closed()) {
                job->cancel();  // nobody reads the answer
                return;
            }
        }
        const Job::Result & result = job->result();
        if (!result.error.empty()) return send_error(res, job_error(result));
        return send_json(res, 200, final_json(text, result));
    }
    res.set_header("Cache-Control", "no-cache");
    const std::atomic<bool> & ending = s.ending;
    res.set_chunked_content_provider(
        "text/event-stream", [job, final_json, &ending](size_t, httplib::DataSink & sink) {
        auto write = [&](const json & event) {
            const std::string line = openai::sse(event);
            if (sink.write(line.data(), line.size())) return true;
            job->cancel();  // the client went away: free the slot
            return false;
        };
        int predicted = 0;
        for (;;) {
            if (ending) {
                job->cancel();
                write(shutting_down_error().body());
                sink.done();
                return true;
            }
            std::string text;
            std::vector<TokenOrigin> origins;
            const Job::Wait w = job->next(text, &origins);
            if (w == Job::Wait::Ended) break;
            if (w == Job::Wait::Idle) {
                if (!sink.is_writable()) {
                    job->cancel();
                    return false;
                }
                continue;
            }
            predicted += static_cast<int>(origins.size());
            if (!write(json{{"index", 0}, {"content", text}, {"tokens", json::array()}, {"stop", false}, {"tokens_predicted", predicted}})) return false;
        }
        const Job::Result & result = job->result();
        if (!result.error.empty()) write(job_error(result).body());
        else write(final_json("", result));
        sink.done();
        return true; }, [job](bool) { job->cancel(); });
}

}  // namespace specula::infill
