#pragma once
// `specula serve`'s HTTP side (cpp-httplib): OpenAI routes over a Scheduler, plus /health,
// /metrics (Prometheus text), /metrics.json (its twin for the live page), /slots and the page at /. Listens before the model is loaded, answering 503 on
// /health and the API routes until ready() is called. Connections go through GatedServer
// (server/gated_server.h): slow clients wait for their request head without holding a thread.
#include <atomic>
#include <chrono>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "tokenizer/chat_template.h"

namespace specula {

class Scheduler;
struct ModelBundle;
struct AccessPolicy;
namespace openai {
struct RequestDefaults;
}

// How long a client may take to send its request, counted from the connection's accept: past a
// deadline it gets 408 and the connection closes.
struct RequestDeadlines {
    std::chrono::milliseconds head{10000};     // the request line and headers
    std::chrono::milliseconds request{30000};  // the whole request, body included
};

class HttpServer {
public:
    // Request bodies longer than max_request_bytes are refused with 413 (whatever their framing:
    // Content-Length, chunked or none) before they are read whole; connections beyond
    // max_connections open at once get 503.
    HttpServer(int max_connections, size_t max_request_bytes, RequestDeadlines deadlines = {});
    ~HttpServer();
    HttpServer(const HttpServer &) = delete;
    HttpServer & operator=(const HttpServer &) = delete;

    // Binds (port 0: any free port) and serves in a background thread; returns the port.
    // Throws Error when the address cannot be bound.
    int start(const std::string & host, int port);
    // From now on requests go to `scheduler`, generating with `target`'s tokenizer; both must
    // outlive the server (or stop() first). `model_ids`: the names requests may give as `model`
    // (serve --alias), all listed by /v1/models; the first is the one answered when none is given.
    void ready(ModelBundle & target, Scheduler & scheduler, std::vector<std::string> model_ids);
    // Whether a request field the server does not read is refused with 400 (serve --strict-fields)
    // rather than ignored, named in the log and in the X-Specula-Ignored-Fields header.
    void set_strict_fields(bool strict);
    // The HTML served at "/" (the live page, tools/report/live.html); none: "/" answers 404.
    void set_index_page(std::string html);
    // Who may use the server: API keys, CORS origins, Host names (server/access.h); before start().
    // Without one: no key, no CORS, Host names other than loopback names and IP addresses, foreign
    // origins and non-JSON POSTs refused.
    void set_access_policy(const AccessPolicy & policy);
    // Whether text spelling a special token in a completions prompt or a chat message's content
    // becomes that token (serve --special-tokens-in-prompt); by default it is text, and only the
    // chat template's markup is control tokens.
    void set_special_tokens_in_prompt(bool parse);
    // Where a thinking chat template's reasoning goes in chat replies (serve --reasoning-format):
    // left in the content (None) or parsed into reasoning_content (the default).
    void set_reasoning_format(ReasoningFormat format);
    // Whether a thinking chat template thinks (serve --reasoning on|off, llama-server's): its
    // enable_thinking variable (and the chat layer's) for a request whose chat_template_kwargs do
    // not set it; unset: the template's own default.
    void set_thinking(std::optional<bool> thinking);
    // Whether /v1/embeddings answers (serve --embeddings; the scheduler's SchedulerOptions::embeddings
    // must agree), else 501 naming the flag.
    void set_embeddings(bool on);
    // Whether a request naming a model the server does not serve is answered (serve --any-model,
    // llama-server's way; the response echoes the name) rather than refused with 404.
    void set_any_model(bool any);
    // What a request that omits a sampling field or its length gets (serve --temp, --seed,
    // --n-predict, ...; the route's own default where unset).
    void set_request_defaults(const openai::RequestDefaults & defaults);
    // serve --verbose (llama-server's): every request's method, path, status and body, and the
    // response's body (a stream's: named as one), on stderr, but for the routes polled (/health,
    // /metrics, /metrics.json, /models, /props, /slots); and requests get llama-server's __verbose
    // unless they say otherwise (openai::RequestDefaults::verbose). Before start().
    void set_verbose(bool on);
    // Stops accepting, lets the requests in flight finish for up to `grace`, then ends the rest (a
    // stream with an OpenAI error event and [DONE], other requests with 503). From any thread;
    // returns once every connection has closed.
    void shutdown(std::chrono::milliseconds grace);
    void stop();  // shutdown() with no grace
    // The requests being served, each named by its method, path and how long it has been served:
    // what a shutdown that cannot end reports.
    std::vector<std::string> in_flight();
    // Until the listener stops, and a shutdown() under way has ended. False when the listener
    // failed on its own (accept() failed other than for a lack of descriptors or memory).
    bool wait();

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace specula
