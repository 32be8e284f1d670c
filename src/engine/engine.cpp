#include <algorithm>
#include <memory>

#include "engine/generate.h"
#include "engine/specee.h"
#include "engine/sequence.h"
#include "engine/model_bundle.h"
#include "runtime/kv_cache.h"
#include "runtime/backend.h"
#include "runtime/model.h"
#include "specula/specula.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace specula {

struct Engine::Impl {
    std::unique_ptr<ModelBundle> target;
    std::unique_ptr<Drafter> drafter;  // the one sequence's
    // The prefix cache: one stream whose rows are the target's exact K/V of `cached`, the last
    // generation's prompt and reply as far as the cache held them; the drafter's state is of the
    // same tokens. The next generation keeps the longest common prefix (a chat passing the whole
    // conversation each turn prefills only the new turn).
    std::unique_ptr<KvCache> cache;
    std::vector<int32_t> cached;

    // Cuts the cache to the longest common prefix of `cached` and `prompt`, short of the prompt's
    // last token (the first root); the drafter's state follows in the Sequence (keep_prefix).
    void keep_common_prefix(std::span<const int32_t> prompt);
    // Nothing reusable (a lossy SpecEE generation's rows are not the target's exact K/V).
    void forget() {
        cache->rollback(0);
        cached.clear();
    }
};

void Engine::Impl::keep_common_prefix(std::span<const int32_t> prompt) {
    const size_t limit = std::min({cached.size(), static_cast<size_t>(cache->size()), prompt.size() - 1});
    size_t n = 0;
    while (n < limit && cached[n] == prompt[n]) ++n;
    cache->rollback(static_cast<int>(n));
    cached.resize(n);
}

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Engine::~Engine() = default;

std::unique_ptr<Engine> Engine::open(const EngineOptions & options) {
    auto impl = std::make_unique<Impl>();
    impl->target = ModelBundle::open(options);
    impl->drafter = impl->target->make_drafter(options.n_ctx);
    impl->cache = std::make_unique<KvCache>(*impl->target->backend, impl->target->model->config(), options.n_ctx);
    return std::unique_ptr<Engine>(new Engine(std::move(impl)));
}

std::vector<int32_t> Engine::tokenize(const std::string & text, bool chat) const {
    const Tokenizer & tok = *impl_->target->tokenizer;
    return chat ? tok.tokenize_chat({{"user", text}}) : tok.tokenize(text);
}

std::vector<int32_t> Engine::tokenize_chat(const std::vector<std::pair<std::string, std::string>> & messages) const {
    return impl_->target->tokenizer->tokenize_chat(messages);
}

std::string Engine::detokenize(std::span<const int32_t> tokens) const {
    return impl_->target->tokenizer->detokenize({tokens.begin(), tokens.end()});
}

std::string Engine::piece(int32_t token) const { return impl_->target->tokenizer->piece(token); }

GenerationStats Engine::generate(std::span<const int32_t> tokens, const GenerationOptions & options, const TokenSink & sink) {
    ModelBundle & t = *impl_->target;
    // Before the cost probe, which tiles the prompt to fill its batches and would never fill them.
    if (tokens.empty()) throw Error("the prompt is empty and the vocabulary adds no BOS token: nothing to generate from");
    for (int32_t tok : tokens) {
        if (tok < 0 || tok >= t.model->config().n_vocab) {
            throw Error("prompt token id " + std::to_string(tok) + " is outside the " + std::to_string(t.model->config().n_vocab) +
                        "-token vocabulary");
        }
    }
    if (static_cast<int>(tokens.size()) >= t.options.n_ctx) {
        throw Error("prompt is " + std::to_string(tokens.size()) + " tokens, longer than the " + std::to_string(t.options.n_ctx) + "-token context");
    }
    KvCache & cache = *impl_->cache;
    auto is_end = [&](int32_t tok) { return ends_generation(options, *t.tokenizer, tok); };
    const GenerationMode mode = t.generation_mode();
    if (mode == GenerationMode::Plain) {
        impl_->keep_common_prefix(tokens);
        const int n_cached = cache.size();
        std::vector<int32_t> seen(tokens.begin(), tokens.end());
        impl_->cached.clear();  // until the generation has ended whole
        const std::unique_ptr<LogitsState> processing = logits_processing(options, tokens, t.tokenizer.get());
        GenerationStats stats = generate_plain(
            *t.runner, cache, tokens.subspan(n_cached), options, is_end,
            [&](int32_t tok) {
                seen.push_back(tok);
                return sink(tok);
            },
            processing.get());
        seen.resize(std::min(seen.size(), static_cast<size_t>(cache.size())));
        impl_->cached = std::move(seen);
        stats.n_prompt = static_cast<int>(tokens.size());
        stats.n_cached = n_cached;
        stats.kernels = t.backend->kernels_summary();
        return stats;
    }
    if (mode == GenerationMode::SpeceeLossy) {
        check_lossy_early_exit_options(options);
        impl_->forget();
        EarlyExitDecoder decoder(*t.model, *t.runner, t.exit_predictor.get(), t.options.specee_online);
        EarlyExitStats exits;
        const int n_layer = t.model->config().n_layer;
        int position = static_cast<int>(tokens.size());
        auto on_token = [&](const ExitStep & s) {
            if (options.on_exit) options.on_exit(ExitReport{position, s.token, s.exit_layer, n_layer});
            ++position;
        };
        GenerationStats stats = generate_early_exit(decoder, *t.runner, cache, *impl_->drafter, tokens, options, t.exit_threshold,
                                                    is_end, sink, exits, on_token);
        stats.early_exit = exits.summary(t.model->config().n_layer);
        stats.kernels = t.backend->kernels_summary();
        return stats;
    }

    if (t.needs_verify_cost() && t.verify_cost_ms.empty()) impl_->forget();  // the probe runs in the empty cache
    t.measure_verify_cost_once(cache, tokens, 0, impl_->drafter->feature_layers());
    impl_->keep_common_prefix(tokens);
    const RoundPolicies policies = t.make_round_policies(mode);
    SequenceParts parts = t.sequence_parts(mode, cache, impl_->drafter.get(), policies.length.get(), policies.tree_size.get());
    if (options.on_round) parts.on_round = [&](const RoundInfo & r) { options.on_round(round_report(r)); };
    impl_->cached.clear();  // until the generation has ended whole
    Sequence seq(parts, tokens, options, is_end);
    Sequence * const one[1] = {&seq};
    while (!seq.done()) step_sequences(*t.runner, one, [&](size_t, int32_t tok) { return sink(tok); });
    impl_->cached.assign(seq.history().begin(), seq.history().begin() + seq.n_exact());
    GenerationStats stats = seq.stats();
    stats.verify_cost_ms = t.verify_cost_ms;
    if (const auto * exits = dynamic_cast<const EarlyExitDrafter *>(impl_->drafter.get())) {
        stats.early_exit = exits->exit_stats().summary(t.model->config().n_layer);
    }
    stats.kernels = t.backend->kernels_summary();
    return stats;
}

GenerationStats Engine::generate(const std::string & prompt, const GenerationOptions & options, const PieceSink & sink) {
    return generate(tokenize(prompt, options.chat), options, sink);
}

GenerationStats Engine::generate(std::span<const int32_t> prompt, const GenerationOptions & options, const PieceSink & sink) {
    Utf8Stream utf8;
    bool more = true;
    GenerationStats stats = generate(prompt, options, [&](int32_t token) {
        const Tokenizer & tok = *impl_->target->tokenizer;
        const bool end = options.stop_at_end_of_generation && ends_generation(options, tok, token);
        const std::string text = utf8.push(end ? std::string() : tok.piece(token, options.special_token_text));
        return more = text.empty() || sink(text);
    });
    if (const std::string rest = utf8.flush(); more && !rest.empty()) sink(rest);
    return stats;
}

}  // namespace specula
