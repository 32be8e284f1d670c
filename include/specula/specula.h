#pragma once
// specula's public API: open a model, generate text with a callback per token.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "specula/sampling.h"

namespace specula {

struct EngineOptions {
    std::string model_path;
    // Speculation: at most one drafter. None = plain decoding.
    std::string draft_model_path;  // a small LM sharing the target's vocabulary
    std::string eagle_path;        // EAGLE-1/2 head for the target (specula-eagle1 GGUF)
    std::string eagle3_path;       // EAGLE-3 head for the target (llama.cpp eagle3 GGUF)
    bool ngram = false;            // prompt-lookup drafting
    int ngram_min = 1, ngram_max = 3;
    int draft_max = 8;             // longest draft per round
    std::string draft_policy = "cost";   // cost | heuristic | fixed (chains; docs/policies.md)
    std::string tree;            // chain | static | dynamic; empty: dynamic for EAGLE heads, else chain
    int tree_depth = 6;
    int tree_branching = 4;      // dynamic: children per node and nodes expanded per depth
    int tree_nodes = 0;          // nodes verified per round; 0 = chosen from the measured verify cost
    int n_ctx = 2048;            // tokens of context (prompt + generation)
    int n_threads = 0;           // 0 = physical cores
    std::string device = "cpu";  // a ggml device name when built with a GPU backend
    std::string kernels = "auto";    // auto | specula | ggml; auto = specula's batch-invariant kernels on the CPU
    std::string attention = "auto";  // auto | flash | matmul | specula; auto = specula's with specula's
                                     // kernels, else matmul on the CPU and flash on GPUs
};

struct GenerationOptions {
    int n_predict = 128;
    SamplingParams sampling;
    bool stop_at_end_of_generation = true;
    std::string trace_path;  // speculative runs: one JSON line per drafted/emitted token
    bool chat = false;       // wrap the prompt as a user message in the model's chat template
};

// Counters of a speculative run. "Emitted" counts every token a round produced (accepted drafts
// plus the target's correction or bonus token), so mean_accepted_length is tokens per target forward.
struct SpeculationStats {
    int rounds = 0;
    int drafted = 0;
    int accepted = 0;
    int emitted = 0;
    std::vector<int> drafted_at;   // [d]: rounds whose draft reached depth d+1 (drafted at least d+1 tokens deep)
    std::vector<int> reached_at;   // [d]: rounds whose draft had a token at depth d+1 with all before accepted
    std::vector<int> accepted_at;  // [d]: rounds that accepted that token

    double acceptance_rate() const { return drafted ? double(accepted) / drafted : 0.0; }
    double mean_accepted_length() const { return rounds ? double(emitted) / rounds : 0.0; }
    // Per-position acceptance as every output reports it: accepted at depth d+1 / rounds that
    // drafted that deep. 0 when no round drafted that deep (outputs print "-" there).
    double acceptance_at(size_t d) const { return drafted_at[d] ? double(accepted_at[d]) / drafted_at[d] : 0.0; }
    // P(accept depth d+1 | every token before it accepted): what the cost model multiplies.
    double acceptance_given_reached(size_t d) const { return reached_at[d] ? double(accepted_at[d]) / reached_at[d] : 0.0; }
    void add_round(int n_drafted, int draft_depth, int n_accepted) {
        ++rounds;
        drafted += n_drafted;
        accepted += n_accepted;
        emitted += n_accepted + 1;
        if (static_cast<int>(reached_at.size()) < draft_depth) {
            drafted_at.resize(draft_depth, 0);
            reached_at.resize(draft_depth, 0);
            accepted_at.resize(draft_depth, 0);
        }
        for (int d = 0; d < draft_depth; ++d) {
            ++drafted_at[d];
            if (d <= n_accepted) ++reached_at[d];
            if (d < n_accepted) ++accepted_at[d];
        }
    }
};

struct GenerationStats {
    int n_prompt = 0;
    int n_generated = 0;
    double prompt_seconds = 0.0;
    bool speculative = false;
    SpeculationStats speculation;
    double generation_seconds = 0.0;
    double prompt_tok_s() const { return prompt_seconds > 0 ? n_prompt / prompt_seconds : 0.0; }
    double generation_tok_s() const { return generation_seconds > 0 ? n_generated / generation_seconds : 0.0; }
};

// Receives each generated token's text; return false to stop.
using PieceSink = std::function<bool(const std::string & piece)>;

class Engine {
public:
    static std::unique_ptr<Engine> open(const EngineOptions & options);  // throws specula::Error
    ~Engine();
    GenerationStats generate(const std::string & prompt, const GenerationOptions & options, const PieceSink & sink);

private:
    struct Impl;
    explicit Engine(std::unique_ptr<Impl> impl);
    std::unique_ptr<Impl> impl_;
};

}  // namespace specula
