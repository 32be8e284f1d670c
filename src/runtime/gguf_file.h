#pragma once
// A GGUF file opened for reading: validated header, typed metadata access with clear errors,
// and loading tensor data into backend buffers. Shared by every model and head loader.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

struct gguf_context;
struct ggml_context;
struct ggml_tensor;

namespace specula {

class GgufFile {
public:
    // Throws Error: missing, not GGUF, corrupt, or any tensor's data past the end of the file.
    explicit GgufFile(const std::string & path);
    ~GgufFile();
    GgufFile(const GgufFile &) = delete;
    GgufFile & operator=(const GgufFile &) = delete;

    const std::string & path() const { return path_; }
    uint64_t file_bytes() const { return file_bytes_; }
    std::string architecture() const;

    bool has(const std::string & key) const;
    // Integer metadata of any stored integer type, exactly (an unsigned value above INT64_MAX throws).
    std::optional<int64_t> find_int(const std::string & key) const;
    // Same, and the value must fit 0..UINT32_MAX (throws Error naming key and value otherwise).
    uint32_t get_u32(const std::string & key) const;
    std::optional<uint32_t> find_u32(const std::string & key) const;
    float get_f32(const std::string & key) const;
    std::optional<float> find_f32(const std::string & key) const;
    std::optional<std::string> find_str(const std::string & key) const;
    std::optional<bool> find_bool(const std::string & key) const;
    std::vector<int32_t> get_i32_array(const std::string & key) const;                      // integer or bool (0/1) elements; outside int32 throws
    std::optional<std::vector<std::string>> find_str_array(const std::string & key) const;  // none: absent or not a string array
    size_t array_length(const std::string & key) const;                                     // 0 if absent

    // Tensor metadata (no data) as stored in the file; nullptr if absent.
    ggml_tensor * tensor_meta(const std::string & name) const;
    std::vector<ggml_tensor *> tensors() const;
    // Reads the named tensor's bytes from the file into `dst` (already allocated in a backend buffer).
    void load_tensor_data(const std::string & name, ggml_tensor * dst) const;
    std::vector<uint8_t> read_tensor_bytes(const std::string & name) const;

private:
    std::string path_;
    uint64_t file_bytes_ = 0;
    gguf_context * gguf_ = nullptr;
    ggml_context * meta_ = nullptr;
    int64_t key_id(const std::string & key) const;
    void check_data_extents();  // and records file_bytes_
};

}  // namespace specula
