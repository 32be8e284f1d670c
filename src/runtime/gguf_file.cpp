#include "runtime/gguf_file.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>

#include "specula/error.h"
#include "ggml-backend.h"
#include "ggml.h"
#include "gguf.h"
#include "runtime/library_log.h"

namespace specula {

GgufFile::GgufFile(const std::string & path) : path_(path) {
    std::error_code ec;
    if (!std::filesystem::exists(path, ec)) throw Error(path + ": no such file");
    if (std::filesystem::is_directory(path, ec)) throw Error(path + ": is a directory, not a GGUF file");
    {
        std::ifstream in(path, std::ios::binary);
        char magic[4] = {};
        if (!in.read(magic, 4) || std::memcmp(magic, "GGUF", 4) != 0) {
            throw Error(path + ": not a GGUF file (bad magic)");
        }
    }
    gguf_init_params params{};
    params.no_alloc = true;
    params.ctx = &meta_;
    capture_library_log();
    take_library_errors();  // drop what earlier calls logged
    gguf_ = gguf_init_from_file(path.c_str(), params);
    if (!gguf_) {
        const std::string why = take_library_errors();
        throw Error(path + ": corrupt or truncated GGUF file" + (why.empty() ? "" : " (" + why + ")"));
    }
    try {
        check_data_extents();
    } catch (...) {  // a constructor that throws runs no destructor
        ggml_free(meta_);
        gguf_free(gguf_);
        throw;
    }
}

// ggml's parser reads only the header when not loading data: a file cut short passes it. Every
// tensor's data must lie inside the file before any reader sizes a buffer by its metadata.
void GgufFile::check_data_extents() {
    std::error_code ec;
    const uint64_t file_size = std::filesystem::file_size(path_, ec);
    if (ec) throw Error(path_ + ": cannot read the file size (" + ec.message() + ")");
    file_bytes_ = file_size;
    const uint64_t data_offset = gguf_get_data_offset(gguf_);
    for (int64_t id = 0; id < gguf_get_n_tensors(gguf_); ++id) {
        const uint64_t begin = data_offset + gguf_get_tensor_offset(gguf_, id);
        const uint64_t end = begin + gguf_get_tensor_size(gguf_, id);
        if (begin < data_offset || end < begin || end > file_size) {
            throw Error(path_ + ": tensor " + gguf_get_tensor_name(gguf_, id) + " has data at bytes " + std::to_string(begin) +
                        ".." + std::to_string(end) + ", past the end of the " + std::to_string(file_size) +
                        "-byte file (truncated?)");
        }
    }
}

GgufFile::~GgufFile() {
    if (meta_) ggml_free(meta_);
    if (gguf_) gguf_free(gguf_);
}

int64_t GgufFile::key_id(const std::string & key) const { return gguf_find_key(gguf_, key.c_str()); }

bool GgufFile::has(const std::string & key) const { return key_id(key) >= 0; }

std::string GgufFile::architecture() const {
    auto a = find_str("general.architecture");
    if (!a) throw Error(path_ + ": GGUF has no general.architecture");
    return *a;
}

std::optional<int64_t> GgufFile::find_int(const std::string & key) const {
    const int64_t id = key_id(key);
    if (id < 0) return std::nullopt;
    switch (gguf_get_kv_type(gguf_, id)) {
        case GGUF_TYPE_UINT8: return gguf_get_val_u8(gguf_, id);
        case GGUF_TYPE_INT8: return gguf_get_val_i8(gguf_, id);
        case GGUF_TYPE_UINT16: return gguf_get_val_u16(gguf_, id);
        case GGUF_TYPE_INT16: return gguf_get_val_i16(gguf_, id);
        case GGUF_TYPE_UINT32: return gguf_get_val_u32(gguf_, id);
        case GGUF_TYPE_INT32: return gguf_get_val_i32(gguf_, id);
        case GGUF_TYPE_INT64: return gguf_get_val_i64(gguf_, id);
        case GGUF_TYPE_UINT64: {
            const uint64_t v = gguf_get_val_u64(gguf_, id);
            if (v > static_cast<uint64_t>(INT64_MAX)) throw Error(path_ + ": metadata key " + key + " is " + std::to_string(v) + ", too large");
            return static_cast<int64_t>(v);
        }
        default: throw Error(path_ + ": metadata key " + key + " is not an integer");
    }
}

std::optional<uint32_t> GgufFile::find_u32(const std::string & key) const {
    const std::optional<int64_t> v = find_int(key);
    if (v && (*v < 0 || *v > UINT32_MAX)) {
        throw Error(path_ + ": metadata key " + key + " is " + std::to_string(*v) + ", expected 0.." + std::to_string(UINT32_MAX));
    }
    return v;
}

uint32_t GgufFile::get_u32(const std::string & key) const {
    auto v = find_u32(key);
    if (!v) throw Error(path_ + ": missing metadata key " + key);
    return *v;
}

std::optional<float> GgufFile::find_f32(const std::string & key) const {
    const int64_t id = key_id(key);
    if (id < 0) return std::nullopt;
    switch (gguf_get_kv_type(gguf_, id)) {
        case GGUF_TYPE_FLOAT32: return gguf_get_val_f32(gguf_, id);
        case GGUF_TYPE_FLOAT64: return static_cast<float>(gguf_get_val_f64(gguf_, id));
        default: throw Error(path_ + ": metadata key " + key + " is not a float");
    }
}

float GgufFile::get_f32(const std::string & key) const {
    auto v = find_f32(key);
    if (!v) throw Error(path_ + ": missing metadata key " + key);
    return *v;
}

std::optional<std::string> GgufFile::find_str(const std::string & key) const {
    const int64_t id = key_id(key);
    if (id < 0) return std::nullopt;
    if (gguf_get_kv_type(gguf_, id) != GGUF_TYPE_STRING) throw Error(path_ + ": metadata key " + key + " is not a string");
    return std::string(gguf_get_val_str(gguf_, id));
}

std::optional<bool> GgufFile::find_bool(const std::string & key) const {
    const int64_t id = key_id(key);
    if (id < 0) return std::nullopt;
    if (gguf_get_kv_type(gguf_, id) != GGUF_TYPE_BOOL) throw Error(path_ + ": metadata key " + key + " is not a bool");
    return gguf_get_val_bool(gguf_, id);
}

size_t GgufFile::array_length(const std::string & key) const {
    const int64_t id = key_id(key);
    if (id < 0 || gguf_get_kv_type(gguf_, id) != GGUF_TYPE_ARRAY) return 0;
    return gguf_get_arr_n(gguf_, id);
}

std::vector<int32_t> GgufFile::get_i32_array(const std::string & key) const {
    const int64_t id = key_id(key);
    if (id < 0) throw Error(path_ + ": missing metadata key " + key);
    if (gguf_get_kv_type(gguf_, id) != GGUF_TYPE_ARRAY) throw Error(path_ + ": metadata key " + key + " is not an array");
    const size_t n = gguf_get_arr_n(gguf_, id);
    const auto t = gguf_get_arr_type(gguf_, id);
    std::vector<int32_t> out(n);
    const void * data = gguf_get_arr_data(gguf_, id);
    for (size_t i = 0; i < n; ++i) {
        int64_t v = 0;
        switch (t) {
            case GGUF_TYPE_INT32: v = static_cast<const int32_t *>(data)[i]; break;
            case GGUF_TYPE_UINT32: v = static_cast<const uint32_t *>(data)[i]; break;
            case GGUF_TYPE_INT64: v = static_cast<const int64_t *>(data)[i]; break;
            case GGUF_TYPE_UINT64: v = static_cast<int64_t>(std::min<uint64_t>(static_cast<const uint64_t *>(data)[i], INT64_MAX)); break;
            case GGUF_TYPE_BOOL: v = static_cast<const int8_t *>(data)[i] != 0; break;
            default: throw Error(path_ + ": metadata key " + key + " is not an integer or bool array");
        }
        if (v < INT32_MIN || v > INT32_MAX) {
            throw Error(path_ + ": metadata key " + key + "[" + std::to_string(i) + "] is " + std::to_string(v) + ", outside the 32-bit range");
        }
        out[i] = static_cast<int32_t>(v);
    }
    return out;
}

std::optional<std::vector<std::string>> GgufFile::find_str_array(const std::string & key) const {
    const int64_t id = key_id(key);
    if (id < 0 || gguf_get_kv_type(gguf_, id) != GGUF_TYPE_ARRAY || gguf_get_arr_type(gguf_, id) != GGUF_TYPE_STRING) return std::nullopt;
    std::vector<std::string> out(gguf_get_arr_n(gguf_, id));
    for (size_t i = 0; i < out.size(); ++i) out[i] = gguf_get_arr_str(gguf_, id, i);
    return out;
}

ggml_tensor * GgufFile::tensor_meta(const std::string & name) const { return ggml_get_tensor(meta_, name.c_str()); }

std::vector<ggml_tensor *> GgufFile::tensors() const {
    std::vector<ggml_tensor *> out;
    for (ggml_tensor * t = ggml_get_first_tensor(meta_); t; t = ggml_get_next_tensor(meta_, t)) out.push_back(t);
    return out;
}

std::vector<uint8_t> GgufFile::read_tensor_bytes(const std::string & name) const {
    const int64_t id = gguf_find_tensor(gguf_, name.c_str());
    if (id < 0) throw Error(path_ + ": missing tensor " + name);
    const size_t offset = gguf_get_data_offset(gguf_) + gguf_get_tensor_offset(gguf_, id);
    const size_t size = gguf_get_tensor_size(gguf_, id);
    std::unique_ptr<FILE, int (*)(FILE *)> f(std::fopen(path_.c_str(), "rb"), &std::fclose);
    if (!f) throw Error(path_ + ": cannot open for reading");
    std::vector<uint8_t> buf(size);
    if (std::fseek(f.get(), static_cast<long>(offset), SEEK_SET) != 0 || std::fread(buf.data(), 1, size, f.get()) != size) {
        throw Error(path_ + ": truncated data for tensor " + name);
    }
    return buf;
}

void GgufFile::load_tensor_data(const std::string & name, ggml_tensor * dst) const {
    const std::vector<uint8_t> buf = read_tensor_bytes(name);
    if (buf.size() != ggml_nbytes(dst)) throw Error(path_ + ": tensor " + name + " has an unexpected size");
    ggml_backend_tensor_set(dst, buf.data(), 0, buf.size());
}

}  // namespace specula
