#pragma once
// What a run reports: each speculative round as the observer (and the trace file) sees it, and the
// counters and timings of a whole generation. A leaf of the public API: the verifier and the trace
// writer use these structs without the Engine (specula/specula.h includes this header).
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace specula {

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
enum class Outcome {
    Accepted,
    Rejected,
    Correction,
    Bonus
};
const char * outcome_name(Outcome o);

// One verification event of a round, in the order the verifier decided them.
struct VerifyEvent {
    int node = -1;  // tree node; -1 for the correction/bonus token
    int depth = 0;  // 1-based position after the root
    int32_t token = 0;
    float q = 1.0f;            // draft probability of the token (1 when deterministic)
    float p = 0.0f;            // target's processed probability of the token
    float accept_prob = 0.0f;  // min(1, p/q); 1/0 for greedy match/mismatch
    double draw = -1.0;        // the uniform draw (-1 if none): compared against accept_prob for a drawn child, else the position's keyed draw (Rng::at)
    Outcome outcome = Outcome::Accepted;
};

// One node of a verified draft; nodes are listed parents first.
struct DraftNode {
    int32_t token = 0;
    int parent = -1;  // -1: a child of the round's root (the last token before the round)
    int depth = 1;
    float q = 1.0f;          // draft probability of the token given its parent (1 when deterministic)
    float path_prob = 1.0f;  // the draft's probability that verification reaches this node
};

// One speculative round, as the observer (and the trace file, one observer) sees it. The round
// emits accepted.size() + 1 tokens: the accepted drafts, then next_token.
struct RoundReport {
    int round = 0;                             // 0-based
    int position = 0;                          // the root's position: tokens in the target's cache before the round
    double draft_ms = 0.0, verify_ms = 0.0;    // verify_ms: the target's forward and the verification
    double forward_ms = 0.0, commit_ms = 0.0;  // the target's forward alone; the whole commit after it
    RoundDecision decision;
    std::vector<DraftNode> tree;  // the verified draft
    std::vector<int> accepted;    // accepted nodes, top-down
    int32_t next_token = -1;      // the target's correction or bonus token
    bool bonus = false;
    std::vector<VerifyEvent> events;
    // SpecEE's lossless drafts: per tree node, the layer whose state decided its token (-1: it
    // ran the full LM head); empty for other drafters.
    std::vector<int> exit_layer;
    // Each drafter level of the round (ms): its forward and the proposing after it; a sequence
    // batched with others in a server step gets its share. Empty for drafters without a network.
    std::vector<double> draft_level_ms;
};
using RoundObserver = std::function<void(const RoundReport & round)>;

// One token of SpecEE's lossy mode: where it left the target.
struct ExitReport {
    int position = 0;  // the token's position in the sequence
    int32_t token = 0;
    int exit_layer = -1;  // the layer whose entering state decided it (n_layer: after every layer); -1: the full LM head
    int n_layer = 0;
};
using ExitObserver = std::function<void(const ExitReport & token)>;

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
    int draft_forwards = 0;       // drafter levels over all rounds (forwards of the drafter's network)
    double draft_level_ms = 0.0;  // their time: draft_ms minus planning, pruning and building the block

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
    int n_cached = 0;  // of them, tokens whose K/V a prefix cache held (not prefilled again)
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

}  // namespace specula
