#pragma once
// specula's public API: open a model (and its drafter), generate from text or token ids, observe
// each speculative round. Every failure throws specula::Error (specula/error.h).
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "specula/error.h"
#include "specula/options.h"
#include "specula/report.h"
#include "specula/sampling.h"

namespace specula {

class LogitsState;  // src/sample/logits_state.h

struct EngineOptions {
    std::string model_path;
    DrafterSpec drafter;                                   // none = plain decoding
    int draft_max = 8;                                     // longest draft per round
    DraftPolicyKind draft_policy = DraftPolicyKind::Cost;  // chains (docs/policies.md)
    std::optional<TreeShape> tree;                         // none: dynamic for EAGLE heads, else chain
    int tree_depth = 6;
    int tree_branching = 4;      // dynamic: children per node and nodes expanded per depth
    int tree_nodes = 0;          // nodes verified per round; 0 = chosen from the measured verify cost
    int n_ctx = 2048;            // tokens of context (prompt + generation)
    int n_threads = 0;           // 0 = physical cores
    std::string device = "cpu";  // a ggml device name, or a list of them the layers are split across
    std::string split;           // the layer share of each listed device ("1,3"); empty: by free memory
    double rpc_timeout = 120.0;  // seconds an rpc-server may take to answer a forward before the run ends
    Kernels kernels = Kernels::Auto;
    Attention attention = Attention::Auto;
    // SpecEE early exit (docs/specee.md): the exit-predictor sidecar, with the EAGLE-3 head as
    // the drafter of its candidates; lossy (default) = greedy with exits, the text may differ from plain.
    std::string specee_path;
    float specee_threshold = -1.0f;  // exit above this predictor probability; < 0: the file's default
    bool specee_lossless = false;    // exited tokens are drafts the full target verifies: plain's output
    bool specee_online = false;      // probe near the recent tokens' exit layers too (online_probe_layers)
    // Jinja source replacing the model's chat template (--chat-template FILE); empty: the model's.
    std::string chat_template;
};

inline constexpr int kMaxTopLogprobs = 20;  // the most alternatives GenerationOptions::top_logprobs asks for
using LogprobObserver = std::function<void(const TokenLogprob &)>;

struct GenerationOptions {
    int n_predict = 128;
    SamplingParams sampling;
    // A GBNF grammar (llama.cpp's format) the output must follow; empty: none. The target's
    // logits are masked by the grammar's state along each drafted path.
    std::string grammar;
    // A lazy grammar (llama.cpp's, as its chat layer makes for tool calls the model may or may not
    // start) leaves the output free until a trigger: the output's text so far matches one of
    // grammar_trigger_patterns (regexes; the grammar then reads the text from the pattern's first
    // group on) or a token of grammar_trigger_tokens is emitted (the grammar reads from it on).
    bool grammar_lazy = false;
    std::vector<std::string> grammar_trigger_patterns;
    std::vector<int32_t> grammar_trigger_tokens;
    // The grammar above compiled once (compile_grammar, engine/generate.h), each generation and
    // each choice starting from a clone of it; null: compiled when the generation starts.
    std::shared_ptr<const LogitsState> compiled_grammar;
    int top_logprobs = -1;       // -1: no logprobs; else on_logprob gets each token with this many alternatives (0..20)
    LogprobObserver on_logprob;  // called before the token's sink
    // The logprobs on_logprob gets are those of the distribution each token was drawn from, after
    // the sampler chain (truncation and temperature: token_post_sampling_logprob), rather than of
    // the processed logits at temperature 1 (llama-server's post_sampling_probs).
    bool post_sampling_logprobs = false;
    // -1: none; else on_prompt_logprob gets each prompt token after the first, in order, with its
    // log-probability under the target's raw logits of the row before it and this many
    // alternatives (0..20), as the prompt prefills (lm-eval's loglikelihood). Every prompt row is
    // then computed: what a cache held of the prompt is dropped.
    int prompt_logprobs = -1;
    LogprobObserver on_prompt_logprob;
    bool stop_at_end_of_generation = true;
    // Text outputs (a PieceSink, the server's replies) render control tokens as their text
    // (`<|im_start|>`), vLLM's skip_special_tokens: false; else as nothing. A token that ends the
    // generation never gets its text.
    bool special_token_text = false;
    // With stop_at_end_of_generation: more tokens that end the generation as the model's end
    // tokens do (a request's stop_token_ids), and how many tokens are generated before any of them
    // may be drawn (banned until then, as vLLM's min_tokens).
    std::vector<int32_t> stop_tokens;
    int min_tokens = 0;
    bool chat = false;       // text prompts: wrap the prompt as a user message in the model's chat template
    RoundObserver on_round;  // speculative runs: called after each round; the reports are built only when set
    ExitObserver on_exit;    // SpecEE's lossy mode: called after each token
};

// Receives each generated token id; return false to stop.
using TokenSink = std::function<bool(int32_t token)>;
// Receives generated text, in pieces that never split a UTF-8 character; return false to stop.
using PieceSink = std::function<bool(const std::string & piece)>;

class Engine {
public:
    static std::unique_ptr<Engine> open(const EngineOptions & options);  // throws Error
    ~Engine();

    // Text -> token ids as generate() reads a text prompt: BOS as the vocabulary asks; with
    // `chat`, through the model's chat template as a user message (BOS once).
    std::vector<int32_t> tokenize(const std::string & text, bool chat = false) const;
    // A conversation of (role, content) messages (system, user, assistant) through the model's chat
    // template, ending with the assistant's turn opened. Contents stay text: control-token text in
    // them opens no turn (as tokenize's with chat).
    std::vector<int32_t> tokenize_chat(const std::vector<std::pair<std::string, std::string>> & messages) const;
    std::string detokenize(std::span<const int32_t> tokens) const;  // as text: a leading word space may be dropped
    std::string piece(int32_t token) const;                         // one token's bytes, as streams concatenate them

    // From token ids to token ids. Throws Error on an empty prompt or one that does not fit.
    GenerationStats generate(std::span<const int32_t> prompt, const GenerationOptions & options, const TokenSink & sink);
    // From token ids (tokenize_chat's, say) to text.
    GenerationStats generate(std::span<const int32_t> prompt, const GenerationOptions & options, const PieceSink & sink);
    // From text (tokenize(prompt, options.chat)) to text.
    GenerationStats generate(const std::string & prompt, const GenerationOptions & options, const PieceSink & sink);

private:
    struct Impl;
    explicit Engine(std::unique_ptr<Impl> impl);
    std::unique_ptr<Impl> impl_;
};

}  // namespace specula
