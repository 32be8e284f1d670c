#pragma once
// What the serve benchmark's workloads share (the closed-loop client sweep of serve_bench.cpp, the
// request-rate sweep and multi-turn conversations of serve_replay.cpp): the configurations, the
// servers they start and stop, the streaming OpenAI client, latency distributions.
#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "serve_bench.h"

namespace specula::bench {

using serve_clock = std::chrono::steady_clock;
inline double seconds_since(serve_clock::time_point t0) { return std::chrono::duration<double>(serve_clock::now() - t0).count(); }

// A server process started here, its output in a log file, stopped (SIGTERM, then SIGKILL) when
// this goes out of scope; it dies with the benchmark too (PR_SET_PDEATHSIG).
class ServerProcess {
public:
    ServerProcess(const std::string & name, std::vector<std::string> argv, std::string log_path, int port);
    ~ServerProcess();
    ServerProcess(const ServerProcess &) = delete;
    ServerProcess & operator=(const ServerProcess &) = delete;
    // Until GET /health answers 200 (both servers answer 503 while loading).
    void wait_ready(double timeout_s);
    // Throws Error with the exit status and the log's tail when the process has ended.
    void check_running();

private:
    std::string name_, log_;
    int port_;
    pid_t pid_ = 0;
};

// One streamed request as the client saw it.
struct RequestResult {
    size_t prompt = 0;
    int tokens = 0;          // usage.completion_tokens (else the text chunks)
    int prompt_tokens = -1;  // usage.prompt_tokens; -1: not reported
    int cached_tokens = -1;  // usage.prompt_tokens_details.cached_tokens; -1: not reported
    double seconds = 0, ttft = 0;
    std::vector<double> chunk_times;  // seconds from the send to each chunk that carried text
    long drafted = 0, accepted = 0;
    std::string text, error;
};
// POST /v1/completions (`body` has "prompt") or /v1/chat/completions ("messages"), streamed.
RequestResult stream_completion(int port, const nlohmann::json & body);

struct Config {
    std::string server;  // "specula" | "llama-server"
    std::string name;    // e.g. "plain", "draft model", "n-gram"
    bool speculative = false;
};
// Per server of --servers its plain configuration and, where it can, its speculative one; `note`
// says which drafter they use (and why llama-server has none, when it cannot run the head).
struct ServeConfigs {
    std::vector<Config> configs;
    std::string note;
};
ServeConfigs serve_configs(const ServeBenchOptions & o);

// Checks the models, the servers' binaries and the settings every workload shares; fills in the
// default binaries.
void validate_servers(ServeBenchOptions & o);

// A request of configuration `c` with every field but the prompt: streamed, T = 0, ignore_eos
// (exactly max_tokens); llama-server gets `cache_prompt` (its prompt cache across requests).
nlohmann::json request_template(const Config & c, int max_tokens, bool cache_prompt);
// The request for one prompt: a user message for a chat workload, else the raw prompt.
nlohmann::json with_prompt(nlohmann::json request, const std::string & text, bool chat);

// Configuration c's server with `parallel` slots (and room to queue `queue` more), started,
// ready, and warmed up with `warm_up` (graphs, caches; not measured). `label` names its log.
struct StartedServer {
    std::unique_ptr<ServerProcess> process;
    int port = 0;
};
StartedServer start_server(const ServeBenchOptions & o, const Config & c, int parallel, int queue, int threads, int n_ctx,
                           const std::filesystem::path & scratch, const std::string & label, const nlohmann::json & warm_up);

// A scratch folder for the servers' logs, gone however the run ends.
struct ScratchDir {
    ScratchDir();
    ~ScratchDir();
    ScratchDir(const ScratchDir &) = delete;
    ScratchDir & operator=(const ScratchDir &) = delete;
    std::filesystem::path path;
};

// Mean and percentiles (linear between the closest ranks, as numpy's default and vLLM's report).
struct Distribution {
    double mean = 0, p50 = 0, p90 = 0, p99 = 0;
    size_t n = 0;
};
Distribution distribution(std::vector<double> xs);
nlohmann::json to_json(const Distribution & d);

}  // namespace specula::bench
