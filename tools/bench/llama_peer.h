#pragma once
// llama.cpp's own forward pass through libllama, on the same GGUF: the peer in batch-cost benchmarks
// (both engines doing what a verifier does) and the oracle for specula's logits in tests, whose
// further libllama checks (residual streams, EAGLE-3) are tests/llama_oracle.h.
#include <cstdint>
#include <span>
#include <string>
#include <vector>

struct ggml_tensor;
struct llama_model;
struct llama_context;

namespace specula {

// Called on every tensor of each decode (llama.cpp's cb_eval: with ask, whether to be called again
// with the tensor's data). It slows decoding: none when timing.
struct LlamaEvalHook {
    bool (*callback)(ggml_tensor * tensor, bool ask, void * user) = nullptr;
    void * user = nullptr;
};

class LlamaPeer {
public:
    // flash_attn: llama.cpp's fused attention kernel, else its KQ/softmax/KQV path (use specula's
    // Backend::flash_attention() for a like-for-like comparison).
    LlamaPeer(const std::string & gguf_path, int n_ctx, int n_threads, bool flash_attn, int n_batch = 512,
              LlamaEvalHook eval_hook = {});
    ~LlamaPeer();
    LlamaPeer(const LlamaPeer &) = delete;
    LlamaPeer & operator=(const LlamaPeer &) = delete;

    // Decodes tokens at positions size().. (in chunks of n_batch), returns logits of every row
    // ([n, n_vocab]) or of the last.
    std::vector<float> decode(std::span<const int32_t> tokens, bool all_logits);
    void rollback(int n);  // drop cached positions >= n
    int size() const { return n_past_; }
    int n_vocab() const { return n_vocab_; }

private:
    llama_model * model_ = nullptr;
    llama_context * ctx_ = nullptr;
    int n_past_ = 0;
    int n_batch_ = 0;
    int n_vocab_ = 0;
};

}  // namespace specula
