#include <memory>
#include <numeric>

#include "common/error.h"
#include "draft/draft_model.h"
#include "draft/eagle.h"
#include "runtime/eagle_head.h"
#include "draft/ngram.h"
#include "engine/generate.h"
#include "engine/speculative.h"
#include "kv/kv_cache.h"
#include "runtime/backend.h"
#include "runtime/forward.h"
#include "runtime/model.h"
#include "specula/specula.h"
#include "tokenizer/tokenizer.h"

namespace specula {

struct Engine::Impl {
    EngineOptions options;
    std::unique_ptr<Backend> backend;
    std::unique_ptr<Model> model;
    std::unique_ptr<Tokenizer> tokenizer;
    std::unique_ptr<Model> draft_model;
    std::unique_ptr<EagleHead> head;
    std::unique_ptr<Drafter> drafter;
    DraftPolicyKind policy = DraftPolicyKind::Fixed;
    TreeBudget tree;
    std::vector<double> verify_cost_ms;  // measured once: cost policy, default tree size
};

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Engine::~Engine() = default;

std::unique_ptr<Engine> Engine::open(const EngineOptions & options) {
    auto impl = std::make_unique<Impl>();
    impl->options = options;
    if (options.n_ctx <= 0) throw Error("context size must be positive");
    impl->backend = std::make_unique<Backend>(BackendOptions{options.device, options.n_threads, options.attention, options.kernels});
    impl->model = Model::load(options.model_path, *impl->backend);
    impl->tokenizer = std::make_unique<Tokenizer>(options.model_path);
    if (impl->tokenizer->n_vocab() > impl->model->config().n_vocab) {
        throw Error(options.model_path + ": tokenizer has more tokens than the embedding matrix");
    }

    const int n_drafters = !options.draft_model_path.empty() + !options.eagle_path.empty() + !options.eagle3_path.empty() + options.ngram;
    if (n_drafters > 1) throw Error("choose one drafter: --draft, --eagle, --eagle3 or --ngram");
    const bool eagle = !options.eagle_path.empty() || !options.eagle3_path.empty();
    if (n_drafters == 1) {
        impl->policy = parse_draft_policy(options.draft_policy);
        const std::string shape = options.tree.empty() ? (eagle ? "dynamic" : "chain") : options.tree;
        impl->tree = TreeBudget{parse_tree_shape(shape), options.tree_depth, options.tree_branching, options.tree_nodes};
        if (impl->tree.shape != TreeShape::Chain && (options.tree_depth < 1 || options.tree_branching < 1 || options.tree_nodes < 0)) {
            throw Error("tree depth and branching must be at least 1, tree nodes at least 0");
        }
        if (impl->tree.shape != TreeShape::Chain && options.ngram) throw Error("the n-gram drafter drafts chains only (--tree chain)");
        if (options.draft_max < 1) throw Error("--draft-max must be at least 1");
        if (options.draft_max + 2 > options.n_ctx) {
            throw Error("draft length " + std::to_string(options.draft_max) + " does not fit the " +
                        std::to_string(options.n_ctx) + "-token context");
        }
    }
    if (!options.draft_model_path.empty()) {
        impl->draft_model = Model::load(options.draft_model_path, *impl->backend);
        const Tokenizer draft_vocab(options.draft_model_path);
        if (draft_vocab.fingerprint() != impl->tokenizer->fingerprint() ||
            impl->draft_model->config().n_vocab != impl->model->config().n_vocab) {
            throw Error("draft model " + options.draft_model_path + " has a different vocabulary (" +
                        std::to_string(draft_vocab.n_vocab()) + " tokens) than the target (" +
                        std::to_string(impl->tokenizer->n_vocab()) + " tokens)");
        }
        impl->drafter = std::make_unique<DraftModelDrafter>(*impl->draft_model, options.n_ctx);
    } else if (eagle) {
        const std::string & path = options.eagle_path.empty() ? options.eagle3_path : options.eagle_path;
        impl->head = EagleHead::load(path, *impl->model, *impl->backend);
        const EagleKind want = options.eagle_path.empty() ? EagleKind::Eagle3 : EagleKind::Eagle1;
        if (impl->head->config().kind != want) {
            throw Error(path + (want == EagleKind::Eagle3 ? " is an EAGLE-1 head: use --eagle" : " is an EAGLE-3 head: use --eagle3"));
        }
        impl->drafter = std::make_unique<EagleDrafter>(*impl->head, options.n_ctx);
    } else if (options.ngram) {
        impl->drafter = std::make_unique<NgramDrafter>(options.ngram_min, options.ngram_max);
    }
    return std::unique_ptr<Engine>(new Engine(std::move(impl)));
}

GenerationStats Engine::generate(const std::string & prompt, const GenerationOptions & options, const PieceSink & sink) {
    Impl & s = *impl_;
    const std::vector<int32_t> tokens =
        s.tokenizer->tokenize(options.chat ? s.tokenizer->apply_chat_template({{"user", prompt}}, true) : prompt);
    // Before the cost probe, which tiles the prompt to fill its batches and would never fill them.
    if (tokens.empty()) throw Error("the prompt is empty and the vocabulary adds no BOS token: nothing to generate from");
    KvCache cache(*s.backend, s.model->config(), s.options.n_ctx);
    ModelRunner runner(*s.model);
    auto is_end = [&](int32_t t) { return s.tokenizer->is_end_of_generation(t); };
    auto emit = [&](int32_t t) { return sink(s.tokenizer->piece(t)); };
    if (!s.drafter) return generate_plain(runner, cache, tokens, options, is_end, emit);

    const int k_max = s.options.draft_max;
    const bool auto_tree = s.tree.shape != TreeShape::Chain && s.tree.max_nodes == 0;
    if ((s.policy == DraftPolicyKind::Cost || auto_tree) && s.verify_cost_ms.empty()) {
        // Once per engine, at a typical depth (attention grows with it), on the prompt's token ids.
        const int max_tokens = std::min(std::max(k_max + 1, auto_tree ? kAutoTreeMaxNodes + 1 : 0), s.options.n_ctx);
        const int depth = std::min(128, s.options.n_ctx - max_tokens);
        std::vector<int32_t> probe;
        while (static_cast<int>(probe.size()) < depth + max_tokens) probe.insert(probe.end(), tokens.begin(), tokens.end());
        if (depth > 0) prefill(runner, cache, std::span(probe).first(depth));
        s.verify_cost_ms = measure_verify_cost(runner, cache, std::span(probe).subspan(depth), max_tokens);
        cache.rollback(0);
    }
    TreeBudget tree = s.tree;
    std::unique_ptr<TreeSizePolicy> tree_size;
    if (auto_tree) tree_size = std::make_unique<TreeSizePolicy>(s.verify_cost_ms);
    auto policy = make_draft_policy(s.policy, k_max, s.verify_cost_ms);
    std::unique_ptr<TraceWriter> trace;
    if (!options.trace_path.empty()) {
        trace = std::make_unique<TraceWriter>(options.trace_path, [&](int32_t t) { return s.tokenizer->piece(t); });
    }
    SpecContext ctx{runner, cache, *s.drafter, *policy, tree, nullptr, nullptr, tree_size.get()};
    if (trace) {
        ctx.on_round = [&](const RoundInfo & r) { trace->round(r.round, r.base, r.draft_ms, r.verify_ms, r.decision, r.draft->tree, *r.result); };
    }
    return generate_speculative(ctx, tokens, options, is_end, emit);
}

}  // namespace specula
