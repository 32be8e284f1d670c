#pragma once
// One sequence's speculative decoding, a round at a time. A round is
//   draft    the round policy (policy/round_policy.h) sets the budget and the drafter starts;
//            the caller runs the drafter's forwards, batched with other sequences' (run_drafts),
//            then block() takes the draft, sized by the policy, as [root, draft nodes];
//   forward  the caller runs one target forward over that block with the tree mask, alone or
//            beside other sequences' blocks (step_sequences);
//   verify   greedy or rejection sampling against the target's logits (verify/verify.h);
//   commit   the accepted path kept in the target's cache (compact; a chain prefix is O(1)), the
//            drafter told what stands, the tokens emitted, the round policy told what it cost.
// Invariant between rounds: the target's cache holds the sequence minus its last token (the
// next root), the drafter's holds at most that, and both hold nothing that was rejected.
// One-sequence generation (generate_speculative) and a many-sequence scheduler (src/server)
// drive the same code. The sequence owns its Rng and sampling parameters, so its output does not
// depend on what else shares the forward. It references its cache stream, drafter and policies,
// owned by the caller.
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "draft/drafter.h"
#include "engine/generate.h"
#include "policy/draft_length.h"
#include "policy/round_policy.h"
#include "policy/tree_size.h"
#include "runtime/forward.h"
#include "sample/sampler.h"
#include "specula/specula.h"
#include "trace/trace.h"
#include "tree/tree_builder.h"
#include "verify/path_logits.h"
#include "verify/verify.h"

namespace specula {

class CatchUpGate;
class KvCache;
class Tokenizer;

struct RoundInfo {
    int round = 0;
    int base = 0;          // target cache size before the round (= position of the root)
    int draft_length = 0;  // what the policy asked for
    double draft_ms = 0, verify_ms = 0;
    double forward_ms = 0, commit_ms = 0;
    const Draft * draft = nullptr;
    const VerifyResult * result = nullptr;
    std::span<const int32_t> history;        // the sequence after this round's tokens
    RoundDecision decision;                  // what the policy chose and why (built only when observed)
    std::span<const double> draft_level_ms;  // each drafter level's time (its forward and proposing)
};

// The public report of a round (specula/report.h), for observers.
RoundReport round_report(const RoundInfo & round);

// The tree, the target's logits, the sequence's Rng and the root's position (verify_sampled's keyed draws).
using VerifyFn = std::function<VerifyResult(const TokenTree &, const TargetLogits &, Rng &, int64_t)>;

struct SequenceParts {
    KvCache & cache;                                       // the target's cache stream of this sequence
    Drafter * drafter = nullptr;                           // nullptr: no drafting (each round verifies the root alone)
    DraftLengthPolicy * policy = nullptr;                  // chain depth per round (chain shape only); nullptr: 0
    TreeBudget tree;                                       // shape Chain: a chain of the policy's length
    std::function<void(const RoundInfo &)> on_round = {};  // trace, tests; may be empty
    VerifyFn verify = {};                                  // empty = the standard verifier for the sampling params
    TreeSizePolicy * tree_size = nullptr;                  // trees: nodes verified per round (else tree.max_nodes)
    const Tokenizer * tokenizer = nullptr;                 // the vocabulary of GenerationOptions::grammar (none: no grammar)
    CatchUpGate * catch_up = nullptr;                      // whether the drafter catches up on this request (nullptr: it does)
};

class Sequence {
public:
    // Prompt tokens at most 512 per prefill block. Throws Error when the prompt is empty or does
    // not fit the cache. The cache may hold the prompt's first tokens, fewer than all of them (a
    // prefix cache: the caller matched them), and the drafter the state it built from them in the
    // sequence before (else it was reset): the drafter keeps what is exact for this prompt
    // (Drafter::keep_prefix), the cache is cut to what the drafter needs, and the rest prefills.
    Sequence(SequenceParts parts, std::span<const int32_t> prompt, const GenerationOptions & options,
             std::function<bool(int32_t)> is_end, int prefill_chunk = 512);

    bool done() const;
    bool prefilling() const { return prefilled_ < run_.n_prompt - 1; }
    int prefilled() const { return prefilled_; }  // prompt tokens in the cache, those it held at the start included

    // A step is draft(), the drafter's forwards (the caller's, run_drafts), block(), the target's
    // forward of block() into output() (the caller's), commit(). While prefilling, the block is
    // the next prompt chunk and nothing is drafted.
    //
    // Draft: the round policy plans the round and the drafter starts. `step`: what the rest of the
    // step is expected to carry (policies weigh the whole step); may_draft false: the step drafts
    // nothing (the server's SpeculationGate). Returns the drafter whose pending forwards the
    // caller runs, nullptr when none.
    Drafter * draft(const StepShare & step = {}, bool may_draft = true);
    // The draft taken and sized, as the target's block: [root, draft nodes]. draft_ms: this
    // sequence's share of the time its drafter's forwards took, level_ms: that share level by
    // level (the round's trace shows it).
    const ForwardBatch & block(double draft_ms, std::span<const double> level_ms = {});
    // Verify and commit, after the target's forward of block() into output(): forward_ms is how
    // long it took, step_rows its rows (-1: this block's alone), verify_only_step: none of them
    // were prefill chunks (the step then prices rows for the policies). Calls sink with each
    // emitted token; false stops the sequence.
    void commit(double forward_ms, const std::function<bool(int32_t)> & sink, int step_rows = -1, bool verify_only_step = true);

    // Rows of the last block if it was a verify block (0 after a prompt chunk), and tokens its
    // commit emitted.
    int last_rows() const { return last_rows_; }
    int last_tokens() const { return last_tokens_; }
    void stop() { stopped_ = true; }

    const GenerationStats & stats() const { return run_; }
    std::span<const int32_t> history() const { return history_; }
    int n_prompt() const { return run_.n_prompt; }
    // The leading tokens of history() whose target K/V rows the cache holds (at most its size: a
    // sequence stopped inside an accepted block holds rows past its last emitted token).
    int n_exact() const;
    KvCache & cache() const { return p_.cache; }
    // Where the target's forward of block() writes; kept between steps so that its buffers
    // (a verify block's logits are megabytes) are reused, not allocated anew each step.
    ForwardOutput & output() { return out_; }

private:
    void commit_prompt_chunk();
    // The round's stages after the target's forward.
    VerifyResult verify();
    std::vector<int> keep_accepted(const VerifyResult & result);
    void emit(const VerifyResult & result, const std::function<bool(int32_t)> & sink);
    void account(const VerifyResult & result, double forward_ms, double verify_ms, double commit_ms);
    // The catch-up gate's choice at the first decoding round, and what the request tells it.
    bool model_draft_allowed(int tokens_left);
    void report_catch_up(double draft_ms);
    void report_reply();

    SequenceParts p_;
    GenerationOptions options_;
    std::function<bool(int32_t)> is_end_;
    int chunk_;
    Rng rng_;
    VerifyFn verify_;
    // The request's logit processing after history_ (nullptr: none), and the round's rows under it.
    std::unique_ptr<LogitsState> logits_state_;
    PathLogits path_;
    std::vector<float> logprob_scratch_;
    RoundPolicy policy_;
    std::vector<int32_t> history_;
    std::vector<int> feature_layers_;
    std::vector<float> features_;
    int prefilled_ = 0;  // prompt tokens in the cache
    int emitted_ = 0;
    bool stopped_ = false;
    // The catch-up gate's decision for this request (decided at its first decoding round), the
    // lag it was made at, and the catch-up's time once the first drafting round took it.
    enum class CatchUp {
        Undecided,
        Allowed,
        KeptOut
    } catch_up_ = CatchUp::Undecided;
    int catch_up_lag_ = 0;
    double catch_up_ms_ = -1.0;  // < 0: not taken yet
    bool reply_reported_ = false;
    GenerationStats run_;
    // What one round carries from draft() through block() to commit(), and nothing longer: a new
    // round starts from an empty one.
    struct Round {
        bool prefill_block = false;  // the block is a prompt chunk: nothing drafted or verified
        RoundPlan plan;
        bool drafting = false;  // the drafter was started (its draft is taken in block())
        double plan_ms = 0.0;
        int base = 0;  // the target cache's size before the round: the root's position
        Draft draft;
        Draft free;  // the drafter's free draft offered this round (RoundState::free_draft), until used
        double draft_ms = 0.0;
        std::vector<double> level_ms;  // the drafter's levels (ms, this sequence's share)
        RoundDecision decision;        // built only when the round is observed
        std::vector<int> node_row;     // [n + 1] the block row of the root and of each draft node (-1: skipped)
    };
    Round round_;
    // Buffers reused round after round: the target's block and its output (a verify block's
    // logits are megabytes).
    ForwardBatch block_;
    ForwardOutput out_;
    int last_rows_ = 0, last_tokens_ = 0;
    std::chrono::steady_clock::time_point t_start_{}, t_gen_{};
};

// One step of several sequences (none done, each on its own stream of one KV pool): each one's
// plan, their drafters' forwards batched (run_drafts), their blocks, one target forward over all
// of them, then each commits; sink(i, token) receives
// sequence i's tokens (false stops it). `previous`: the last step, from which each sequence's
// policies estimate what the others will carry in this one; may_draft false: no sequence drafts.
struct StepResult {
    double forward_ms = 0.0;
    int rows = 0;            // rows of the target forward
    int verify_rows = 0;     // of them, the rows of sequences past their prompt
    int tokens = 0;          // tokens the step emitted, all sequences
    int drafting = 0;        // sequences whose drafters ran forwards
    int draft_forwards = 0;  // forwards those drafters' drafts took together (batched: one per tree level)
};
// `grammar_failures` (may be null: the GrammarError is thrown) gets (i, message) for each sequence
// whose grammar could not go on (constrain/grammar_guard.h: GrammarError) while it drafted or
// committed: the step leaves it out and goes on with the others; the caller ends it.
StepResult step_sequences(ModelRunner & target, std::span<Sequence * const> sequences,
                          const std::function<bool(size_t, int32_t)> & sink, const StepResult & previous = {},
                          bool may_draft = true, std::vector<std::pair<size_t, std::string>> * grammar_failures = nullptr);

// One sequence from prompt to end on `target`: its steps, alone.
GenerationStats generate_speculative(ModelRunner & target, const SequenceParts & parts, std::span<const int32_t> prompt,
                                     const GenerationOptions & options, const std::function<bool(int32_t)> & is_end, const TokenSink & sink);

}  // namespace specula
