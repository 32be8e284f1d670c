#include "server/http_server.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <utility>

#include "specula/error.h"
#include "engine/generate.h"
#include "engine/model_bundle.h"
#include "server/access.h"
#include "server/choices.h"
#include "server/embeddings.h"
#include "server/gated_server.h"
#include "server/http_reply.h"
#include "server/infill.h"
#include "server/metrics_text.h"
#include "server/openai.h"
#include "server/openai_chat.h"
#include "server/openai_generation.h"
#include "server/openai_logprobs.h"
#include "server/scheduler.h"
#include "server/token_routes.h"
#include "tokenizer/tokenizer.h"

namespace specula {

using nlohmann::json;

struct HttpServer::Impl {
    Impl(int max_connections, size_t max_request_bytes, RequestDeadlines deadlines);

    GatedServer http;
    const size_t max_request_bytes;
    std::thread listener;
    std::mutex listener_mutex;  // joins the listener once
    std::atomic<bool> listener_failed{false};
    std::mutex shutdown_mutex;
    std::condition_variable shutdown_done;
    bool shutting_down = false, shut_down = false;  // under shutdown_mutex
    std::atomic<bool> ending{false};                // past the shutdown's grace: requests end now
    std::atomic<ModelBundle *> target{nullptr};
    std::atomic<Scheduler *> scheduler{nullptr};
    openai::Accepted accepted;  // the served names (the first answered by default), strict fields
    std::string index_page;     // served at "/"; empty: 404
    AccessPolicy access;
    SpecialTokens prompt_specials = SpecialTokens::Text;  // in completions prompts and chat contents
    ReasoningFormat reasoning = ReasoningFormat::Deepseek;
    std::optional<bool> thinking;  // serve --reasoning on|off; unset: the template's default
    bool embeddings = false;       // /v1/embeddings answers
    std::atomic<uint64_t> next_id{1};
    int64_t started = 0;
    std::map<std::string, std::string> methods;  // path -> the methods it has routes for, for 405
    // Request-side computations on threads of their own (within_deadline), those whose request
    // gave up waiting included; at most max_preparing at once.
    const int max_preparing;
    std::mutex preparing_mutex;
    std::condition_variable preparing_ended;
    int preparing = 0;  // under preparing_mutex
    std::once_flag infill_vocabulary_built;
    std::shared_ptr<const InfillVocabulary> infill_vocabulary;  // the "infill" sampler's, built on first use

    void routes();
    template <class T>
    T within_deadline(std::function<T()> work);
    void wait_preparations();
    void on_get(const std::string & path, httplib::Server::Handler handler);
    void on_post(const std::string & path, httplib::Server::Handler handler);
    // The OpenAI error object of an error cpp-httplib answers itself (unknown route, bad framing, ...).
    openai::ApiError http_error(const httplib::Request & req, int status, httplib::Response & res) const;
    void join_listener();
    void completion(openai::Endpoint endpoint, const httplib::Request & req, httplib::Response & res);
};

void send_json(httplib::Response & res, int status, const json & j) {
    res.status = status;
    res.set_content(openai::wire(j), "application/json");
}
void send_error(httplib::Response & res, const openai::ApiError & e) { send_json(res, e.status, e.body()); }
openai::ApiError shutting_down_error() { return openai::ApiError{503, "the server is shutting down", "unavailable_error", "", ""}; }

void note_ignored(const httplib::Request & req, httplib::Response & res, const std::vector<std::string> & fields) {
    std::string names;
    for (const std::string & f : fields) names += (names.empty() ? "" : ", ") + f;
    // A name is the client's text: control and non-ASCII bytes would break the header (or forge one).
    for (char & ch : names) {
        if (static_cast<unsigned char>(ch) < 0x20 || static_cast<unsigned char>(ch) >= 0x7f) ch = '?';
    }
    res.set_header("X-Specula-Ignored-Fields", names);
    std::fprintf(stderr, "specula: %s %s: ignored fields: %s\n", req.method.c_str(), req.path.c_str(), names.c_str());
}

namespace {
// The request's SpecEE mode and threshold: what it asked for, else the server's default (the
// lossless mode with `serve --specee-lossless`, else off) at the predictors' threshold.
EarlyExitRequest early_exit_request(const openai::Request & r, const ModelBundle & t) {
    auto bad = [](const std::string & param, const std::string & message) {
        return openai::ApiError{400, message, "invalid_request_error", param, ""};
    };
    EarlyExitRequest e;
    if (r.specee.empty()) e.mode = t.options.specee_lossless ? EarlyExitMode::Lossless : EarlyExitMode::Off;
    else e.mode = r.specee == "lossy" ? EarlyExitMode::Lossy : r.specee == "lossless" ? EarlyExitMode::Lossless
                                                                                      : EarlyExitMode::Off;
    if (!t.exit_predictor) {
        if (e.mode != EarlyExitMode::Off) throw bad("specee", "'specee': this server has no exit predictors (serve --specee FILE)");
        if (r.specee_threshold >= 0.0f) throw bad("specee_threshold", "'specee_threshold': this server has no exit predictors (serve --specee FILE)");
        return e;
    }
    if (e.mode == EarlyExitMode::Lossy && !r.sampling.greedy()) {
        throw bad("specee", "'specee': \"lossy\" decodes greedily: set 'temperature' to 0 (\"lossless\" samples)");
    }
    e.threshold = r.specee_threshold >= 0.0f ? r.specee_threshold : t.exit_threshold;
    return e;
}

// The server's chat defaults: where reasoning goes, and (serve --reasoning on|off) whether the
// template thinks, as llama-server's --reasoning sets its enable_thinking variable, unless the
// request's chat_template_kwargs set it.
void chat_defaults(openai::Request & r, ReasoningFormat reasoning, std::optional<bool> thinking) {
    r.chat.reasoning = reasoning;
    if (!thinking || r.chat.template_kwargs.count("enable_thinking")) return;
    r.chat.enable_thinking = *thinking;
    r.chat.template_kwargs["enable_thinking"] = *thinking ? "true" : "false";
}

int64_t unix_now() {
    return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// A response's or chunk's logprobs: its choice's, or llama-server's completion_probabilities.
void set_logprobs(const openai::Completion & c, json & j, json logprobs) {
    if (c.endpoint == openai::Endpoint::Llama) j["completion_probabilities"] = std::move(logprobs["content"]);
    else j["choices"][0]["logprobs"] = std::move(logprobs);
}

// A non-streamed answer: one JSON object, sent whole once the generation has ended, with its true
// status. While it waits the handler watches the connection, so that a client that went away
// (closed or reset; not one that only shut its sending side) frees its slot at once rather than
// hold it for the whole generation.
// `reply`: parses the reply for tool calls or reasoning (openai::parses_reply), or nullptr.
void respond_whole(httplib::Response & res, const std::shared_ptr<Job> & job, const openai::Completion & c,
                   const std::shared_ptr<openai::ReplyStream> & reply, const std::atomic<bool> & ending) {
    std::string text;
    std::vector<TokenLogprob> logprobs;
    openai::ChoiceEnd end;
    while (job->next(text, nullptr, c.token_text ? &logprobs : nullptr, std::chrono::milliseconds(200), &end.tokens) != Job::Wait::Ended) {
        if (ending) {
            job->cancel();
            return send_error(res, shutting_down_error());
        }
        if (GatedServer::client_gone()) {
            job->cancel();  // nobody reads the answer
            return;
        }
    }
    const Job::Result & result = job->result();
    if (!result.error.empty()) return send_error(res, job_error(result));
    end.stop_type = result.stop_type, end.stopping_word = result.stopping_word;
    json response = openai::response(c, text, result.finish_reason, result.stats, 0, end);
    if (c.token_text) set_logprobs(c, response, choice_logprobs(c, *job, logprobs));
    if (reply) {
        const ChatReply parsed = reply->finish(text);
        openai::set_reply(response, parsed);
        response["choices"][0]["finish_reason"] = openai::finish_reason(parsed, result.finish_reason);
    }
    send_json(res, 200, response);
}

// Whether a piece of text's tokens can be sent an event each: as many as its ids (and logprobs),
// each token's text whole (none cut by the stop strings' holding back, no character split).
bool per_token(const openai::Completion & c, const std::vector<TokenOrigin> & origins, const std::vector<int32_t> & ids,
               const std::vector<TokenLogprob> & logprobs) {
    return ids.size() > 1 && origins.size() == ids.size() && (!c.token_text || logprobs.size() == ids.size());
}

// A streamed answer: server-sent events, a chunk per piece of text.
// A parsed reply (`reply` set) streams the reasoning, content and calls' deltas the partial
// parses add, without the tokens extension (its tokens' texts would not make up the delta).
void respond_stream(httplib::Response & res, const std::shared_ptr<Job> & job, const openai::Completion & c, bool include_usage,
                    const std::shared_ptr<openai::ReplyStream> & reply, const std::atomic<bool> & ending) {
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream", [job, c, include_usage, reply, &ending](size_t, httplib::DataSink & sink) {
        auto write = [&](const std::string & event) {
            if (sink.write(event.data(), event.size())) return true;
            job->cancel();  // the client went away: free the slot
            return false;
        };
        // llama-server's /completion streams its tokens' events alone, without an opening one.
        if (c.endpoint != openai::Endpoint::Llama && !write(openai::sse(openai::chunk_start(c)))) return false;
        // The logprobs of the tokens released since the last chunk written go on the next one.
        std::vector<TokenLogprob> logprobs;
        size_t text_offset = 0;
        // The ids of the tokens released since the last chunk written (llama-server's /completion
        // sends them), and all of them (its last event's with return_tokens).
        std::vector<int32_t> ids;
        openai::ChoiceEnd end;
        auto with_logprobs = [&](json chunk) {
            if (c.token_text && !logprobs.empty()) set_logprobs(c, chunk, openai::logprobs(c, logprobs, text_offset));
            logprobs.clear();
            if (c.endpoint == openai::Endpoint::Llama && chunk.value("stop", true) == false) chunk["tokens"] = ids;
            if (c.timings_per_token && !chunk.contains("timings")) chunk["timings"] = openai::timings(job->progress());
            end.tokens.insert(end.tokens.end(), ids.begin(), ids.end());
            ids.clear();
            return chunk;
        };
        for (;;) {
            if (ending) {
                job->cancel();
                write(openai::sse(shutting_down_error().body()));
                write("data: [DONE]\n\n");
                sink.done();
                return true;
            }
            std::string text;
            std::vector<TokenOrigin> origins;
            std::vector<Job::PromptProgress> progress;
            const Job::Wait w = job->next(text, &origins, c.token_text ? &logprobs : nullptr, std::chrono::milliseconds(200), &ids,
                                          c.return_progress ? &progress : nullptr);
            for (const Job::PromptProgress & p : progress) {
                if (!write(openai::sse(openai::chunk_progress(c, p.total, p.cache, p.processed, p.time_ms)))) return false;
            }
            if (!progress.empty() && text.empty() && origins.empty() && ids.empty()) continue;  // nothing else came
            if (w == Job::Wait::Text && reply) {
                for (json & delta : reply->add(text)) {
                    if (!write(openai::sse(with_logprobs(openai::chunk_delta(c, std::move(delta)))))) return false;
                }
            } else if (w == Job::Wait::Text && c.endpoint == openai::Endpoint::Llama && per_token(c, origins, ids, logprobs)) {
                // llama-server's /completion sends an event per token: a round's tokens one by one.
                const std::vector<int32_t> round_ids = std::exchange(ids, {});
                const std::vector<TokenLogprob> round_logprobs = std::exchange(logprobs, {});
                for (size_t k = 0; k < round_ids.size(); ++k) {
                    const TokenOrigin & o = origins[k];
                    ids = {round_ids[k]};
                    if (c.token_text) logprobs = {round_logprobs[k]};
                    const json tokens = json::array({{{"text", o.text}, {"kind", o.kind}, {"depth", o.depth}}});
                    if (!write(openai::sse(with_logprobs(openai::chunk_text(c, o.text, tokens))))) return false;
                }
            } else if (w == Job::Wait::Text) {
                json tokens = json::array();
                for (const TokenOrigin & o : origins) tokens.push_back({{"text", o.text}, {"kind", o.kind}, {"depth", o.depth}});
                if (!write(openai::sse(with_logprobs(openai::chunk_text(c, text, tokens))))) return false;
            } else if (w == Job::Wait::Idle) {
                if (!sink.is_writable() || !write(": waiting\n\n")) {
                    job->cancel();
                    return false;
                }
            } else {
                break;
            }
        }
        const Job::Result & result = job->result();
        if (!result.error.empty()) {
            write(openai::sse(job_error(result).body()));
        } else {
            std::string finish_reason = result.finish_reason;
            if (reply) {
                std::vector<json> deltas;
                const ChatReply parsed = reply->finish("", &deltas);
                for (json & delta : deltas) {
                    if (!write(openai::sse(openai::chunk_delta(c, std::move(delta))))) return false;
                }
                finish_reason = openai::finish_reason(parsed, result.finish_reason);
            }
            // llama-server's /completion ends with its whole answer's fields, without the text sent.
            end.stop_type = result.stop_type, end.stopping_word = result.stopping_word;
            json last = c.endpoint == openai::Endpoint::Llama ? openai::response(c, "", finish_reason, result.stats, 0, openai::ChoiceEnd{end.stop_type, end.stopping_word, {}})
                                                              : openai::chunk_finish(c, finish_reason);
            last = with_logprobs(std::move(last));
            if (c.endpoint != openai::Endpoint::Llama && c.verbose) last["__verbose"] = openai::llama_object(c, "", finish_reason, result.stats, end, true);
            // llama-server's timings of the whole generation on the stream's last event.
            json usage = include_usage ? openai::chunk_usage(c, result.stats) : json();
            (include_usage ? usage : last)["timings"] = openai::timings(result.stats);
            if (!write(openai::sse(last))) return false;
            if (include_usage && !write(openai::sse(usage))) return false;
        }
        write("data: [DONE]\n\n");
        sink.done();
        return true; }, [job](bool) { job->cancel(); });
}

}  // namespace

HttpServer::Impl::Impl(int max_connections, size_t max_body_bytes, RequestDeadlines deadlines)
    : http(max_connections, deadlines, [](int status, const std::string & message) {
          const char * type = status == 503 ? "unavailable_error" : "invalid_request_error";
          return openai::wire(openai::ApiError{status, message, type, "", ""}.body());
      }),
      max_request_bytes(max_body_bytes),
      max_preparing(max_connections) {}

// Parsing a body, rendering a chat template and tokenizing a prompt cannot be interrupted (a
// 4 MiB prompt takes seconds to tokenize), so they run on a thread of their own while the handler
// waits for them until the request deadline (--request-timeout): a request that outlasts it gets
// 408 and frees its handler thread and connection, and its computation ends unheard. Those still
// running count against max_preparing (503 past it), so abandoned ones cannot pile up.
template <class T>
T HttpServer::Impl::within_deadline(std::function<T()> work) {
    struct Outcome {
        std::mutex mutex;
        std::condition_variable ended;
        std::optional<T> value;
        std::exception_ptr error;
        bool done = false;
    };
    {
        std::lock_guard lock(preparing_mutex);
        if (preparing >= max_preparing) {
            throw openai::ApiError{503, "the server is busy: " + std::to_string(preparing) + " requests are being prepared (parsed, tokenized)",
                                   "unavailable_error", "", ""};
        }
        ++preparing;
    }
    auto outcome = std::make_shared<Outcome>();
    std::thread([this, outcome, work = std::move(work)] {
        std::optional<T> value;
        std::exception_ptr error;
        try {
            value = work();
        } catch (...) {
            error = std::current_exception();
        }
        {
            std::lock_guard lock(outcome->mutex);
            // Moved, not copied: the handler then holds the only reference to the exception, so
            // that its last release is on the thread that reads it (ThreadSanitizer cannot see the
            // uninstrumented libstdc++'s atomic reference count order a release on this thread).
            outcome->value = std::move(value);
            outcome->error = std::move(error);
            outcome->done = true;
            outcome->ended.notify_all();
        }
        std::lock_guard lock(preparing_mutex);
        --preparing;
        preparing_ended.notify_all();
    }).detach();
    const GatedServer::Clock::time_point deadline = GatedServer::request_deadline();
    std::unique_lock lock(outcome->mutex);
    const auto done = [&] { return outcome->done; };
    if (deadline == GatedServer::Clock::time_point::max()) outcome->ended.wait(lock, done);
    else if (!outcome->ended.wait_until(lock, deadline, done)) {
        throw openai::ApiError{408,
                               "the request could not be prepared (its body parsed, its chat template rendered, its prompt tokenized) within " +
                                   http.deadline_text() + " of its arrival (--request-timeout): send a shorter prompt",
                               "invalid_request_error", "", "request_timeout"};
    }
    if (outcome->error) std::rethrow_exception(std::exchange(outcome->error, nullptr));
    return std::move(*outcome->value);
}

void HttpServer::Impl::wait_preparations() {
    std::unique_lock lock(preparing_mutex);
    preparing_ended.wait(lock, [this] { return preparing == 0; });
}

HttpServer::HttpServer(int max_connections, size_t max_request_bytes, RequestDeadlines deadlines)
    : impl_(std::make_unique<Impl>(max_connections, max_request_bytes, deadlines)) {
    impl_->started = unix_now();
    impl_->http.set_payload_max_length(max_request_bytes);
    // The errors cpp-httplib answers itself come with no body: give them OpenAI's error object.
    impl_->http.set_error_handler(httplib::Server::HandlerWithResponse([this](const httplib::Request & req, httplib::Response & res) {
        if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
        send_error(res, impl_->http_error(req, res.status, res));
        return httplib::Server::HandlerResponse::Handled;
    }));
    impl_->routes();
}

HttpServer::~HttpServer() { stop(); }

int HttpServer::start(const std::string & host, int port) {
    const int bound = port == 0 ? impl_->http.bind_to_any_port(host) : (impl_->http.bind_to_port(host, port) ? port : -1);
    if (bound < 0) throw Error("cannot listen on " + host + ":" + std::to_string(port));
    impl_->listener = std::thread([this] {
        if (impl_->http.serve()) return;
        std::lock_guard lock(impl_->shutdown_mutex);
        impl_->listener_failed = !impl_->shutting_down;  // a shutdown() racing the start is no failure
    });
    return bound;
}

void HttpServer::ready(ModelBundle & target, Scheduler & scheduler, std::vector<std::string> model_ids) {
    if (model_ids.empty()) throw Error("the server needs a model name");
    impl_->accepted.models = std::move(model_ids);
    impl_->target = &target;
    impl_->scheduler = &scheduler;
}

void HttpServer::set_strict_fields(bool strict) { impl_->accepted.strict_fields = strict; }

void HttpServer::set_index_page(std::string html) { impl_->index_page = std::move(html); }

void HttpServer::set_access_policy(const AccessPolicy & policy) { impl_->access = policy; }

void HttpServer::set_special_tokens_in_prompt(bool parse) { impl_->prompt_specials = parse ? SpecialTokens::Parse : SpecialTokens::Text; }

void HttpServer::set_reasoning_format(ReasoningFormat format) { impl_->reasoning = format; }

void HttpServer::set_thinking(std::optional<bool> thinking) { impl_->thinking = thinking; }

void HttpServer::set_embeddings(bool on) { impl_->embeddings = on; }

void HttpServer::set_any_model(bool any) { impl_->accepted.any_model = any; }

void HttpServer::set_request_defaults(const openai::RequestDefaults & defaults) {
    const bool verbose = impl_->accepted.defaults.verbose;  // set_verbose's
    impl_->accepted.defaults = defaults;
    impl_->accepted.defaults.verbose = verbose;
}

void HttpServer::set_verbose(bool on) {
    impl_->accepted.defaults.verbose = on;
    if (!on) {
        impl_->http.set_logger(nullptr);
        return;
    }
    impl_->http.set_logger([](const httplib::Request & req, const httplib::Response & res) {
        static const std::set<std::string, std::less<>> polled = {"/health", "/v1/health", "/metrics", "/metrics.json", "/models", "/v1/models", "/props", "/slots", "/"};
        if (polled.count(req.path)) return;
        const bool stream = res.body.empty() && res.get_header_value("Content-Type").rfind("text/event-stream", 0) == 0;
        // One write, so that the lines of requests served at once do not interleave.
        const std::string entry = "specula: " + req.method + " " + req.path + " " + std::to_string(res.status) + "\nrequest:  " + req.body +
                                  "\nresponse: " + (stream ? std::string("(a stream of server-sent events)") : res.body) + "\n";
        std::fwrite(entry.data(), 1, entry.size(), stderr);
    });
}

void HttpServer::shutdown(std::chrono::milliseconds grace) {
    {
        std::unique_lock lock(impl_->shutdown_mutex);
        if (impl_->shutting_down) {
            impl_->shutdown_done.wait(lock, [this] { return impl_->shut_down; });
            return;
        }
        impl_->shutting_down = true;
    }
    impl_->http.stop_accepting();
    if (!impl_->http.wait_idle(std::chrono::steady_clock::now() + grace)) {
        impl_->ending = true;
        impl_->http.cut_reads();
    }
    impl_->http.join_workers();  // the requests still in flight end within a step (`ending`)
    impl_->wait_preparations();  // they use the tokenizer, which the caller releases next
    impl_->join_listener();
    {
        std::lock_guard lock(impl_->shutdown_mutex);
        impl_->shut_down = true;
    }
    impl_->shutdown_done.notify_all();
}

void HttpServer::stop() {
    shutdown(std::chrono::milliseconds(0));
    impl_->scheduler = nullptr;
}

std::vector<std::string> HttpServer::in_flight() { return impl_->http.in_flight(); }

bool HttpServer::wait() {
    impl_->join_listener();
    std::unique_lock lock(impl_->shutdown_mutex);
    impl_->shutdown_done.wait(lock, [this] { return !impl_->shutting_down || impl_->shut_down; });
    return !impl_->listener_failed;
}

void HttpServer::Impl::join_listener() {
    std::lock_guard lock(listener_mutex);
    if (listener.joinable()) listener.join();
}

void HttpServer::Impl::on_get(const std::string & path, httplib::Server::Handler handler) {
    methods[path] += methods[path].empty() ? "GET" : ", GET";
    http.Get(path, std::move(handler));
}

void HttpServer::Impl::on_post(const std::string & path, httplib::Server::Handler handler) {
    methods[path] += methods[path].empty() ? "POST" : ", POST";
    http.Post(path, std::move(handler));
}

openai::ApiError HttpServer::Impl::http_error(const httplib::Request & req, int status, httplib::Response & res) const {
    auto invalid = [&](int code, const std::string & message) { return openai::ApiError{code, message, "invalid_request_error", "", ""}; };
    if (status == 404) {
        const auto route = methods.find(req.path);
        if (route == methods.end()) return openai::ApiError{404, "no route " + req.method + " " + req.path + ": see /v1/models", "not_found_error", "", ""};
        res.set_header("Allow", route->second);
        return invalid(405, req.path + " answers " + route->second + ", not " + req.method);
    }
    if (ending && status == 400) return shutting_down_error();  // its read was cut short (GatedServer::cut_reads)
    if (GatedServer::request_timed_out()) return invalid(408, "the request did not arrive whole within " + http.deadline_text());
    if (status == 413) {
        return openai::ApiError{413, "the request body is larger than the server's limit of " + std::to_string(max_request_bytes) + " bytes",
                                "invalid_request_error", "", "request_too_large"};
    }
    if (status == 400) return invalid(400, "malformed HTTP request (request line, headers or body framing)");
    const std::string name = httplib::status_message(status);
    return openai::ApiError{status, name.empty() ? "HTTP error " + std::to_string(status) : name, status >= 500 ? "server_error" : "invalid_request_error",
                            "", ""};
}

void HttpServer::Impl::routes() {
    // Keys, origins, Host names and media types, before a route is chosen or a body read.
    http.set_pre_routing_handler([this](const httplib::Request & req, httplib::Response & res) {
        const AccessDecision d = check_access(access, req.method, req.path, [&req](const char * name) { return req.get_header_value(name); });
        for (const auto & [name, value] : d.headers) res.set_header(name, value);
        if (d.refusal) send_error(res, *d.refusal);
        else if (d.preflight) res.status = 200;  // llama-server's; a preflight succeeds on any 2xx
        return d.refusal || d.preflight ? httplib::Server::HandlerResponse::Handled : httplib::Server::HandlerResponse::Unhandled;
    });
    auto health = [this](const httplib::Request &, httplib::Response & res) {
        Scheduler * s = scheduler;
        if (!s) return send_json(res, 503, json{{"status", "loading"}});
        const std::string failure = s->metrics().failure;
        if (!failure.empty()) return send_json(res, 503, json{{"status", "error"}, {"error", failure}});
        send_json(res, 200, json{{"status", "ok"}});
    };
    on_get("/health", health);
    on_get("/v1/health", health);  // llama-server's second name
    // An entry per name (as clients look for theirs among the ids), each with llama-server's
    // `aliases`: all the names.
    auto models = [this](const httplib::Request &, httplib::Response & res) {
        if (!scheduler) return send_error(res, openai::ApiError{503, "the model is loading", "unavailable_error", "", ""});
        json data = json::array();
        for (const std::string & id : accepted.models) {
            data.push_back({{"id", id}, {"object", "model"}, {"created", started}, {"owned_by", "specula"}, {"aliases", accepted.models}});
        }
        send_json(res, 200, json{{"object", "list"}, {"data", std::move(data)}});
    };
    on_get("/v1/models", models);
    on_get("/models", models);  // llama-server's second name
    on_get("/slots", [this](const httplib::Request & req, httplib::Response & res) {
        Scheduler * s = scheduler;
        if (!s) return send_error(res, openai::ApiError{503, "the model is loading", "unavailable_error", "", ""});
        const std::string tenant = tenant_of(access, [&req](const char * name) { return req.get_header_value(name); });
        json slots = json::array();
        for (const auto & slot : s->metrics().slot_states) {
            json j = {{"id", slot.id}, {"state", slot.busy ? "processing" : "idle"}, {"is_processing", slot.busy}, {"n_ctx", s->context_size()}};
            // Another tenant's request: its lengths are none of this key's business.
            if (slot.tenant.empty() || slot.tenant == tenant) {
                j["n_prompt"] = slot.n_prompt, j["n_generated"] = slot.n_generated, j["n_cached"] = slot.n_cached;
            }
            slots.push_back(std::move(j));
        }
        send_json(res, 200, slots);
    });
    on_get("/", [this](const httplib::Request &, httplib::Response & res) {
        if (index_page.empty()) return send_error(res, openai::ApiError{404, "no page here: see /v1/models", "not_found_error", "", ""});
        res.set_content(index_page, "text/html; charset=utf-8");
    });
    on_get("/metrics.json", [this](const httplib::Request &, httplib::Response & res) {
        Scheduler * s = scheduler;
        if (!s) return send_error(res, openai::ApiError{503, "the model is loading", "unavailable_error", "", ""});
        send_json(res, 200, metrics_json(s->metrics()));
    });
    on_get("/metrics", [this](const httplib::Request &, httplib::Response & res) {
        Scheduler * s = scheduler;
        if (!s) return send_error(res, openai::ApiError{503, "the model is loading", "unavailable_error", "", ""});
        res.set_header("Process-Start-Time-Unix", std::to_string(started));  // llama-server's
        res.set_content(prometheus(s->metrics()), "text/plain; version=0.0.4");
    });
    for (const char * path : {"/v1/chat/completions", "/chat/completions"}) {  // llama-server answers both
        on_post(path, [this](const httplib::Request & req, httplib::Response & res) { completion(openai::Endpoint::Chat, req, res); });
    }
    on_post("/v1/completions", [this](const httplib::Request & req, httplib::Response & res) { completion(openai::Endpoint::Completions, req, res); });
    // llama-server's own routes: /completion (and its second name) answering in its shape, /props,
    // /apply-template.
    for (const char * path : {"/completion", "/completions"}) {
        on_post(path, [this](const httplib::Request & req, httplib::Response & res) { completion(openai::Endpoint::Llama, req, res); });
    }
    on_get("/props", [this](const httplib::Request &, httplib::Response & res) {
        Scheduler * s = scheduler;
        ModelBundle * t = target;
        if (!s || !t) return send_error(res, openai::ApiError{503, "the model is loading", "unavailable_error", "", ""});
        const int slots = static_cast<int>(s->metrics().slot_states.size());
        // What a request to the OpenAI routes that omits them gets (-1: a random seed, until the context is full).
        bool seeded = false;
        const SamplingParams d = openai::openai_sampling(accepted.defaults, seeded);
        const json params{{"n_predict", accepted.defaults.max_tokens.value_or(-1)},
                          {"temperature", d.temperature},
                          {"top_k", d.top_k},
                          {"top_p", d.top_p},
                          {"min_p", d.min_p},
                          {"repeat_penalty", d.repeat_penalty},
                          {"repeat_last_n", d.penalty_last_n},
                          {"presence_penalty", d.presence_penalty},
                          {"frequency_penalty", d.frequency_penalty},
                          {"seed", seeded ? json(d.seed) : json(-1)}};
        json settings{{"id", 0}, {"n_ctx", s->context_size()}, {"speculative", t->speculative}, {"is_processing", false}, {"params", params}};
        send_json(res, 200,
                  json{{"default_generation_settings", std::move(settings)},
                       {"n_ctx", s->context_size()},
                       {"total_slots", slots},
                       {"model_alias", accepted.models.front()},
                       {"model_path", t->options.model_path},
                       {"modalities", {{"vision", false}, {"audio", false}}},
                       {"chat_template", t->tokenizer->chat_template().source()},
                       {"build_info", "specula"}});
    });
    on_post("/apply-template", [this](const httplib::Request & req, httplib::Response & res) {
        ModelBundle * t = target;
        if (!t || !scheduler) return send_error(res, openai::ApiError{503, "the model is loading", "unavailable_error", "", ""});
        try {
            openai::Request r = openai::parse_request(openai::Endpoint::Chat, req.body, accepted);
            chat_defaults(r, reasoning, thinking);
            std::string prompt;
            try {
                prompt = t->tokenizer->chat_template().render(r.chat).text;
            } catch (const std::exception & e) {
                throw openai::ApiError{400, std::string("cannot render the messages: ") + e.what(), "invalid_request_error", "messages", ""};
            }
            if (!r.ignored_fields.empty()) note_ignored(req, res, r.ignored_fields);
            send_json(res, 200, json{{"prompt", prompt}});
        } catch (const openai::ApiError & e) {
            send_error(res, e);
        }
    });
    // llama-server's count of a chat request's prompt tokens: the body a chat completion takes,
    // rendered and tokenized as that request's prompt would be, nothing generated.
    for (const char * path : {"/v1/chat/completions/input_tokens", "/chat/completions/input_tokens"}) {
        on_post(path, [this](const httplib::Request & req, httplib::Response & res) {
            ModelBundle * t = target;
            if (!t || !scheduler) return send_error(res, openai::ApiError{503, "the model is loading", "unavailable_error", "", ""});
            try {
                auto [count, ignored] = within_deadline<std::pair<size_t, std::vector<std::string>>>(
                    [this, t, body = req.body, reasoning = reasoning, thinking = thinking, specials = prompt_specials] {
                        openai::Request r = openai::parse_request(openai::Endpoint::Chat, body, accepted);
                        chat_defaults(r, reasoning, thinking);
                        try {
                            return std::pair{t->tokenizer->tokenize_conversation(r.chat, specials).tokens.size(), r.ignored_fields};
                        } catch (const std::exception & e) {
                            throw openai::ApiError{400, std::string("cannot tokenize the prompt: ") + e.what(), "invalid_request_error", "messages", ""};
                        }
                    });
                if (!ignored.empty()) note_ignored(req, res, ignored);
                send_json(res, 200, json{{"input_tokens", count}});
            } catch (const openai::ApiError & e) {
                send_error(res, e);
            }
        });
    }
    // llama-server's token routes (server/token_routes.h), under the same access checks.
    for (const auto & route : {std::pair{"/tokenize", &openai::tokenize}, std::pair{"/detokenize", &openai::detokenize}}) {
        on_post(route.first, [this, answer = route.second](const httplib::Request & req, httplib::Response & res) {
            ModelBundle * t = target;
            if (!t || !scheduler) return send_error(res, openai::ApiError{503, "the model is loading", "unavailable_error", "", ""});
            try {
                send_json(res, 200, within_deadline<json>([answer, t, body = req.body] { return answer(*t->tokenizer, body); }));
            } catch (const openai::ApiError & e) {
                send_error(res, e);
            }
        });
    }
    // OpenAI's embeddings, and llama-server's second name (server/embeddings.h).
    auto embed = [this](const httplib::Request & req, httplib::Response & res) {
        Scheduler * s = scheduler;
        ModelBundle * t = target;
        if (!s || !t) return send_error(res, openai::ApiError{503, "the model is loading", "unavailable_error", "", ""});
        if (!embeddings) {
            return send_error(res, openai::ApiError{501, "this server computes no embeddings: start it with --embeddings", "not_supported_error", "", ""});
        }
        embeddings::Request r;
        try {
            r = within_deadline<embeddings::Request>([this, s, t, body = req.body, specials = prompt_specials] {
                return embeddings::parse(body, accepted, *t->tokenizer, specials, s->context_size());
            });
        } catch (const openai::ApiError & e) {
            return send_error(res, e);
        }
        if (!r.ignored_fields.empty()) note_ignored(req, res, r.ignored_fields);
        std::future<std::vector<std::vector<float>>> answer = s->embed(r.inputs);
        while (answer.wait_for(std::chrono::milliseconds(200)) != std::future_status::ready) {
            if (ending) return send_error(res, shutting_down_error());
            if (GatedServer::client_gone()) return;  // the worker finishes it; nobody reads it
        }
        try {
            send_json(res, 200, embeddings::response(r, answer.get()));
        } catch (const std::exception & e) {
            send_error(res, openai::ApiError{500, e.what(), "server_error", "", ""});
        }
    };
    on_post("/v1/embeddings", embed);
    on_post("/embeddings", embed);
    // llama-server's fill-in-the-middle route for editor plugins (server/infill.h).
    on_post("/infill", [this](const httplib::Request & req, httplib::Response & res) {
        Scheduler * s = scheduler;
        ModelBundle * t = target;
        if (!s || !t) return send_error(res, openai::ApiError{503, "the model is loading", "unavailable_error", "", ""});
        const Tenancy tenancy{tenant_of(access, [&req](const char * name) { return req.get_header_value(name); }), ""};
        auto vocabulary = [this, t] {
            std::call_once(infill_vocabulary_built, [&] { infill_vocabulary = infill::make_vocabulary(*t->tokenizer); });
            return infill_vocabulary;
        };
        const infill::Server server{*s, *t, accepted, prompt_specials, tenancy, ending, vocabulary};
        infill::Prepared p;
        try {
            p = within_deadline<infill::Prepared>([server, body = req.body] { return infill::prepare(body, server); });
        } catch (const openai::ApiError & e) {
            return send_error(res, e);
        }
        infill::answer(req, res, server, std::move(p));
    });
    http.set_exception_handler([](const httplib::Request &, httplib::Response & res, std::exception_ptr ep) {
        std::string what = "internal error";
        try {
            std::rethrow_exception(ep);
        } catch (const std::exception & e) {
            what = e.what();
        } catch (...) {
        }
        send_error(res, openai::ApiError{500, what, "server_error", "", ""});
    });
}

void HttpServer::Impl::completion(openai::Endpoint endpoint, const httplib::Request & req, httplib::Response & res) {
    Scheduler * s = scheduler;
    ModelBundle * t = target;
    if (!s || !t) return send_error(res, openai::ApiError{503, "the model is loading", "unavailable_error", "", ""});
    struct Prepared {
        openai::Request r;
        std::vector<std::vector<int32_t>> prompts;  // chat: one
        ChatPrompt chat;
        int n_predict = 0;
        EarlyExitRequest early_exit;
        std::shared_ptr<const LogitsState> grammar;
    };
    Prepared p;
    try {
        p = within_deadline<Prepared>([this, endpoint, s, t, body = req.body, reasoning = reasoning, thinking = thinking, specials = prompt_specials] {
            Prepared p;
            openai::Request & r = p.r;
            r = openai::parse_request(endpoint, body, accepted);
            try {
                if (endpoint == openai::Endpoint::Chat) {
                    chat_defaults(r, reasoning, thinking);
                    Tokenizer::Chat rendered = t->tokenizer->tokenize_conversation(r.chat, specials);
                    p.prompts.push_back(std::move(rendered.tokens));
                    p.chat = std::move(rendered.prompt);
                } else {
                    for (const openai::Prompt & prompt : r.prompts) {
                        p.prompts.push_back(openai::prompt_tokens(prompt, *t->tokenizer, specials));
                    }
                }
            } catch (const std::exception & e) {
                throw openai::ApiError{400, std::string("cannot tokenize the prompt: ") + e.what(), "invalid_request_error",
                                       endpoint == openai::Endpoint::Chat ? "messages" : "prompt", ""};
            }
            for (size_t k = 0; k < p.prompts.size(); ++k) {
                const std::string which = p.prompts.size() > 1 ? " 'prompt[" + std::to_string(k) + "]'" : "";
                if (p.prompts[k].empty()) throw openai::ApiError{400, "the prompt" + which + " is empty", "invalid_request_error", "prompt", ""};
                p.n_predict = openai::tokens_to_generate(r, p.prompts[k].size(), s->context_size());
            }
            p.early_exit = early_exit_request(r, *t);
            p.grammar = openai::check_generation(r, *t->tokenizer);  // compiled once, here, not under the scheduler's lock
            if (r.ignore_eos && (!r.stop_token_ids.empty() || r.min_tokens > 0)) {
                const char * field = r.stop_token_ids.empty() ? "min_tokens" : "stop_token_ids";
                throw openai::ApiError{400, std::string("'") + field + "' cannot be combined with 'ignore_eos', which no token ends", "invalid_request_error", field, ""};
            }
            if (!r.grammar.empty() && openai::parses_tool_calls(r.chat) && !p.chat.grammar.empty()) {
                throw openai::ApiError{400, "'" + r.grammar_field + "' cannot be combined with tool calls ('tools', 'tool_choice'), which have a grammar of their own",
                                       "invalid_request_error", r.grammar_field, ""};
            }
            if (r.n > 1 && endpoint == openai::Endpoint::Llama) throw openai::ApiError{400, "'n' above 1 is not supported by /completion: use /v1/completions", "invalid_request_error", "n", ""};
            if (r.n > 1 && openai::parses_tool_calls(r.chat)) throw openai::ApiError{400, "'n' above 1 cannot be combined with 'tools'", "invalid_request_error", "n", ""};
            const size_t choices = static_cast<size_t>(r.n) * p.prompts.size();
            if (choices > static_cast<size_t>(s->capacity())) {
                const std::string asked = p.prompts.size() > 1 ? std::to_string(p.prompts.size()) + " prompts x 'n' " + std::to_string(r.n) : "'n' is " + std::to_string(r.n);
                throw openai::ApiError{400, asked + ": more choices than this server's slots and queue hold (" + std::to_string(s->capacity()) + ", --parallel + --queue)",
                                       "invalid_request_error", p.prompts.size() > 1 ? "prompt" : "n", ""};
            }
            return p;
        });
    } catch (const openai::ApiError & e) {
        return send_error(res, e);
    }
    openai::Request & r = p.r;
    if (!r.ignored_fields.empty()) note_ignored(req, res, r.ignored_fields);
    ChatPrompt & chat = p.chat;
    GenerationOptions gen;
    gen.n_predict = p.n_predict;
    const EarlyExitRequest early_exit = p.early_exit;
    gen.sampling = r.sampling;
    if (!r.seeded) gen.sampling.seed = std::random_device{}() ^ (next_id.load() << 32);
    gen.stop_at_end_of_generation = !r.ignore_eos;
    gen.special_token_text = r.special_token_text;
    gen.stop_tokens = r.stop_token_ids;
    gen.min_tokens = r.min_tokens;
    gen.top_logprobs = r.top_logprobs;
    gen.post_sampling_logprobs = r.post_sampling_probs;
    if (r.echo) gen.prompt_logprobs = r.top_logprobs;
    gen.grammar = r.grammar;
    gen.compiled_grammar = p.grammar;
    // The chat layer's grammar of the calls: from the reply's first token for tool_choice required
    // or a named function, lazily (from the model's first call marker on) for "auto".
    if (openai::parses_tool_calls(r.chat) && !chat.grammar.empty()) {
        gen.grammar = chat.grammar;
        gen.grammar_lazy = chat.grammar_lazy;
        gen.grammar_trigger_patterns = chat.grammar_trigger_patterns;
        gen.grammar_trigger_tokens = chat.grammar_trigger_tokens;
        try {
            gen.compiled_grammar = compile_grammar(gen, t->tokenizer.get());
        } catch (const Error & e) {
            return send_error(res, openai::ApiError{400, std::string("'tools': the tool calls' grammar: ") + e.what(), "invalid_request_error", "tools", ""});
        }
    }
    // The template format's own stop strings, beside (not counted among) the client's.
    for (const std::string & stop : chat.additional_stops) {
        if (std::find(r.stop.begin(), r.stop.end(), stop) == r.stop.end()) r.stop.push_back(stop);
    }
    Tenancy tenancy{tenant_of(access, [&req](const char * name) { return req.get_header_value(name); }), r.cache_salt};
    // A batch's prompts in order, each with its n choices: choice k answers prompt k / n.
    std::vector<std::shared_ptr<Job>> jobs;
    for (std::vector<int32_t> & prompt : p.prompts) {
        std::vector<std::shared_ptr<Job>> choices = s->submit_choices(std::move(prompt), gen, r.n, early_exit, r.stop, tenancy);
        if (choices.empty()) {
            for (const auto & job : jobs) job->cancel();
            return send_error(res, openai::ApiError{503, "the server is busy: every slot and the queue are full", "server_error", "", "queue_full"});
        }
        jobs.insert(jobs.end(), choices.begin(), choices.end());
    }
    const std::shared_ptr<Job> & job = jobs.front();

    openai::Completion c;
    c.endpoint = endpoint;
    c.id = (endpoint == openai::Endpoint::Chat ? "chatcmpl-" : "cmpl-") + std::to_string(next_id++);
    c.created = unix_now();
    c.model = r.model;
    c.n = r.n;
    if (r.echo) {
        for (size_t k = 0; k < r.prompts.size(); ++k) {
            const openai::Prompt & prompt = r.prompts[k];
            c.echo.push_back(!prompt.mixed.empty()   ? t->tokenizer->detokenize(jobs[k * static_cast<size_t>(r.n)]->prompt())
                             : prompt.tokens.empty() ? prompt.text
                                                     : t->tokenizer->detokenize(prompt.tokens));
        }
    }
    c.echo_logprobs = r.echo && r.top_logprobs >= 0;
    c.verbose = r.verbose, c.return_tokens = r.return_tokens, c.timings_per_token = r.timings_per_token, c.post_sampling = r.post_sampling_probs;
    c.return_progress = r.return_progress && r.stream;
    if (r.endpoint == openai::Endpoint::Llama) {
        c.generation_settings = json{{"n_predict", r.max_tokens},
                                     {"seed", r.sampling.seed},
                                     {"temperature", r.sampling.temperature},
                                     {"top_k", r.sampling.top_k},
                                     {"top_p", r.sampling.top_p},
                                     {"min_p", r.sampling.min_p},
                                     {"stop", r.stop},
                                     {"ignore_eos", r.ignore_eos},
                                     {"n_probs", std::max(0, r.top_logprobs)},
                                     {"min_tokens", r.min_tokens}};
        c.response_fields = r.response_fields;
    }
    for (size_t k = 0; r.verbose && k < jobs.size(); k += static_cast<size_t>(r.n)) {
        std::string & text = c.prompt_texts.emplace_back();
        for (int32_t id : jobs[k]->prompt()) text += t->tokenizer->piece(id, true);
    }
    if (r.top_logprobs >= 0) c.token_text = [tokenizer = t->tokenizer.get(), special = r.special_token_text](int32_t id) { return tokenizer->piece(id, special); };

    if (jobs.size() > 1) {
        auto parsed_as = openai::parses_reply(r.chat, chat) ? std::make_shared<const ChatPrompt>(std::move(chat)) : nullptr;
        if (r.stream) respond_choices_stream(res, jobs, c, parsed_as, r.include_usage, ending);
        else respond_choices_whole(res, jobs, c, parsed_as, ending);
        return;
    }
    auto reply = openai::parses_reply(r.chat, chat) ? std::make_shared<openai::ReplyStream>(std::move(chat)) : nullptr;
    if (r.stream) respond_stream(res, job, c, r.include_usage, reply, ending);
    else respond_whole(res, job, c, reply, ending);
}

}  // namespace specula
