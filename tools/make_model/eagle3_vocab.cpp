#include "eagle3_vocab.h"

#include <cstring>
#include <numeric>
#include <vector>

#include "specula/error.h"
#include "common/progress.h"
#include "ggml.h"
#include "gguf.h"
#include "gguf_edit.h"
#include "runtime/gguf_file.h"
#include "tokenizer/draft_vocabulary.h"

namespace specula {

CompactVocabResult write_compact_eagle3(const std::string & head_path, std::span<const int64_t> token_counts, int keep,
                                        const std::string & out_path) {
    GgufFile head(head_path);
    if (head.architecture() != "eagle3") throw Error(head_path + ": not an EAGLE-3 head");
    if (head.tensor_meta("d2t")) throw Error(head_path + ": the head already has a compact vocabulary (d2t)");
    ggml_tensor * lm = head.tensor_meta("output.weight");
    if (!lm) throw Error(head_path + ": missing tensor output.weight");
    const int64_t E = lm->ne[0], V = lm->ne[1];
    if (static_cast<int64_t>(token_counts.size()) != V) {
        throw Error("token counts cover " + std::to_string(token_counts.size()) + " ids, the head's vocabulary has " + std::to_string(V));
    }
    if (keep < 1 || keep >= V) throw Error("--keep must be in [1, " + std::to_string(V - 1) + "]");

    // In id order: d2t is ascending as in EAGLE-3's checkpoints.
    const std::vector<int32_t> ids = most_frequent_ids(token_counts, keep);
    const double total = std::accumulate(token_counts.begin(), token_counts.end(), 0.0);
    double covered = 0.0;
    for (int64_t id : ids) covered += token_counts[id];

    gguf_context * out = metadata_of(head_path);
    size_t bytes = 1 << 20;
    for (ggml_tensor * t : head.tensors()) bytes += ggml_nbytes(t) + ggml_tensor_overhead();
    ggml_init_params params{bytes + static_cast<size_t>(keep) * (sizeof(int64_t) + E * sizeof(float)), nullptr, false};
    ggml_context * ctx = ggml_init(params);
    Progress progress("writing " + out_path, static_cast<int64_t>(head.tensors().size()));
    for (ggml_tensor * meta : head.tensors()) {
        const std::string name = ggml_get_name(meta);
        progress.step(name);
        if (name == "output.weight") {  // rows of the kept ids, stored as F16
            const std::vector<float> all = read_f32(head, name);
            std::vector<float> rows(static_cast<size_t>(keep) * E);
            for (int k = 0; k < keep; ++k) std::memcpy(&rows[static_cast<size_t>(k) * E], &all[static_cast<size_t>(ids[k]) * E], E * sizeof(float));
            ggml_tensor * t = ggml_new_tensor_2d(ctx, GGML_TYPE_F16, E, keep);
            ggml_set_name(t, name.c_str());
            ggml_quantize_chunk(GGML_TYPE_F16, rows.data(), t->data, 0, keep, E, nullptr);
            gguf_add_tensor(out, t);
            continue;
        }
        ggml_tensor * t = ggml_new_tensor(ctx, meta->type, ggml_n_dims(meta), meta->ne);  // copied as stored
        ggml_set_name(t, name.c_str());
        const std::vector<uint8_t> raw = head.read_tensor_bytes(name);
        std::memcpy(t->data, raw.data(), raw.size());
        gguf_add_tensor(out, t);
    }
    ggml_tensor * d2t = ggml_new_tensor_1d(ctx, GGML_TYPE_I64, keep);  // draft id -> target id
    ggml_set_name(d2t, "d2t");
    for (int k = 0; k < keep; ++k) static_cast<int64_t *>(d2t->data)[k] = ids[k];
    gguf_add_tensor(out, d2t);
    write_gguf(out, ctx, out_path);
    return {keep, total > 0 ? covered / total : 0.0};
}

}  // namespace specula
