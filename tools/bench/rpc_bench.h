#pragma once
#include <string>
#include <vector>

#include "specula/options.h"

namespace specula::bench {

struct RpcBenchOptions {
    std::string model;                                // target GGUF
    std::string eagle3;                               // EAGLE-3 head: adds its dynamic-tree and chain modes
    std::string draft;                                // draft model GGUF: adds its chain mode
    std::string device;                               // device list with RPC[host:port] entries; empty = two local rpc-servers started here
    std::string split;                                // layer shares of the listed devices (--split); empty = by free memory
    std::vector<double> delays_ms = {0.0, 1.0, 5.0};  // added latency each way on every link
    Kernels kernels = Kernels::Auto;                  // matmul kernels of the local CPU's share (--kernels)
    int threads = 0;                                  // specula's CPU threads (0 = physical cores)
    int server_threads = 1;                           // threads of each rpc-server the benchmark starts
    int reps = 3;
    int n_gen = 64;         // tokens per generation
    int n_prompts = 4;      // the first prompt of each category, up to this many
    std::string prompts;    // prompt set JSON; empty = tools/bench/prompts.json
    std::string json_path;  // write results as JSON
};

// Plain vs speculative decoding with the target's layers on rpc-servers, each reached through a
// proxy that adds a fixed latency each way (LinkProxy): tok/s (median and spread over reps),
// speedup over plain at the same latency, and the round trips each generated token cost.
int run_rpc_bench(const RpcBenchOptions & options);

}  // namespace specula::bench
