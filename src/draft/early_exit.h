#pragma once
// SpecEE early exit (docs/specee.md), the drafting side: one decode token runs the target in
// layer segments that end at the predictor's scheduled layers. At each, the drafter's candidates
// are scored through the final norm and their own LM-head rows only (CandidateLogits); when the
// layer's predictor is confident, the best candidate is emitted, the remaining layers run no
// attention or FFN, and their K/V rows for the token are the exit state's projections
// (ForwardBatch::kv_only), so later tokens attend to a complete cache. Without an exit, the last
// segment ends in the full LM head, and the token's logits and cache rows are those of one full
// forward, bit for bit. EarlyExitDrafter drafts with it (the lossless mode); the lossy mode's
// sequence, which emits exited tokens unverified, is engine/specee.h's.
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "draft/drafter.h"
#include "runtime/candidate_logits.h"
#include "runtime/exit_predictor.h"
#include "runtime/forward.h"

namespace specula {

class KvCache;
class Model;

struct ExitStep {
    int exit_layer = -1;          // layer whose entering state decided the token; -1: no exit (full LM head)
    int32_t token = -1;           // exited: the best candidate; else the full logits' argmax
    std::vector<float> logits;    // no exit: the full logits row [n_vocab]
    std::vector<float> features;  // the state entering each feature layer, concatenated; past an
                                  // exit layer, the exit state (the layers there never ran)
};

class EarlyExitDecoder {
public:
    // `online`: the paper's second scheduling level (online_probe_layers) over the predictor's
    // layers; else the offline schedule alone.
    EarlyExitDecoder(const Model & model, ModelRunner & runner, const ExitPredictor * predictor, bool online = false);

    // A new sequence: the online level forgets the previous one's stopping layers.
    void begin_sequence() { recent_stops_.clear(); }
    // Decodes `token` at `position` (appended to `cache`). Probes at the scheduled layers when
    // there are candidates; exits where the probability exceeds `threshold` (1: never).
    ExitStep step(KvCache & cache, int32_t token, int position, std::span<const int32_t> candidates, float threshold,
                  std::span<const int> feature_layers);
    // The same with the predictor replaced by an exit forced at `exit_layer` (1..n_layer): the
    // runtime alone, for tests and for collecting training features.
    ExitStep step_forced(KvCache & cache, int32_t token, int position, std::span<const int32_t> candidates, int exit_layer,
                         std::span<const int> feature_layers);

    // Per layer the last step probed: the candidates' logits there ([layers][4]).
    const std::vector<std::vector<float>> & probe_logits() const { return probe_logits_; }

private:
    ExitStep run(KvCache & cache, int32_t token, int position, std::span<const int32_t> candidates,
                 std::span<const int> schedule, const std::function<bool(size_t, std::span<const float>)> & exits,
                 std::span<const int> feature_layers);
    const Model & model_;
    ModelRunner & runner_;
    const ExitPredictor * predictor_;
    bool online_;
    std::vector<int> recent_stops_;  // the online level's window: the last probed tokens' stopping layers
    CandidateLogits probe_;
    ForwardOutput out_;
    std::vector<std::vector<float>> probe_logits_;
};

// The drafter's top candidates for the token after history.back(): the root's children of a
// one-level draft of kExitCandidates children (an EAGLE head: its top 4 at T = 0). Empty when
// the drafter has nothing to draft from yet (no target features before the root).
std::vector<int32_t> top_candidates(Drafter & drafter, std::span<const int32_t> history);

// Where tokens left the target: exits_at[l] tokens decided by the state entering layer l
// (l == n_layer: after every layer, without the full LM head); full = tokens that ran it.
struct EarlyExitStats {
    std::vector<int> exits_at;
    int full = 0;
    int probed = 0;  // tokens that had candidates to probe
    int probes = 0;  // predictor runs (scheduled layers probed), all tokens
    void add(int exit_layer, int n_layer, int predictor_runs = 0);
    void merge(const EarlyExitStats & other);
    int exited() const;
    // Mean layer at which tokens stopped (a full token counts as n_layer).
    double mean_exit_layer(int n_layer) const;
    // "exited 812/1024 (79%), mean exit layer 14.2 of 18; exits by layer: 9:40 12:300 ...; predictor runs per token 2.10"
    std::string summary(int n_layer) const;
};

// SpecEE's lossless mode: early-exited tokens as drafts. The drafter runs the target itself in
// its own cache, token after token with exits (as the lossy mode decodes), and proposes the chain
// of tokens up to and including the first that did not exit; the full target verifies them, so
// the output is plain decoding's (greedy-identical; exact distribution at T > 0, the chain being
// deterministic drafts). Its own cache keeps the exit-state K/V rows of accepted drafts (only
// the drafts' quality depends on them); rows the verifier settled beyond them are caught up at
// full depth, the prompt included.
class EarlyExitDrafter : public Drafter {
public:
    EarlyExitDrafter(const Model & model, const ExitPredictor & predictor, float threshold, std::unique_ptr<Drafter> candidates,
                     int n_ctx, bool online = false);
    ~EarlyExitDrafter() override;
    const char * name() const override { return "specee"; }
    void start(const DraftRequest & request) override;
    Draft take() override { return std::move(draft_); }
    void accept(const Acceptance & acceptance) override;
    void reset() override;
    // Its cache holds exit-state rows of accepted drafts, which a cold start would not have: reset,
    // and its first draft catches up on the whole prompt at full depth itself.
    int keep_prefix(int n_common, int) override {
        reset();
        return n_common;
    }
    // The head's layers, although this drafter catches up on features itself: a server's step
    // is one forward with one tap list, shared with the EAGLE-3 sequences beside this one.
    std::vector<int> feature_layers() const override { return feature_layers_; }
    const EarlyExitStats & exit_stats() const { return stats_; }
    // A server's slot keeps its drafter from request to request, each with its own threshold and counters.
    void set_threshold(float threshold) { threshold_ = threshold; }
    void clear_exit_stats() { stats_ = {}; }

private:
    const Model & model_;
    std::unique_ptr<ModelRunner> runner_;
    std::unique_ptr<KvCache> cache_;
    std::unique_ptr<Drafter> candidates_;
    EarlyExitDecoder decoder_;
    float threshold_;
    std::vector<int> feature_layers_;
    EarlyExitStats stats_;
    Draft draft_;
    int draft_root_ = 0;                              // position of the last draft's root
    std::vector<std::vector<float>> draft_features_;  // the head's features of each position the last draft ran
};

}  // namespace specula
