#include "runtime/candidate_logits.h"

#include <cmath>
#include <cstring>
#include <string>

#include "ggml-backend.h"
#include "ggml.h"
#include "runtime/kernels/packed_matrix.h"
#include "runtime/model.h"
#include "specula/error.h"

namespace specula {

namespace {

const ggml_tensor * stored_head_rows(const Model & model) {
    const ModelWeights & w = model.weights();
    if (model.config().tied_output) return w.tok_embd;
    if (kernels::packed_matrix_of(w.output)) throw Error("candidate logits: this model's untied LM head is only held repacked");
    return w.output;
}

}  // namespace

CandidateLogits::CandidateLogits(const Model & model) : model_(model) {
    const ggml_tensor * norm = model.weights().output_norm;
    if (norm->type != GGML_TYPE_F32) throw Error("candidate logits: the final norm is not F32");
    norm_.resize(ggml_nelements(norm));
    ggml_backend_tensor_get(norm, norm_.data(), 0, ggml_nbytes(norm));
    const ggml_tensor * head = stored_head_rows(model);
    if (!ggml_get_type_traits(head->type)->to_float && head->type != GGML_TYPE_F32) {
        throw Error(std::string("candidate logits: no conversion for LM-head type ") + ggml_type_name(head->type));
    }
}

void CandidateLogits::compute(std::span<const float> hidden, std::span<const int32_t> candidates, std::span<float> out) const {
    const ModelConfig & c = model_.config();
    const size_t E = c.n_embd;
    if (hidden.size() != E || out.size() != candidates.size()) throw Error("candidate logits: wrong row or output size");
    // The exit compares candidates; it need not reproduce the full head's bits.
    double sum = 0.0;
    for (float x : hidden) sum += static_cast<double>(x) * x;
    const float scale = 1.0f / std::sqrt(static_cast<float>(sum / E) + c.rms_eps);
    normed_.resize(E);
    for (size_t i = 0; i < E; ++i) normed_[i] = hidden[i] * scale * norm_[i];

    const ggml_tensor * head = stored_head_rows(model_);
    row_bytes_.resize(head->nb[1]);
    row_.resize(E);
    for (size_t k = 0; k < candidates.size(); ++k) {
        const int32_t t = candidates[k];
        if (t < 0 || t >= c.n_vocab) throw Error("candidate logits: token id " + std::to_string(t) + " outside the vocabulary");
        ggml_backend_tensor_get(head, row_bytes_.data(), static_cast<size_t>(t) * head->nb[1], head->nb[1]);
        if (head->type == GGML_TYPE_F32) {
            std::memcpy(row_.data(), row_bytes_.data(), E * sizeof(float));
        } else {
            ggml_get_type_traits(head->type)->to_float(row_bytes_.data(), row_.data(), static_cast<int64_t>(E));
        }
        float dot = 0.0f;
        for (size_t i = 0; i < E; ++i) dot += row_[i] * normed_[i];
        out[k] = c.final_logit_softcap > 0.0f ? c.final_logit_softcap * std::tanh(dot / c.final_logit_softcap) : dot;
    }
}

}  // namespace specula
