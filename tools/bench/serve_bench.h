#pragma once
#include <string>
#include <vector>

namespace specula::bench {

struct ServeBenchOptions {
    std::string model;             // target GGUF, served by both servers
    std::string draft;             // draft GGUF (same vocabulary)
    std::string eagle3;            // EAGLE-3 head GGUF (instead of a draft model); neither = n-gram drafting in both servers
    std::string specula_bin;       // the `specula` binary to serve with (default: this one)
    std::string llama_server_bin;  // default: build/bin/llama-server (the pinned llama.cpp)
    std::string specula_args;      // more arguments of specula's speculative server, space-separated (e.g. its policies)
    std::vector<int> clients = {1, 2, 4, 8, 16};
    std::vector<std::string> servers = {"specula", "llama-server"};
    std::string prompts;    // prompt set (JSON); empty = tools/bench/prompts.json of the source tree
    std::string json_path;  // write results as JSON
    int threads = 0;        // 0 = physical cores; both servers get the same count
    int reps = 3;
    int n_gen = 64;                // tokens per request (ignore_eos: exactly this many)
    int draft_max = 4;             // longest draft per round, both servers
    int n_ctx = 0;                 // context per slot (llama-server gets parallel x this); 0: the workload's default
    double startup_timeout = 180;  // seconds for a server to answer /health

    // Replayed conversations instead of the client sweep (serve_replay.h).
    std::string dataset;                                              // "sharegpt" (the pinned serving set, sharegpt.h) or a conversations file of its format
    std::vector<std::string> request_rates = {"1", "2", "4", "inf"};  // requests per second, Poisson arrivals; inf: all at once
    int num_prompts = 32;                                             // requests per rate (each rate its own sample)
    int max_tokens = 256;                                             // cap of a recorded reply's length in tokens
    int slots = 4;                                                    // --parallel of every server
    unsigned seed = 0;                                                // the sample of conversations and the arrival times
    bool multi_turn = false;
    int turns = 8;          // multi-turn: turns per conversation
    int conversations = 8;  // multi-turn: conversations, `slots` at a time

    // Editor sessions against /infill instead (serve_fim.h): a folder of source files.
    std::string fim;
    int fim_files = 3;     // files typed
    int fim_lines = 24;    // lines typed per file, a request at each line's end
    int fim_predict = 32;  // n_predict of each request
};

// The same concurrent streaming workload through HTTP on 127.0.0.1 against `specula serve` (plain
// and with its drafter) and llama-server (plain and with its draft model, EAGLE-3 head or
// n-gram), each started
// and stopped here with --parallel = clients, same GGUF, threads, n_predict, T = 0: aggregate
// tok/s, per-request tok/s and time to first token, median and spread over reps. A chat prompt
// set goes through /v1/chat/completions (each server applies the model's chat template), any
// other through /v1/completions. With `dataset`: the request-rate sweep or, with `multi_turn`,
// the multi-turn conversations of serve_replay.h instead; with `fim`, the editor sessions of serve_fim.h.
int run_serve_bench(const ServeBenchOptions & options);

}  // namespace specula::bench
