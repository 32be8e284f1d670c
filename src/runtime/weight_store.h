#pragma once
// Weights of one GGUF file placed in backend buffers. A matrix is repacked for specula's own
// matmul (runtime/kernels/packed_matrix.h) when the backend runs specula's kernels and has one
// for its type; otherwise it goes to the first buffer type the device accepts for a matrix
// multiply with it (ggml's CPU repack layouts first). Everything else goes to the device's default
// type. Shared by models and draft heads.
#include <cstdint>
#include <deque>
#include <string>
#include <utility>
#include <vector>

#include "runtime/kernels/packed_matrix.h"

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

    // Declares tensor `name` of the given shape, placed on the device that runs `layer`
    // (Backend::kIo: the embedding and output head); nullptr if absent and not required.
    // Throws Error on a missing required tensor, a wrong shape or an unsupported type. A matmul
    // weight may come back packed (kernels::packed_matrix_of tells); use it through linear().
    ggml_tensor * want(const GgufFile & file, Backend & backend, const std::string & name, std::vector<int64_t> shape,
                       bool matmul, bool required, int layer = -1);
    // A matmul weight made of some rows of matrix `name` (`rows`, ascending, in range), in that
    // order, placed and packed as want() places the whole matrix (a trimmed LM head). Packed for
    // specula's kernels, each output has the bits the whole matrix gives that row. Throws Error on
    // a missing tensor or a row outside it.
    ggml_tensor * want_rows(const GgufFile & file, Backend & backend, const std::string & name, std::vector<int32_t> rows, int layer);
    // Whether want(..., matmul = true, layer) would repack this tensor for specula's kernels.
    static bool packs(const Backend & backend, const ggml_tensor * meta, int layer = -1);
    // Allocates the buffers and reads every declared tensor from `file`.
    void load(const GgufFile & file);
    size_t bytes() const { return bytes_; }

private:
    // Declares a tensor shaped as `meta` (the file's, or its gathered rows').
    ggml_tensor * declare(const GgufFile & file, Backend & backend, const std::string & name, ggml_tensor * meta, bool matmul,
                          int layer, std::vector<int32_t> rows);
    std::vector<std::pair<void *, ggml_context *>> ctx_by_buft_;
    std::vector<ggml_backend_buffer *> buffers_;
    struct Declared {
        std::string name;
        ggml_tensor * tensor;
        std::vector<int32_t> rows;  // the file matrix's rows it holds, in order; empty: the whole tensor
    };
    std::vector<Declared> declared_;
    // Packing: the file's matrix is read into a staging tensor, repacked, and the staging freed.
    struct PendingPack {
        ggml_tensor * staging;
        ggml_tensor * packed;
    };
    std::vector<PendingPack> pending_;
    std::deque<kernels::PackedMatrix> packed_;  // stable addresses: packed tensors' extra point here
    ggml_context * staging_ctx_ = nullptr;
    size_t bytes_ = 0;
};

}  // namespace specula
