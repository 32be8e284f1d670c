#pragma once
#include <string>
#include <vector>

namespace specula::bench {

struct DecodeBenchOptions {
    std::string model;
    int threads = 0;
    int reps = 5;
    int n_gen = 64;
    int depth = 128;  // context already in the cache when a batch is verified
    std::string attention = "auto";  // specula's attention kernel; llama.cpp runs the same one (-fa on/off)
    std::vector<int> batch_sizes = {1, 2, 4, 8, 16, 32, 64};
    std::string json_path;
};

// specula vs llama.cpp on one GGUF, same process and threads: generation speed (llama-bench tg)
// and the cost of a verifier-style forward (all rows' logits, at depth) for each batch size.
int run_decode_bench(const DecodeBenchOptions & options);

}  // namespace specula::bench
