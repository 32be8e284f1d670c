#include "runtime/weight_store.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "specula/error.h"
#include "ggml-backend.h"
#include "ggml.h"
#include "runtime/backend.h"
#include "runtime/gguf_file.h"
#include "runtime/gguf_validate.h"
#include "runtime/kernels/matmul.h"

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

bool WeightStore::packs(const Backend & backend, const ggml_tensor * meta, int layer) {
    kernels::PackedFormat format;
    return backend.own_kernels(layer) && meta->ne[2] == 1 && meta->ne[3] == 1 && kernels::packable(meta->type, meta->ne[0], &format);
}

WeightStore::~WeightStore() {
    for (auto * b : buffers_) ggml_backend_buffer_free(b);
    for (auto & [buft, ctx] : ctx_by_buft_) ggml_free(ctx);
    if (staging_ctx_) ggml_free(staging_ctx_);
}

ggml_tensor * WeightStore::want(const GgufFile & file, Backend & backend, const std::string & name, std::vector<int64_t> shape,
                                bool matmul, bool required, int layer) {
    ggml_tensor * meta = file.tensor_meta(name);
    if (!meta) {
        if (required) throw Error(file.path() + ": missing tensor " + name);
        return nullptr;
    }
    check_weight(file, name, *meta, shape);
    return declare(file, backend, name, meta, matmul, layer, {});
}

ggml_tensor * WeightStore::want_rows(const GgufFile & file, Backend & backend, const std::string & name, std::vector<int32_t> rows, int layer) {
    const ggml_tensor * meta = file.tensor_meta(name);
    if (!meta) throw Error(file.path() + ": missing tensor " + name);
    if (ggml_n_dims(meta) != 2) throw Error(file.path() + ": " + name + " is not a matrix");
    if (rows.empty() || !std::is_sorted(rows.begin(), rows.end()) || std::adjacent_find(rows.begin(), rows.end()) != rows.end() ||
        rows.front() < 0 || rows.back() >= meta->ne[1]) {
        throw Error(file.path() + ": rows of " + name + " must be ascending, distinct and within its " + std::to_string(meta->ne[1]) + " rows");
    }
    ggml_context * ctx = ggml_init(ggml_init_params{ggml_tensor_overhead(), nullptr, true});
    if (!ctx) throw Error("WeightStore: could not create a context");
    ggml_tensor * gathered = ggml_new_tensor_2d(ctx, meta->type, meta->ne[0], static_cast<int64_t>(rows.size()));
    try {
        ggml_tensor * t = declare(file, backend, name, gathered, true, layer, std::move(rows));
        ggml_free(ctx);
        return t;
    } catch (...) {
        ggml_free(ctx);
        throw;
    }
}

ggml_tensor * WeightStore::declare(const GgufFile & file, Backend & backend, const std::string & name, ggml_tensor * meta, bool matmul,
                                   int layer, std::vector<int32_t> rows) {
    auto context_for = [&](ggml_backend_buffer_type_t buft) {
        for (auto & [b, c] : ctx_by_buft_) {
            if (b == buft) return c;
        }
        ggml_init_params params{ggml_tensor_overhead() * (file.tensors().size() + 1), nullptr, true};
        ggml_context * c = ggml_init(params);
        ctx_by_buft_.push_back({buft, c});
        return c;
    };
    kernels::PackedFormat format;
    if (matmul && packs(backend, meta, layer)) {
        kernels::packable(meta->type, meta->ne[0], &format);
        kernels::PackedMatrix & m = packed_.emplace_back();
        m.format = format;
        m.source_type = meta->type;
        m.k = meta->ne[0];
        m.n_rows = meta->ne[1];
        if (!staging_ctx_) {
            ggml_init_params params{ggml_tensor_overhead() * (file.tensors().size() + 1), nullptr, true};
            staging_ctx_ = ggml_init(params);
        }
        ggml_tensor * staging = ggml_dup_tensor(staging_ctx_, meta);
        ggml_tensor * packed = ggml_new_tensor_2d(context_for(backend.default_buft(layer)), GGML_TYPE_I8,
                                                  static_cast<int64_t>(m.group_bytes()), m.n_groups());
        packed->extra = &m;
        ggml_set_name(staging, name.c_str());
        ggml_set_name(packed, name.c_str());
        declared_.push_back({name, staging, std::move(rows)});
        pending_.push_back({staging, packed});
        return packed;
    }
    ggml_backend_buffer_type_t buft = backend.default_buft(layer);
    if (matmul) {
        for (auto [dev, candidate] : backend.matmul_weight_bufts(layer)) {
            if (buft_supports_matmul(dev, candidate, meta)) {
                buft = candidate;
                break;
            }
        }
    }
    if (std::getenv("SPECULA_VERBOSE") && matmul) {
        std::fprintf(stderr, "specula: %s (%s) -> ggml mul_mat, buffer %s\n", name.c_str(), ggml_type_name(meta->type),
                     ggml_backend_buft_name(buft));
    }
    ggml_tensor * t = ggml_dup_tensor(context_for(buft), meta);
    ggml_set_name(t, name.c_str());
    declared_.push_back({name, t, std::move(rows)});
    return t;
}

void WeightStore::load(const GgufFile & file) {
    for (auto & [buft, ctx] : ctx_by_buft_) {
        auto type = static_cast<ggml_backend_buffer_type_t>(buft);
        ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors_from_buft(ctx, type);
        if (!buf) {
            ggml_backend_dev_t dev = ggml_backend_buft_get_device(type);
            throw Error(file.path() + ": out of memory allocating weights on " + (dev ? ggml_backend_dev_name(dev) : ggml_backend_buft_name(type)) +
                        " (with a device list, give it fewer layers: --split)");
        }
        ggml_backend_buffer_set_usage(buf, GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
        buffers_.push_back(buf);
        bytes_ += ggml_backend_buffer_get_size(buf);
    }
    ggml_backend_buffer_t staging = nullptr;
    if (staging_ctx_) {
        staging = ggml_backend_alloc_ctx_tensors_from_buft(staging_ctx_, ggml_backend_cpu_buffer_type());
        if (!staging) throw Error(file.path() + ": out of memory allocating weights to repack");
    }
    try {
        for (const Declared & d : declared_) {
            if (d.rows.empty()) {
                file.load_tensor_data(d.name, d.tensor);
                continue;
            }
            const std::vector<uint8_t> whole = file.read_tensor_bytes(d.name);
            const size_t row_bytes = d.tensor->nb[1];
            for (size_t i = 0; i < d.rows.size(); ++i) {
                ggml_backend_tensor_set(d.tensor, whole.data() + static_cast<size_t>(d.rows[i]) * row_bytes, i * row_bytes, row_bytes);
            }
        }
    } catch (...) {
        if (staging) ggml_backend_buffer_free(staging);
        throw;
    }
    const bool verbose = std::getenv("SPECULA_VERBOSE") != nullptr;
    for (const PendingPack & p : pending_) {
        const auto & m = *kernels::packed_matrix_of(p.packed);
        kernels::pack_matrix(m, p.staging->data, p.packed->data);
        if (verbose) {
            std::fprintf(stderr, "specula: %s (%s) -> specula %s kernel\n", p.packed->name, ggml_type_name(m.source_type),
                         kernels::cpu_path_name(kernels::detected_cpu_path()));
        }
    }
    pending_.clear();
    if (staging) ggml_backend_buffer_free(staging);
    if (staging_ctx_) {
        ggml_free(staging_ctx_);
        staging_ctx_ = nullptr;
    }
}

}  // namespace specula
