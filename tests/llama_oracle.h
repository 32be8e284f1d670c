#pragma once
// libllama as the tests' oracle beyond LlamaPeer's logits (tools/bench/llama_peer.h, which the benchmarks
// share): llama.cpp's residual stream of chosen layers, and llama.cpp's own EAGLE-3.
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "llama_peer.h"
#include "server/embeddings.h"

namespace specula {

// llama.cpp's residual stream ("l_out-<layer>") of the chosen layers, in every decode of a
// LlamaPeer made with hook(): [n, n_embd] per layer, the rows of each decode appended.
class LayerCapture {
public:
    explicit LayerCapture(std::vector<int> layers) : layers_(std::move(layers)) {}
    LlamaEvalHook hook() { return {&LayerCapture::eval, this}; }
    const std::vector<float> & captured(int layer) const;  // throws Error for a layer not captured

private:
    static bool eval(ggml_tensor * tensor, bool ask, void * user);
    std::vector<int> layers_;
    std::map<int, std::vector<float>> data_;
};

// llama.cpp's own EAGLE-3 on a head GGUF: its encoder (fc) over target `features` ([n, 3 x target
// hidden]), then its decoder on (tokens[i], g[i]) at positions 0..n-1. Returns the logits of every
// row over the target vocabulary ([n, n_vocab], -inf off d2t); throws Error if llama.cpp refuses.
std::vector<float> llama_eagle3_logits(const std::string & target_path, const std::string & head_path,
                                       std::span<const int32_t> tokens, std::span<const float> features, bool flash_attn,
                                       int & n_vocab);

// libllama's pooled embedding of `tokens` (a context with embeddings on and that pooling type, as
// llama-server computes /v1/embeddings): [n_embd], not normalised.
std::vector<float> llama_embedding(const std::string & path, std::span<const int32_t> tokens, embeddings::Pooling pooling);

}  // namespace specula
