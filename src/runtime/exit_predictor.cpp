#include "runtime/exit_predictor.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "ggml.h"
#include "runtime/gguf_file.h"
#include "runtime/gguf_validate.h"
#include "runtime/model.h"
#include "specula/error.h"

namespace specula {

void exit_features(std::span<const float> logits, std::span<float> previous_probs, bool first_layer, std::span<float> features) {
    const size_t K = kExitCandidates;
    if (logits.size() != K || previous_probs.size() != K || features.size() != kExitFeatures) throw Error("exit features: wrong sizes");
    const float top = *std::max_element(logits.begin(), logits.end());
    float sum = 0.0f;
    for (size_t i = 0; i < K; ++i) sum += std::exp(logits[i] - top);
    for (size_t i = 0; i < K; ++i) {
        const float p = std::exp(logits[i] - top) / sum;
        features[i] = logits[i];
        features[K + i] = p;
        features[2 * K + i] = first_layer ? 0.0f : p - previous_probs[i];
        previous_probs[i] = p;
    }
}

void ExitFeatureChain::next(std::span<const float> logits, bool offline, std::span<float> features) {
    if (offline) {
        exit_features(logits, previous_offline_, !any_offline_, features);
        any_offline_ = true;
        previous_ = previous_offline_;
    } else {
        exit_features(logits, previous_, !any_, features);
    }
    any_ = true;
}

std::vector<int> online_probe_layers(std::span<const int> layers, std::span<const int> offline, std::span<const int> recent_stops) {
    const bool warm = recent_stops.size() >= static_cast<size_t>(kOnlineWindow);
    const std::span<const int> window = warm ? recent_stops.last(kOnlineWindow) : std::span<const int>();
    std::vector<int> probe;
    for (int l : layers) {
        bool near = std::find(offline.begin(), offline.end(), l) != offline.end();
        for (int stop : window) {
            for (int offset : kOnlineOffsets) near = near || l == stop + offset;
        }
        if (near) probe.push_back(l);
    }
    return probe;
}

std::unique_ptr<ExitPredictor> ExitPredictor::load(const std::string & path, const Model & target) {
    GgufFile file(path);
    if (file.architecture() != "specula-specee") {
        throw Error(path + ": not a SpecEE predictor file (architecture '" + file.architecture() + "'; expected specula-specee)");
    }
    const ModelConfig & t = target.config();
    const int n_layer = get_int_in(file, "specula-specee.target_block_count", 1, kMaxModelDim);
    const int n_embd = get_int_in(file, "specula-specee.target_embedding_length", 1, kMaxModelDim);
    if (n_layer != t.n_layer || n_embd != t.n_embd) {
        throw Error(path + ": predictors for a target of " + std::to_string(n_layer) + " layers and width " + std::to_string(n_embd) +
                    ", the target has " + std::to_string(t.n_layer) + " and " + std::to_string(t.n_embd));
    }
    get_int_in(file, "specula-specee.candidates", kExitCandidates, kExitCandidates);
    get_int_in(file, "specula-specee.features", kExitFeatures, kExitFeatures);
    auto p = std::unique_ptr<ExitPredictor>(new ExitPredictor());
    p->hidden_ = get_int_in(file, "specula-specee.hidden", 1, 4096);
    p->threshold_ = find_float_in(file, "specula-specee.threshold", 0.0f, 1.0f).value_or(0.5f);
    p->layers_ = file.get_i32_array("specula-specee.layers");
    if (p->layers_.empty()) throw Error(path + ": specula-specee.layers lists no layer");
    for (size_t i = 0; i < p->layers_.size(); ++i) {
        const int l = p->layers_[i];
        if (l < 1 || l > n_layer || (i > 0 && l <= p->layers_[i - 1])) {
            throw Error(path + ": specula-specee.layers must increase within 1.." + std::to_string(n_layer) + ", found " + std::to_string(l));
        }
    }
    p->offline_layers_ = p->layers_;
    if (file.has("specula-specee.offline_layers")) {
        p->offline_layers_ = file.get_i32_array("specula-specee.offline_layers");
        if (p->offline_layers_.empty()) throw Error(path + ": specula-specee.offline_layers lists no layer");
        for (size_t i = 0; i < p->offline_layers_.size(); ++i) {
            const int l = p->offline_layers_[i];
            if (!std::binary_search(p->layers_.begin(), p->layers_.end(), l) || (i > 0 && l <= p->offline_layers_[i - 1])) {
                throw Error(path + ": specula-specee.offline_layers must increase within specula-specee.layers, found " + std::to_string(l));
            }
        }
    }
    for (int l : p->layers_) p->offline_.push_back(std::binary_search(p->offline_layers_.begin(), p->offline_layers_.end(), l));
    const size_t expected_tensors = 4 * p->layers_.size();
    if (file.tensors().size() != expected_tensors) {
        throw Error(path + ": " + std::to_string(file.tensors().size()) + " tensors, expected " + std::to_string(expected_tensors) +
                    " (4 per listed layer)");
    }
    const int64_t H = p->hidden_;
    auto read = [&](const std::string & name, std::vector<int64_t> shape) {
        const ggml_tensor * meta = file.tensor_meta(name);
        if (!meta) throw Error(path + ": tensor " + name + " is missing");
        if (meta->type != GGML_TYPE_F32) throw Error(path + ": tensor " + name + " must be F32");
        for (int d = 0; d < GGML_MAX_DIMS; ++d) {
            const int64_t want = d < static_cast<int>(shape.size()) ? shape[d] : 1;
            if (meta->ne[d] != want) throw Error(path + ": tensor " + name + " has the wrong shape");
        }
        const std::vector<uint8_t> bytes = file.read_tensor_bytes(name);
        std::vector<float> v(bytes.size() / sizeof(float));
        std::memcpy(v.data(), bytes.data(), v.size() * sizeof(float));
        for (float x : v) {
            if (!std::isfinite(x)) throw Error(path + ": tensor " + name + " holds a non-finite value");
        }
        return v;
    };
    for (int l : p->layers_) {
        const std::string n = "exit." + std::to_string(l) + ".";
        Mlp m;
        m.w1 = read(n + "fc1.weight", {kExitFeatures, H});
        m.b1 = read(n + "fc1.bias", {H});
        m.w2 = read(n + "fc2.weight", {H});
        m.b2 = read(n + "fc2.bias", {1})[0];
        p->mlps_.push_back(std::move(m));
    }
    return p;
}

size_t ExitPredictor::index_of(int layer) const {
    const auto it = std::lower_bound(layers_.begin(), layers_.end(), layer);
    if (it == layers_.end() || *it != layer) throw Error("exit predictor: no predictor at layer " + std::to_string(layer));
    return static_cast<size_t>(it - layers_.begin());
}

float ExitPredictor::exit_probability(size_t i, std::span<const float> features) const {
    if (i >= mlps_.size() || features.size() != kExitFeatures) throw Error("exit predictor: bad layer index or feature count");
    const Mlp & m = mlps_[i];
    float z = m.b2;
    for (int h = 0; h < hidden_; ++h) {
        float a = m.b1[h];
        for (int f = 0; f < kExitFeatures; ++f) a += m.w1[static_cast<size_t>(h) * kExitFeatures + f] * features[f];
        z += m.w2[h] * std::max(a, 0.0f);
    }
    return 1.0f / (1.0f + std::exp(-z));
}

}  // namespace specula
