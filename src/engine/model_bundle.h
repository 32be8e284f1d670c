#pragma once
// The shared model bundle: what every sequence of an engine shares: the target model, its tokenizer, the drafter's model or
// head, the drafting defaults and the measured verify-cost curve, and the runner whose graph cache
// all sequences' target forwards use. The CLI, the engine and the server open it; drafters are
// assembled in engine/drafter_factory.h (which the benchmarks use too).
// Per-sequence state (cache stream, drafter instance, policies, Rng) is made from it per sequence.
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "draft/drafter.h"
#include "engine/drafter_factory.h"
#include "engine/generation_mode.h"
#include "policy/catch_up_gate.h"
#include "policy/draft_length.h"
#include "policy/tree_size.h"
#include "specula/specula.h"
#include "tree/tree_builder.h"

namespace specula {

class Backend;
struct BackendOptions;
class EarlyExitDrafter;
class ExitPredictor;
class KvCache;
class Model;
class ModelRunner;
class Tokenizer;

// The backend settings of `options`: ModelBundle's, and the benchmarks' for the same options.
BackendOptions backend_options(const EngineOptions & options);

struct ModelBundle {
    static std::unique_ptr<ModelBundle> open(const EngineOptions & options);  // throws Error
    ~ModelBundle();

    EngineOptions options;
    std::unique_ptr<Backend> backend;
    // The drafter's when the target runs on remote devices: drafting stays on the local CPU.
    std::unique_ptr<Backend> draft_backend;
    std::unique_ptr<Model> model;
    std::unique_ptr<Tokenizer> tokenizer;
    DrafterFactory drafter;
    std::unique_ptr<ModelRunner> runner;  // the target's forwards, every sequence's
    bool speculative = false;             // a drafter was chosen
    DraftPolicyKind policy = DraftPolicyKind::Fixed;
    TreeBudget tree;
    std::vector<double> verify_cost_ms;             // measured once: cost policy, default tree size
    int verify_cost_depth = 0;                      // the context it was measured at (tokens)
    double verify_cost_row_depth_ms = 0.0;          // a row past the first: ms more per token deeper
    std::unique_ptr<ExitPredictor> exit_predictor;  // SpecEE (options.specee_path)
    float exit_threshold = 0.5f;

    bool needs_verify_cost() const;
    // Measures verify_cost_ms once, on `tokens` tiled, in the empty `cache` (left empty), for
    // forwards of 1 up to the largest a sequence verifies, or `at_least_rows` (a server's steps
    // carry several sequences' rows); then verify_cost_row_depth_ms from the same rows timed
    // deeper, where the cache has room for that. The forwards tap `tap_layers` as the generation's
    // verify blocks will (its drafter's feature layers), so they build the graphs those reuse.
    void measure_verify_cost_once(KvCache & cache, std::span<const int32_t> tokens, int at_least_rows = 0,
                                  std::span<const int> tap_layers = {});
    // Per sequence: a drafter with its own caches of n_ctx slots (nullptr without speculation)
    // and its policies (the tree-size policy is nullptr unless the tree size is chosen per round).
    std::unique_ptr<Drafter> make_drafter(int n_ctx) const;
    // SpecEE's lossless drafter for one sequence (its own target cache and EAGLE-3 head); throws
    // without exit predictors.
    std::unique_ptr<EarlyExitDrafter> make_exit_drafter(int n_ctx, float threshold) const;
    // Drafters for n sequences stepped together, their forwards batched (DrafterFactory::make_group).
    std::vector<std::unique_ptr<Drafter>> make_drafters(int n_ctx, int n) const;
    std::unique_ptr<DraftLengthPolicy> make_draft_policy() const;
    std::unique_ptr<TreeSizePolicy> make_tree_size_policy() const;
    // A catch-up gate for a server slot's requests (policy/catch_up_gate.h); nullptr before the
    // verify cost is measured.
    std::unique_ptr<CatchUpGate> make_catch_up_gate() const;

    // The mode the options choose (Engine, `specula generate`): Plain without a drafter, a SpecEE
    // mode with exit predictors, else Speculative. A server picks SpecEE modes per request.
    GenerationMode generation_mode() const;
    VerifyCostCurve verify_cost() const { return {verify_cost_ms, verify_cost_depth, verify_cost_row_depth_ms}; }
    // The mode's round policies and a sequence's parts under this bundle's drafting rules
    // (engine/generation_mode.h).
    RoundPolicies make_round_policies(GenerationMode mode) const;
    SequenceParts sequence_parts(GenerationMode mode, KvCache & cache, Drafter * sequence_drafter, DraftLengthPolicy * length, TreeSizePolicy * tree_size,
                                 std::function<void(const RoundInfo &)> on_round = {}) const;
};

}  // namespace specula
