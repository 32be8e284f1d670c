// Scheduler's embeddings (serve --embeddings): requests queued for the worker, which runs their
// forwards between steps in a KV stream of their own (every forward of the target runs on the
// worker: docs/server.md, "One thread computes").
#include <cmath>
#include <cstring>

#include "engine/model_bundle.h"
#include "ggml-backend.h"
#include "ggml.h"
#include "runtime/forward.h"
#include "runtime/kv_cache.h"
#include "runtime/model.h"
#include "server/scheduler_slot.h"
#include "specula/error.h"

namespace specula {

namespace {
// The target's output norm weights as floats, however the GGUF stores them.
std::vector<float> output_norm_weights(const Model & model) {
    const ggml_tensor * w = model.weights().output_norm;
    std::vector<float> out(static_cast<size_t>(ggml_nelements(w)));
    std::vector<uint8_t> raw(ggml_nbytes(w));
    ggml_backend_tensor_get(w, raw.data(), 0, raw.size());
    if (w->type == GGML_TYPE_F32) std::memcpy(out.data(), raw.data(), raw.size());
    else ggml_get_type_traits(w->type)->to_float(raw.data(), out.data(), static_cast<int64_t>(out.size()));
    return out;
}
}  // namespace

void Scheduler::start_embeddings() {
    embed_cache_ = std::make_unique<KvCache>(*target_.backend, target_.model->config(), target_.options.n_ctx);
    output_norm_ = output_norm_weights(*target_.model);
}

std::future<std::vector<std::vector<float>>> Scheduler::embed(std::vector<std::vector<int32_t>> inputs) {
    EmbedRequest q{std::move(inputs), {}};
    std::future<std::vector<std::vector<float>>> answer = q.done.get_future();
    try {
        if (!embed_cache_) throw Error("this server computes no embeddings (serve --embeddings)");
        for (const auto & tokens : q.inputs) {
            if (tokens.empty() || static_cast<int>(tokens.size()) > context_size()) {
                throw Error("an input of " + std::to_string(tokens.size()) + " tokens: embeddings take 1.." + std::to_string(context_size()));
            }
        }
        std::lock_guard lock(mutex_);
        if (!failure_.empty()) throw Error(failure_);
        if (stopping_) throw Error("the server is shutting down");
        embed_queue_.push_back(std::move(q));
    } catch (...) {
        q.done.set_exception(std::current_exception());
        return answer;
    }
    cv_.notify_all();
    return answer;
}

void Scheduler::run_embeddings(std::deque<EmbedRequest> & requests, SchedulerMetrics & counts) {
    const auto t0 = std::chrono::steady_clock::now();
    const int n_layer = target_.model->config().n_layer;
    const float eps = target_.model->config().rms_eps;
    const size_t E = output_norm_.size();
    ForwardOutput out;
    for (EmbedRequest & q : requests) {
        try {
            std::vector<std::vector<float>> vectors;
            for (const std::vector<int32_t> & tokens : q.inputs) {
                embed_cache_->rollback(0);
                std::vector<float> rows;
                for (size_t begin = 0; begin < tokens.size(); begin += static_cast<size_t>(options_.prefill_chunk)) {
                    const size_t n = std::min(tokens.size() - begin, static_cast<size_t>(options_.prefill_chunk));
                    ForwardBatch b = ForwardBatch::causal(std::span(tokens).subspan(begin, n), embed_cache_->size(), {});
                    b.tap_layers = {n_layer};  // the residual stream after the last layer, before the output norm
                    target_.runner->forward(b, *embed_cache_, out);
                    ++counts.embedding_forwards;
                    counts.embedding_tokens += n;
                    rows.insert(rows.end(), out.taps.at(0).begin(), out.taps.at(0).end());
                }
                // The output norm (RMS norm times its weights), as the LM head reads the state.
                for (size_t r = 0; r < rows.size() / E; ++r) {
                    float * x = rows.data() + r * E;
                    double sq = 0.0;
                    for (size_t j = 0; j < E; ++j) sq += double(x[j]) * x[j];
                    const float scale = static_cast<float>(1.0 / std::sqrt(sq / double(E) + eps));
                    for (size_t j = 0; j < E; ++j) x[j] = x[j] * scale * output_norm_[j];
                }
                vectors.push_back(embeddings::pool(rows, static_cast<int>(E), options_.pooling));
            }
            q.done.set_value(std::move(vectors));
        } catch (...) {
            q.done.set_exception(std::current_exception());
        }
    }
    embed_cache_->rollback(0);
    counts.embedding_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace specula
