#include "runtime/gguf_validate.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <set>
#include <unordered_map>
#include <sstream>

#include "specula/error.h"
#include "ggml.h"
#include "runtime/gguf_file.h"

namespace specula {

namespace {

std::string range_str(int64_t lo, int64_t hi) { return std::to_string(lo) + ".." + std::to_string(hi); }

std::string float_str(float v) {
    std::ostringstream s;
    s << v;
    return s.str();
}

std::string shape_str(const int64_t * ne, size_t n) {
    std::string s = "[";
    for (size_t i = 0; i < n; ++i) s += (i ? ", " : "") + std::to_string(ne[i]);
    return s + "]";
}

// A token text for an error line: quoted, bytes outside printable ASCII as \xNN, at most 40 of them.
std::string printable(const std::string & text) {
    std::string s = "\"";
    for (size_t i = 0; i < std::min<size_t>(text.size(), 40); ++i) {
        const auto c = static_cast<unsigned char>(text[i]);
        char hex[8];
        std::snprintf(hex, sizeof hex, "\\x%02x", c);
        s += c >= 0x20 && c < 0x7f && c != '"' && c != '\\' ? std::string(1, static_cast<char>(c)) : std::string(hex);
    }
    return s + (text.size() > 40 ? "...\"" : "\"");
}

// Types ggml's CPU mul_mat and get_rows both take as a weight (tied embeddings are both).
bool is_matrix_type(ggml_type t) {
    switch (t) {
        case GGML_TYPE_F32:
        case GGML_TYPE_F16:
        case GGML_TYPE_BF16:
        case GGML_TYPE_Q4_0:
        case GGML_TYPE_Q4_1:
        case GGML_TYPE_Q5_0:
        case GGML_TYPE_Q5_1:
        case GGML_TYPE_Q8_0:
        case GGML_TYPE_Q2_K:
        case GGML_TYPE_Q3_K:
        case GGML_TYPE_Q4_K:
        case GGML_TYPE_Q5_K:
        case GGML_TYPE_Q6_K:
            return true;
        default:
            return false;
    }
}

bool is_integer_type(ggml_type t) { return t == GGML_TYPE_I8 || t == GGML_TYPE_I16 || t == GGML_TYPE_I32 || t == GGML_TYPE_I64; }

// A tensor's integer elements, whatever the integer type it is stored as.
std::vector<int64_t> read_integers(const GgufFile & f, const std::string & name, const ggml_tensor & meta) {
    const std::vector<uint8_t> raw = f.read_tensor_bytes(name);
    const size_t n = static_cast<size_t>(ggml_nelements(&meta));
    std::vector<int64_t> out(n);
    for (size_t i = 0; i < n; ++i) {
        switch (meta.type) {
            case GGML_TYPE_I8: out[i] = reinterpret_cast<const int8_t *>(raw.data())[i]; break;
            case GGML_TYPE_I16: {
                int16_t v;
                std::memcpy(&v, raw.data() + 2 * i, 2);
                out[i] = v;
                break;
            }
            case GGML_TYPE_I32: {
                int32_t v;
                std::memcpy(&v, raw.data() + 4 * i, 4);
                out[i] = v;
                break;
            }
            case GGML_TYPE_I64: std::memcpy(&out[i], raw.data() + 8 * i, 8); break;
            default: throw Error(f.path() + ": tensor " + name + " is not an integer tensor");
        }
    }
    return out;
}

// A 1-D tensor: ne[1..3] are 1.
bool is_vector(const ggml_tensor & t) { return t.ne[1] == 1 && t.ne[2] == 1 && t.ne[3] == 1; }

}  // namespace

std::optional<int> find_int_in(const GgufFile & f, const std::string & key, int lo, int hi) {
    const std::optional<int64_t> v = f.find_int(key);
    if (!v) return std::nullopt;
    if (*v < lo || *v > hi) {
        throw Error(f.path() + ": metadata key " + key + " is " + std::to_string(*v) + ", expected " + range_str(lo, hi));
    }
    return static_cast<int>(*v);
}

int get_int_in(const GgufFile & f, const std::string & key, int lo, int hi) {
    const std::optional<int> v = find_int_in(f, key, lo, hi);
    if (!v) throw Error(f.path() + ": missing metadata key " + key);
    return *v;
}

std::optional<float> find_float_in(const GgufFile & f, const std::string & key, float lo, float hi) {
    const std::optional<float> v = f.find_f32(key);
    if (!v) return std::nullopt;
    if (!std::isfinite(*v) || *v <= lo || *v > hi) {
        throw Error(f.path() + ": metadata key " + key + " is " + float_str(*v) + ", expected a finite value in (" + float_str(lo) +
                    ", " + float_str(hi) + "]");
    }
    return v;
}

float get_float_in(const GgufFile & f, const std::string & key, float lo, float hi) {
    const std::optional<float> v = find_float_in(f, key, lo, hi);
    if (!v) throw Error(f.path() + ": missing metadata key " + key);
    return *v;
}

void read_layer_sizes(const GgufFile & f, const std::string & a, ModelConfig & c) {
    const std::string & path = f.path();
    c.key_prefix = a;
    c.path = path;
    c.file_bytes = f.file_bytes();
    c.n_embd = get_int_in(f, a + "embedding_length", 1, kMaxModelDim);
    c.n_ff = get_int_in(f, a + "feed_forward_length", 1, kMaxModelDim);
    c.n_head = get_int_in(f, a + "attention.head_count", 1, kMaxModelDim);
    c.n_head_kv = find_int_in(f, a + "attention.head_count_kv", 1, kMaxModelDim).value_or(c.n_head);
    if (c.n_head % c.n_head_kv != 0) {
        throw Error(path + ": " + a + "attention.head_count_kv is " + std::to_string(c.n_head_kv) + ", expected a divisor of " + a +
                    "attention.head_count " + std::to_string(c.n_head));
    }
    if (auto key_length = find_int_in(f, a + "attention.key_length", 1, kMaxModelDim)) {
        c.head_dim = *key_length;
    } else {
        if (c.n_embd % c.n_head != 0) {
            throw Error(path + ": " + a + "attention.head_count " + std::to_string(c.n_head) + " does not divide " + a +
                        "embedding_length " + std::to_string(c.n_embd) + " (and no attention.key_length gives the head size)");
        }
        c.head_dim = c.n_embd / c.n_head;
    }
    if (c.head_dim % 2 != 0) throw Error(path + ": head size " + std::to_string(c.head_dim) + " is odd; rope rotates pairs of dimensions");
    if (int64_t(c.n_head) * c.head_dim > kMaxModelDim) {
        throw Error(path + ": " + std::to_string(c.n_head) + " heads of size " + std::to_string(c.head_dim) + " exceed the attention width bound " +
                    std::to_string(kMaxModelDim));
    }
    const int v_len = find_int_in(f, a + "attention.value_length", 1, kMaxModelDim).value_or(c.head_dim);
    if (v_len != c.head_dim) {
        throw Error(path + ": " + a + "attention.value_length is " + std::to_string(v_len) + ", expected the key length " +
                    std::to_string(c.head_dim) + " (different value and key lengths are not supported)");
    }
    const int n_rot = find_int_in(f, a + "rope.dimension_count", 1, kMaxModelDim).value_or(c.head_dim);
    if (n_rot != c.head_dim) {
        throw Error(path + ": " + a + "rope.dimension_count is " + std::to_string(n_rot) + ", expected the head size " +
                    std::to_string(c.head_dim) + " (partial rotary is not supported)");
    }
    c.rms_eps = get_float_in(f, a + "attention.layer_norm_rms_epsilon", 0.0f, 1.0f);
    c.rope_freq_base = find_float_in(f, a + "rope.freq_base", 0.0f, 1e30f).value_or(10000.0f);
}

void check_block_count(const GgufFile & f, const std::string & key, int n_layer) {
    int max_block = -1;
    for (ggml_tensor * t : f.tensors()) {
        const std::string name = ggml_get_name(t);
        if (name.rfind("blk.", 0) != 0) continue;
        const size_t dot = name.find('.', 4);
        const std::string index = name.substr(4, dot == std::string::npos ? std::string::npos : dot - 4);
        if (index.empty() || index.size() > 9 || index.find_first_not_of("0123456789") != std::string::npos) {
            throw Error(f.path() + ": tensor " + name + " has no layer number after blk.");
        }
        max_block = std::max(max_block, std::stoi(index));
    }
    if (max_block + 1 != n_layer) {
        throw Error(f.path() + ": metadata key " + key + " is " + std::to_string(n_layer) + " but the file has tensors for " +
                    std::to_string(max_block + 1) + " layers (blk.0 .. blk." + std::to_string(max_block) + ")");
    }
}

void check_token_texts(const GgufFile & f) {
    const std::string key = "tokenizer.ggml.tokens";
    const std::optional<std::vector<std::string>> texts = f.find_str_array(key);
    if (!texts) return;  // libllama names a missing or mistyped array itself
    std::unordered_map<std::string, size_t> first_with;
    for (size_t id = 0; id < texts->size(); ++id) {
        const std::string text = (*texts)[id].empty() ? "[EMPTY_" + std::to_string(id) + "]" : (*texts)[id];
        const auto [it, inserted] = first_with.emplace(text, id);
        if (!inserted) {
            throw Error(f.path() + ": metadata key " + key + "[" + std::to_string(id) + "] is " + printable(text) + ", as token " +
                        std::to_string(it->second) + " is (libllama needs distinct token texts)");
        }
    }
    if (f.find_str("tokenizer.ggml.model") != "llama") return;
    for (int byte = 0; byte < 256; ++byte) {
        char text[8];
        std::snprintf(text, sizeof text, "<0x%02X>", byte);
        if (!first_with.count(text)) {
            throw Error(f.path() + ": the SentencePiece vocabulary (tokenizer.ggml.model llama) has no byte token " + text +
                        " (libllama spells text it has no token for in byte tokens)");
        }
    }
}

int embedding_rows(const GgufFile & f, const std::string & vocab_key) {
    ggml_tensor * embd = f.tensor_meta("token_embd.weight");
    if (!embd) throw Error(f.path() + ": missing tensor token_embd.weight");
    if (embd->ne[1] < 1 || embd->ne[1] > INT32_MAX) {
        throw Error(f.path() + ": tensor token_embd.weight has " + std::to_string(embd->ne[1]) + " rows, expected 1.." + std::to_string(INT32_MAX));
    }
    const int rows = static_cast<int>(embd->ne[1]);
    if (auto stored = f.find_int(vocab_key); stored && *stored != rows) {
        throw Error(f.path() + ": metadata key " + vocab_key + " is " + std::to_string(*stored) + " but token_embd.weight has " +
                    std::to_string(rows) + " rows");
    }
    return rows;
}

void check_weight(const GgufFile & f, const std::string & name, const ggml_tensor & meta, std::span<const int64_t> shape) {
    const std::string where = f.path() + ": tensor " + name;
    if (shape.size() == 1 && meta.type != GGML_TYPE_F32) {
        throw Error(where + " has type " + ggml_type_name(meta.type) + ", expected f32 (it is applied elementwise to f32 activations)");
    }
    if (shape.size() != 1 && !is_matrix_type(meta.type)) {
        throw Error(where + " has type " + ggml_type_name(meta.type) +
                    ", expected a matrix type (f32 f16 bf16 q4_0 q4_1 q5_0 q5_1 q8_0 q2_k q3_k q4_k q5_k q6_k)");
    }
    for (size_t i = 0; i < 4; ++i) {
        const int64_t expect = i < shape.size() ? shape[i] : 1;
        if (meta.ne[i] != expect) {
            throw Error(where + " has shape " + shape_str(meta.ne, std::max<size_t>(ggml_n_dims(&meta), shape.size())) + ", expected " +
                        shape_str(shape.data(), shape.size()));
        }
    }
}

std::vector<int32_t> read_d2t(const GgufFile & f, int n_target_vocab) {
    ggml_tensor * meta = f.tensor_meta("d2t");
    if (!meta) return {};
    const std::string where = f.path() + ": tensor d2t";
    if (meta->type != GGML_TYPE_I64) throw Error(where + " has type " + ggml_type_name(meta->type) + ", expected i64 target token ids");
    if (!is_vector(*meta) || meta->ne[0] < 1 || meta->ne[0] > n_target_vocab) {
        throw Error(where + " has shape " + shape_str(meta->ne, ggml_n_dims(meta)) + ", expected [n] with 1 <= n <= " +
                    std::to_string(n_target_vocab) + " (the target's vocabulary)");
    }
    std::vector<int32_t> d2t;
    std::vector<bool> seen(n_target_vocab);
    const std::vector<int64_t> ids = read_integers(f, "d2t", *meta);
    for (size_t i = 0; i < ids.size(); ++i) {
        if (ids[i] < 0 || ids[i] >= n_target_vocab) {
            throw Error(where + " maps draft token " + std::to_string(i) + " to " + std::to_string(ids[i]) +
                        ", outside the target's vocabulary 0.." + std::to_string(n_target_vocab - 1));
        }
        if (seen[ids[i]]) throw Error(where + " maps two draft tokens to target token " + std::to_string(ids[i]));
        seen[ids[i]] = true;
        d2t.push_back(static_cast<int32_t>(ids[i]));
    }
    return d2t;
}

void check_t2d(const GgufFile & f, int n_target_vocab, std::span<const int32_t> d2t) {
    ggml_tensor * meta = f.tensor_meta("t2d");
    if (!meta) return;
    const std::string where = f.path() + ": tensor t2d";
    if (!is_integer_type(meta->type)) {
        throw Error(where + " has type " + ggml_type_name(meta->type) + ", expected an integer type (one 0/1 flag per target token)");
    }
    if (!is_vector(*meta) || meta->ne[0] != n_target_vocab) {
        throw Error(where + " has shape " + shape_str(meta->ne, ggml_n_dims(meta)) + ", expected [" + std::to_string(n_target_vocab) +
                    "] (the target's vocabulary)");
    }
    std::vector<bool> mapped(n_target_vocab, d2t.empty());
    for (int32_t id : d2t) mapped[id] = true;
    const std::vector<int64_t> flags = read_integers(f, "t2d", *meta);
    for (int id = 0; id < n_target_vocab; ++id) {
        if (flags[id] != 0 && flags[id] != 1) throw Error(where + "[" + std::to_string(id) + "] is " + std::to_string(flags[id]) + ", expected 0 or 1");
        if ((flags[id] == 1) != mapped[id]) {
            throw Error(where + "[" + std::to_string(id) + "] is " + std::to_string(flags[id]) + " but d2t " +
                        (mapped[id] ? "maps a draft token to" : "maps no draft token to") + " target token " + std::to_string(id));
        }
    }
}

}  // namespace specula
