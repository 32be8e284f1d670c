#include "eagle_convert.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "specula/error.h"
#include "common/json_limits.h"
#include "common/progress.h"
#include "ggml.h"
#include "gguf.h"
#include "gguf_edit.h"
#include "runtime/gguf_file.h"
#include "runtime/gguf_validate.h"

namespace specula {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::string shape_str(const std::vector<int64_t> & s) {
    std::string r = "[";
    for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
    return r + "]";
}

size_t dtype_size(const std::string & dt) {
    if (dt == "F64" || dt == "I64" || dt == "U64") return 8;
    if (dt == "F32" || dt == "I32" || dt == "U32") return 4;
    if (dt == "F16" || dt == "BF16" || dt == "I16" || dt == "U16") return 2;
    if (dt == "I8" || dt == "U8" || dt == "BOOL") return 1;
    return 0;
}

// A header array of non-negative integers: nlohmann's own get<> would convert a float such as
// 1e300 with a cast whose result is undefined, and a negative one would wrap.
std::vector<uint64_t> header_counts(const json & v, const char * what) {
    if (!v.is_array()) throw Error(std::string(what) + " is not an array");
    std::vector<uint64_t> r;
    for (const json & x : v) {
        if (!x.is_number_unsigned()) throw Error(std::string(what) + " holds " + json_kind(x) + ", not a non-negative integer");
        r.push_back(x.get<uint64_t>());
    }
    return r;
}

// A shard the index names, as a path inside the checkpoint folder `dir`: a relative name without
// "..", whose file (symbolic links followed) lies inside the folder. Anything else would have the
// converter read, and name in its errors, whatever file the index points at. A huggingface_hub
// snapshot folder (.../snapshots/<revision>) holds links into the repository's blobs/ two levels
// up: there the repository folder is the bound.
fs::path shard_path(const fs::path & index, const fs::path & dir, const std::string & name) {
    const fs::path rel(name);
    const bool climbs = std::any_of(rel.begin(), rel.end(), [](const fs::path & part) { return part == ".."; });
    if (name.empty() || rel.has_root_path() || climbs) {
        throw Error(index.string() + ": weight_map names shard \"" + name + "\", expected a file name inside the checkpoint folder");
    }
    std::error_code ec;
    const fs::path real_dir = fs::canonical(dir, ec);
    const fs::path bound = real_dir.parent_path().filename() == "snapshots" ? real_dir.parent_path().parent_path() : real_dir;
    const fs::path real = fs::weakly_canonical(dir / rel, ec);
    if (ec || std::mismatch(bound.begin(), bound.end(), real.begin(), real.end()).first != bound.end()) {
        throw Error(index.string() + ": weight_map shard \"" + name + "\" leads outside the checkpoint folder (to " + real.string() + ")");
    }
    return dir / rel;
}

}  // namespace

int64_t SafeTensor::numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
}

// ---------------------------------------------------------------- safetensors

SafetensorsCheckpoint::SafetensorsCheckpoint(const std::string & dir) {
    if (!fs::is_directory(dir)) throw Error(dir + ": no such checkpoint directory");
    const fs::path index = fs::path(dir) / "model.safetensors.index.json";
    std::vector<std::string> files;
    if (fs::exists(index)) {
        std::ifstream in(index);
        json j;
        try {
            j = parse_json(in);
        } catch (const std::exception & e) {
            throw Error(index.string() + ": invalid JSON (" + e.what() + ")");
        }
        if (!j.contains("weight_map") || !j["weight_map"].is_object()) throw Error(index.string() + ": has no weight_map");
        std::set<std::string> shards;
        for (auto & [name, file] : j["weight_map"].items()) {
            if (!file.is_string()) throw Error(index.string() + ": weight_map entry " + name + " is not a file name");
            shards.insert(file.get<std::string>());
        }
        for (const auto & s : shards) files.push_back(shard_path(index, dir, s).string());
    } else {
        for (const auto & e : fs::directory_iterator(dir)) {
            if (e.path().extension() == ".safetensors") files.push_back(e.path().string());
        }
        std::sort(files.begin(), files.end());
    }
    if (files.empty()) {
        const bool has_bin = fs::exists(fs::path(dir) / "pytorch_model.bin") || fs::exists(fs::path(dir) / "pytorch_model.bin.index.json");
        throw Error(dir + ": no *.safetensors files" +
                    (has_bin ? std::string(" (pytorch .bin checkpoints are not supported: re-save the state dict as safetensors)") : ""));
    }
    for (const auto & f : files) add_file(f);
}

void SafetensorsCheckpoint::add_file(const std::string & path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw Error(path + ": cannot open");
    const uint64_t file_size = fs::file_size(path);
    uint8_t len_bytes[8];
    if (!in.read(reinterpret_cast<char *>(len_bytes), 8)) throw Error(path + ": not a safetensors file (too short)");
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | len_bytes[i];
    if (n == 0 || n > file_size - 8 || n > (uint64_t(100) << 20)) throw Error(path + ": not a safetensors file (bad header length)");
    std::string header(n, '\0');
    if (!in.read(header.data(), static_cast<std::streamsize>(n))) throw Error(path + ": truncated safetensors header");
    json j;
    try {
        j = parse_json(header);
    } catch (const std::exception & e) {
        throw Error(path + ": invalid safetensors header JSON (" + e.what() + ")");
    }
    if (!j.is_object()) throw Error(path + ": safetensors header is not a JSON object");
    const uint64_t data_start = 8 + n;
    for (auto & [name, v] : j.items()) {
        if (name == "__metadata__") continue;
        try {
            Entry e;
            e.file = path;
            e.dtype = v.at("dtype").get<std::string>();
            for (uint64_t d : header_counts(v.at("shape"), "shape")) {
                if (d > uint64_t(INT64_MAX)) throw Error("shape dimension " + std::to_string(d) + " is too large");
                e.shape.push_back(static_cast<int64_t>(d));
            }
            const auto off = header_counts(v.at("data_offsets"), "data_offsets");
            if (off.size() != 2 || off[1] < off[0]) throw Error("bad data_offsets");
            // Compared before adding: offsets near 2^64 would wrap back inside the file.
            if (off[1] > file_size - data_start) {
                throw Error("data_offsets end at byte " + std::to_string(off[1]) + " of the data, past the end of the file (" +
                            std::to_string(file_size - data_start) + " data bytes)");
            }
            e.begin = data_start + off[0];
            e.end = data_start + off[1];
            uint64_t numel = 1;
            for (int64_t d : e.shape) {
                if (__builtin_mul_overflow(numel, static_cast<uint64_t>(d), &numel)) throw Error("shape " + shape_str(e.shape) + " overflows");
            }
            const size_t es = dtype_size(e.dtype);
            uint64_t bytes = 0;
            if (es != 0 && (__builtin_mul_overflow(numel, es, &bytes) || bytes != e.end - e.begin)) {
                throw Error("byte size " + std::to_string(e.end - e.begin) + " does not match dtype " + e.dtype + " and shape " + shape_str(e.shape));
            }
            if (index_.count(name)) throw Error("duplicate tensor (also in " + index_[name].file + ")");
            index_[name] = std::move(e);
        } catch (const Error & err) {
            throw Error(path + ": tensor " + name + ": " + err.what());
        } catch (const std::exception & err) {
            throw Error(path + ": tensor " + name + ": malformed header entry (" + err.what() + ")");
        }
    }
}

std::vector<std::string> SafetensorsCheckpoint::names() const {
    std::vector<std::string> r;
    for (const auto & [n, e] : index_) r.push_back(n);
    return r;
}

const std::vector<int64_t> & SafetensorsCheckpoint::shape(const std::string & name) const {
    auto it = index_.find(name);
    if (it == index_.end()) throw Error("checkpoint has no tensor " + name);
    return it->second.shape;
}

SafeTensor SafetensorsCheckpoint::read(const std::string & name) const {
    auto it = index_.find(name);
    if (it == index_.end()) throw Error("checkpoint has no tensor " + name);
    const Entry & e = it->second;
    const size_t es = dtype_size(e.dtype);
    if (es == 0) throw Error(e.file + ": tensor " + name + " has unsupported dtype " + e.dtype + " (F32 F16 BF16 F64 I64 I32 I16 I8 U8 BOOL)");
    std::vector<uint8_t> raw(e.end - e.begin);
    std::ifstream in(e.file, std::ios::binary);
    in.seekg(static_cast<std::streamoff>(e.begin));
    if (!in.read(reinterpret_cast<char *>(raw.data()), static_cast<std::streamsize>(raw.size()))) throw Error(e.file + ": cannot read tensor " + name);
    SafeTensor t;
    t.dtype = e.dtype;
    t.shape = e.shape;
    const size_t n = raw.size() / es;
    auto load = [&](auto tag) {
        using T = decltype(tag);
        std::vector<T> v(n);
        std::memcpy(v.data(), raw.data(), raw.size());  // safetensors is little-endian, as this host
        return v;
    };
    if (e.dtype == "F32") {
        t.f32 = load(float{});
    } else if (e.dtype == "F64") {
        auto v = load(double{});
        t.f32.assign(v.begin(), v.end());
    } else if (e.dtype == "F16") {
        auto v = load(uint16_t{});
        t.f32.resize(n);
        for (size_t i = 0; i < n; ++i) t.f32[i] = ggml_fp16_to_fp32(v[i]);
    } else if (e.dtype == "BF16") {
        auto v = load(uint16_t{});
        t.f32.resize(n);
        for (size_t i = 0; i < n; ++i) {
            const uint32_t bits = uint32_t(v[i]) << 16;
            std::memcpy(&t.f32[i], &bits, 4);
        }
    } else if (e.dtype == "I64") {
        t.i64 = load(int64_t{});
    } else if (e.dtype == "U64") {
        auto v = load(uint64_t{});
        t.i64.assign(v.begin(), v.end());
    } else if (e.dtype == "I32") {
        auto v = load(int32_t{});
        t.i64.assign(v.begin(), v.end());
    } else if (e.dtype == "U32") {
        auto v = load(uint32_t{});
        t.i64.assign(v.begin(), v.end());
    } else if (e.dtype == "I16") {
        auto v = load(int16_t{});
        t.i64.assign(v.begin(), v.end());
    } else if (e.dtype == "U16") {
        auto v = load(uint16_t{});
        t.i64.assign(v.begin(), v.end());
    } else if (e.dtype == "I8") {
        auto v = load(int8_t{});
        t.i64.assign(v.begin(), v.end());
    } else {  // U8, BOOL
        t.i64.assign(raw.begin(), raw.end());
    }
    return t;
}

void write_safetensors_file(const std::string & path, const std::string & header_json, std::span<const uint8_t> data) {
    std::string header = header_json;
    while (header.size() % 8) header += ' ';
    std::ofstream out(path, std::ios::binary);
    const uint64_t n = header.size();
    for (int i = 0; i < 8; ++i) out.put(static_cast<char>((n >> (8 * i)) & 0xff));
    out.write(header.data(), static_cast<std::streamsize>(header.size()));
    out.write(reinterpret_cast<const char *>(data.data()), static_cast<std::streamsize>(data.size()));
    if (!out) throw Error(path + ": could not write");
}

std::vector<float> permute_qk_rows(const std::vector<float> & w, int64_t rows, int64_t cols, int n_head) {
    if (n_head <= 0 || rows % (2 * n_head) != 0) throw Error("q/k permutation: " + std::to_string(rows) + " rows do not split into " + std::to_string(n_head) + " heads of even size");
    // reshape(n_head, 2, D/2, cols).swapaxes(1, 2): out row h*D + 2i + j <- in row h*D + j*D/2 + i
    const int64_t D = rows / n_head, half = D / 2;
    std::vector<float> out(w.size());
    for (int64_t h = 0; h < n_head; ++h) {
        for (int64_t i = 0; i < half; ++i) {
            for (int64_t j = 0; j < 2; ++j) {
                const int64_t dst = h * D + 2 * i + j, src = h * D + j * half + i;
                std::memcpy(out.data() + dst * cols, w.data() + src * cols, sizeof(float) * cols);
            }
        }
    }
    return out;
}

// ---------------------------------------------------------------- conversion

namespace {

struct OutTensor {
    std::string name;
    ggml_type type;
    std::vector<int64_t> ne;  // ggml order (innermost first)
    std::vector<uint8_t> data;
};

ggml_type parse_out_type(const std::string & t) {
    if (t == "f16") return GGML_TYPE_F16;
    if (t == "f32") return GGML_TYPE_F32;
    if (t == "q8_0") return GGML_TYPE_Q8_0;
    throw Error("unknown --type '" + t + "' (f16, f32, q8_0)");
}

// Float data [rows, cols] (or a vector when rows == 0) stored as `type`.
OutTensor make_float(const std::string & name, const std::vector<float> & v, int64_t rows, int64_t cols, ggml_type type) {
    OutTensor t;
    t.name = name;
    if (rows == 0) {  // 1-D: always F32
        t.type = GGML_TYPE_F32;
        t.ne = {cols};
        t.data.resize(v.size() * sizeof(float));
        std::memcpy(t.data.data(), v.data(), t.data.size());
        return t;
    }
    if (type == GGML_TYPE_Q8_0 && cols % ggml_blck_size(type) != 0) type = GGML_TYPE_F16;  // as llama.cpp: fall back
    t.type = type;
    t.ne = {cols, rows};
    t.data.resize(ggml_row_size(type, cols) * rows);
    if (type == GGML_TYPE_F32) {
        std::memcpy(t.data.data(), v.data(), t.data.size());
    } else {
        ggml_quantize_chunk(type, v.data(), t.data.data(), 0, rows, cols, nullptr);
    }
    return t;
}

struct TargetInfo {
    std::string path, arch;
    int n_layer = 0, n_embd = 0, n_vocab = 0, n_ctx = 0;
};

TargetInfo read_target(const std::string & path) {
    GgufFile f(path);
    TargetInfo t;
    t.path = path;
    t.arch = f.architecture();
    const std::string a = t.arch + ".";
    if (!f.has(a + "block_count") || !f.has(a + "embedding_length")) throw Error(path + ": target has no " + a + "block_count / embedding_length (not a llama-family model?)");
    t.n_layer = get_int_in(f, a + "block_count", 1, kMaxModelDim);
    t.n_embd = get_int_in(f, a + "embedding_length", 1, kMaxModelDim);
    t.n_ctx = find_int_in(f, a + "context_length", 1, INT32_MAX).value_or(4096);
    const size_t n_tokens = f.array_length("tokenizer.ggml.tokens");
    if (n_tokens == 0) throw Error(path + ": target has no tokenizer (tokenizer.ggml.tokens) to copy");
    if (n_tokens > INT32_MAX) throw Error(path + ": tokenizer.ggml.tokens has " + std::to_string(n_tokens) + " entries, expected at most " + std::to_string(INT32_MAX));
    t.n_vocab = f.tensor_meta("token_embd.weight") ? embedding_rows(f, a + "vocab_size") : static_cast<int>(n_tokens);
    return t;
}

struct HeadConfig {
    int hidden = 0, n_ff = 0, n_head = 0, n_head_kv = 0, head_dim = 0;
    bool has_head_dim = false;
    float rms_eps = 1e-6f, rope_theta = 10000.0f;
    std::optional<int> n_ctx;
    int vocab = 0, draft_vocab = 0;
    std::optional<int> n_layers;
    std::optional<int> target_hidden;
    std::vector<int> aux_layers;
    bool norm_before_residual = false, norm_before_fc = false;
};

HeadConfig read_config_json(const std::string & dir);

HeadConfig read_config(const std::string & dir) {
    try {
        return read_config_json(dir);
    } catch (const nlohmann::json::exception & e) {  // a key of the wrong JSON type
        throw Error((fs::path(dir) / "config.json").string() + ": malformed (" + e.what() + ")");
    }
}

HeadConfig read_config_json(const std::string & dir) {
    const fs::path p = fs::path(dir) / "config.json";
    std::ifstream in(p);
    if (!in) throw Error(p.string() + ": missing (the checkpoint directory needs config.json)");
    json j;
    try {
        j = parse_json(in);
    } catch (const std::exception & e) {
        throw Error(p.string() + ": invalid JSON (" + e.what() + ")");
    }
    if (j.contains("transformer_layer_config") && j["transformer_layer_config"].is_object()) {  // Eagle3Speculator
        for (auto & [k, v] : j["transformer_layer_config"].items()) j[k] = v;
    }
    const std::string where = p.string() + ": ";
    // Every size in config.json is positive and bounded as GGUF metadata is (runtime/gguf_validate.h):
    // read as 64-bit, never truncated to int.
    auto get_int = [&](const char * key) -> std::optional<int> {
        if (!j.contains(key) || j[key].is_null()) return std::nullopt;
        if (!j[key].is_number_integer()) throw Error(where + key + " must be an integer");
        const int64_t v = j[key].is_number_unsigned() ? static_cast<int64_t>(std::min<uint64_t>(j[key].get<uint64_t>(), INT64_MAX))
                                                      : j[key].get<int64_t>();
        if (v < 1 || v > INT32_MAX) throw Error(where + key + " is " + j[key].dump() + ", expected 1.." + std::to_string(INT32_MAX));
        return static_cast<int>(v);
    };
    auto need_int = [&](const char * key) {
        auto v = get_int(key);
        if (!v) throw Error(where + "missing " + key);
        return *v;
    };
    auto get_float = [&](const char * key, const json & obj) -> std::optional<float> {
        if (!obj.contains(key) || !obj[key].is_number()) return std::nullopt;
        const double v = obj[key].get<double>();
        if (!(v > 0.0) || !std::isfinite(static_cast<float>(v))) throw Error(where + key + " is " + obj[key].dump() + ", expected a positive finite number");
        return static_cast<float>(v);
    };
    HeadConfig c;
    c.hidden = need_int("hidden_size");
    c.n_ff = need_int("intermediate_size");
    c.n_head = need_int("num_attention_heads");
    c.n_head_kv = get_int("num_key_value_heads").value_or(c.n_head);
    if (auto hd = get_int("head_dim")) c.head_dim = *hd, c.has_head_dim = true;
    else c.head_dim = c.hidden / c.n_head;
    if (c.n_head % c.n_head_kv != 0) {
        throw Error(where + "num_key_value_heads " + std::to_string(c.n_head_kv) + " does not divide num_attention_heads " + std::to_string(c.n_head));
    }
    if (c.head_dim <= 0 || c.head_dim % 2 != 0) {
        throw Error(where + "head size " + std::to_string(c.head_dim) + " (head_dim, or hidden_size / num_attention_heads) is not a positive even number");
    }
    c.rms_eps = get_float("rms_norm_eps", j).value_or(c.rms_eps);
    json rope = json::object();
    if (j.contains("rope_parameters") && j["rope_parameters"].is_object()) rope = j["rope_parameters"];
    else if (j.contains("rope_scaling") && j["rope_scaling"].is_object()) rope = j["rope_scaling"];
    std::string rope_type = rope.value("rope_type", rope.value("type", std::string("default")));
    if (rope_type != "default") throw Error(where + "rope scaling type '" + rope_type + "' is not supported by specula's EAGLE heads");
    if (auto theta = get_float("rope_theta", j)) c.rope_theta = *theta;
    else if (auto nested = get_float("rope_theta", rope)) c.rope_theta = *nested;
    if (auto v = get_int("max_position_embeddings")) c.n_ctx = *v;
    c.vocab = get_int("vocab_size").value_or(0);
    c.draft_vocab = get_int("draft_vocab_size").value_or(0);
    c.n_layers = get_int("num_hidden_layers");
    c.target_hidden = get_int("target_hidden_size");
    if (j.contains("eagle_aux_hidden_state_layer_ids") && !j["eagle_aux_hidden_state_layer_ids"].is_null()) {
        for (const json & id : j["eagle_aux_hidden_state_layer_ids"]) {  // range-checked against the target later
            if (!id.is_number_integer() || id.get<int64_t>() < INT32_MIN || id.get<int64_t>() > INT32_MAX) {
                throw Error(where + "eagle_aux_hidden_state_layer_ids has " + json_kind(id) + ", expected layer numbers");
            }
            c.aux_layers.push_back(id.get<int>());
        }
    }
    auto get_bool = [&](const char * key) { return j.contains(key) && j[key].is_boolean() && j[key].get<bool>(); };
    c.norm_before_residual = get_bool("norm_before_residual");
    c.norm_before_fc = get_bool("norm_before_fc");
    return c;
}

// Canonical checkpoint name: drop "model.", layer 0 as "L." ("midlayer." / "layers.0.").
std::string canonical(std::string n) {
    if (n.rfind("model.", 0) == 0) n = n.substr(6);
    if (n.rfind("midlayer.", 0) == 0) return "L." + n.substr(9);
    if (n.rfind("layers.0.", 0) == 0) return "L." + n.substr(9);
    return n;
}

// The head's sizes, checked against the config's and the target's.
struct HeadShape {
    int vocab = 0;                   // the target's vocabulary
    int E = 0;                       // the head's width
    int target_hidden = 0;           // the target's width (EAGLE-3 reads 3 of its layers)
    int n_draft = 0;                 // the head's output vocabulary (EAGLE-3: a subset, mapped by d2t)
    std::vector<int> target_layers;  // EAGLE-3: the target layers whose inputs the head reads
};

HeadShape check_against_target(const HeadConfig & c, const TargetInfo & tgt, bool eagle3, const std::string & cfg) {
    const std::string vs_target = " but the target " + tgt.path + " has ";
    HeadShape h;
    if (c.n_layers && *c.n_layers != 1) throw Error(cfg + "num_hidden_layers is " + std::to_string(*c.n_layers) + "; an EAGLE head has 1");
    h.vocab = c.vocab > 0 ? c.vocab : tgt.n_vocab;
    if (h.vocab != tgt.n_vocab) throw Error(cfg + "vocab_size is " + std::to_string(h.vocab) + vs_target + std::to_string(tgt.n_vocab) + " tokens");
    h.E = c.hidden;
    h.target_hidden = eagle3 && c.target_hidden ? *c.target_hidden : tgt.n_embd;
    if (h.target_hidden != tgt.n_embd) throw Error(cfg + "target_hidden_size is " + std::to_string(h.target_hidden) + vs_target + "hidden size " + std::to_string(tgt.n_embd));
    if (!eagle3 && h.E != tgt.n_embd) throw Error(cfg + "hidden_size is " + std::to_string(h.E) + vs_target + "hidden size " + std::to_string(tgt.n_embd));
    h.n_draft = eagle3 && c.draft_vocab > 0 ? c.draft_vocab : h.vocab;
    if (h.n_draft > h.vocab) throw Error(cfg + "draft_vocab_size " + std::to_string(h.n_draft) + " exceeds vocab_size " + std::to_string(h.vocab));
    if (eagle3) {
        const int L = tgt.n_layer;
        const bool from_config = !c.aux_layers.empty();
        h.target_layers = from_config ? c.aux_layers : std::vector<int>{2, L / 2, L - 3};
        if (h.target_layers.size() != 3) throw Error(cfg + "eagle_aux_hidden_state_layer_ids must list 3 layers");
        for (int l : h.target_layers) {
            if (l < 0 || l > L) {
                throw Error(std::string(from_config ? cfg + "eagle_aux_hidden_state_layer_ids" : "default target layers [2, L/2, L-3]") +
                            " include layer " + std::to_string(l) + vs_target + std::to_string(L) + " layers");
            }
        }
    }
    return h;
}

// One checkpoint tensor the head may hold: its GGUF name ("" = dropped), HF shape, whether it must be there.
struct TensorSpec {
    std::string out;
    std::vector<int64_t> shape;  // HF order
    bool required;
    int permute_heads = 0;
};

// Canonical checkpoint name -> spec, for this kind of head and these sizes.
std::map<std::string, TensorSpec> expected_tensors(const HeadConfig & c, const HeadShape & h, const TargetInfo & tgt, bool eagle3,
                                                   const SafetensorsCheckpoint & ck, const std::string & dir) {
    const int64_t E = h.E, Q = int64_t(c.n_head) * c.head_dim, KV = int64_t(c.n_head_kv) * c.head_dim, F = c.n_ff;
    const int64_t attn_in = eagle3 ? 2 * E : E;
    std::map<std::string, TensorSpec> specs;
    specs["L.self_attn.q_proj.weight"] = {"blk.0.attn_q.weight", {Q, attn_in}, true, c.n_head};
    specs["L.self_attn.k_proj.weight"] = {"blk.0.attn_k.weight", {KV, attn_in}, true, c.n_head_kv};
    specs["L.self_attn.v_proj.weight"] = {"blk.0.attn_v.weight", {KV, attn_in}, true};
    specs["L.self_attn.o_proj.weight"] = {"blk.0.attn_output.weight", {E, Q}, true};
    specs["L.post_attention_layernorm.weight"] = {"blk.0.ffn_norm.weight", {E}, true};
    specs["L.mlp.gate_proj.weight"] = {"blk.0.ffn_gate.weight", {F, E}, true};
    specs["L.mlp.up_proj.weight"] = {"blk.0.ffn_up.weight", {F, E}, true};
    specs["L.mlp.down_proj.weight"] = {"blk.0.ffn_down.weight", {E, F}, true};
    if (eagle3) {
        const bool has_d2t = ck.has("d2t") || ck.has("model.d2t");
        if (h.n_draft < h.vocab && !has_d2t) throw Error(dir + ": draft_vocab_size " + std::to_string(h.n_draft) + " < vocab_size " + std::to_string(h.vocab) + " but the checkpoint has no d2t");
        specs["fc.weight"] = {"fc.weight", {E, 3 * int64_t(h.target_hidden)}, true};
        specs["input_norm.weight"] = {"enc.output_norm.weight", {3 * int64_t(h.target_hidden)}, c.norm_before_fc};
        specs["L.input_layernorm.weight"] = {"blk.0.attn_norm.weight", {E}, true};
        specs["L.hidden_norm.weight"] = {"blk.0.attn_norm_2.weight", {E}, true};
        specs["norm.weight"] = {"output_norm.weight", {E}, true};
        specs["lm_head.weight"] = {"output.weight", {h.n_draft, E}, has_d2t || h.n_draft < h.vocab || E != tgt.n_embd};
        specs["embed_tokens.weight"] = {"token_embd.weight", {h.vocab, E}, E != tgt.n_embd};
        specs["d2t"] = {"d2t", {h.n_draft}, h.n_draft < h.vocab};
    } else {
        specs["fc.weight"] = {"fc.weight", {E, 2 * E}, true};
        specs["fc.bias"] = {"fc.bias", {E}, false};
        specs["embed_tokens.weight"] = {"", {h.vocab, E}, false};  // dropped: the target's embeddings are used
    }
    return specs;
}

// Canonical name -> checkpoint name of every tensor the checkpoint holds; throws Error on an
// unexpected, duplicated, missing or misshapen one.
std::map<std::string, std::string> match_tensors(const SafetensorsCheckpoint & ck, const std::map<std::string, TensorSpec> & specs, bool eagle3,
                                                 const std::string & dir) {
    const std::set<std::string> ignored = {"t2d"};
    std::map<std::string, std::string> found;
    for (const auto & n : ck.names()) {
        const std::string cn = canonical(n);
        if (ignored.count(cn) || cn.find("rotary_emb.inv_freq") != std::string::npos) continue;
        if (!specs.count(cn)) {
            throw Error(dir + ": unexpected tensor " + n + " for an " + (eagle3 ? "EAGLE-3" : "EAGLE-1") + " checkpoint" +
                        (!eagle3 && cn == "L.input_layernorm.weight" ? " (EAGLE-1 has no input_layernorm: is this EAGLE-3?)" : ""));
        }
        if (found.count(cn)) throw Error(dir + ": tensors " + found[cn] + " and " + n + " are the same weight");
        found[cn] = n;
    }
    for (const auto & [cn, s] : specs) {
        if (!found.count(cn)) {
            if (s.required) throw Error(dir + ": missing tensor " + (cn.rfind("L.", 0) == 0 ? (eagle3 ? "midlayer." : "layers.0.") + cn.substr(2) : cn));
            continue;
        }
        const auto & shape = ck.shape(found.at(cn));
        if (shape != s.shape) throw Error(dir + ": tensor " + found.at(cn) + " has shape " + shape_str(shape) + ", expected " + shape_str(s.shape));
    }
    return found;
}

// d2t: the checkpoint's offsets as absolute target ids, each in the vocabulary and none twice.
OutTensor d2t_tensor(const SafeTensor & t, int vocab, const std::string & dir) {
    if (t.i64.empty() && t.numel() > 0) throw Error(dir + ": d2t has dtype " + t.dtype + "; expected integer offsets");
    std::vector<int64_t> ids(t.i64.size());
    std::set<int64_t> seen;
    for (size_t i = 0; i < ids.size(); ++i) {
        ids[i] = t.i64[i] + static_cast<int64_t>(i);  // offsets -> absolute target ids
        if (ids[i] < 0 || ids[i] >= vocab) throw Error(dir + ": d2t maps draft token " + std::to_string(i) + " to target id " + std::to_string(ids[i]) + ", outside the target vocabulary of " + std::to_string(vocab));
        if (!seen.insert(ids[i]).second) throw Error(dir + ": d2t maps two draft tokens to target id " + std::to_string(ids[i]));
    }
    OutTensor ot{"d2t", GGML_TYPE_I64, {static_cast<int64_t>(ids.size())}, {}};
    ot.data.resize(ids.size() * sizeof(int64_t));
    std::memcpy(ot.data.data(), ids.data(), ot.data.size());
    return ot;
}

// The head's GGUF: the target's tokenizer.* keys, the head's hyperparameters, then `outs`.
void write_head_gguf(const EagleConvertOptions & o, const HeadConfig & c, const HeadShape & h, const TargetInfo & tgt, bool eagle3,
                     ggml_type wtype, std::vector<OutTensor> & outs) {
    gguf_context * out = gguf_init_empty();
    {
        ggml_context * meta = nullptr;
        gguf_init_params p{true, &meta};
        gguf_context * src = gguf_init_from_file(tgt.path.c_str(), p);
        if (!src) {
            gguf_free(out);
            throw Error(tgt.path + ": cannot read target GGUF");
        }
        gguf_set_kv(out, src);
        gguf_free(src);
        if (meta) ggml_free(meta);
        for (int64_t i = gguf_get_n_kv(out) - 1; i >= 0; --i) {  // keep only tokenizer.*
            const std::string key = gguf_get_key(out, i);
            if (key.rfind("tokenizer.", 0) != 0) gguf_remove_key(out, key.c_str());
        }
    }
    const std::string arch = eagle3 ? "eagle3" : "specula-eagle1";
    const std::string a = arch + ".";
    gguf_set_val_str(out, "general.architecture", arch.c_str());
    const std::string name = fs::path(o.checkpoint_dir).lexically_normal().filename().string();
    gguf_set_val_str(out, "general.name", (name.empty() ? fs::path(o.checkpoint_dir).parent_path().filename().string() : name).c_str());
    gguf_set_val_u32(out, "general.file_type", wtype == GGML_TYPE_F32 ? 0 : wtype == GGML_TYPE_F16 ? 1
                                                                                                   : 7);
    gguf_set_val_u32(out, (a + "block_count").c_str(), 1);
    gguf_set_val_u32(out, (a + "context_length").c_str(), c.n_ctx.value_or(tgt.n_ctx));
    gguf_set_val_u32(out, (a + "embedding_length").c_str(), h.E);
    gguf_set_val_u32(out, (a + "feed_forward_length").c_str(), c.n_ff);
    gguf_set_val_u32(out, (a + "attention.head_count").c_str(), c.n_head);
    gguf_set_val_u32(out, (a + "attention.head_count_kv").c_str(), c.n_head_kv);
    if (c.has_head_dim) {
        gguf_set_val_u32(out, (a + "attention.key_length").c_str(), c.head_dim);
        gguf_set_val_u32(out, (a + "attention.value_length").c_str(), c.head_dim);
    }
    gguf_set_val_f32(out, (a + "attention.layer_norm_rms_epsilon").c_str(), c.rms_eps);
    gguf_set_val_f32(out, (a + "rope.freq_base").c_str(), c.rope_theta);
    gguf_set_val_u32(out, (a + "rope.dimension_count").c_str(), c.head_dim);
    gguf_set_val_u32(out, (a + "vocab_size").c_str(), h.vocab);
    gguf_set_val_u32(out, (a + "target_hidden_size").c_str(), h.target_hidden);
    if (eagle3) {
        gguf_set_arr_data(out, "eagle3.target_layers", GGUF_TYPE_INT32, h.target_layers.data(), h.target_layers.size());
        gguf_set_val_bool(out, "eagle3.norm_before_residual", c.norm_before_residual);
        gguf_set_val_bool(out, "eagle3.norm_before_fc", c.norm_before_fc);
    }

    // The tensors point into `outs`, which holds their data until written.
    ggml_init_params ip{ggml_tensor_overhead() * (outs.size() + 1), nullptr, true};
    ggml_context * ctx = ggml_init(ip);
    for (auto & t : outs) {
        ggml_tensor * g = t.ne.size() == 1 ? ggml_new_tensor_1d(ctx, t.type, t.ne[0]) : ggml_new_tensor_2d(ctx, t.type, t.ne[0], t.ne[1]);
        ggml_set_name(g, t.name.c_str());
        g->data = t.data.data();
        gguf_add_tensor(out, g);
    }
    write_gguf(out, ctx, o.out_path);
}

}  // namespace

EagleConvertResult convert_eagle(const EagleConvertOptions & o) {
    const bool eagle3 = o.kind == "eagle3";
    if (!eagle3 && o.kind != "eagle1") throw Error("unknown --kind '" + o.kind + "' (eagle3, eagle1)");
    const ggml_type wtype = parse_out_type(o.type);
    const TargetInfo tgt = read_target(o.target_gguf);
    const HeadConfig c = read_config(o.checkpoint_dir);
    const SafetensorsCheckpoint ck(o.checkpoint_dir);
    const HeadShape h = check_against_target(c, tgt, eagle3, (fs::path(o.checkpoint_dir) / "config.json").string() + ": ");
    const std::map<std::string, TensorSpec> specs = expected_tensors(c, h, tgt, eagle3, ck, o.checkpoint_dir);
    const std::map<std::string, std::string> found = match_tensors(ck, specs, eagle3, o.checkpoint_dir);

    std::vector<OutTensor> outs;
    int64_t n_convert = 0;
    for (const auto & [cn, s] : specs) n_convert += found.count(cn) && !s.out.empty();
    Progress progress("converting " + o.checkpoint_dir, n_convert);
    for (const auto & [cn, s] : specs) {
        if (!found.count(cn) || s.out.empty()) continue;
        const std::string & name = found.at(cn);
        progress.step(name);
        SafeTensor t = ck.read(name);
        if (cn == "d2t") {
            outs.push_back(d2t_tensor(t, h.vocab, o.checkpoint_dir));
            continue;
        }
        if (t.f32.empty()) throw Error(o.checkpoint_dir + ": tensor " + name + " has dtype " + t.dtype + "; expected floating point");
        if (s.shape.size() == 1) {
            outs.push_back(make_float(s.out, t.f32, 0, s.shape[0], GGML_TYPE_F32));
        } else {
            std::vector<float> v = s.permute_heads ? permute_qk_rows(t.f32, s.shape[0], s.shape[1], s.permute_heads) : std::move(t.f32);
            outs.push_back(make_float(s.out, v, s.shape[0], s.shape[1], wtype));
        }
    }
    write_head_gguf(o, c, h, tgt, eagle3, wtype, outs);
    EagleConvertResult result;
    result.n_draft_vocab = h.n_draft;
    result.target_layers = h.target_layers;
    result.n_tensors = static_cast<int>(outs.size());
    return result;
}

}  // namespace specula
