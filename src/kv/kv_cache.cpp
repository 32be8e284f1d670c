#include "kv/kv_cache.h"

#include <atomic>
#include <cstring>
#include <string>

#include "specula/error.h"
#include "ggml-backend.h"
#include "ggml.h"
#include "runtime/backend.h"
#include "runtime/model_config.h"

namespace specula {

// The tensors every stream of a pool shares.
struct KvStorage {
    KvStorage(Backend & backend, int n_layers, int n_embd_kv, int slots);
    ~KvStorage() {
        if (buffer) ggml_backend_buffer_free(buffer);
        if (ctx) ggml_free(ctx);
    }
    uint64_t id = 0;
    int n_embd_kv = 0;
    int slots = 0;
    bool v_transposed = false;
    ggml_context * ctx = nullptr;
    ggml_backend_buffer * buffer = nullptr;
    std::vector<ggml_tensor *> k, v;
};

KvStorage::KvStorage(Backend & backend, int n_layers, int n_embd_kv, int slots)
    : n_embd_kv(n_embd_kv), slots(slots), v_transposed(backend.attention_kernel() == AttentionKernel::Matmul) {
    static std::atomic<uint64_t> next_id{1};
    id = next_id++;
    if (slots <= 0) throw Error("KV cache capacity must be positive");
    ggml_init_params params{ggml_tensor_overhead() * (2 * n_layers + 1), nullptr, true};
    ctx = ggml_init(params);
    for (int il = 0; il < n_layers; ++il) {
        k.push_back(ggml_new_tensor_2d(ctx, GGML_TYPE_F16, n_embd_kv, slots));  // [n_embd_kv, slots]
        v.push_back(v_transposed ? ggml_new_tensor_2d(ctx, GGML_TYPE_F16, slots, n_embd_kv)
                                 : ggml_new_tensor_2d(ctx, GGML_TYPE_F16, n_embd_kv, slots));
        ggml_format_name(k.back(), "cache_k_l%d", il);
        ggml_format_name(v.back(), "cache_v_l%d", il);
    }
    buffer = ggml_backend_alloc_ctx_tensors_from_buft(ctx, backend.default_buft());
    if (!buffer) throw Error("out of memory allocating a KV cache of " + std::to_string(slots) + " slots");
    // Never-written slots are masked out, but must not hold NaN bit patterns a kernel could touch.
    ggml_backend_buffer_clear(buffer, 0);
}

KvCache::KvCache(Backend & backend, const ModelConfig & config, int capacity)
    : KvCache(backend, config.n_layer, config.n_embd_kv(), capacity) {}

KvCache::KvCache(Backend & backend, int n_layers, int n_embd_kv, int capacity)
    : KvCache(std::make_shared<KvStorage>(backend, n_layers, n_embd_kv, capacity), 0, capacity) {}

KvCache::KvCache(std::shared_ptr<KvStorage> storage, int offset, int capacity)
    : storage_(std::move(storage)), id_(storage_->id), n_embd_kv_(storage_->n_embd_kv), offset_(offset), capacity_(capacity),
      v_transposed_(storage_->v_transposed), k_(storage_->k), v_(storage_->v) {}

std::vector<std::unique_ptr<KvCache>> KvCache::pool(Backend & backend, const ModelConfig & config, int capacity, int n_streams) {
    return pool(backend, config.n_layer, config.n_embd_kv(), capacity, n_streams);
}

std::vector<std::unique_ptr<KvCache>> KvCache::pool(Backend & backend, int n_layers, int n_embd_kv, int capacity, int n_streams) {
    if (capacity <= 0 || n_streams <= 0) throw Error("KV pool: capacity and stream count must be positive");
    if (static_cast<int64_t>(capacity) * n_streams > (1 << 30)) throw Error("KV pool: too many slots");
    auto storage = std::make_shared<KvStorage>(backend, n_layers, n_embd_kv, capacity * n_streams);
    std::vector<std::unique_ptr<KvCache>> streams;
    for (int i = 0; i < n_streams; ++i) streams.push_back(std::unique_ptr<KvCache>(new KvCache(storage, i * capacity, capacity)));
    return streams;
}

KvCache::~KvCache() = default;

int KvCache::storage_slots() const { return storage_->slots; }

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
            const size_t first = width * (offset_ + base + first_moved);
            ggml_backend_tensor_get(t, src.data(), offset + first, src.size());
            for (size_t i = first_moved; i < kept.size(); ++i) {
                std::memcpy(dst.data() + width * (i - first_moved), src.data() + width * (kept[i] - first_moved), width);
            }
            ggml_backend_tensor_set(t, dst.data(), offset + first, dst.size());
        };
        const size_t row = ggml_row_size(GGML_TYPE_F16, n_embd_kv_);
        for (ggml_tensor * t : k_) move(t, 0, row);
        for (ggml_tensor * t : v_) {
            if (!v_transposed_) {
                move(t, 0, row);
                continue;
            }
            for (int j = 0; j < n_embd_kv_; ++j) move(t, ggml_row_size(GGML_TYPE_F16, storage_->slots) * j, sizeof(ggml_fp16_t));
        }
    }
    size_ = base + static_cast<int>(kept.size());
}

std::vector<float> KvCache::read_row(int layer, bool value, int slot) const {
    ggml_tensor * t = value ? v_.at(layer) : k_.at(layer);
    if (slot < 0 || slot >= capacity_) throw Error("KV read_row: slot outside the cache");
    slot += offset_;
    std::vector<ggml_fp16_t> h(n_embd_kv_);
    if (value && v_transposed_) {
        for (int j = 0; j < n_embd_kv_; ++j) {
            ggml_backend_tensor_get(t, &h[j], ggml_row_size(GGML_TYPE_F16, storage_->slots) * j + sizeof(ggml_fp16_t) * slot,
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
