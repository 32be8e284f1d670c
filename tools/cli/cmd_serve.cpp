#include <CLI/CLI.hpp>
#include <atomic>
#include <chrono>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "commands.h"
#include "engine_flags.h"
#include "engine/model_bundle.h"
#include "report.h"
#include "server/access.h"
#include "server/http_server.h"
#include "server/openai.h"
#include "server/scheduler.h"
#include "specula/error.h"

namespace specula::cli {

namespace {
// After SIGTERM or SIGINT: how long past --shutdown-timeout the requests' ends and the scheduler's
// last step may take before the process exits anyway, and the exit status it then has.
constexpr std::chrono::seconds kShutdownDrain{5};
constexpr int kShutdownAbandoned = 3;

struct ServeArgs {
    EngineOptions engine;
    SchedulerOptions scheduler;
    std::string host = "127.0.0.1";
    int port = 8080;
    size_t max_request_bytes = 4 << 20;
    bool special_tokens_in_prompt = false;
    std::string reasoning_format = "auto";  // llama-server's default
    std::string reasoning = "auto";
    int max_connections = 256;
    double head_timeout = 10, request_timeout = 30, shutdown_timeout = 10;  // seconds
    std::vector<std::string> api_keys, cors_origins, allowed_hosts;
    std::string api_key_file;
    std::vector<std::string> aliases;
    bool strict_fields = false;
    bool no_spec = false;
    std::string pooling = "mean";
    bool any_model = false;
    bool verbose = false;
    openai::RequestDefaults defaults;
};

// Slots, the queue, prefill chunks, the speculation gate and the caches: the scheduler's options.
void add_scheduler_flags(CLI::App * sub, ServeArgs & a) {
    sub->add_option("-c,--ctx-size", a.engine.n_ctx, "context size in tokens, per slot")->capture_default_str();
    sub->add_option("--parallel", a.scheduler.parallel, "slots: sequences generated at once")->capture_default_str();
    sub->add_option("--queue", a.scheduler.max_queued, "requests that may wait for a slot (more get 503)")->capture_default_str();
    sub->add_option("--prefill-chunk", a.scheduler.prefill_chunk, "prompt tokens a sequence adds per step")->capture_default_str();
    sub->add_flag("!--no-speculation-gate", a.scheduler.gate_speculation,
                  "draft in every step the policies choose to, even at loads where plain steps measured faster");
    sub->add_option("--suffix-cache-tokens", a.scheduler.suffix_cache_tokens,
                    "tokens of earlier requests (prompts and outputs) kept for lookup drafts, the oldest evicted first; 0: off")
        ->check(CLI::NonNegativeNumber)
        ->capture_default_str();
    sub->add_flag("--shared-suffix-cache", a.scheduler.shared_suffix_cache,
                  "lookup drafts read every API key's earlier requests, not only the request's own key's (and cache_salt's): "
                  "a shared repeat drafts for free, and its speed tells one key what another's requests said (docs/server.md, \"Tenants\")");
    sub->add_option("--cache-bytes", a.scheduler.cache_bytes,
                    "host memory for the KV rows of conversations whose slots others took, so that their next turns skip "
                    "the prefill; the least recently used evicted first; 0: off")
        ->check(CLI::NonNegativeNumber)
        ->capture_default_str();
}

// The address, the connection and time limits, and who may call the server.
void add_http_flags(CLI::App * sub, ServeArgs & a) {
    sub->add_option("--host", a.host, "address to listen on")->capture_default_str();
    sub->add_option("--port", a.port, "port (0: any free port)")->capture_default_str();
    sub->add_option("--max-request-bytes", a.max_request_bytes, "longest request body accepted (longer ones get 413)")
        ->check(CLI::PositiveNumber)
        ->capture_default_str();
    sub->add_option("--max-connections", a.max_connections, "connections open at once, waiting or served (more get 503)")
        ->check(CLI::PositiveNumber)
        ->capture_default_str();
    sub->add_option("--head-timeout", a.head_timeout, "seconds a client has, from connecting, to send its request line and headers (else 408)")
        ->check(CLI::PositiveNumber)
        ->capture_default_str();
    sub->add_option("--request-timeout", a.request_timeout,
                    "seconds a request has, from connecting, to arrive whole, body included, and be prepared (parsed, its chat template "
                    "rendered, its prompt tokenized) (else 408)")
        ->check(CLI::PositiveNumber)
        ->capture_default_str();
    sub->add_option("--shutdown-timeout", a.shutdown_timeout,
                    "on SIGTERM or SIGINT, seconds the requests in flight have to finish before they are ended (503)")
        ->check(CLI::NonNegativeNumber)
        ->capture_default_str();
    sub->add_option("--api-key", a.api_keys,
                    "key that requests must send as 'Authorization: Bearer KEY' (repeatable; without it $SPECULA_API_KEY); /health and the page at / stay open")
        ->envname("SPECULA_API_KEY");
    sub->add_option("--api-key-file", a.api_key_file, "file of API keys, one a line ('#' starts a comment line); kept out of the process list");
    sub->add_option("--cors-origin", a.cors_origins,
                    "origin whose web pages may call the server, e.g. http://localhost:3000 (repeatable; localhost allows any page of this "
                    "machine, at any port, as llama-server's --cors-origins localhost; * allows any); default none");
    sub->add_option("--allowed-host", a.allowed_hosts,
                    "Host name answered besides localhost, IP addresses and this machine's name, whatever the address bound "
                    "(repeatable; * answers any name)");
}

// How requests are read: model names, unknown fields, special-token text, reasoning.
void add_request_flags(CLI::App * sub, ServeArgs & a) {
    sub->add_option("--alias", a.aliases,
                    "name requests may give as 'model', listed by /v1/models (repeatable or comma-separated, as vLLM's "
                    "--served-model-name; the first is answered when a request names none); default: the model file's name")
        ->delimiter(',');
    sub->add_flag("--any-model", a.any_model,
                  "answer a request whatever 'model' it names, echoing that name, as llama-server does; by default a name that is "
                  "not served (--alias) gets 404 model_not_found, as OpenAI and vLLM answer");
    sub->add_flag("--strict-fields", a.strict_fields,
                  "refuse (400) a request field the server does not read; by default it is ignored, named in the log and in the "
                  "X-Specula-Ignored-Fields response header");
    sub->add_flag("--special-tokens-in-prompt", a.special_tokens_in_prompt,
                  "text spelling a special token (\"<|im_start|>\") in a completions prompt or a chat message becomes that token; "
                  "by default it is text, and only the chat template's markup is control tokens");
    sub->add_option("--reasoning-format", a.reasoning_format,
                    "where a thinking chat template's reasoning goes: none (left in the content), deepseek or auto (parsed into "
                    "message.reasoning_content, streamed as delta.reasoning_content), deepseek-legacy (reasoning_content, and left in "
                    "the content too)")
        ->check(CLI::IsMember({"none", "auto", "deepseek", "deepseek-legacy"}))
        ->capture_default_str();
    sub->add_option("--reasoning", a.reasoning,
                    "whether a thinking chat template thinks: on or off sets its enable_thinking variable for requests whose "
                    "chat_template_kwargs do not (off: the reply opens with an empty thinking section); auto: the template's default "
                    "(llama-server's --reasoning)")
        ->check(CLI::IsMember({"on", "off", "auto"}))
        ->capture_default_str();
    sub->add_flag("--embeddings", a.scheduler.embeddings,
                  "answer /v1/embeddings (and /embeddings): the target's final hidden states after its output norm, pooled by "
                  "--pooling and L2-normalised; without it those routes answer 501");
    sub->add_flag("-v,--verbose", a.verbose,
                  "log every request (method, path, status, its body and the response's) on stderr, but for the routes polled "
                  "(/health, /metrics, /models, /props, /slots), and give every completion llama-server's __verbose object unless "
                  "the request sets \"verbose\": false, as llama-server's --verbose does");
    sub->add_option("--pooling", a.pooling, "how --embeddings pools an input's rows: mean, last (the last token's) or cls (the first token's)")
        ->check(CLI::IsMember({"mean", "last", "cls"}))
        ->capture_default_str();
}

// The server-wide request defaults, under `generate`'s flag names (llama-server's but
// --penalty-last-n, its --repeat-last-n): each only where a request omits the field.
void add_request_default_flags(CLI::App * sub, openai::RequestDefaults & d) {
    const std::string unset = " that omits it (default: the route's own: OpenAI's on /v1/*, llama-server's on /infill)";
    auto real = [sub](const char * name, std::optional<float> & out, const std::string & help) {
        return sub->add_option_function<float>(
            name, [&out](float v) { out = v; }, help);
    };
    real("--temp", d.temperature, "temperature of a request" + unset + "; 0 = greedy")->check(CLI::Range(0.0, 100.0));
    real("--top-p", d.top_p, "top-p of a request" + unset + "; 1 = off")->check(CLI::Range(0.0, 1.0));
    real("--min-p", d.min_p, "min-p of a request" + unset + "; 0 = off")->check(CLI::Range(0.0, 1.0));
    real("--repeat-penalty", d.repeat_penalty, "repeat penalty of a request" + unset + "; 1 = off")->check(CLI::PositiveNumber);
    real("--presence-penalty", d.presence_penalty, "presence penalty of a request" + unset + "; 0 = off")->check(CLI::Range(-2.0, 2.0));
    real("--frequency-penalty", d.frequency_penalty, "frequency penalty of a request" + unset + "; 0 = off")->check(CLI::Range(-2.0, 2.0));
    sub->add_option_function<int>(
        "--top-k", [&d](int v) { d.top_k = v; }, "top-k of a request" + unset + "; 0 = off");
    sub->add_option_function<int>(
           "--penalty-last-n", [&d](int v) { d.penalty_last_n = v; }, "the recent tokens the penalties count for a request" + unset + "; -1 = all")
        ->check(CLI::Range(-1, std::numeric_limits<int32_t>::max()));
    sub->add_option_function<int>(
           "--n-predict", [&d](int v) { d.max_tokens = v == -1 ? std::nullopt : std::optional<int>(v); },
           "most tokens a request that names none (max_tokens, n_predict) generates, cut to the room its context leaves; default "
           "(and -1): until the context is full")
        ->check(CLI::Range(-1, std::numeric_limits<int32_t>::max()))
        ->check([](const std::string & v) { return v == "0" ? std::string("0 would generate nothing: -1 (until the context is full) or at least 1") : std::string(); });
    // llama-server's -1: a random seed per request, as without the flag.
    sub->add_option_function<int64_t>(
        "--seed", [&d](int64_t v) { d.seed = v == -1 ? std::nullopt : std::optional<uint64_t>(static_cast<uint64_t>(v)); },
        "seed of a request that omits it (choice i: seed + i), so that equal requests get equal texts; default (and -1): a random seed per request");
}

void add_specee_flags(CLI::App * sub, ServeArgs & a) {
    sub->add_option("--specee", a.engine.specee_path,
                    "SpecEE exit predictors GGUF (models/*-specee.gguf): requests choose \"specee\": \"lossy\" | \"lossless\" | \"off\"");
    sub->add_flag("--specee-lossless", a.engine.specee_lossless, "requests that name no SpecEE mode get the lossless one (default: off)");
    sub->add_option("--specee-threshold", a.engine.specee_threshold,
                    "exit threshold of requests that give no \"specee_threshold\" (default: the file's)");
    sub->add_flag("--specee-online", a.engine.specee_online, "also probe near the recent tokens' exit layers (docs/specee.md)");
}

std::chrono::milliseconds ms(double seconds) { return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000)); }

// SIGTERM and SIGINT end the server gracefully. They are blocked before any thread starts (threads
// inherit the mask), and taken by one thread with sigwait() (watch_shutdown).
sigset_t block_stop_signals() {
    sigset_t stop_signals;
    sigemptyset(&stop_signals);
    sigaddset(&stop_signals, SIGTERM);
    sigaddset(&stop_signals, SIGINT);
    pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
    return stop_signals;
}

// The thread that takes the first stop signal and watches the shutdown it starts: a second signal,
// or a shutdown still under way at its deadline (a thread stuck in a computation, which no one can
// interrupt), ends the process at once, abandoning what is left (docs/server.md, "Shutdown").
// stage: what the shutdown waits for once the requests have ended, for the line that names it.
void watch_shutdown(const std::shared_ptr<HttpServer> & server, const std::shared_ptr<std::atomic<bool>> & loaded,
                    const std::shared_ptr<std::atomic<const char *>> & stage, sigset_t stop_signals, std::chrono::milliseconds grace) {
    auto name = [](int signal) { return signal == SIGTERM ? "SIGTERM" : "SIGINT"; };
    int signal = 0;
    sigwait(&stop_signals, &signal);
    std::fprintf(stderr, "specula: %s: shutting down\n", name(signal));
    if (!*loaded) {  // nothing is in flight while the model loads
        std::fflush(nullptr);
        std::_Exit(0);
    }
    std::thread([server, grace] { server->shutdown(grace); }).detach();
    const auto deadline = std::chrono::steady_clock::now() + grace + kShutdownDrain;
    for (;;) {
        const auto left = std::chrono::duration_cast<std::chrono::nanoseconds>(deadline - std::chrono::steady_clock::now()).count();
        if (left <= 0) break;
        const timespec wait{static_cast<time_t>(left / 1'000'000'000), static_cast<long>(left % 1'000'000'000)};
        const int again = sigtimedwait(&stop_signals, nullptr, &wait);
        if (again > 0) {
            std::fprintf(stderr, "specula: %s again: exiting at once with status %d\n", name(again), 128 + again);
            std::fflush(nullptr);
            std::_Exit(128 + again);
        }
        if (errno != EINTR) break;
    }
    std::string left_over;
    for (const std::string & request : server->in_flight()) left_over += (left_over.empty() ? "" : ", ") + request;
    if (left_over.empty()) left_over = *stage;
    std::fprintf(stderr, "specula: the shutdown did not end within --shutdown-timeout + %d s; abandoning %s; exiting with status %d\n",
                 static_cast<int>(kShutdownDrain.count()), left_over.c_str(), kShutdownAbandoned);
    std::fflush(nullptr);
    std::_Exit(kShutdownAbandoned);
}

// Who may call the server and how it reads requests, before it starts listening.
void configure(HttpServer & server, const ServeArgs & args, std::vector<std::string> keys) {
    const AccessPolicy access = make_access_policy(args.host, std::move(keys), args.cors_origins, args.allowed_hosts);
    if (!access.loopback_bind && access.api_keys.empty()) {
        std::fprintf(stderr, "specula: note: %s is not a loopback address and no --api-key is set: whoever reaches it can use the server\n",
                     args.host.c_str());
    }
    server.set_access_policy(access);
    server.set_index_page(report::live_page());
    server.set_special_tokens_in_prompt(args.special_tokens_in_prompt);
    server.set_strict_fields(args.strict_fields);
    for (const std::string & alias : args.aliases) {
        if (alias.empty()) throw Error("--alias: a model name cannot be empty");
    }
    server.set_reasoning_format(reasoning_format_from_name(args.reasoning_format));
    server.set_thinking(args.reasoning == "auto" ? std::nullopt : std::optional<bool>(args.reasoning == "on"));
    server.set_embeddings(args.scheduler.embeddings);
    server.set_any_model(args.any_model);
    server.set_request_defaults(args.defaults);
    server.set_verbose(args.verbose);
}

// Listens at once (the port line), then loads the model and serves until a stop signal; the exit
// status.
int serve(ServeArgs & args) {
    choose_model_and_drafter(args.engine, args.no_spec);
    std::vector<std::string> keys = args.api_keys;
    if (!args.api_key_file.empty()) {
        for (std::string & key : read_api_keys(args.api_key_file)) keys.push_back(std::move(key));
    }
    if (args.request_timeout < args.head_timeout) {
        throw Error("--request-timeout (" + std::to_string(args.request_timeout) + " s) is shorter than --head-timeout (" +
                    std::to_string(args.head_timeout) + " s)");
    }
    const sigset_t stop_signals = block_stop_signals();
    auto server_ptr = std::make_shared<HttpServer>(args.max_connections, args.max_request_bytes,
                                                   RequestDeadlines{ms(args.head_timeout), ms(args.request_timeout)});
    HttpServer & server = *server_ptr;
    auto loaded = std::make_shared<std::atomic<bool>>(false);
    auto stage = std::make_shared<std::atomic<const char *>>("the requests in flight");
    std::thread(watch_shutdown, server_ptr, loaded, stage, stop_signals, ms(args.shutdown_timeout)).detach();
    configure(server, args, std::move(keys));
    const int port = server.start(args.host, args.port);
    // Tests and scripts read this line for the port.
    std::fprintf(stderr, "specula: listening on http://%s:%d (loading %s)\n", args.host.c_str(), port, args.engine.model_path.c_str());
    std::unique_ptr<ModelBundle> target = ModelBundle::open(args.engine);
    args.scheduler.pooling = embeddings::pooling_from_name(args.pooling);
    auto scheduler_ptr = std::make_unique<Scheduler>(*target, args.scheduler);
    Scheduler & scheduler = *scheduler_ptr;
    server.ready(*target, scheduler,
                 args.aliases.empty() ? std::vector<std::string>{std::filesystem::path(args.engine.model_path).stem().string()} : args.aliases);
    *loaded = true;
    const bool suffix_cache = args.engine.drafter.kind == DrafterKind::Ngram && args.scheduler.suffix_cache_tokens > 0;
    std::fprintf(stderr, "specula: ready: %d slots of %d tokens, %s%s\n", args.scheduler.parallel, args.engine.n_ctx,
                 decoding_mode(args.engine).c_str(), suffix_cache ? " and the suffix cache" : "");
    if (!server.wait()) {
        std::fprintf(stderr, "specula: the listening socket failed (accept); exiting\n");
        server.stop();
        return 1;
    }
    if (scheduler.failed()) {  // a target whose rpc-server failed cannot be torn down
        std::fflush(nullptr);
        std::_Exit(1);
    }
    *stage = "the scheduler's step in progress";
    scheduler_ptr.reset();
    *stage = "the release of the model";
    target.reset();
    return 0;
}

}  // namespace

void register_serve(CLI::App & app, Commands & commands) {
    auto args = std::make_shared<ServeArgs>();
    CLI::App * sub = app.add_subcommand(command::serve.name, command::serve.description);
    sub->add_option("-m,--model", args->engine.model_path,
                    "target model GGUF (default: SmolLM2-135M-Instruct from the model cache, fetched if absent, with its "
                    "EAGLE-3 head unless another drafter is given)");
    add_scheduler_flags(sub, *args);
    add_http_flags(sub, *args);
    add_request_flags(sub, *args);
    add_request_default_flags(sub, args->defaults);
    add_engine_flags(sub, args->engine, args->no_spec);
    add_specee_flags(sub, *args);
    commands.run = nullptr;
    sub->callback([args, &commands] { commands.run = [args] { return serve(*args); }; });
}

}  // namespace specula::cli
