#include "runtime/forward.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <string>

#include "specula/error.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml.h"
#include "runtime/kv_cache.h"
#include "runtime/arch/graph.h"
#include "runtime/backend.h"
#include "runtime/gguf_file.h"
#include "runtime/model.h"
#include "runtime/network.h"
#include "runtime/weight_store.h"

namespace specula {

BlockMask BlockMask::causal(int n) {
    BlockMask m;
    m.n = n;
    m.visible.assign(static_cast<size_t>(n) * n, 0);
    for (int i = 0; i < n; ++i) {
        for (int j = 0; j <= i; ++j) m.visible[static_cast<size_t>(i) * n + j] = 1;
    }
    return m;
}

BlockMask BlockMask::from_parents(std::span<const int> parents) {
    BlockMask m;
    m.n = static_cast<int>(parents.size());
    m.visible.assign(static_cast<size_t>(m.n) * m.n, 0);
    for (int i = 0; i < m.n; ++i) {
        if (parents[i] >= i) throw Error("tree mask: parent of row " + std::to_string(i) + " must come before it");
        m.visible[static_cast<size_t>(i) * m.n + i] = 1;
        if (parents[i] >= 0) {
            for (int j = 0; j < i; ++j) m.visible[static_cast<size_t>(i) * m.n + j] |= m.visible[static_cast<size_t>(parents[i]) * m.n + j];
        }
    }
    return m;
}

ForwardBatch ForwardBatch::causal(std::span<const int32_t> tokens, int start_pos, std::vector<int32_t> logit_rows) {
    ForwardBatch b;
    b.tokens.assign(tokens.begin(), tokens.end());
    b.positions.resize(tokens.size());
    for (size_t i = 0; i < tokens.size(); ++i) b.positions[i] = start_pos + static_cast<int32_t>(i);
    b.mask = BlockMask::causal(static_cast<int>(tokens.size()));
    b.logit_rows = std::move(logit_rows);
    return b;
}

namespace {

// Attention reads a cache view padded to this many slots, so that one graph serves many steps.
constexpr int kKvPad = 256;

struct GraphKey {
    int n_tokens, hidden_width, n_kv, n_out, layer_begin, layer_end;
    bool kv_only;
    std::vector<int> taps;
    uint64_t cache_id;
    bool operator==(const GraphKey &) const = default;
};

// The compute buffers of every runner's kept graphs, process-wide: a bounded cache whose size
// depends on the shapes seen so far, which the server reports beside its RSS.
std::atomic<size_t> kept_graph_bytes{0}, kept_graphs{0};

}  // namespace

struct ModelRunner::Graph {
    GraphKey key;
    size_t bytes = 0;  // its compute buffers, on every backend
    ggml_backend_sched_t sched = nullptr;
    ggml_context * ctx = nullptr;
    ggml_cgraph * gf = nullptr;
    GraphInputs in;
    GraphOutputs out;
    Graph() { ++kept_graphs; }
    Graph(const Graph &) = delete;
    Graph & operator=(const Graph &) = delete;
    ~Graph() {
        kept_graph_bytes -= bytes;
        --kept_graphs;
        if (sched) ggml_backend_sched_free(sched);
        if (ctx) ggml_free(ctx);
    }
};

ModelRunner::ModelRunner(const Network & network) : net_(network) {
    graph_size_ = std::max<size_t>(2048, static_cast<size_t>(network.shape().n_layer) * 48 + 128);
}

// The LM head of a trimmed vocabulary: a copy of the output weight's rows of its ids, placed and
// packed as the model's own weight.
struct ModelRunner::TrimmedHead {
    WeightStore store;
    ggml_tensor * output = nullptr;
};

ModelRunner::ModelRunner(const Model & model, std::span<const int32_t> ids) : ModelRunner(static_cast<const Network &>(model)) {
    const int32_t n_vocab = model.config().n_vocab;
    if (ids.empty()) throw Error("ModelRunner: a trimmed vocabulary needs at least one logit id");
    std::vector<int32_t> rows(ids.begin(), ids.end());
    std::sort(rows.begin(), rows.end());
    rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
    for (const int32_t t : {rows.front(), rows.back()}) {
        if (t < 0 || t >= n_vocab) throw Error("ModelRunner: logit id " + std::to_string(t) + " outside the " + std::to_string(n_vocab) + "-token vocabulary");
    }
    if (static_cast<int32_t>(rows.size()) == n_vocab) return;
    const GgufFile file(model.path());
    head_ = std::make_unique<TrimmedHead>();
    head_->output = head_->store.want_rows(file, model.backend(), model.config().tied_output ? "token_embd.weight" : "output.weight", rows, Backend::kIo);
    head_->store.load(file);
    logit_ids_ = std::move(rows);
}

ModelRunner::~ModelRunner() = default;

size_t ModelRunner::kept_graph_bytes_all() { return kept_graph_bytes.load(); }
size_t ModelRunner::kept_graphs_all() { return kept_graphs.load(); }

ForwardOutput ModelRunner::forward(const ForwardBatch & batch, KvCache & cache) {
    ForwardOutput out;
    forward(batch, cache, out);
    return out;
}

void ModelRunner::check(const ForwardBatch & b, const KvCache & cache) const {
    const NetworkShape & c = net_.shape();
    const int n = b.n_tokens();
    const int layer_end = b.layer_end < 0 ? c.n_layer : b.layer_end;
    if (n <= 0) throw Error("forward: empty batch");
    // layer_begin == layer_end == n_layer: the output alone, on a continuation's final state.
    const bool head_only = b.layer_begin == c.n_layer && layer_end == c.n_layer && b.kv_slot_begin >= 0 && !b.kv_only;
    if (b.layer_begin < 0 || (b.layer_begin >= layer_end && !head_only) || layer_end > c.n_layer) throw Error("forward: bad layer range");
    if (!b.tokens.empty() && static_cast<int>(b.tokens.size()) != n) throw Error("forward: tokens and positions differ in length");
    if (b.hidden_in.size() % n != 0) throw Error("forward: hidden_in is not a whole number of rows");
    const int hidden_width = static_cast<int>(b.hidden_in.size() / n);
    net_.check_hidden_in(b, hidden_width);
    if (b.mask.n != n) throw Error("forward: mask size differs from the batch size");
    if (cache.n_layers() != c.n_layer || cache.n_embd_kv() != c.n_embd_kv) throw Error("forward: KV cache does not fit this model");
    for (int32_t t : b.tokens) {
        if (t < 0 || t >= c.n_token_vocab) throw Error("forward: token id " + std::to_string(t) + " outside the vocabulary");
    }
    for (int32_t r : b.logit_rows) {
        if (r < 0 || r >= n) throw Error("forward: logit row outside the batch");
    }
    if (!b.cached_visible.empty() && static_cast<int>(b.cached_visible.size()) != n) throw Error("forward: cached_visible needs one entry per row");
    for (const auto & slots : b.cached_visible) {
        for (int32_t slot : slots) {
            if (slot < 0 || slot >= cache.size()) throw Error("forward: cached_visible names a slot outside the cache");
        }
    }
    if (b.kv_slot_begin >= 0 && (b.layer_begin == 0 || b.kv_slot_begin + n != cache.size())) {
        throw Error("forward: a continuation segment starts past layer 0 and rewrites the cache's last rows");
    }
    if (b.kv_only && (b.kv_slot_begin < 0 || !b.tap_layers.empty() || !b.logit_rows.empty())) {
        throw Error("forward: a K/V-only batch continues an earlier segment and returns nothing");
    }
    for (int l : b.tap_layers) {
        if (l < b.layer_begin || l > layer_end) throw Error("forward: tap layer " + std::to_string(l) + " outside the layer range");
    }
}

void ModelRunner::forward(const ForwardBatch & b, KvCache & cache, ForwardOutput & out) {
    const BatchPart part{&b, &cache, &out};
    forward_parts(std::span(&part, 1));
}

void ModelRunner::forward_parts(std::span<const BatchPart> parts) {
    const NetworkShape & c = net_.shape();
    if (parts.empty()) throw Error("forward: no parts");
    const ForwardBatch & first = *parts[0].batch;
    const int layer_end = first.layer_end < 0 ? c.n_layer : first.layer_end;
    const size_t hidden_width = first.hidden_in.size() / std::max(1, first.n_tokens());
    for (const BatchPart & p : parts) {
        check(*p.batch, *p.cache);
        const ForwardBatch & b = *p.batch;
        if (p.cache->id() != parts[0].cache->id()) throw Error("forward: parts must use streams of one KV pool");
        if (b.layer_begin != first.layer_begin || (b.layer_end < 0 ? c.n_layer : b.layer_end) != layer_end ||
            b.tap_layers != first.tap_layers || b.kv_only != first.kv_only || b.tokens.empty() != first.tokens.empty() ||
            b.hidden_in.size() != hidden_width * b.n_tokens()) {
            throw Error("forward: parts differ in layer range, taps or inputs");
        }
        for (const BatchPart & q : parts) {
            if (&q != &p && q.cache == p.cache) throw Error("forward: two parts extend the same KV stream");
        }
    }
    bool want_logits = false;
    if (layer_end == c.n_layer) {
        for (const BatchPart & p : parts) want_logits |= !p.batch->logit_rows.empty();
    }

    // A continuation's slots belong to its earlier segment: a failure leaves them in place.
    std::vector<int> first_slots;
    try {
        for (const BatchPart & p : parts) {
            const int rewrite = p.batch->kv_slot_begin;
            first_slots.push_back(rewrite >= 0 ? rewrite : p.cache->append(p.batch->n_tokens()));
        }
        run_graph(parts, first_slots, want_logits, layer_end);
    } catch (...) {
        for (size_t i = 0; i < first_slots.size(); ++i) {
            if (parts[i].batch->kv_slot_begin < 0) parts[i].cache->rollback(first_slots[i]);
        }
        throw;
    }
}

ModelRunner::Graph & ModelRunner::graph_for(const ForwardBatch & b, KvCache & cache, int n_kv, bool want_logits, int layer_end) {
    const int n = b.n_tokens();
    const int hidden_width = static_cast<int>(b.hidden_in.size() / n);
    GraphKey key{n, hidden_width, n_kv, want_logits ? static_cast<int>(b.logit_rows.size()) : 0, b.layer_begin, layer_end, b.kv_only, b.tap_layers, cache.id()};
    for (size_t i = 0; i < graphs_.size(); ++i) {
        if (graphs_[i]->key == key) {
            std::rotate(graphs_.begin() + i, graphs_.begin() + i + 1, graphs_.end());
            return *graphs_.back();
        }
    }
    if (graphs_.size() >= kMaxGraphs) graphs_.erase(graphs_.begin());
    auto g = std::make_unique<Graph>();
    g->key = key;
    auto & backends = net_.backend().backends();
    g->sched = ggml_backend_sched_new(const_cast<ggml_backend_t *>(backends.data()), nullptr, static_cast<int>(backends.size()),
                                      graph_size_, false, true);
    if (!g->sched) throw Error("could not create the ggml scheduler");
    ggml_init_params params{ggml_tensor_overhead() * graph_size_ + ggml_graph_overhead_custom(graph_size_, false), nullptr, true};
    g->ctx = ggml_init(params);
    g->gf = ggml_new_graph_custom(g->ctx, graph_size_, false);
    GraphInputs & in = g->in;
    if (!b.tokens.empty()) {
        in.tokens = ggml_new_tensor_1d(g->ctx, GGML_TYPE_I32, n);
        ggml_set_input(in.tokens);
    }
    if (hidden_width > 0) {
        in.hidden_in = ggml_new_tensor_2d(g->ctx, GGML_TYPE_F32, hidden_width, n);
        ggml_set_input(in.hidden_in);
    }
    in.positions = ggml_new_tensor_1d(g->ctx, GGML_TYPE_I32, n);
    in.kq_mask = ggml_new_tensor_2d(g->ctx, GGML_TYPE_F16, n_kv, n);
    in.kv_slots = ggml_new_tensor_1d(g->ctx, GGML_TYPE_I64, n);
    in.n_kv = n_kv;
    in.attention = net_.backend().attention_kernel();
    ggml_set_input(in.positions);
    ggml_set_input(in.kq_mask);
    ggml_set_input(in.kv_slots);
    if (net_.shape().sliding_window > 0) {
        in.kq_mask_sliding = ggml_new_tensor_2d(g->ctx, GGML_TYPE_F16, n_kv, n);
        ggml_set_input(in.kq_mask_sliding);
    }
    if (cache.v_transposed()) {
        in.v_elements = ggml_new_tensor_1d(g->ctx, GGML_TYPE_I64, static_cast<int64_t>(cache.n_embd_kv()) * n);
        ggml_set_input(in.v_elements);
    }
    if (want_logits) {
        in.out_rows = ggml_new_tensor_1d(g->ctx, GGML_TYPE_I32, key.n_out);
        ggml_set_input(in.out_rows);
        if (head_) in.output = head_->output;
    }
    g->out = net_.build_graph(g->ctx, g->gf, cache, in, b, layer_end);
    for (ggml_tensor * t : g->out.taps) {
        ggml_set_output(t);
        ggml_build_forward_expand(g->gf, t);
    }
    for (ggml_tensor * t : {g->out.logits, g->out.hidden_out}) {
        if (t) {
            ggml_set_output(t);
            ggml_build_forward_expand(g->gf, t);
        }
    }
    if (!ggml_backend_sched_alloc_graph(g->sched, g->gf)) throw Error("forward: could not allocate the compute graph");
    for (ggml_backend_t backend : backends) g->bytes += ggml_backend_sched_get_buffer_size(g->sched, backend);
    kept_graph_bytes += g->bytes;
    graphs_.push_back(std::move(g));
    ++graphs_built_;
    return *graphs_.back();
}

namespace {

// The parts as one block: rows of part p start at row_begin[p]; slots holds each row's storage slot.
struct MergedBlock {
    ForwardBatch batch;
    std::vector<int> row_begin;
    std::vector<int64_t> slots;
    int kv_len = 0;  // storage slots up to the end of the farthest part's block
};

MergedBlock merge_parts(std::span<const BatchPart> parts, std::span<const int> first_slots, bool want_logits, int layer_end) {
    MergedBlock m;
    ForwardBatch & merged = m.batch;
    merged.layer_begin = parts[0].batch->layer_begin;
    merged.layer_end = layer_end;
    merged.tap_layers = parts[0].batch->tap_layers;
    merged.kv_only = parts[0].batch->kv_only;
    for (size_t p = 0; p < parts.size(); ++p) {
        const ForwardBatch & b = *parts[p].batch;
        const int base = static_cast<int>(merged.positions.size());
        m.row_begin.push_back(base);
        merged.tokens.insert(merged.tokens.end(), b.tokens.begin(), b.tokens.end());
        merged.hidden_in.insert(merged.hidden_in.end(), b.hidden_in.begin(), b.hidden_in.end());
        merged.positions.insert(merged.positions.end(), b.positions.begin(), b.positions.end());
        if (want_logits) {
            for (int32_t r : b.logit_rows) merged.logit_rows.push_back(base + r);
        }
        const int first = parts[p].cache->offset() + first_slots[p];
        for (int i = 0; i < b.n_tokens(); ++i) m.slots.push_back(first + i);
        m.kv_len = std::max(m.kv_len, first + b.n_tokens());
    }
    merged.mask.n = merged.n_tokens();  // the graph key needs only the size; the real mask is built per part
    return m;
}

// [n_kv, n]: 0 where a row may attend (its own stream's visible prefix, its listed cached slots,
// its block's mask), -inf elsewhere (other streams and padding included). prefixes: each part's
// visible prefix.
std::vector<ggml_fp16_t> attention_mask(std::span<const BatchPart> parts, std::span<const int> first_slots, const MergedBlock & m,
                                        int n_kv, std::vector<int> & prefixes) {
    std::vector<ggml_fp16_t> mask(static_cast<size_t>(n_kv) * m.batch.n_tokens(), ggml_fp32_to_fp16(-INFINITY));
    const ggml_fp16_t zero = ggml_fp32_to_fp16(0.0f);
    for (size_t p = 0; p < parts.size(); ++p) {
        const ForwardBatch & b = *parts[p].batch;
        const int offset = parts[p].cache->offset(), block = offset + first_slots[p];
        const int prefix = b.visible_prefix < 0 ? first_slots[p] : std::min(b.visible_prefix, first_slots[p]);
        prefixes.push_back(prefix);
        for (int i = 0; i < b.n_tokens(); ++i) {
            ggml_fp16_t * row = mask.data() + static_cast<size_t>(m.row_begin[p] + i) * n_kv;
            std::fill(row + offset, row + offset + prefix, zero);
            if (!b.cached_visible.empty()) {
                for (int32_t slot : b.cached_visible[i]) row[offset + slot] = zero;
            }
            for (int j = 0; j < b.n_tokens(); ++j) {
                if (b.mask.sees(i, j)) row[block + j] = zero;
            }
        }
    }
    return mask;
}

// Sliding-window layers also hide every key whose position is window or more before the query's
// (llama.cpp's standard SWA rule). A cached stream slot below the prefix holds the token at
// sequence index = slot, so its position is the slot number.
void hide_outside_window(std::vector<ggml_fp16_t> & mask, std::span<const BatchPart> parts, std::span<const int> first_slots,
                         const MergedBlock & m, std::span<const int> prefixes, int n_kv, int window) {
    const ggml_fp16_t ninf = ggml_fp32_to_fp16(-INFINITY);
    for (size_t p = 0; p < parts.size(); ++p) {
        const ForwardBatch & b = *parts[p].batch;
        const int offset = parts[p].cache->offset(), block = offset + first_slots[p], prefix = prefixes[p];
        for (int i = 0; i < b.n_tokens(); ++i) {
            ggml_fp16_t * row = mask.data() + static_cast<size_t>(m.row_begin[p] + i) * n_kv;
            const int pos = b.positions[i];
            std::fill(row + offset, row + offset + std::clamp(pos - window + 1, 0, prefix), ninf);
            // cached_visible slots hold draft-tree nodes at positions >= prefix, not recorded
            // here; they are surely inside the window only while the query is near the prefix.
            if (!b.cached_visible.empty() && !b.cached_visible[i].empty() && pos - prefix >= window) {
                throw Error("forward: a sliding-window model cannot see cached tree slots farther than its window from the cached prefix");
            }
            for (int j = 0; j < b.n_tokens(); ++j) {
                if (pos - b.positions[j] >= window) row[block + j] = ninf;
            }
        }
    }
}

// Each part's rows straight from the graph's outputs into its ForwardOutput, whose buffers the
// caller keeps between forwards: a verify block's logits are megabytes, and a fresh buffer for
// them costs page faults on every forward.
void read_outputs(std::span<const BatchPart> parts, std::span<const int> row_begin, const GraphOutputs & g, const NetworkShape & c, size_t V) {
    const size_t E = c.n_embd;
    size_t logit_row = 0;
    for (size_t p = 0; p < parts.size(); ++p) {
        const ForwardBatch & b = *parts[p].batch;
        ForwardOutput & out = *parts[p].out;
        out.n_vocab = static_cast<int>(V);
        out.n_embd = c.n_embd;
        const size_t rows = b.n_tokens(), first = row_begin[p];
        const size_t n_out = g.logits ? b.logit_rows.size() : 0;
        out.logits.resize(n_out * V);
        if (n_out > 0) ggml_backend_tensor_get(g.logits, out.logits.data(), sizeof(float) * logit_row * V, sizeof(float) * n_out * V);
        logit_row += n_out;
        out.taps.resize(g.taps.size());
        for (size_t t = 0; t < g.taps.size(); ++t) {
            out.taps[t].resize(rows * E);
            ggml_backend_tensor_get(g.taps[t], out.taps[t].data(), sizeof(float) * first * E, sizeof(float) * rows * E);
        }
        out.hidden_out.resize(g.hidden_out ? rows * E : 0);
        if (g.hidden_out) ggml_backend_tensor_get(g.hidden_out, out.hidden_out.data(), sizeof(float) * first * E, sizeof(float) * rows * E);
    }
}

}  // namespace

void ModelRunner::run_graph(std::span<const BatchPart> parts, std::span<const int> first_slots, bool want_logits, int layer_end) {
    const NetworkShape & c = net_.shape();
    const KvCache & pool = *parts[0].cache;
    const MergedBlock m = merge_parts(parts, first_slots, want_logits, layer_end);
    const ForwardBatch & merged = m.batch;
    const std::vector<int64_t> & slots = m.slots;
    const int n = merged.n_tokens();
    const int n_kv = std::min(pool.storage_slots(), (m.kv_len + kKvPad - 1) / kKvPad * kKvPad);

    const Backend::RemoteWait remote_wait(net_.backend());
    Graph & g = graph_for(merged, *parts[0].cache, n_kv, want_logits, layer_end);

    // An input the graph never reads (e.g. the mask when no layer's attention output is needed)
    // has no buffer and needs no data.
    auto set = [](ggml_tensor * t, const void * data, size_t bytes) {
        if (t && t->buffer) ggml_backend_tensor_set(t, data, 0, bytes);
    };
    set(g.in.tokens, merged.tokens.data(), sizeof(int32_t) * merged.tokens.size());
    set(g.in.hidden_in, merged.hidden_in.data(), sizeof(float) * merged.hidden_in.size());
    set(g.in.positions, merged.positions.data(), sizeof(int32_t) * n);
    set(g.in.kv_slots, slots.data(), sizeof(int64_t) * n);
    if (g.in.v_elements) {
        const int width = pool.n_embd_kv();
        std::vector<int64_t> elements(static_cast<size_t>(width) * n);
        for (int i = 0; i < n; ++i) {
            for (int j = 0; j < width; ++j) elements[static_cast<size_t>(i) * width + j] = static_cast<int64_t>(j) * pool.storage_slots() + slots[i];
        }
        set(g.in.v_elements, elements.data(), sizeof(int64_t) * elements.size());
    }
    set(g.in.out_rows, merged.logit_rows.data(), sizeof(int32_t) * merged.logit_rows.size());

    if (g.in.kq_mask->buffer || (g.in.kq_mask_sliding && g.in.kq_mask_sliding->buffer)) {
        std::vector<int> prefixes;
        std::vector<ggml_fp16_t> mask = attention_mask(parts, first_slots, m, n_kv, prefixes);
        set(g.in.kq_mask, mask.data(), sizeof(ggml_fp16_t) * mask.size());
        if (g.in.kq_mask_sliding) {
            hide_outside_window(mask, parts, first_slots, m, prefixes, n_kv, c.sliding_window);
            set(g.in.kq_mask_sliding, mask.data(), sizeof(ggml_fp16_t) * mask.size());
        }
    }

    if (ggml_backend_sched_graph_compute(g.sched, g.gf) != GGML_STATUS_SUCCESS) throw Error("forward: graph compute failed");
    read_outputs(parts, m.row_begin, g.out, c, logit_ids_.empty() ? static_cast<size_t>(c.n_vocab) : logit_ids_.size());
}

}  // namespace specula
