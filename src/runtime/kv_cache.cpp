#include "runtime/kv_cache.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <string>

#include "specula/error.h"
#include "ggml-backend.h"
#include "ggml.h"
#include "runtime/backend.h"
#include "runtime/model_config.h"

namespace specula {

// The tensors every stream of a pool shares. Each layer's K/V lives on the device that runs the
// layer (Backend::device_of): one buffer per device.
struct KvStorage {
    KvStorage(Backend & backend, int n_layers, int n_embd_kv, int slots);
    ~KvStorage() { release(); }
    void release() {
        for (Part & p : parts) {
            if (p.buffer) ggml_backend_buffer_free(p.buffer);
            if (p.ctx) ggml_free(p.ctx);
        }
        parts.clear();
    }
    // The layers one device holds.
    struct Part {
        ggml_backend * device = nullptr;  // computes on the buffer (device-side compaction)
        ggml_context * ctx = nullptr;
        ggml_backend_buffer * buffer = nullptr;
        std::vector<int> layers;
    };
    const Backend * owner = nullptr;  // its remote waits are watched (Backend::RemoteWait)
    uint64_t id = 0;
    int n_embd_kv = 0;
    int slots = 0;
    bool v_transposed = false;
    std::vector<Part> parts;
    std::vector<ggml_tensor *> k, v;
};

KvStorage::KvStorage(Backend & backend, int n_layers, int width, int n_slots)
    : owner(&backend), n_embd_kv(width), slots(n_slots), v_transposed(backend.attention_kernel() == AttentionKernel::Matmul) {
    static std::atomic<uint64_t> next_id{1};
    id = next_id++;
    if (slots <= 0) throw Error("KV cache capacity must be positive");
    k.resize(n_layers);
    v.resize(n_layers);
    for (int il = 0; il < n_layers; ++il) {
        ggml_backend * device = backend.backend_of(il);
        auto part = std::find_if(parts.begin(), parts.end(), [&](const Part & p) { return p.device == device; });
        if (part == parts.end()) {
            ggml_init_params params{ggml_tensor_overhead() * (2 * n_layers + 1), nullptr, true};
            parts.push_back({device, ggml_init(params), nullptr, {}});
            part = parts.end() - 1;
        }
        part->layers.push_back(il);
        k[il] = ggml_new_tensor_2d(part->ctx, GGML_TYPE_F16, n_embd_kv, slots);  // [n_embd_kv, slots]
        v[il] = v_transposed ? ggml_new_tensor_2d(part->ctx, GGML_TYPE_F16, slots, n_embd_kv)
                             : ggml_new_tensor_2d(part->ctx, GGML_TYPE_F16, n_embd_kv, slots);
        ggml_format_name(k[il], "cache_k_l%d", il);
        ggml_format_name(v[il], "cache_v_l%d", il);
    }
    for (Part & p : parts) {
        p.buffer = ggml_backend_alloc_ctx_tensors_from_buft(p.ctx, ggml_backend_get_default_buffer_type(p.device));
        if (!p.buffer) {
            const std::string device = ggml_backend_name(p.device);
            release();  // a throwing constructor runs no destructor
            throw Error("out of memory allocating a KV cache of " + std::to_string(slots) + " slots on " + device);
        }
        // Never-written slots are masked out, but must not hold NaN bit patterns a kernel could touch.
        ggml_backend_buffer_clear(p.buffer, 0);
    }
}

namespace {

// A real model's KV cache stays within a few times its file even at a long context and with
// several streams (an MHA 7B model in Q2_K at 32k tokens: 6x): a cache far larger comes from
// sizes a hostile file asks for (a huge key_length on a tiny width), which would be allocated and
// cleared until the process is killed. Below the floor nothing is refused.
constexpr uint64_t kKvBytesPerFileByte = 64;
constexpr uint64_t kKvFloorBytes = uint64_t(1) << 30;

// `slots` K and V rows of F16 per layer; throws Error naming the file and its size keys past the bound.
int checked_slots(const ModelConfig & c, int64_t slots) {
    const uint64_t bytes = uint64_t(c.n_layer) * 2 * uint64_t(c.n_embd_kv()) * 2 * uint64_t(std::max<int64_t>(slots, 0));
    const uint64_t bound = std::max(kKvFloorBytes, kKvBytesPerFileByte * c.file_bytes);
    if (c.file_bytes > 0 && bytes > bound) {
        const std::string & a = c.key_prefix;
        throw Error(c.path + ": a KV cache of " + std::to_string(slots) + " tokens would need " + std::to_string(bytes) + " bytes (" +
                    std::to_string(c.n_layer) + " layers x K and V x " + a + "attention.head_count_kv " + std::to_string(c.n_head_kv) +
                    " x " + a + "attention.key_length " + std::to_string(c.head_dim) + " x 2 bytes), more than " +
                    std::to_string(kKvBytesPerFileByte) + " times the " + std::to_string(c.file_bytes) + "-byte file");
    }
    return static_cast<int>(slots);
}

}  // namespace

KvCache::KvCache(Backend & backend, const ModelConfig & config, int capacity)
    : KvCache(backend, config.n_layer, config.n_embd_kv(), checked_slots(config, capacity)) {}

KvCache::KvCache(Backend & backend, int n_layers, int n_embd_kv, int capacity)
    : KvCache(std::make_shared<KvStorage>(backend, n_layers, n_embd_kv, capacity), 0, capacity) {}

KvCache::KvCache(std::shared_ptr<KvStorage> storage, int offset, int capacity)
    : storage_(std::move(storage)), id_(storage_->id), n_embd_kv_(storage_->n_embd_kv), offset_(offset), capacity_(capacity), v_transposed_(storage_->v_transposed), k_(storage_->k), v_(storage_->v) {}

std::vector<std::unique_ptr<KvCache>> KvCache::pool(Backend & backend, const ModelConfig & config, int capacity, int n_streams) {
    checked_slots(config, int64_t(capacity) * n_streams);
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
    std::vector<std::pair<int, int>> moves;  // stream slot from -> to, ascending: every `to` is below its `from`
    for (size_t i = 0; i < kept.size(); ++i) {
        if (kept[i] != static_cast<int>(i)) moves.emplace_back(base + kept[i], base + static_cast<int>(i));
    }
    if (!moves.empty()) move_slots(moves);
    size_ = base + static_cast<int>(kept.size());
}

void KvCache::copy_from(const KvCache & source, int n) {
    if (source.storage_ != storage_) throw Error("KV copy: the source stream belongs to another storage");
    if (n < 0 || n > source.size_ || n > capacity_) throw Error("KV copy: " + std::to_string(n) + " slots outside the source or this stream");
    if (&source == this) return rollback(n);
    std::vector<std::pair<int, int>> moves;
    for (int i = 0; i < n; ++i) moves.emplace_back(source.offset_ - offset_ + i, i);
    if (!moves.empty()) move_slots(moves);
    size_ = n;
}

void KvCache::move_slots(std::span<const std::pair<int, int>> moves) {
    for (const KvStorage::Part & part : storage_->parts) {
        if (ggml_backend_buffer_is_host(part.buffer)) {
            move_slots_on_host(moves, part.layers);
        } else {
            move_slots_on_device(moves, part.layers, part.device);
        }
    }
}

// A slot is a row of n_embd_kv F16 values in K and in a row-major V, and a column of a transposed V.
void KvCache::move_slots_on_host(std::span<const std::pair<int, int>> moves, std::span<const int> layers) {
    const size_t row = ggml_row_size(GGML_TYPE_F16, n_embd_kv_);
    auto move_rows = [&](ggml_tensor * t) {
        auto * data = static_cast<char *>(t->data);
        for (auto [from, to] : moves) std::memcpy(data + row * (offset_ + to), data + row * (offset_ + from), row);
    };
    for (int il : layers) move_rows(k_[il]);
    for (int il : layers) {
        ggml_tensor * t = v_[il];
        if (!v_transposed_) {
            move_rows(t);
            continue;
        }
        auto * v = static_cast<ggml_fp16_t *>(t->data);
        for (int j = 0; j < n_embd_kv_; ++j) {
            ggml_fp16_t * channel = v + static_cast<size_t>(j) * storage_->slots + offset_;
            for (auto [from, to] : moves) channel[to] = channel[from];
        }
    }
}

// One graph of copies between views of the cache's own tensors, run by the device that holds
// them: the rows never cross to the host (a GPU or an RPC server keeps them where they are).
// The copies run in order, and none reads a slot an earlier one wrote: a compaction reads above
// every slot written before, a copy reads another stream.
void KvCache::move_slots_on_device(std::span<const std::pair<int, int>> moves, std::span<const int> layers, ggml_backend * device) {
    const size_t n_copies = moves.size() * 2 * layers.size();
    const size_t n_nodes = std::max<size_t>(GGML_DEFAULT_GRAPH_SIZE, n_copies);
    ggml_init_params params{ggml_tensor_overhead() * (3 * n_copies + 1) + ggml_graph_overhead_custom(n_nodes, false), nullptr, true};
    ggml_context * ctx = ggml_init(params);
    if (!ctx) throw Error("KV compact: out of memory for the copy graph");
    ggml_cgraph * gf = ggml_new_graph_custom(ctx, n_nodes, false);
    auto slot_view = [&](ggml_tensor * t, bool transposed, int slot) {
        ggml_tensor * v = transposed ? ggml_view_2d(ctx, t, 1, n_embd_kv_, t->nb[1], ggml_row_size(t->type, offset_ + slot))
                                     : ggml_view_1d(ctx, t, n_embd_kv_, t->nb[1] * (offset_ + slot));
        ggml_backend_view_init(v);
        return v;
    };
    auto copy = [&](ggml_tensor * t, bool transposed) {
        for (auto [from, to] : moves) {
            ggml_tensor * c = ggml_cpy(ctx, slot_view(t, transposed, from), slot_view(t, transposed, to));
            ggml_backend_view_init(c);
            ggml_build_forward_expand(gf, c);
        }
    };
    for (int il : layers) copy(k_[il], false);
    for (int il : layers) copy(v_[il], v_transposed_);
    const ggml_status status = [&] {
        const Backend::RemoteWait remote_wait(*storage_->owner);
        return ggml_backend_graph_compute(device, gf);
    }();
    ggml_free(ctx);
    if (status != GGML_STATUS_SUCCESS) throw Error("KV compact: the device could not move the kept rows");
}

// A slot is a row of n_embd_kv F16 values in K and in a row-major V (n slots: one transfer), and a
// column of a transposed V (one transfer per channel, gathered into the host copy's rows).
KvCache::HostRows KvCache::save_rows(int n) const {
    if (n < 0 || n > size_) throw Error("KV save: " + std::to_string(n) + " slots outside the cache's " + std::to_string(size_));
    HostRows rows{n, std::vector<uint16_t>(row_bytes(n) / sizeof(uint16_t))};
    const size_t row = ggml_row_size(GGML_TYPE_F16, n_embd_kv_), half = sizeof(ggml_fp16_t);
    std::vector<uint16_t> channel(n);
    const Backend::RemoteWait remote_wait(*storage_->owner);
    for (int il = 0; il < n_layers() && n > 0; ++il) {
        uint16_t * k = rows.f16.data() + size_t(2 * il) * n * n_embd_kv_;
        uint16_t * v = k + size_t(n) * n_embd_kv_;
        ggml_backend_tensor_get(k_[il], k, row * offset_, row * n);
        if (!v_transposed_) {
            ggml_backend_tensor_get(v_[il], v, row * offset_, row * n);
            continue;
        }
        for (int j = 0; j < n_embd_kv_; ++j) {
            ggml_backend_tensor_get(v_[il], channel.data(), half * (size_t(storage_->slots) * j + offset_), half * n);
            for (int i = 0; i < n; ++i) v[size_t(i) * n_embd_kv_ + j] = channel[i];
        }
    }
    return rows;
}

void KvCache::load_rows(const HostRows & rows) {
    const int n = rows.n;
    if (n < 0 || n > capacity_ || rows.f16.size() * sizeof(uint16_t) != row_bytes(n)) {
        throw Error("KV load: " + std::to_string(n) + " saved slots are of another shape or exceed this " + std::to_string(capacity_) +
                    "-slot stream");
    }
    const size_t row = ggml_row_size(GGML_TYPE_F16, n_embd_kv_), half = sizeof(ggml_fp16_t);
    std::vector<uint16_t> channel(n);
    const Backend::RemoteWait remote_wait(*storage_->owner);
    for (int il = 0; il < n_layers() && n > 0; ++il) {
        const uint16_t * k = rows.f16.data() + size_t(2 * il) * n * n_embd_kv_;
        const uint16_t * v = k + size_t(n) * n_embd_kv_;
        ggml_backend_tensor_set(k_[il], k, row * offset_, row * n);
        if (!v_transposed_) {
            ggml_backend_tensor_set(v_[il], v, row * offset_, row * n);
            continue;
        }
        for (int j = 0; j < n_embd_kv_; ++j) {
            for (int i = 0; i < n; ++i) channel[i] = v[size_t(i) * n_embd_kv_ + j];
            ggml_backend_tensor_set(v_[il], channel.data(), half * (size_t(storage_->slots) * j + offset_), half * n);
        }
    }
    size_ = n;
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
