#pragma once
// specula's public API: open a model (and its drafter), generate from text or token ids, observe
// each speculative round. Every failure throws specula::Error (specula/error.h).
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "specula/error.h"
#include "specula/options.h"
#include "specula/sampling.h"

namespace specula {

struct EngineOptions {
    std::string model_path;
    DrafterSpec drafter;                  // none = plain decoding
    int draft_max = 8;                    // longest draft per round
    DraftPolicyKind draft_policy = DraftPolicyKind::Cost;  // chains (docs/policies.md)
    std::optional<TreeShape> tree;        // none: dynamic for EAGLE heads, else chain
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
};

// What a round's policy chose.
struct RoundDecision {
    const char * policy = "";  // cost | heuristic | fixed (chains), tree-size | fixed-tree (trees)
    int asked = 0;             // draft length (chains) or node budget (trees) the policy asked for
    int drafted_nodes = 0;     // nodes the drafter produced
    int verified_nodes = 0;    // nodes sent to the target after pruning
    std::string why;           // the policy's reasons where it exposes them; may be empty
};

// accepted / rejected: a drafted token the target keeps / refuses; correction: the target's token
// where a draft was refused; bonus: the target's token after a fully accepted path.
enum class Outcome { Accepted, Rejected, Correction, Bonus };
const char * outcome_name(Outcome o);

// One verification event of a round, in the order the verifier decided them.
struct VerifyEvent {
    int node = -1;              // tree node; -1 for the correction/bonus token
    int depth = 0;              // 1-based position after the root
    int32_t token = 0;
    float q = 1.0f;             // draft probability of the token (1 when deterministic)
    float p = 0.0f;             // target's processed probability of the token
    float accept_prob = 0.0f;   // min(1, p/q); 1/0 for greedy match/mismatch
    double draw = -1.0;         // the uniform draw compared against accept_prob (-1 if none)
    Outcome outcome = Outcome::Accepted;
};

// One node of a verified draft; nodes are listed parents first.
struct DraftNode {
    int32_t token = 0;
    int parent = -1;         // -1: a child of the round's root (the last token before the round)
    int depth = 1;
    float q = 1.0f;          // draft probability of the token given its parent (1 when deterministic)
    float path_prob = 1.0f;  // the draft's probability that verification reaches this node
};

// One speculative round, as the observer (and the trace file, one observer) sees it. The round
// emits accepted.size() + 1 tokens: the accepted drafts, then next_token.
struct RoundReport {
    int round = 0;     // 0-based
    int position = 0;  // the root's position: tokens in the target's cache before the round
    double draft_ms = 0.0, verify_ms = 0.0;  // verify_ms: the target's forward and the verification
    double forward_ms = 0.0, commit_ms = 0.0;  // the target's forward alone; the whole commit after it
    RoundDecision decision;
    std::vector<DraftNode> tree;  // the verified draft
    std::vector<int> accepted;    // accepted nodes, top-down
    int32_t next_token = -1;      // the target's correction or bonus token
    bool bonus = false;
    std::vector<VerifyEvent> events;
};
using RoundObserver = std::function<void(const RoundReport & round)>;

struct GenerationOptions {
    int n_predict = 128;
    SamplingParams sampling;
    bool stop_at_end_of_generation = true;
    bool chat = false;       // text prompts: wrap the prompt as a user message in the model's chat template
    RoundObserver on_round;  // speculative runs: called after each round; the reports are built only when set
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
    // Where the rounds' time went (milliseconds, all rounds): the target's forwards, the
    // drafter (policy, drafter forwards, pruning, building the block), and the commit
    // (verification, KV compaction, handing the accepted path to the drafter, emitting).
    double forward_ms = 0.0, draft_ms = 0.0, commit_ms = 0.0;

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
    // The target's measured forward cost for 1..N tokens that the draft policies planned with
    // (empty when no policy needed it): why a run drafted as much or as little as it did.
    std::vector<double> verify_cost_ms;
    std::string early_exit;  // SpecEE runs: where tokens exited (one line; empty otherwise)
    std::string kernels;     // which kernels ran the target's matmuls and why (Backend::kernels_summary)
    double prompt_tok_s() const { return prompt_seconds > 0 ? n_prompt / prompt_seconds : 0.0; }
    double generation_tok_s() const { return generation_seconds > 0 ? n_generated / generation_seconds : 0.0; }
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
    std::string detokenize(std::span<const int32_t> tokens) const;  // as text: a leading word space may be dropped
    std::string piece(int32_t token) const;                         // one token's bytes, as streams concatenate them

    // From token ids to token ids. Throws Error on an empty prompt or one that does not fit.
    GenerationStats generate(std::span<const int32_t> prompt, const GenerationOptions & options, const TokenSink & sink);
    // From text (tokenize(prompt, options.chat)) to text.
    GenerationStats generate(const std::string & prompt, const GenerationOptions & options, const PieceSink & sink);

private:
    struct Impl;
    explicit Engine(std::unique_ptr<Impl> impl);
    std::unique_ptr<Impl> impl_;
};

}  // namespace specula
