#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <memory>

#include "commands.h"
#include "engine/target.h"
#include "server/http_server.h"
#include "server/scheduler.h"

namespace specula::cli {

void register_serve(CLI::App & app, Commands & commands) {
    struct Args {
        EngineOptions engine;
        SchedulerOptions scheduler;
        std::string host = "127.0.0.1";
        int port = 8080;
    };
    auto args = std::make_shared<Args>();
    CLI::App * sub = app.add_subcommand("serve", "OpenAI-compatible HTTP server: many sequences speculate at once, one target forward per step");
    sub->add_option("-m,--model", args->engine.model_path, "target model GGUF")->required();
    sub->add_option("-c,--ctx-size", args->engine.n_ctx, "context size in tokens, per slot")->capture_default_str();
    sub->add_option("--parallel", args->scheduler.parallel, "slots: sequences generated at once")->capture_default_str();
    sub->add_option("--queue", args->scheduler.max_queued, "requests that may wait for a slot (more get 503)")->capture_default_str();
    sub->add_option("--prefill-chunk", args->scheduler.prefill_chunk, "prompt tokens a sequence adds per step")->capture_default_str();
    sub->add_option("--host", args->host, "address to listen on")->capture_default_str();
    sub->add_option("--port", args->port, "port (0: any free port)")->capture_default_str();
    sub->add_option("-t,--threads", args->engine.n_threads, "CPU threads (0 = physical cores)")->capture_default_str();
    sub->add_option("--device", args->engine.device, "ggml device (cpu, or e.g. CUDA0 in a GPU build)")->capture_default_str();
    sub->add_option("--kernels", args->engine.kernels, "matmul kernels: auto (specula's on the CPU) | specula | ggml")->capture_default_str();
    sub->add_option("--attention", args->engine.attention, "attention kernel: auto | flash | matmul | specula")->capture_default_str();
    sub->add_option("--draft", args->engine.draft_model_path, "draft model GGUF (same vocabulary as the target)");
    sub->add_option("--eagle", args->engine.eagle_path, "EAGLE-1/2 head GGUF for the target (default tree: dynamic)");
    sub->add_option("--eagle3", args->engine.eagle3_path, "EAGLE-3 head GGUF for the target, llama.cpp layout (default tree: dynamic)");
    sub->add_flag("--ngram", args->engine.ngram, "draft by prompt lookup (n-gram matching)");
    sub->add_option("--ngram-min", args->engine.ngram_min, "shortest n-gram to match")->capture_default_str();
    sub->add_option("--ngram-max", args->engine.ngram_max, "longest n-gram to match")->capture_default_str();
    sub->add_option("--draft-max", args->engine.draft_max, "longest draft per round")->capture_default_str();
    sub->add_option("--draft-policy", args->engine.draft_policy, "draft length policy: cost | heuristic | fixed")->capture_default_str();
    sub->add_option("--tree", args->engine.tree, "draft shape: chain | static | dynamic (default: dynamic for EAGLE heads, else chain)");
    sub->add_option("--tree-depth", args->engine.tree_depth, "tree depth below the root")->capture_default_str();
    sub->add_option("--tree-branching", args->engine.tree_branching, "dynamic tree: children per node and nodes expanded per depth")->capture_default_str();
    sub->add_option("--tree-nodes", args->engine.tree_nodes, "nodes verified per round (0 = from the measured verify cost)")->capture_default_str();
    commands.run = nullptr;
    sub->callback([args, &commands] {
        commands.run = [args] {
            HttpServer server(args->scheduler.parallel + args->scheduler.max_queued + 8);
            const int port = server.start(args->host, args->port);
            // Tests and scripts read this line for the port.
            std::fprintf(stderr, "specula: listening on http://%s:%d (loading %s)\n", args->host.c_str(), port, args->engine.model_path.c_str());
            std::unique_ptr<Target> target = Target::open(args->engine);
            Scheduler scheduler(*target, args->scheduler);
            server.ready(*target, scheduler, std::filesystem::path(args->engine.model_path).stem().string());
            std::fprintf(stderr, "specula: ready: %d slots of %d tokens\n", args->scheduler.parallel, args->engine.n_ctx);
            server.wait();
            return 0;
        };
    });
}

}  // namespace specula::cli
