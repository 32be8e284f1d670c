#pragma once
// Weights of one GGUF file placed in backend buffers: each matrix in the first buffer type the
// device accepts for a matrix multiply with it (CPU repack layouts first), everything else in the
// device's default type. Shared by models and draft heads.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

struct ggml_context;
struct ggml_tensor;
struct ggml_backend_buffer;

namespace specula {

class Backend;
class GgufFile;

class WeightStore {
public:
    WeightStore() = default;
    ~WeightStore();
    WeightStore(const WeightStore &) = delete;
    WeightStore & operator=(const WeightStore &) = delete;

    // Declares tensor `name` of the given shape; nullptr if absent and not required.
    // Throws Error on a missing required tensor, a wrong shape or an unsupported type.
    ggml_tensor * want(const GgufFile & file, Backend & backend, const std::string & name, std::vector<int64_t> shape,
                       bool matmul, bool required);
    // Allocates the buffers and reads every declared tensor from `file`.
    void load(const GgufFile & file);
    size_t bytes() const { return bytes_; }

private:
    std::vector<std::pair<void *, ggml_context *>> ctx_by_buft_;
    std::vector<ggml_backend_buffer *> buffers_;
    std::vector<std::pair<std::string, ggml_tensor *>> declared_;
    size_t bytes_ = 0;
};

}  // namespace specula
