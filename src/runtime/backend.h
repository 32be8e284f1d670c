#pragma once
// The compute device(s) a model runs on. Algorithms above the runtime never see this:
// choosing CUDA/Metal/Vulkan/RPC instead of the CPU is a ggml build switch plus `device`.
#include <memory>
#include <string>
#include <vector>

struct ggml_backend;
struct ggml_backend_buffer_type;
struct ggml_backend_device;
struct ggml_threadpool;

namespace specula {

struct BackendOptions {
    std::string device = "cpu";  // "cpu", or a ggml device name such as "CUDA0" / "RPC[host:port]"
    int n_threads = 0;           // CPU threads; 0 = number of physical cores
    std::string attention = "auto";  // auto | flash | matmul (see Backend::flash_attention)
};

class Backend {
public:
    explicit Backend(const BackendOptions & opts);
    ~Backend();
    Backend(const Backend &) = delete;
    Backend & operator=(const Backend &) = delete;

    // Backends in scheduling priority: the chosen device first, the CPU last (fallback for ops).
    const std::vector<ggml_backend *> & backends() const { return backends_; }
    // Buffer types to try, in order, for a weight used by a matrix multiply (CPU repack first).
    const std::vector<std::pair<ggml_backend_device *, ggml_backend_buffer_type *>> & matmul_weight_bufts() const {
        return matmul_bufts_;
    }
    ggml_backend_buffer_type * default_buft() const;
    ggml_backend * primary() const { return backends_.front(); }
    int n_threads() const { return n_threads_; }
    // Attention as ggml's fused flash-attention kernel, or as KQ matmul, masked softmax, KQV matmul
    // over a transposed V cache (llama.cpp's -fa off). "auto": matmul on the CPU, where the fused
    // kernel walks the keys one query row at a time, so that a 4-8 row verify block costs 1.5-3x
    // the matmul form; the fused kernel on GPUs. KV caches take their V layout from this.
    bool flash_attention() const { return flash_attention_; }
    void set_n_threads(int n);

private:
    std::vector<ggml_backend *> backends_;
    std::vector<std::pair<ggml_backend_device *, ggml_backend_buffer_type *>> matmul_bufts_;
    ggml_backend * cpu_ = nullptr;
    // Kept across forwards: without it ggml starts and joins its worker threads on every graph,
    // which is a visible share of a small draft model's step.
    ggml_threadpool * threadpool_ = nullptr;
    int n_threads_ = 1;
    bool flash_attention_ = false;
};

int default_thread_count();

}  // namespace specula
