#include <memory>

#include "common/error.h"
#include "engine/generate.h"
#include "engine/speculative.h"
#include "engine/target.h"
#include "kv/kv_cache.h"
#include "runtime/model.h"
#include "specula/specula.h"
#include "tokenizer/tokenizer.h"

namespace specula {

struct Engine::Impl {
    std::unique_ptr<Target> target;
    std::unique_ptr<Drafter> drafter;  // the one sequence's
};

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Engine::~Engine() = default;

std::unique_ptr<Engine> Engine::open(const EngineOptions & options) {
    auto impl = std::make_unique<Impl>();
    impl->target = Target::open(options);
    impl->drafter = impl->target->make_drafter(options.n_ctx);
    return std::unique_ptr<Engine>(new Engine(std::move(impl)));
}

GenerationStats Engine::generate(const std::string & prompt, const GenerationOptions & options, const PieceSink & sink) {
    Target & t = *impl_->target;
    const std::vector<int32_t> tokens = options.chat ? t.tokenizer->tokenize_chat({{"user", prompt}}) : t.tokenizer->tokenize(prompt);
    // Before the cost probe, which tiles the prompt to fill its batches and would never fill them.
    if (tokens.empty()) throw Error("the prompt is empty and the vocabulary adds no BOS token: nothing to generate from");
    KvCache cache(*t.backend, t.model->config(), t.options.n_ctx);
    auto is_end = [&](int32_t tok) { return t.tokenizer->is_end_of_generation(tok); };
    auto emit = [&](int32_t tok) { return sink(t.tokenizer->piece(tok)); };
    if (!impl_->drafter) return generate_plain(*t.runner, cache, tokens, options, is_end, emit);

    t.measure_verify_cost_once(cache, tokens);
    std::unique_ptr<TreeSizePolicy> tree_size = t.make_tree_size_policy();
    auto policy = t.make_draft_policy();
    std::unique_ptr<TraceWriter> trace;
    if (!options.trace_path.empty()) {
        trace = std::make_unique<TraceWriter>(options.trace_path, [&](int32_t tok) { return t.tokenizer->piece(tok); });
    }
    SpecContext ctx{*t.runner, cache, *impl_->drafter, *policy, t.tree, nullptr, nullptr, tree_size.get()};
    if (trace) {
        ctx.on_round = [&](const RoundInfo & r) { trace->round(r.round, r.base, r.draft_ms, r.verify_ms, r.decision, r.draft->tree, *r.result); };
    }
    return generate_speculative(ctx, tokens, options, is_end, emit);
}

}  // namespace specula
