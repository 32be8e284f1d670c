#pragma once
// specula's public API: open a model, generate text with a callback per token.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "specula/sampling.h"

namespace specula {

struct EngineOptions {
    std::string model_path;
    int n_ctx = 2048;            // tokens of context (prompt + generation)
    int n_threads = 0;           // 0 = physical cores
    std::string device = "cpu";  // a ggml device name when built with a GPU backend
};

struct GenerationOptions {
    int n_predict = 128;
    SamplingParams sampling;
    bool stop_at_end_of_generation = true;
};

struct GenerationStats {
    int n_prompt = 0;
    int n_generated = 0;
    double prompt_seconds = 0.0;
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
