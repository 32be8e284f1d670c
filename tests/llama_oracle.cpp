#include "llama_oracle.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>

#include "ggml-backend.h"
#include "ggml.h"
#include "llama-ext.h"
#include "llama.h"
#include "specula/error.h"
#include "tokenizer/tokenizer.h"

namespace specula {

namespace {

// One sequence at positions 0.., every row's logits (or embeddings) kept.
void fill_one_sequence(llama_batch & batch, std::span<const int32_t> tokens) {
    const int n = static_cast<int>(tokens.size());
    for (int i = 0; i < n; ++i) {
        batch.token[i] = tokens[i];
        batch.pos[i] = i;
        batch.n_seq_id[i] = 1;
        batch.seq_id[i][0] = 0;
        batch.logits[i] = 1;
    }
    batch.n_tokens = n;
}

}  // namespace

bool LayerCapture::eval(ggml_tensor * tensor, bool ask, void * user) {
    auto * self = static_cast<LayerCapture *>(user);
    int layer = -1;
    if (std::sscanf(tensor->name, "l_out-%d", &layer) != 1) return false;
    const bool wanted = std::find(self->layers_.begin(), self->layers_.end(), layer) != self->layers_.end();
    if (ask || !wanted) return wanted;
    auto & out = self->data_[layer];
    const size_t before = out.size();
    out.resize(before + ggml_nelements(tensor));
    ggml_backend_tensor_get(tensor, out.data() + before, 0, ggml_nbytes(tensor));
    return true;
}

const std::vector<float> & LayerCapture::captured(int layer) const {
    auto it = data_.find(layer);
    if (it == data_.end()) throw Error("layer " + std::to_string(layer) + " was not captured");
    return it->second;
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
    fill_one_sequence(dec, tokens);
    std::copy(g, g + static_cast<size_t>(n) * E, dec.embd);
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

std::vector<float> llama_embedding(const std::string & path, std::span<const int32_t> tokens, embeddings::Pooling pooling) {
    init_llama_backend();
    const int n = static_cast<int>(tokens.size());
    std::unique_ptr<llama_model, decltype(&llama_model_free)> model(llama_model_load_from_file(path.c_str(), llama_model_default_params()), &llama_model_free);
    if (!model) throw Error("libllama could not load " + path);
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = std::max(n, 64), cp.n_batch = cp.n_ctx, cp.n_ubatch = cp.n_ctx, cp.n_threads = 1, cp.n_threads_batch = 1;
    cp.embeddings = true;
    cp.pooling_type = pooling == embeddings::Pooling::Mean   ? LLAMA_POOLING_TYPE_MEAN
                      : pooling == embeddings::Pooling::Last ? LLAMA_POOLING_TYPE_LAST
                                                             : LLAMA_POOLING_TYPE_CLS;
    std::unique_ptr<llama_context, decltype(&llama_free)> ctx(llama_init_from_model(model.get(), cp), &llama_free);
    if (!ctx) throw Error("libllama could not create an embeddings context");
    llama_batch batch = llama_batch_init(n, 0, 1);
    fill_one_sequence(batch, tokens);
    const int rc = llama_decode(ctx.get(), batch);
    llama_batch_free(batch);
    if (rc != 0) throw Error("llama_decode (embeddings) failed");
    const float * e = llama_get_embeddings_seq(ctx.get(), 0);
    if (!e) throw Error("libllama gave no pooled embedding");
    return std::vector<float>(e, e + llama_model_n_embd(model.get()));
}

}  // namespace specula
