#pragma once
// The compute device(s) a model runs on. Algorithms above the runtime never see this:
// choosing CUDA/Metal/Vulkan/RPC instead of the CPU is a ggml build switch plus `device`.
#include <memory>
#include <string>
#include <vector>

struct ggml_backend;
struct ggml_backend_buffer_type;
struct ggml_backend_device;

namespace specula {

struct BackendOptions {
    std::string device = "cpu";  // "cpu", or a ggml device name such as "CUDA0" / "RPC[host:port]"
    int n_threads = 0;           // CPU threads; 0 = number of physical cores
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
    void set_n_threads(int n);

private:
    std::vector<ggml_backend *> backends_;
    std::vector<std::pair<ggml_backend_device *, ggml_backend_buffer_type *>> matmul_bufts_;
    ggml_backend * cpu_ = nullptr;
    int n_threads_ = 1;
};

int default_thread_count();

}  // namespace specula
