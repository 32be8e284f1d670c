#include "llama_peer.h"

#include <algorithm>
#include <cstring>

#include "specula/error.h"
#include "llama.h"
#include "runtime/library_log.h"
#include "tokenizer/tokenizer.h"

namespace specula {

LlamaPeer::LlamaPeer(const std::string & gguf_path, int n_ctx, int n_threads, bool flash_attn, int n_batch, LlamaEvalHook eval_hook) {
    init_llama_backend();
    llama_model_params mp = llama_model_default_params();
    take_library_errors();  // drop what earlier calls logged
    model_ = llama_model_load_from_file(gguf_path.c_str(), mp);
    if (!model_) {
        const std::string why = take_library_errors();
        throw Error(gguf_path + ": libllama could not load the model" + (why.empty() ? "" : " (" + why + ")"));
    }
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = n_ctx;
    n_batch_ = n_batch;
    cp.n_batch = n_batch;
    cp.n_ubatch = n_batch;
    cp.n_seq_max = 1;
    cp.n_threads = n_threads;
    cp.n_threads_batch = n_threads;
    cp.flash_attn_type = flash_attn ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED;
    cp.cb_eval = eval_hook.callback;
    cp.cb_eval_user_data = eval_hook.user;
    ctx_ = llama_init_from_model(model_, cp);
    if (!ctx_) throw Error(gguf_path + ": libllama could not create a context");
    n_vocab_ = llama_vocab_n_tokens(llama_model_get_vocab(model_));
}

LlamaPeer::~LlamaPeer() {
    if (ctx_) llama_free(ctx_);
    if (model_) llama_model_free(model_);
}

std::vector<float> LlamaPeer::decode(std::span<const int32_t> tokens, bool all_logits) {
    const int n = static_cast<int>(tokens.size());
    const int rows = all_logits ? n : 1;
    std::vector<float> out(static_cast<size_t>(rows) * n_vocab_);
    // libllama takes at most n_batch tokens a call: a longer input (a deep prompt) goes in chunks.
    for (int begin = 0; begin < n; begin += n_batch_) {
        const int m = std::min(n_batch_, n - begin);
        auto wanted = [&](int i) { return all_logits || begin + i == n - 1; };  // rows whose logits are returned
        llama_batch batch = llama_batch_init(m, 0, 1);
        for (int i = 0; i < m; ++i) {
            batch.token[i] = tokens[begin + i];
            batch.pos[i] = n_past_ + i;
            batch.n_seq_id[i] = 1;
            batch.seq_id[i][0] = 0;
            batch.logits[i] = wanted(i);
        }
        batch.n_tokens = m;
        const int rc = llama_decode(ctx_, batch);
        llama_batch_free(batch);
        if (rc != 0) throw Error("llama_decode failed (" + std::to_string(rc) + ")");
        n_past_ += m;
        for (int i = 0; i < m; ++i) {
            if (!wanted(i)) continue;
            const int row = all_logits ? begin + i : 0;
            std::memcpy(out.data() + static_cast<size_t>(row) * n_vocab_, llama_get_logits_ith(ctx_, i), sizeof(float) * n_vocab_);
        }
    }
    return out;
}

void LlamaPeer::rollback(int n) {
    llama_memory_seq_rm(llama_get_memory(ctx_), 0, n, -1);
    n_past_ = n;
}

}  // namespace specula
