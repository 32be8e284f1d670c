#pragma once
// `specula serve`'s HTTP side (cpp-httplib): OpenAI routes over a Scheduler, plus /health,
// /metrics (Prometheus text), /metrics.json (its twin for the live page), /slots and the page at /. Listens before the model is loaded, answering 503 on
// /health and the API routes until ready() is called.
#include <atomic>
#include <cstddef>
#include <memory>
#include <string>
#include <thread>

namespace specula {

class Scheduler;
struct ModelBundle;

class HttpServer {
public:
    // Request bodies longer than max_request_bytes are refused with 413 before they are read whole.
    HttpServer(int max_connections, size_t max_request_bytes);
    ~HttpServer();
    HttpServer(const HttpServer &) = delete;
    HttpServer & operator=(const HttpServer &) = delete;

    // Binds (port 0: any free port) and serves in a background thread; returns the port.
    // Throws Error when the address cannot be bound.
    int start(const std::string & host, int port);
    // From now on requests go to `scheduler`, generating with `target`'s tokenizer; both must
    // outlive the server (or stop() first).
    void ready(ModelBundle & target, Scheduler & scheduler, const std::string & model_id);
    // The HTML served at "/" (the live page, tools/report/live.html); none: "/" answers 404.
    void set_index_page(std::string html);
    void stop();
    void wait();  // until stop() (or the listener fails)

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace specula
