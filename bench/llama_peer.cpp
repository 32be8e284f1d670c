#include "llama_peer.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <map>

#include "ggml-backend.h"
#include "ggml.h"

#include "specula/error.h"
#include "llama-ext.h"
#include "llama.h"
#include "runtime/library_log.h"
#include "tokenizer/tokenizer.h"

namespace specula {

struct LlamaPeer::Capture {
    std::vector<int> layers;
    std::map<int, std::vector<float>> data;

    static bool eval(ggml_tensor * t, bool ask, void * user) {
        auto * self = static_cast<Capture *>(user);
        int layer = -1;
        if (std::sscanf(t->name, "l_out-%d", &layer) != 1) return false;
        bool wanted = false;
        for (int l : self->layers) wanted |= l == layer;
        if (ask || !wanted) return wanted;
        auto & out = self->data[layer];
        out.resize(ggml_nelements(t));
        ggml_backend_tensor_get(t, out.data(), 0, ggml_nbytes(t));
        return true;
    }
};

LlamaPeer::LlamaPeer(const std::string & gguf_path, int n_ctx, int n_threads, bool flash_attn, int n_batch, bool with_capture)
    : capture_(new Capture) {
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
    if (with_capture) {
        cp.cb_eval = &Capture::eval;
        cp.cb_eval_user_data = capture_;
    }
    ctx_ = llama_init_from_model(model_, cp);
    if (!ctx_) throw Error(gguf_path + ": libllama could not create a context");
    n_vocab_ = llama_vocab_n_tokens(llama_model_get_vocab(model_));
}

LlamaPeer::~LlamaPeer() {
    if (ctx_) llama_free(ctx_);
    if (model_) llama_model_free(model_);
    delete capture_;
}

void LlamaPeer::capture_layers(std::vector<int> layers) { capture_->layers = std::move(layers); }

const std::vector<float> & LlamaPeer::captured(int layer) const {
    auto it = capture_->data.find(layer);
    if (it == capture_->data.end()) throw Error("layer " + std::to_string(layer) + " was not captured");
    return it->second;
}

std::vector<float> LlamaPeer::decode(std::span<const int32_t> tokens, bool all_logits) {
    const int n = static_cast<int>(tokens.size());
    if (n > n_batch_ && !capture_->layers.empty()) {
        throw Error("LlamaPeer: a captured decode takes at most " + std::to_string(n_batch_) + " tokens, not " + std::to_string(n));
    }
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

std::vector<float> llama_eagle3_logits(const std::string & target_path, const std::string & head_path,
                                       std::span<const int32_t> tokens, std::span<const float> features, bool flash_attn,
                                       int & n_vocab) {
    init_llama_backend();
    const int n = static_cast<int>(tokens.size());
    std::unique_ptr<llama_model, decltype(&llama_model_free)> tgt(llama_model_load_from_file(target_path.c_str(), llama_model_default_params()),
                                                                  &llama_model_free);
    std::unique_ptr<llama_model, decltype(&llama_model_free)> dft(llama_model_load_from_file(head_path.c_str(), llama_model_default_params()),
                                                                  &llama_model_free);
    if (!tgt || !dft) throw Error("libllama could not load " + target_path + " or " + head_path);
    llama_context_params tp = llama_context_default_params();
    tp.n_ctx = 64, tp.n_threads = 1, tp.n_threads_batch = 1;
    std::unique_ptr<llama_context, decltype(&llama_free)> ctx_tgt(llama_init_from_model(tgt.get(), tp), &llama_free);
    llama_context_params dp = tp;
    dp.ctx_other = ctx_tgt.get();  // the head borrows the target's embeddings / lm_head
    dp.flash_attn_type = flash_attn ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED;
    std::unique_ptr<llama_context, decltype(&llama_free)> ctx_dft(llama_init_from_model(dft.get(), dp), &llama_free);
    if (!ctx_tgt || !ctx_dft) throw Error("libllama could not create the EAGLE-3 contexts");
    llama_set_embeddings_nextn(ctx_dft.get(), true, true);

    std::vector<float> feats(features.begin(), features.end());
    llama_batch enc{n, nullptr, feats.data(), nullptr, nullptr, nullptr, nullptr};
    if (llama_encode(ctx_dft.get(), enc) != 0) throw Error("llama_encode (EAGLE-3 encoder) failed");
    const int E = llama_model_n_embd(dft.get());
    const float * g = llama_get_embeddings_nextn(ctx_dft.get());
    llama_batch dec = llama_batch_init(n, E, 1);
    // llama_batch_init allocates either tokens or embeddings; the eagle3 decoder takes both.
    dec.token = static_cast<llama_token *>(malloc(sizeof(llama_token) * n));
    for (int i = 0; i < n; ++i) {
        dec.token[i] = tokens[i];
        std::copy(g + i * E, g + (i + 1) * E, dec.embd + i * E);
        dec.pos[i] = i;
        dec.n_seq_id[i] = 1;
        dec.seq_id[i][0] = 0;
        dec.logits[i] = 1;
    }
    dec.n_tokens = n;
    const int rc = llama_decode(ctx_dft.get(), dec);
    n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(tgt.get()));
    std::vector<float> out;
    if (rc == 0) {
        for (int i = 0; i < n; ++i) {
            const float * row = llama_get_logits_ith(ctx_dft.get(), i);
            out.insert(out.end(), row, row + n_vocab);
        }
    }
    free(dec.token);
    dec.token = nullptr;
    llama_batch_free(dec);
    if (rc != 0) throw Error("llama_decode (EAGLE-3 decoder) failed");
    return out;
}

}  // namespace specula
