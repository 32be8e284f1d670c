#include "engine/model_bundle.h"

#include <algorithm>

#include "specula/error.h"
#include "common/progress.h"
#include "engine/generate.h"
#include "engine/verify_cost_probe.h"
#include "engine/specee.h"
#include "runtime/exit_predictor.h"
#include "runtime/kv_cache.h"
#include "runtime/backend.h"
#include "runtime/forward.h"
#include "runtime/model.h"
#include "tokenizer/tokenizer.h"

namespace specula {

BackendOptions backend_options(const EngineOptions & options) {
    return BackendOptions{options.device, options.n_threads, options.attention, options.kernels, options.split, options.rpc_timeout};
}

ModelBundle::~ModelBundle() = default;

std::unique_ptr<ModelBundle> ModelBundle::open(const EngineOptions & options) {
    auto t = std::make_unique<ModelBundle>();
    t->options = options;
    if (options.n_ctx <= 0) throw Error("context size must be positive");
    t->backend = std::make_unique<Backend>(backend_options(options));
    const DrafterSpec & spec = options.drafter;
    Progress progress("loading " + options.model_path, spec.kind == DrafterKind::None ? 2 : 3);
    t->model = Model::load(options.model_path, *t->backend);
    progress.step("weights");
    t->tokenizer = std::make_unique<Tokenizer>(options.model_path);
    if (!options.chat_template.empty()) t->tokenizer->set_chat_template(options.chat_template);
    progress.step("tokenizer");
    if (t->tokenizer->n_vocab() > t->model->config().n_vocab) {
        throw Error(options.model_path + ": tokenizer has more tokens than the embedding matrix");
    }
    t->runner = std::make_unique<ModelRunner>(*t->model);

    t->speculative = spec.kind != DrafterKind::None;
    DrafterSpec drafter_spec = spec;
    if (options.specee_lossless && options.specee_path.empty()) throw Error("--specee-lossless needs --specee FILE");
    if (options.specee_online && options.specee_path.empty()) throw Error("--specee-online needs --specee FILE");
    if (!options.specee_path.empty() && spec.lookup.value_or(false)) {
        throw Error("--lookup grafts prompt lookup into the head's trees, but SpecEE (--specee) takes the head's own candidates: use one of them");
    }
    if (t->speculative) {
        // SpecEE's lossless drafts are chains (the tokens up to the first that did not exit).
        EngineOptions drafting = options;
        if (options.specee_lossless && !options.tree) drafting.tree = TreeShape::Chain;
        const DraftingRules rules = drafting_rules(drafting, spec.kind);
        t->policy = rules.policy;
        t->tree = rules.tree;
        // SpecEE takes the head's own top candidates each step: a graft would add lookup's among them.
        drafter_spec.lookup = rules.lookup && options.specee_path.empty();
    }
    if (t->backend->remote() && spec.kind != DrafterKind::None) {
        t->draft_backend = std::make_unique<Backend>(BackendOptions{"cpu", options.n_threads, options.attention, options.kernels});
    }
    t->drafter = DrafterFactory::open(drafter_spec, t->draft_backend ? *t->draft_backend : *t->backend, *t->model, *t->tokenizer);
    if (t->speculative) progress.step("drafter");
    if (!options.specee_path.empty()) {
        if (spec.kind != DrafterKind::Eagle3) throw Error("--specee takes its candidates from an EAGLE-3 head: add --eagle3 FILE");
        t->exit_predictor = ExitPredictor::load(options.specee_path, *t->model);
        t->exit_threshold = options.specee_threshold < 0.0f ? t->exit_predictor->default_threshold() : options.specee_threshold;
        if (!(t->exit_threshold <= 1.0f)) throw Error("--specee-threshold must be within 0..1 (1: never exit)");
    }
    return t;
}

std::unique_ptr<Drafter> ModelBundle::make_drafter(int n_ctx) const {
    if (exit_predictor && options.specee_lossless) return make_exit_drafter(n_ctx, exit_threshold);
    return drafter.make(n_ctx);
}

std::unique_ptr<EarlyExitDrafter> ModelBundle::make_exit_drafter(int n_ctx, float threshold) const {
    if (!exit_predictor) throw Error("SpecEE needs exit predictors (--specee FILE)");
    return std::make_unique<EarlyExitDrafter>(*model, *exit_predictor, threshold, drafter.make(n_ctx), n_ctx, options.specee_online);
}

std::vector<std::unique_ptr<Drafter>> ModelBundle::make_drafters(int n_ctx, int n) const { return drafter.make_group(n_ctx, n); }

bool ModelBundle::needs_verify_cost() const {
    const bool auto_tree = tree.shape != TreeShape::Chain && tree.max_nodes == 0;
    return speculative && (policy == DraftPolicyKind::Cost || auto_tree);
}

void ModelBundle::measure_verify_cost_once(KvCache & cache, std::span<const int32_t> tokens, int at_least_rows, std::span<const int> tap_layers) {
    if (!needs_verify_cost() || !verify_cost_ms.empty()) return;
    if (tokens.empty()) throw Error("measure_verify_cost_once: no tokens");
    // At a typical depth (attention grows with it), on the given token ids.
    const bool auto_tree = tree.shape != TreeShape::Chain && tree.max_nodes == 0;
    const int max_tokens =
        std::min(std::max({options.draft_max + 1, auto_tree ? kAutoTreeMaxNodes + 1 : 0, at_least_rows}), cache.capacity());
    const int depth = std::min(128, cache.capacity() - max_tokens);
    // Then 1 and `rows` rows again `deeper` tokens on: the policies' prior for how much more a row
    // costs deeper in a context (VerifyCost), where the cache has room for it.
    const int deeper = std::min(kDepthProbeTokens, cache.capacity() - max_tokens - depth), rows = std::min(8, max_tokens);
    const bool probe_depth = deeper >= kDepthProbeTokens / 2 && rows >= 2;
    std::vector<int32_t> probe;
    while (static_cast<int>(probe.size()) < depth + std::max(max_tokens, probe_depth ? deeper + rows : 0)) {
        probe.insert(probe.end(), tokens.begin(), tokens.end());
    }
    Progress progress("measuring the verify cost", 1);
    if (depth > 0) prefill(*runner, cache, std::span(probe).first(depth));
    verify_cost_ms = measure_verify_cost(*runner, cache, std::span(probe).subspan(depth), max_tokens, 3, tap_layers);
    verify_cost_depth = depth;
    if (probe_depth) verify_cost_row_depth_ms = measure_row_depth_ms(*runner, cache, std::span(probe).subspan(depth), verify_cost_ms, rows, deeper);
    progress.step("1.." + std::to_string(max_tokens) + " rows");
    cache.rollback(0);
}

std::unique_ptr<DraftLengthPolicy> ModelBundle::make_draft_policy() const {
    return specula::make_draft_policy(policy, options.draft_max, verify_cost_ms, verify_cost_depth, verify_cost_row_depth_ms);
}

std::unique_ptr<CatchUpGate> ModelBundle::make_catch_up_gate() const {
    return verify_cost_ms.empty() ? nullptr : std::make_unique<CatchUpGate>(verify_cost_ms[0]);
}

std::unique_ptr<TreeSizePolicy> ModelBundle::make_tree_size_policy() const {
    return specula::make_tree_size_policy(tree, options.draft_max, verify_cost());
}

GenerationMode ModelBundle::generation_mode() const {
    if (!speculative) return GenerationMode::Plain;
    if (exit_predictor) return options.specee_lossless ? GenerationMode::SpeceeLossless : GenerationMode::SpeceeLossy;
    return GenerationMode::Speculative;
}

RoundPolicies ModelBundle::make_round_policies(GenerationMode mode) const {
    return specula::make_round_policies(mode, policy, options.draft_max, tree, verify_cost());
}

SequenceParts ModelBundle::sequence_parts(GenerationMode mode, KvCache & cache, Drafter * sequence_drafter, DraftLengthPolicy * length,
                                          TreeSizePolicy * tree_size, std::function<void(const RoundInfo &)> on_round) const {
    SequenceParts parts = specula::sequence_parts(mode, cache, sequence_drafter, tree, length, tree_size, std::move(on_round));
    parts.tokenizer = tokenizer.get();
    return parts;
}

}  // namespace specula
