#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "specula/options.h"

namespace specula::bench {

struct SpecBenchOptions {
    std::string model;               // target GGUF
    std::string draft;               // draft GGUF (same vocabulary)
    std::string eagle;               // optional EAGLE-1 head: adds its chain/static/dynamic modes
    std::string eagle3;              // optional EAGLE-3 head: adds its modes and llama.cpp's EAGLE-3
    std::string specee;              // optional SpecEE predictors (needs eagle3): adds specee-lossy (T = 0) and specee-lossless
    float specee_threshold = -1.0f;  // < 0: the predictors' own
    bool specee_online = false;      // SpecEE's online scheduling level
    bool llamacpp = true;            // false: specula's modes only (no peer tools needed)
    int tree_nodes = 0;              // nodes per tree verify; 0 = from the measured verify cost
    // An earlier run's JSON whose verify-cost curve this run uses instead of measuring its own:
    // the policies then decide on the same curve in both arms of an A/B comparison, where a
    // curve timed once at the start moves with the machine's load from run to run.
    std::string cost_curve_from;
    // The draft model's trimmed vocabulary (DrafterSpec::vocab, vocab_file; neither: the whole vocabulary).
    int draft_vocab = DrafterSpec{}.vocab;
    std::string draft_vocab_file;
    std::string prompts;                    // prompt set (JSON); empty = tools/bench/prompts.json of the source tree
    std::string json_path;                  // write results as JSON
    std::string html_path;                  // write results as an HTML page (tools/report/)
    int threads = 0;                        // 0 = physical cores; every engine gets the same count
    Attention attention = Attention::Auto;  // specula's attention kernel; llama.cpp runs with -fa on and with -fa off
    Kernels kernels = Kernels::Auto;        // specula's matmul kernels (auto: its own on the CPU)
    int reps = 3;
    int n_gen = 128;    // tokens per generation
    int draft_max = 4;  // k for the fixed policy and llama.cpp; the cap for heuristic/cost
    std::vector<float> temps = {0.0f, 1.0f};
    uint64_t seed = 42;  // prompt i uses seed + i, in every mode and rep
};

// Speculative decoding on a categorised prompt set, in one process, same threads and prompts:
// specula plain, specula chain speculation (draft model x fixed/heuristic/cost policy, n-gram),
// draft-model dynamic tree, EAGLE-1/EAGLE-3 chain/static/dynamic trees (when heads are given),
// llama-speculative-simple (draft model; EAGLE-3) and llama-completion. Reports tok/s (median and spread over reps),
// speedup over specula plain, acceptance, and the speedup the cost model predicts.
int run_spec_bench(const SpecBenchOptions & options);

}  // namespace specula::bench
