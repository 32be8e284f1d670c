#pragma once
// `bench serve --dataset`: conversations replayed as serving users measure serving, against every
// configuration of serve_common.h (specula plain and speculative, llama-server plain and
// speculative), each server started once with --parallel = slots for the whole run.
#include "serve_bench.h"

namespace specula::bench {

// The request-rate sweep of vLLM's serving benchmark: at each rate (Poisson arrivals at that many
// requests per second, or all at once for "inf") its own sample of first human turns, each sent
// as a chat message with max_tokens its recorded reply's length (capped; ignore_eos, T = 0), the
// same requests and arrival times for every configuration. Per configuration and rate: TTFT, time
// per output token after the first, inter-token latency (between streamed chunks) and end-to-end
// latency (mean, p50, p90, p99), request and output-token throughput, acceptance, and the cached
// prompt tokens the server reports. llama-server runs with cache_prompt true (its default, and
// specula's prefix cache is always on; every prompt is new, so only a template's shared opening
// can be reused).
int run_rate_sweep(ServeBenchOptions & o);

// Multi-turn conversations: `slots` clients, each holding one conversation at a time for `turns`
// turns, its human turns from the dataset and its replies the server's own (sent back as
// assistant messages); per turn the TTFT, the prompt tokens and the cached tokens the server
// reports. llama-server runs with cache_prompt true, so that it reuses a conversation's earlier
// turns as a serving deployment does.
int run_multi_turn(ServeBenchOptions & o);

}  // namespace specula::bench
