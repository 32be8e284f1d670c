#pragma once
// One forward pass of a model over a block of new tokens: explicit positions, an explicit
// attention mask (a causal batch and a token tree are the same call), logits only for the rows
// asked for, residual-stream taps at any layers, and a layer range for early exit.
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

namespace specula {

class KvCache;
class Model;
class Network;

// Which rows of the new block each row may attend to. What a row sees of the cache is set by
// ForwardBatch::visible_prefix / cached_visible (by default: all of it).
struct BlockMask {
    int n = 0;
    std::vector<uint8_t> visible;  // [n * n], row-major: visible[i*n + j] = row i sees row j

    static BlockMask causal(int n);
    // Row i sees itself and its ancestors; parents[i] < i, -1 for rows whose parent is in the cache.
    static BlockMask from_parents(std::span<const int> parents);
    bool sees(int i, int j) const { return visible[static_cast<size_t>(i) * n + j] != 0; }
};

struct ForwardBatch {
    std::vector<int32_t> tokens;     // [n] token ids (models: when layer_begin == 0; heads: always)
    std::vector<float> hidden_in;    // [n, width] models: residual stream entering layer_begin > 0;
                                     // heads: target features or their own fed-back hidden state
    std::vector<int32_t> positions;  // [n] RoPE positions
    BlockMask mask;                  // attention among the n new rows
    // Cached slots every row sees: [0, visible_prefix); -1 = the whole cache (the usual case: the
    // cache holds only accepted tokens). A tree drafted over several forwards lists each row's
    // cached ancestors in cached_visible[i] (slots at or past visible_prefix).
    int visible_prefix = -1;
    std::vector<std::vector<int32_t>> cached_visible;
    std::vector<int32_t> logit_rows;  // rows to return logits for (only when the range ends at n_layer)
    std::vector<int> tap_layers;      // return the residual stream entering each of these layers
                                      // (0 = token embeddings, n_layer = final pre-norm state), as
                                      // llama.cpp's eagle3 extract_layers count them
    int layer_begin = 0;
    int layer_end = -1;  // exclusive; -1 = n_layer. A continuation may run no layer at
                         // all (layer_begin == n_layer): the output of hidden_in alone
    // Layer segments: >= 0 makes this batch the continuation (layer_begin > 0) of rows an earlier
    // segment already put at stream slots [kv_slot_begin, kv_slot_begin + n), the cache's last n:
    // their K/V for these layers goes into those slots, so that after the last segment the cache
    // holds what one full-depth forward would have written. -1 = append new slots.
    int kv_slot_begin = -1;
    // Early exit (docs/specee.md): a continuation that only writes the K/V rows of layers
    // [layer_begin, layer_end) for rows whose residual stream stopped at layer_begin. Each layer
    // projects hidden_in (the exit state) through its own norm and K/V weights, so later tokens
    // attend to a complete cache; no attention, FFN or output is computed.
    bool kv_only = false;

    int n_tokens() const { return static_cast<int>(positions.size()); }
    // A causal block of `tokens` at positions start.. with logits for the listed rows.
    static ForwardBatch causal(std::span<const int32_t> tokens, int start_pos, std::vector<int32_t> logit_rows);
};

struct ForwardOutput {
    int n_vocab = 0;
    int n_embd = 0;
    std::vector<float> logits;             // [logit_rows.size(), n_vocab]
    std::vector<std::vector<float>> taps;  // per tap layer: [n, n_embd]
    std::vector<float> hidden_out;         // [n, n_embd] after layer_end - 1 (when layer_end < n_layer),
                                           // or a head's pre-norm output (every row)

    std::span<const float> logits_row(size_t i) const {
        return {logits.data() + i * n_vocab, static_cast<size_t>(n_vocab)};
    }
    // Appends rows [first, first + n) of the taps to dst, each row its tap layers concatenated:
    // the features a drafter takes (Acceptance).
    void append_tap_rows(size_t first, size_t n, std::vector<float> & dst) const {
        const size_t E = static_cast<size_t>(n_embd);
        for (size_t r = first; r < first + n; ++r) {
            for (const auto & tap : taps) dst.insert(dst.end(), tap.begin() + r * E, tap.begin() + (r + 1) * E);
        }
    }
};

// One sequence's share of a forward over several sequences: its block, the cache stream it
// extends, and where its outputs go (logits for its logit_rows, taps and hidden_out for its rows).
struct BatchPart {
    const ForwardBatch * batch = nullptr;
    KvCache * cache = nullptr;
    ForwardOutput * out = nullptr;
};

// Runs forwards of one network (a model or a draft head). Built graphs are kept per shape (token count, padded KV length,
// outputs, layer range, cache), each with its own scheduler and allocation, so alternating shapes
// (draft steps, verify blocks, catch-up blocks) reuse their graphs instead of rebuilding them.
class ModelRunner {
public:
    explicit ModelRunner(const Network & network);
    // A language model's runner whose logits cover only some token ids (a draft model's trimmed
    // vocabulary): its LM head is a copy of those rows of the output weight (read from the
    // model's file), so it reads nothing else. The logit columns are `ids` sorted (logit_ids());
    // on specula's kernels their values have the bits a full forward gives (ggml's matmul blocks
    // by the matrix's shape: within float rounding). Ids covering the vocabulary: all ids.
    ModelRunner(const Model & model, std::span<const int32_t> ids);
    ~ModelRunner();
    ModelRunner(const ModelRunner &) = delete;
    ModelRunner & operator=(const ModelRunner &) = delete;

    // Writes K/V of the block into `cache` after its current size (the cache grows by n), or into
    // the block's own slots for a continuation (ForwardBatch::kv_slot_begin), and returns what
    // was asked for. Throws Error on malformed batches or a full cache.
    void forward(const ForwardBatch & batch, KvCache & cache, ForwardOutput & out);
    ForwardOutput forward(const ForwardBatch & batch, KvCache & cache);
    // One forward over the blocks of several sequences, ragged: each part's rows see only their own
    // stream's cached prefix and their own block's mask, so each part gets what forward() alone
    // would give it (bit for bit with batch-invariant kernels). The streams must be distinct
    // streams of one KvCache::pool; the parts must agree on layer range, taps and hidden width.
    void forward_parts(std::span<const BatchPart> parts);

    const Network & network() const { return net_; }
    // The token id of each logit column; empty: column i is id i (the whole vocabulary).
    std::span<const int32_t> logit_ids() const { return logit_ids_; }
    // Graphs built so far: a forward of a shape the runner keeps builds none.
    size_t graphs_built() const { return graphs_built_; }
    // The graphs that every runner of the process keeps, and their compute buffers' bytes (at most
    // kMaxGraphs per runner, so bounded, but by the largest shapes seen so far).
    static size_t kept_graphs_all();
    static size_t kept_graph_bytes_all();

private:
    struct Graph;
    struct TrimmedHead;
    void check(const ForwardBatch & b, const KvCache & cache) const;
    void run_graph(std::span<const BatchPart> parts, std::span<const int> first_slots, bool want_logits, int layer_end);
    const Network & net_;
    size_t graph_size_ = 0;
    Graph & graph_for(const ForwardBatch & b, KvCache & cache, int n_kv, bool want_logits, int layer_end);
    std::vector<std::unique_ptr<Graph>> graphs_;  // most recently used last
    std::unique_ptr<TrimmedHead> head_;           // the output weight's rows of logit_ids_
    std::vector<int32_t> logit_ids_;
    size_t graphs_built_ = 0;
    // Enough for a tree run's verify sizes plus its draft shapes; each holds its compute buffers.
    static constexpr size_t kMaxGraphs = 32;
};

}  // namespace specula
