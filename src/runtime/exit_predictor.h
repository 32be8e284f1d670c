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

class ExitPredictor {
public:
    // Throws Error naming the file and the problem: not a SpecEE sidecar, a target of another
    // depth or width, a bad layer list, a tensor of the wrong shape or type, a non-finite weight.
    static std::unique_ptr<ExitPredictor> load(const std::string & path, const Model & target);

    // Layers (residual state entering layer l; l == n_layer: the final state) that have a
    // predictor, increasing: the offline schedule.
    const std::vector<int> & layers() const { return layers_; }
    float default_threshold() const { return threshold_; }
    // Exit probability at scheduled layer index i (into layers()).
    float exit_probability(size_t i, std::span<const float> features) const;

private:
    struct Mlp {
        std::vector<float> w1, b1, w2;  // w1: [hidden][kExitFeatures] row-major
        float b2 = 0.0f;
    };
    std::vector<int> layers_;
    std::vector<Mlp> mlps_;
    int hidden_ = 0;
    float threshold_ = 0.5f;
};

}  // namespace specula
