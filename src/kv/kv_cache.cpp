#include "kv/kv_cache.h"

#include <atomic>
#include <cstring>
#include <string>

#include "common/error.h"
#include "ggml-backend.h"
#include "ggml.h"
#include "runtime/backend.h"
#include "runtime/model_config.h"

namespace specula {

KvCache::KvCache(Backend & backend, const ModelConfig & config, int capacity)
    : KvCache(backend, config.n_layer, config.n_embd_kv(), capacity) {}

KvCache::KvCache(Backend & backend, int n_layers, int n_embd_kv, int capacity)
    : n_embd_kv_(n_embd_kv), capacity_(capacity), v_transposed_(backend.attention_kernel() == AttentionKernel::Matmul) {
    static std::atomic<uint64_t> next_id{1};
    id_ = next_id++;
    if (capacity <= 0) throw Error("KV cache capacity must be positive");
    ggml_init_params params{ggml_tensor_overhead() * (2 * n_layers + 1), nullptr, true};
    ctx_ = ggml_init(params);
    for (int il = 0; il < n_layers; ++il) {
        k_.push_back(ggml_new_tensor_2d(ctx_, GGML_TYPE_F16, n_embd_kv, capacity));  // [n_embd_kv, capacity]
        v_.push_back(v_transposed_ ? ggml_new_tensor_2d(ctx_, GGML_TYPE_F16, capacity, n_embd_kv)
                                   : ggml_new_tensor_2d(ctx_, GGML_TYPE_F16, n_embd_kv, capacity));
        ggml_format_name(k_.back(), "cache_k_l%d", il);
        ggml_format_name(v_.back(), "cache_v_l%d", il);
    }
    buffer_ = ggml_backend_alloc_ctx_tensors_from_buft(ctx_, backend.default_buft());
    if (!buffer_) throw Error("out of memory allocating a KV cache of " + std::to_string(capacity) + " slots");
    // Never-written slots are masked out, but must not hold NaN bit patterns a kernel could touch.
    ggml_backend_buffer_clear(buffer_, 0);
}

KvCache::~KvCache() {
    if (buffer_) ggml_backend_buffer_free(buffer_);
    if (ctx_) ggml_free(ctx_);
}

void KvCache::rollback(int n) {
    if (n < 0 || n > size_) throw Error("KV rollback to " + std::to_string(n) + " outside [0, " + std::to_string(size_) + "]");
    size_ = n;
}

int KvCache::append(int n) {
    if (size_ + n > capacity_) {
        throw Error("context full: " + std::to_string(size_) + " + " + std::to_string(n) + " tokens exceed the " +
                    std::to_string(capacity_) + "-token context");
    }
    const int first = size_;
    size_ += n;
    return first;
}

void KvCache::compact(int base, std::span<const int> kept) {
    const int block = size_ - base;
    if (base < 0 || block < 0) throw Error("KV compact: block start outside the cache");
    for (size_t i = 0; i < kept.size(); ++i) {
        if (kept[i] < static_cast<int>(i) || kept[i] >= block || (i > 0 && kept[i] <= kept[i - 1])) {
            throw Error("KV compact: kept rows must be ascending offsets inside the block");
        }
    }
    size_t first_moved = 0;
    while (first_moved < kept.size() && kept[first_moved] == static_cast<int>(first_moved)) ++first_moved;
    if (first_moved < kept.size()) {
        // Slots [base + first_moved, base + kept.back()] are read once and their kept rows written
        // back packed, through the host: correct on any backend. A slot is a row of `width` values
        // `stride` apart; a row-major tensor has one such run of slots, a transposed V one per channel.
        const int span = kept.back() + 1 - static_cast<int>(first_moved);
        const int n_kept = static_cast<int>(kept.size() - first_moved);
        auto move = [&](ggml_tensor * t, size_t offset, size_t width) {
            std::vector<uint8_t> src(width * span), dst(width * n_kept);
            ggml_backend_tensor_get(t, src.data(), offset + width * (base + first_moved), src.size());
            for (size_t i = first_moved; i < kept.size(); ++i) {
                std::memcpy(dst.data() + width * (i - first_moved), src.data() + width * (kept[i] - first_moved), width);
            }
            ggml_backend_tensor_set(t, dst.data(), offset + width * (base + first_moved), dst.size());
        };
        const size_t row = ggml_row_size(GGML_TYPE_F16, n_embd_kv_);
        for (ggml_tensor * t : k_) move(t, 0, row);
        for (ggml_tensor * t : v_) {
            if (!v_transposed_) {
                move(t, 0, row);
                continue;
            }
            for (int j = 0; j < n_embd_kv_; ++j) move(t, ggml_row_size(GGML_TYPE_F16, capacity_) * j, sizeof(ggml_fp16_t));
        }
    }
    size_ = base + static_cast<int>(kept.size());
}

std::vector<float> KvCache::read_row(int layer, bool value, int slot) const {
    ggml_tensor * t = value ? v_.at(layer) : k_.at(layer);
    std::vector<ggml_fp16_t> h(n_embd_kv_);
    if (value && v_transposed_) {
        for (int j = 0; j < n_embd_kv_; ++j) {
            ggml_backend_tensor_get(t, &h[j], ggml_row_size(GGML_TYPE_F16, capacity_) * j + sizeof(ggml_fp16_t) * slot,
                                    sizeof(ggml_fp16_t));
        }
    } else {
        ggml_backend_tensor_get(t, h.data(), ggml_row_size(GGML_TYPE_F16, n_embd_kv_) * slot, h.size() * sizeof(ggml_fp16_t));
    }
    std::vector<float> out(n_embd_kv_);
    ggml_fp16_to_fp32_row(h.data(), out.data(), n_embd_kv_);
    return out;
}

}  // namespace specula
