#include "runtime/weight_store.h"

#include "common/error.h"
#include "ggml-backend.h"
#include "ggml.h"
#include "runtime/backend.h"
#include "runtime/gguf_file.h"
#include "runtime/gguf_validate.h"

namespace specula {

namespace {

// Whether `buft` can hold weight `w` used as the first operand of a matrix multiply (CPU repack
// buffer types only take some types and shapes); asked the way the device itself decides.
bool buft_supports_matmul(ggml_backend_dev_t dev, ggml_backend_buffer_type_t buft, ggml_tensor * w) {
    ggml_init_params params{ggml_tensor_overhead() * 4, nullptr, true};
    ggml_context * ctx = ggml_init(params);
    ggml_tensor * b = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, w->ne[0], 512);
    ggml_tensor * op = ggml_mul_mat(ctx, w, b);
    ggml_backend_buffer_t probe = ggml_backend_buft_alloc_buffer(buft, 0);
    w->buffer = probe;
    const bool ok = ggml_backend_dev_supports_op(dev, op);
    w->buffer = nullptr;
    ggml_backend_buffer_free(probe);
    ggml_free(ctx);
    return ok;
}

}  // namespace

WeightStore::~WeightStore() {
    for (auto * b : buffers_) ggml_backend_buffer_free(b);
    for (auto & [buft, ctx] : ctx_by_buft_) ggml_free(ctx);
}

ggml_tensor * WeightStore::want(const GgufFile & file, Backend & backend, const std::string & name, std::vector<int64_t> shape,
                                bool matmul, bool required) {
    ggml_tensor * meta = file.tensor_meta(name);
    if (!meta) {
        if (required) throw Error(file.path() + ": missing tensor " + name);
        return nullptr;
    }
    check_weight(file, name, *meta, shape);
    ggml_backend_buffer_type_t buft = backend.default_buft();
    if (matmul) {
        for (auto [dev, candidate] : backend.matmul_weight_bufts()) {
            if (buft_supports_matmul(dev, candidate, meta)) {
                buft = candidate;
                break;
            }
        }
    }
    ggml_context * ctx = nullptr;
    for (auto & [b, c] : ctx_by_buft_) {
        if (b == buft) ctx = c;
    }
    if (!ctx) {
        ggml_init_params params{ggml_tensor_overhead() * (file.tensors().size() + 1), nullptr, true};
        ctx = ggml_init(params);
        ctx_by_buft_.push_back({buft, ctx});
    }
    ggml_tensor * t = ggml_dup_tensor(ctx, meta);
    ggml_set_name(t, name.c_str());
    declared_.push_back({name, t});
    return t;
}

void WeightStore::load(const GgufFile & file) {
    for (auto & [buft, ctx] : ctx_by_buft_) {
        ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors_from_buft(ctx, static_cast<ggml_backend_buffer_type_t>(buft));
        if (!buf) throw Error(file.path() + ": out of memory allocating weights");
        ggml_backend_buffer_set_usage(buf, GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
        buffers_.push_back(buf);
        bytes_ += ggml_backend_buffer_get_size(buf);
    }
    for (auto & [name, t] : declared_) file.load_tensor_data(name, t);
}

}  // namespace specula
