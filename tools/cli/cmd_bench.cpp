#include <CLI/CLI.hpp>
#include <memory>

#include "commands.h"
#include "decode_bench.h"
#include "engine_flags.h"
#include "rpc_bench.h"
#include "serve_bench.h"
#include "spec_bench.h"

namespace specula::cli {

void register_bench(CLI::App & app, Commands & commands) {
    CLI::App * bench = app.add_subcommand(command::bench.name, command::bench.description);
    bench->require_subcommand(1);

    auto o = std::make_shared<bench::DecodeBenchOptions>();
    CLI::App * decode = bench->add_subcommand("decode", "generation speed and verifier batch cost vs llama.cpp");
    decode->add_option("-m,--model", o->model, "model GGUF")->required();
    decode->add_option("-t,--threads", o->threads, "threads (0 = physical cores)")->capture_default_str();
    decode->add_option("-r,--reps", o->reps, "repetitions per measurement")->capture_default_str();
    decode->add_option("-n,--n-gen", o->n_gen, "tokens per generation run")->capture_default_str();
    decode->add_option("--depth", o->depth, "cached tokens before each batch")->capture_default_str();
    add_choice(decode, "--attention", o->attention, parse_attention, "attention of the ggml-kernels engine and llama.cpp: auto (default) | flash | matmul");
    decode->add_option("-b,--batch-sizes", o->batch_sizes, "batch sizes")->delimiter(',');
    decode->add_option("--json", o->json_path, "write results as JSON");
    decode->callback([o, &commands] { commands.run = [o] { return bench::run_decode_bench(*o); }; });

    auto s = std::make_shared<bench::SpecBenchOptions>();
    CLI::App * spec = bench->add_subcommand("spec", "speculative decoding by prompt category vs plain and llama.cpp");
    spec->add_option("-m,--model", s->model, "target model GGUF")->required();
    spec->add_option("--draft", s->draft, "draft model GGUF (same vocabulary): adds the draft-model modes and llama-speculative-simple with it");
    add_draft_vocab_flag(spec, s->draft_vocab, s->draft_vocab_file, "specula's draft model");
    spec->add_option("--eagle", s->eagle, "EAGLE-1 head GGUF: adds EAGLE-1 chain/static/dynamic modes");
    spec->add_option("--eagle3", s->eagle3, "EAGLE-3 head GGUF: adds EAGLE-3 modes and llama.cpp's EAGLE-3");
    spec->add_option("--specee", s->specee, "SpecEE predictors GGUF (with --eagle3): adds the specee-lossy (T = 0) and specee-lossless modes");
    spec->add_option("--specee-threshold", s->specee_threshold, "SpecEE exit threshold (default: the file's)");
    spec->add_flag("--specee-online", s->specee_online, "SpecEE: probe near the recent tokens' exit layers too (docs/specee.md)");
    spec->add_flag("!--no-llamacpp", s->llamacpp, "specula's modes only: llama.cpp's peer tools are not run (nor needed)");
    spec->add_option("--tree-nodes", s->tree_nodes, "nodes per tree verify (0 = from the measured verify cost)")->capture_default_str();
    spec->add_option("--cost-curve-from", s->cost_curve_from,
                     "an earlier run's --json: use its verify-cost curve instead of measuring one (A/B runs decide on the same curve)");
    spec->add_option("-t,--threads", s->threads, "threads for every engine (0 = physical cores)")->capture_default_str();
    add_choice(spec, "--kernels", s->kernels, parse_kernels, "specula's kernels: auto (default; own on the CPU) | specula | ggml");
    add_choice(spec, "--attention", s->attention, parse_attention,
               "specula's attention kernel: auto (default) | flash | matmul | specula (llama.cpp runs both -fa on and off)");
    spec->add_option("-r,--reps", s->reps, "repetitions of the whole prompt set")->capture_default_str();
    spec->add_option("-n,--n-gen", s->n_gen, "tokens per generation")->capture_default_str();
    spec->add_option("--draft-max", s->draft_max, "draft length (fixed policy, llama.cpp); cap for the others")->capture_default_str();
    spec->add_option("--prompts", s->prompts, "prompt set JSON (default: tools/bench/prompts.json)");
    spec->add_option("--temps", s->temps, "temperatures")->delimiter(',')->capture_default_str();
    spec->add_option("--seed", s->seed, "sampling seed (prompt i uses seed + i)")->capture_default_str();
    spec->add_option("--json", s->json_path, "write results as JSON");
    spec->add_option("--html", s->html_path, "write results as an HTML page with plots (as `specula report --bench`)");
    spec->callback([s, &commands] { commands.run = [s] { return bench::run_spec_bench(*s); }; });

    auto v = std::make_shared<bench::ServeBenchOptions>();
    CLI::App * serve = bench->add_subcommand("serve", "serving through HTTP: specula serve vs llama-server, plain and speculative");
    serve->add_option("-m,--model", v->model, "target model GGUF (both servers)")->required();
    serve->add_option("--draft", v->draft, "draft model GGUF (same vocabulary); without a drafter both servers draft by n-gram");
    serve->add_option("--eagle3", v->eagle3, "EAGLE-3 head GGUF for the speculative configurations (llama-server: --spec-type draft-eagle3)");
    serve->add_option("--servers", v->servers, "servers to run: specula, llama-server")->delimiter(',')->capture_default_str();
    serve->add_option("-t,--threads", v->threads, "threads for both servers (0 = physical cores)")->capture_default_str();
    serve->add_option("--draft-max", v->draft_max, "longest draft per round (both servers)")->capture_default_str();
    serve->add_option("-c,--ctx-size", v->n_ctx, "context per slot (0 = 512 for the client sweep, 2048 for --dataset, 4096 for --multi-turn and --fim)")
        ->capture_default_str();
    serve->add_option("--specula-bin", v->specula_bin, "specula binary to serve with (default: this one)");
    serve->add_option("--llama-server-bin", v->llama_server_bin, "llama-server binary (default: build/bin/llama-server)");
    serve->add_option("--specula-args", v->specula_args,
                      "more arguments of specula's speculative server, space-separated, e.g. --specula-args=\"--draft-policy fixed\"");
    serve->add_option("--startup-timeout", v->startup_timeout, "seconds for a server to come up")->capture_default_str();
    serve->add_option("--json", v->json_path, "write results as JSON");
    // The closed-loop client sweep (without --dataset).
    const std::vector<CLI::Option *> client_sweep = {
        serve->add_option("--clients", v->clients, "client sweep: concurrent clients (each server runs --parallel = clients)")
            ->delimiter(',')
            ->capture_default_str(),
        serve->add_option("-r,--reps", v->reps, "client sweep: repetitions of the whole prompt set per concurrency")->capture_default_str(),
        serve->add_option("-n,--n-gen", v->n_gen, "client sweep: tokens per request (ignore_eos)")->capture_default_str(),
        serve->add_option("--prompts", v->prompts,
                          "client sweep: prompt set JSON (default: tools/bench/prompts.json; a chat set goes through /v1/chat/completions)")};
    // Replayed conversations: the request-rate sweep, or --multi-turn.
    CLI::Option * dataset = serve->add_option(
        "--dataset", v->dataset,
        "replay conversations: sharegpt (the pinned ShareGPT set; prepare it with tools/train/sharegpt_serving_set.py) or a file of its format");
    CLI::Option * multi_turn = serve->add_flag("--multi-turn", v->multi_turn, "with --dataset: multi-turn conversations instead of the rate sweep");
    const std::vector<CLI::Option *> rate_sweep = {
        serve->add_option("--request-rates", v->request_rates, "rate sweep: requests per second (Poisson arrivals), inf = all at once")
            ->delimiter(',')
            ->capture_default_str(),
        serve->add_option("--num-prompts", v->num_prompts, "rate sweep: requests per rate")->capture_default_str()};
    const std::vector<CLI::Option *> conversation = {
        serve->add_option("--turns", v->turns, "multi-turn: turns per conversation")->capture_default_str(),
        serve->add_option("--conversations", v->conversations, "multi-turn: conversations (--slots at a time)")->capture_default_str()};
    const std::vector<CLI::Option *> replay = {
        serve->add_option("--max-tokens", v->max_tokens, "replay: cap of a recorded reply's length in tokens")->capture_default_str(),
        serve->add_option("--slots", v->slots, "replay: --parallel of every server")->capture_default_str(),
        serve->add_option("--seed", v->seed, "replay: seed of the sample and the arrival times")->capture_default_str()};
    for (CLI::Option * c : client_sweep) {
        c->excludes(dataset);
        for (CLI::Option * other : rate_sweep) c->excludes(other);
        for (CLI::Option * other : conversation) c->excludes(other);
        for (CLI::Option * other : replay) c->excludes(other);
    }
    multi_turn->needs(dataset);
    for (CLI::Option * c : rate_sweep) c->needs(dataset)->excludes(multi_turn);
    for (CLI::Option * c : conversation) c->needs(multi_turn);
    for (CLI::Option * c : replay) c->needs(dataset);
    // Editor sessions against /infill.
    CLI::Option * fim = serve->add_option("--fim", v->fim, "a folder of source files: editor sessions against /infill (llama.vscode's and llama.vim's requests)");
    const std::vector<CLI::Option *> fim_options = {
        serve->add_option("--fim-files", v->fim_files, "fim: files typed")->capture_default_str(),
        serve->add_option("--fim-lines", v->fim_lines, "fim: lines typed per file, a request at each line's end")->capture_default_str(),
        serve->add_option("--fim-predict", v->fim_predict, "fim: n_predict of each request")->capture_default_str()};
    fim->excludes(dataset);
    for (CLI::Option * c : client_sweep) c->excludes(fim);
    for (CLI::Option * c : fim_options) c->needs(fim);
    serve->callback([v, &commands] { commands.run = [v] { return bench::run_serve_bench(*v); }; });

    auto r = std::make_shared<bench::RpcBenchOptions>();
    CLI::App * rpc = bench->add_subcommand("rpc", "target split over rpc-servers behind links of added latency: plain vs speculative");
    rpc->add_option("-m,--model", r->model, "target model GGUF")->required();
    rpc->add_option("--eagle3", r->eagle3, "EAGLE-3 head GGUF: adds its dynamic-tree and chain modes");
    rpc->add_option("--draft", r->draft, "draft model GGUF (same vocabulary): adds its chain mode");
    rpc->add_option("--device", r->device, "device list with RPC[host:port] entries (default: two rpc-servers started on 127.0.0.1)");
    rpc->add_option("--split", r->split, "layer shares of the listed devices (default: by free memory)");
    add_choice(rpc, "--kernels", r->kernels, parse_kernels, "matmul kernels of a cpu entry's layers and the LM head: auto (default) | specula | ggml");
    rpc->add_option("--delays", r->delays_ms, "added latency each way on every link, ms")->delimiter(',')->capture_default_str();
    rpc->add_option("-t,--threads", r->threads, "specula's CPU threads (0 = physical cores)")->capture_default_str();
    rpc->add_option("--server-threads", r->server_threads, "threads of each rpc-server started here")->capture_default_str();
    rpc->add_option("-r,--reps", r->reps, "repetitions of the prompt set")->capture_default_str();
    rpc->add_option("-n,--n-gen", r->n_gen, "tokens per generation")->capture_default_str();
    rpc->add_option("--n-prompts", r->n_prompts, "prompts: the first of each category, up to this many")->capture_default_str();
    rpc->add_option("--prompts", r->prompts, "prompt set JSON (default: tools/bench/prompts.json)");
    rpc->add_option("--json", r->json_path, "write results as JSON");
    rpc->callback([r, &commands] { commands.run = [r] { return bench::run_rpc_bench(*r); }; });
}

}  // namespace specula::cli
