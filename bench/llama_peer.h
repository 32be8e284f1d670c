#pragma once
// llama.cpp's own forward pass through libllama, on the same GGUF: the oracle for specula's logits
// in tests and the peer in batch-cost benchmarks (both engines doing what a verifier does).
#include <cstdint>
#include <span>
#include <string>
#include <vector>

struct llama_model;
struct llama_context;

namespace specula {

class LlamaPeer {
public:
    // flash_attn: llama.cpp's fused attention kernel, else its KQ/softmax/KQV path (use specula's
    // Backend::flash_attention() for a like-for-like comparison). with_capture: enable
    // capture_layers() (adds an eval callback, so keep it off when timing).
    LlamaPeer(const std::string & gguf_path, int n_ctx, int n_threads, bool flash_attn, int n_batch = 512,
              bool with_capture = false);
    ~LlamaPeer();
    LlamaPeer(const LlamaPeer &) = delete;
    LlamaPeer & operator=(const LlamaPeer &) = delete;

    // Decodes tokens at positions size().. (in chunks of n_batch), returns logits of every row
    // ([n, n_vocab]) or of the last.
    std::vector<float> decode(std::span<const int32_t> tokens, bool all_logits);
    void rollback(int n);  // drop cached positions >= n
    // Captures llama.cpp's residual stream ("l_out-<layer>") during the next decodes.
    void capture_layers(std::vector<int> layers);
    const std::vector<float> & captured(int layer) const;  // [n, n_embd] of the last decode
    int size() const { return n_past_; }
    int n_vocab() const { return n_vocab_; }

private:
    llama_model * model_ = nullptr;
    llama_context * ctx_ = nullptr;
    int n_past_ = 0;
    int n_batch_ = 0;
    int n_vocab_ = 0;
    struct Capture;
    Capture * capture_ = nullptr;
};

// llama.cpp's own EAGLE-3 on a head GGUF: its encoder (fc) over target `features` ([n, 3 x target
// hidden]), then its decoder on (tokens[i], g[i]) at positions 0..n-1. Returns the logits of every
// row over the target vocabulary ([n, n_vocab], -inf off d2t); throws Error if llama.cpp refuses.
std::vector<float> llama_eagle3_logits(const std::string & target_path, const std::string & head_path,
                                       std::span<const int32_t> tokens, std::span<const float> features, bool flash_attn,
                                       int & n_vocab);

}  // namespace specula
