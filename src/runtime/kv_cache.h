#pragma once
// specula's own KV cache: per layer one K tensor of [n_embd_kv, slots] F16 rows and one V
// tensor, pre-allocated on the device that runs the layer. V is stored transposed ([slots, n_embd_kv]) when the backend computes
// attention with ggml's matmuls (AttentionKernel::Matmul), so that KQV reads it in place.
// A KvCache is one sequence's stream of `capacity` slots inside that storage, starting at
// storage slot offset(): stream slot i holds the token at sequence index i, so the stream holds
// exactly the accepted sequence: a forward writes its block after the last slot, then the caller
// keeps what verification accepted with rollback() (a chain prefix, O(1)) or compact() (a tree
// path). KvCache::pool() makes several streams over one storage, so that one forward can carry
// rows of several sequences (ModelRunner::forward_parts); each row sees only its own stream.
#include <cstdint>
#include <memory>
#include <span>
#include <utility>
#include <vector>

struct ggml_context;
struct ggml_tensor;
struct ggml_backend_buffer;
struct ggml_backend;

namespace specula {

class Backend;
struct ModelConfig;

struct KvStorage;

class KvCache {
public:
    // n_layers: how many layers the cache holds (a model's n_layer, or 1 for a draft head).
    KvCache(Backend & backend, int n_layers, int n_embd_kv, int capacity);
    // For a model loaded from a file (config.file_bytes set): throws Error naming the file and its
    // size keys when the cache would be far larger than the file (kv_cache.cpp), rather than
    // allocate what a hostile file asks for.
    KvCache(Backend & backend, const ModelConfig & config, int capacity);
    // n_streams caches of `capacity` slots each over one storage.
    static std::vector<std::unique_ptr<KvCache>> pool(Backend & backend, const ModelConfig & config, int capacity, int n_streams);
    static std::vector<std::unique_ptr<KvCache>> pool(Backend & backend, int n_layers, int n_embd_kv, int capacity, int n_streams);
    ~KvCache();
    KvCache(const KvCache &) = delete;
    KvCache & operator=(const KvCache &) = delete;

    int size() const { return size_; }  // slots holding committed tokens
    int capacity() const { return capacity_; }
    int offset() const { return offset_; }  // first storage slot of this stream
    int storage_slots() const;              // slots of the whole storage (every stream)
    int n_layers() const { return static_cast<int>(k_.size()); }
    int n_embd_kv() const { return n_embd_kv_; }
    bool v_transposed() const { return v_transposed_; }
    // Unique per storage ever made: graphs that reference the tensors key on this, and one forward
    // may only combine streams of the same storage.
    uint64_t id() const { return id_; }

    // Forget every slot from `n` on. O(1): later writes overwrite, the mask hides the rest.
    void rollback(int n);
    // Keep rows base+kept[0], base+kept[1], ... (ascending) of the block that starts at `base` and
    // move them to base, base+1, ...; the cache then holds base + kept.size() slots. Used after
    // tree verification: the accepted path's rows were written at their tree positions. The rows
    // move where they are: in memory for a host buffer, by copies the device runs otherwise.
    void compact(int base, std::span<const int> kept);
    // This stream becomes a copy of `source`'s first n slots (another stream of the same storage):
    // one prompt's rows shared by several sequences without computing them again. The rows move
    // as compact() moves them.
    void copy_from(const KvCache & source, int n);

    // Runtime side: the forward reserves a block of n slots after size() and writes into them.
    int append(int n);  // returns the block's first slot; throws Error if it does not fit
    ggml_tensor * k(int layer) const { return k_[layer]; }
    ggml_tensor * v(int layer) const { return v_[layer]; }  // [n_embd_kv, slots], or [slots, n_embd_kv] transposed

    // The first n slots' K and V rows of every layer, copied to host memory (a server's prefix
    // store keeps them past the stream's reuse), and back: load_rows() makes this stream hold
    // exactly those rows (n = rows.n), bit for bit. Throws Error when n exceeds size() (save) or
    // the rows are of another shape or do not fit the stream (load).
    struct HostRows {
        int n = 0;
        std::vector<uint16_t> f16;  // per layer K then V, each n rows of n_embd_kv F16 values
    };
    HostRows save_rows(int n) const;
    void load_rows(const HostRows & rows);
    // Host bytes save_rows(n) takes.
    size_t row_bytes(int n) const { return size_t(n) * n_layers() * 2 * n_embd_kv_ * sizeof(uint16_t); }

    // One stream slot's K or V row as floats (tests and debugging).
    std::vector<float> read_row(int layer, bool value, int slot) const;

private:
    KvCache(std::shared_ptr<KvStorage> storage, int offset, int capacity);
    // Moves the slots (stream slot from -> to; `from` may lie in another stream of the storage) on
    // every device part.
    void move_slots(std::span<const std::pair<int, int>> moves);
    // Moves the slots in the listed layers (those of one device).
    void move_slots_on_host(std::span<const std::pair<int, int>> moves, std::span<const int> layers);
    void move_slots_on_device(std::span<const std::pair<int, int>> moves, std::span<const int> layers, ggml_backend * device);
    std::shared_ptr<KvStorage> storage_;
    uint64_t id_ = 0;
    int n_embd_kv_ = 0;
    int offset_ = 0;
    int capacity_ = 0;
    bool v_transposed_ = false;
    int size_ = 0;
    std::vector<ggml_tensor *> k_, v_;
};

}  // namespace specula
