#include <memory>

#include "common/error.h"
#include "engine/generate.h"
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
};

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Engine::~Engine() = default;

std::unique_ptr<Engine> Engine::open(const EngineOptions & options) {
    auto impl = std::make_unique<Impl>();
    impl->options = options;
    if (options.n_ctx <= 0) throw Error("context size must be positive");
    impl->backend = std::make_unique<Backend>(BackendOptions{options.device, options.n_threads});
    impl->model = Model::load(options.model_path, *impl->backend);
    impl->tokenizer = std::make_unique<Tokenizer>(options.model_path);
    if (impl->tokenizer->n_vocab() > impl->model->config().n_vocab) {
        throw Error(options.model_path + ": tokenizer has more tokens than the embedding matrix");
    }
    return std::unique_ptr<Engine>(new Engine(std::move(impl)));
}

GenerationStats Engine::generate(const std::string & prompt, const GenerationOptions & options, const PieceSink & sink) {
    Impl & s = *impl_;
    const std::vector<int32_t> tokens = s.tokenizer->tokenize(prompt);
    KvCache cache(*s.backend, s.model->config(), s.options.n_ctx);
    ModelRunner runner(*s.model);
    return generate_plain(runner, cache, tokens, options,
                          [&](int32_t t) { return s.tokenizer->is_end_of_generation(t); },
                          [&](int32_t t) { return sink(s.tokenizer->piece(t)); });
}

}  // namespace specula
