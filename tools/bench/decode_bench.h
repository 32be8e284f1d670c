#pragma once
#include <string>
#include <vector>

#include "specula/options.h"

namespace specula::bench {

struct DecodeBenchOptions {
    std::string model;
    int threads = 0;
    int reps = 5;
    int n_gen = 64;
    int depth = 128;                        // context already in the cache when a batch is verified
    Attention attention = Attention::Auto;  // attention of the ggml-kernels engine; llama.cpp runs the same one (-fa on/off)
    std::vector<int> batch_sizes = {1, 2, 3, 4, 5, 8, 12, 16};
    std::string json_path;
};

// specula vs llama.cpp on one GGUF, same process and threads: generation speed (llama-bench tg)
// and the cost of a verifier-style forward (all rows' logits, at depth) for each batch size.
int run_decode_bench(const DecodeBenchOptions & options);

}  // namespace specula::bench
