#pragma once
// EAGLE draft heads: one decoder layer that drafts from the target's hidden states. This is the
// network (weights and forward); the drafter that runs it, with its cache and trees, is
// draft/eagle_drafter.h.
//   EAGLE-1/2: x = fc(concat(embed(token), f)) with f the target's final pre-norm hidden state;
//              one layer without input norm; its output predicts the next f; logits through the
//              target's own output norm and lm_head. GGUF: specula's "specula-eagle1" layout
//              (docs/eagle.md).
//   EAGLE-3:   g = fc(concat of the target's hidden states entering 3 layers); the layer's q/k/v
//              see concat(attn_norm(embed(token)), attn_norm_2(g)); own output norm and lm_head
//              over a draft vocabulary mapped to target ids by d2t. GGUF: llama.cpp v0.5.0's
//              "eagle3" layout, so the same file runs in llama.cpp.
// Input convention (both, as llama.cpp's eagle3): the entry at position P pairs token t[P+1]
// with the hidden state for position P; its output drafts t[P+2].
#include <memory>
#include <string>
#include <vector>

#include "runtime/model.h"
#include "runtime/network.h"
#include "runtime/weight_store.h"

namespace specula {

enum class EagleKind {
    Eagle1,
    Eagle3
};

struct EagleHeadConfig {
    EagleKind kind = EagleKind::Eagle3;
    ModelConfig layer;               // attention/FFN sizes of the single decoder layer
    std::vector<int> target_layers;  // features = target hidden states entering these layers
    int target_hidden = 0;
    bool norm_before_residual = false;  // eagle3: residual from attn_norm_2(g) instead of g
    bool norm_before_fc = false;        // eagle3: RMSNorm on the fused features before fc
    int n_draft_vocab = 0;              // logit width
};

class EagleHead : public Network {
public:
    // Loads a head and checks it fits `target` (hidden size, vocabulary, layer list).
    static std::unique_ptr<EagleHead> load(const std::string & path, const Model & target, Backend & backend);

    const EagleHeadConfig & config() const { return config_; }
    // Width of a row of target features (what fc takes): 3 x target hidden (EAGLE-3), hidden (EAGLE-1).
    int feature_width() const;
    // Target id of each draft-vocabulary logit; empty when the head drafts over the target vocabulary.
    const std::vector<int32_t> & d2t() const { return d2t_; }

    const NetworkShape & shape() const override { return shape_; }
    Backend & backend() const override { return backend_; }
    void check_hidden_in(const ForwardBatch & batch, int hidden_width) const override;
    GraphOutputs build_graph(ggml_context * ctx, ggml_cgraph * gf, KvCache & cache, const GraphInputs & in,
                             const ForwardBatch & batch, int layer_end) const override;

private:
    EagleHead(const Model & target, Backend & backend) : target_(target), backend_(backend) {}
    const Model & target_;
    Backend & backend_;
    EagleHeadConfig config_;
    NetworkShape shape_;
    WeightStore store_;
    LayerWeights layer_;
    ggml_tensor * fc_ = nullptr;           // [feature_width (+ n_embd for EAGLE-1), n_embd]
    ggml_tensor * fc_bias_ = nullptr;      // EAGLE-1 checkpoints carry one
    ggml_tensor * attn_norm_2_ = nullptr;  // eagle3 hidden_norm
    ggml_tensor * enc_norm_ = nullptr;     // eagle3 norm_before_fc
    ggml_tensor * tok_embd_ = nullptr;     // own or the target's
    ggml_tensor * output_norm_ = nullptr;  // own (eagle3) or the target's (eagle1)
    ggml_tensor * output_ = nullptr;
    std::vector<int32_t> d2t_;
};

}  // namespace specula
