#pragma once
// SpecEE's exit predictors (docs/specee.md): per scheduled layer, a two-layer MLP that reads
// features of the drafter's candidates at that layer and gives the probability that the best
// candidate there is the full model's token. Loaded from a small GGUF sidecar (architecture
// "specula-specee", format in docs/specee.md), validated against the target it was trained for.
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace specula {

class Model;

// The paper's features for one scheduled layer, from the candidates' logits there: the logits,
// their softmax over the candidates, and that softmax minus the one at the previous scheduled
// layer (zeros at the first). `previous_probs` is read and then overwritten with this layer's.
inline constexpr int kExitCandidates = 4;
inline constexpr int kExitFeatures = 3 * kExitCandidates;
void exit_features(std::span<const float> logits, std::span<float> previous_probs, bool first_layer, std::span<float> features);

// The features of each layer one step probes, in order. An offline layer's change term is taken
// from the previous offline layer (zeros at the first), as without the online level: its
// predictor was trained on the offline schedule, which the online level always probes. An
// online layer's is taken from the layer probed just before it (zeros at the first probe).
class ExitFeatureChain {
public:
    void next(std::span<const float> logits, bool offline, std::span<float> features);

private:
    std::vector<float> previous_ = std::vector<float>(kExitCandidates), previous_offline_ = std::vector<float>(kExitCandidates);
    bool any_ = false, any_offline_ = false;
};

// The paper's online scheduling level, as its authors' code: a token probes the offline layers
// and, once kOnlineWindow tokens have stopped, the layers at kOnlineOffsets from where each of
// the last kOnlineWindow stopped (n_layer for a token that ran the full LM head), wherever a
// predictor exists. Exits cluster by context, so the probes follow them while most trained
// layers run none. `recent_stops`: the last tokens' stopping layers, oldest first.
inline constexpr int kOnlineWindow = 5;
inline constexpr int kOnlineOffsets[] = {-2, 0, 2};
std::vector<int> online_probe_layers(std::span<const int> layers, std::span<const int> offline, std::span<const int> recent_stops);

class ExitPredictor {
public:
    // Throws Error naming the file and the problem: not a SpecEE sidecar, a target of another
    // depth or width, a bad layer list, a tensor of the wrong shape or type, a non-finite weight.
    static std::unique_ptr<ExitPredictor> load(const std::string & path, const Model & target);

    // Layers (residual state entering layer l; l == n_layer: the final state) that have a
    // predictor, increasing.
    const std::vector<int> & layers() const { return layers_; }
    // The offline schedule, chosen from the training data's exit profile: a subset of layers()
    // (all of them in a file without `specula-specee.offline_layers`).
    const std::vector<int> & offline_layers() const { return offline_layers_; }
    // Index into layers() of a layer that has a predictor.
    size_t index_of(int layer) const;
    // Whether layers()[i] is in the offline schedule.
    bool offline(size_t i) const { return offline_[i]; }
    float default_threshold() const { return threshold_; }
    // Exit probability at scheduled layer index i (into layers()).
    float exit_probability(size_t i, std::span<const float> features) const;

private:
    struct Mlp {
        std::vector<float> w1, b1, w2;  // w1: [hidden][kExitFeatures] row-major
        float b2 = 0.0f;
    };
    std::vector<int> layers_, offline_layers_;
    std::vector<bool> offline_;  // per layers() entry
    std::vector<Mlp> mlps_;
    int hidden_ = 0;
    float threshold_ = 0.5f;
};

}  // namespace specula
