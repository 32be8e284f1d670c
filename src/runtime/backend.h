#pragma once
// The compute device(s) a model runs on. Algorithms above the runtime never see this:
// choosing CUDA/Metal/Vulkan/RPC instead of the CPU is a ggml build switch plus `device`.
#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "specula/options.h"

struct ggml_backend;
struct ggml_backend_buffer_type;
struct ggml_backend_device;
struct ggml_threadpool;

namespace specula {

struct BackendOptions {
    // "cpu", a ggml device name such as "CUDA0" / "RPC[host:port]", or a comma-separated list of
    // them (e.g. "cpu,RPC[a:50052],RPC[b:50052]"): the model's layers are split across the list.
    std::string device = "cpu";
    int n_threads = 0;                      // CPU threads; 0 = number of physical cores
    Attention attention = Attention::Auto;  // see Backend::attention_kernel
    Kernels kernels = Kernels::Auto;        // see Backend::own_kernels
    // With a device list: the share of the layers each device runs, comma-separated weights in
    // the list's order (e.g. "1,3"); empty = proportional to each device's free memory.
    std::string split = {};
    // With an rpc-server in the list: a forward that has not come back after this many seconds
    // ends the process with one error line (ggml's RPC client waits on its sockets without one).
    double remote_timeout_s = 120.0;
};

// How attention runs: ggml's fused flash-attention kernel; ggml's KQ matmul, masked softmax and
// KQV matmul over a transposed V cache (llama.cpp's -fa off); or specula's batch-invariant
// CPU op (runtime/kernels/attention.h).
enum class AttentionKernel {
    Flash,
    Matmul,
    Specula
};
const char * attention_kernel_name(AttentionKernel k);

// One entry of the device list.
struct Device {
    std::string name;  // as listed: "cpu", "RPC[host:port]", ...
    ggml_backend * backend = nullptr;
    ggml_backend_device * dev = nullptr;
    bool cpu = false;  // the local CPU (specula's own backend, not a remote one)
};

class Backend {
public:
    // A layer index for the token embedding and the output head (norm + LM head): with a remote
    // device in the list they stay on the local CPU, as drafters that share them do, so that logits
    // never cross the network; otherwise on the first device.
    static constexpr int kIo = -1;

    explicit Backend(const BackendOptions & opts);
    ~Backend();
    Backend(const Backend &) = delete;
    Backend & operator=(const Backend &) = delete;

    // Backends in scheduling priority: the listed non-CPU devices first, the CPU last (fallback for ops).
    const std::vector<ggml_backend *> & backends() const { return backends_; }
    // Splits n_layer layers over the device list (BackendOptions::split), contiguous ranges in the
    // list's order. A split backend serves one model: placing a different layer count throws.
    void place_layers(int n_layer);
    // Index into the device list of the device running `layer` (kIo: the embedding and output head).
    int device_of(int layer) const;
    // Buffer types to try, in order, for a weight used by a matrix multiply (CPU repack first).
    const std::vector<std::pair<ggml_backend_device *, ggml_backend_buffer_type *>> & matmul_weight_bufts(int layer = kIo) const;
    ggml_backend_buffer_type * default_buft(int layer = kIo) const;
    ggml_backend * backend_of(int layer) const { return devices_[device_of(layer)].backend; }
    // Whether a device of the list is an rpc-server (the drafter then gets a backend of its own on
    // the local CPU, and the embedding and output head stay there).
    bool remote() const;
    // What happens when an rpc-server fails mid-run (it dies, the link breaks, or a forward
    // outlasts the timeout). Without a handler: the error line, then the process ends (status 1).
    // With one: the error line, then the handler runs once (on the failing forward's thread or the
    // watchdog's), and the forward that met the failure never returns (its thread stays parked in
    // it): a server fails its requests and stays up. Process-wide, like ggml's abort callback.
    using RemoteFailureHandler = std::function<void(const std::string & line)>;
    static void set_remote_failure_handler(RemoteFailureHandler handler);
    int n_threads() const { return n_threads_; }
    // Whether the weight matmuls of `layer` (kIo: the output head) run specula's packed small-batch
    // kernels (runtime/kernels/matmul.h) instead of ggml's mul_mat: "auto" = yes for what the local
    // CPU runs when specula has a SIMD path for the CPU (kernels::detected_cpu_path), where they make
    // verifying a few tokens cost about what one costs, and keep every row batch-invariant; else
    // ggml's, faster than specula's portable loops. In a device list, the layers (and the output
    // head) placed on its `cpu` entry; other devices keep ggml's kernels. "specula" with a list
    // that has no `cpu` entry is an error.
    bool own_kernels(int layer = kIo) const { return own_kernels_ && devices_[device_of(layer)].cpu; }
    // Which kernels run the matmuls and why, for the run summary; with a device list, per device
    // with the layers it runs, and the attention kernel.
    const std::string & kernels_summary() const { return kernels_summary_; }
    // "auto": specula's op with specula's kernels (the whole forward stays batch-invariant);
    // with ggml's kernels, matmul on the CPU (the fused kernel walks the keys one query row at a
    // time, so a 4-8 row verify costs 1.5-3x the matmul form) and flash on GPUs. A device list
    // runs one ggml kernel for every layer (flash by default), its local CPU layers too.
    // KV caches take their V layout from this (transposed for Matmul only).
    AttentionKernel attention_kernel() const { return attention_; }
    bool flash_attention() const { return attention_ == AttentionKernel::Flash; }
    void set_n_threads(int n);

    // Brackets the network waits of one forward (inputs, compute, outputs) on remote devices: the
    // watchdog ends the process with one error line when one outlasts remote_timeout_s.
    class RemoteWait {
    public:
        explicit RemoteWait(const Backend & backend);
        ~RemoteWait();
        RemoteWait(const RemoteWait &) = delete;
        RemoteWait & operator=(const RemoteWait &) = delete;

    private:
        const Backend & backend_;
    };

private:
    // The constructor's steps, in order.
    void choose_kernels(const BackendOptions & opts, const std::vector<std::string> & names);
    void open_devices(const BackendOptions & opts, const std::vector<std::string> & names, ggml_backend_device * cpu_dev);
    void start_remote(const BackendOptions & opts, ggml_backend_device * cpu_dev);
    std::vector<std::pair<ggml_backend_device *, ggml_backend_buffer_type *>> weight_buffer_types(const Device & d,
                                                                                                  ggml_backend_device * cpu_dev) const;
    void watch_remote_waits();
    void describe_placement();  // the run summary of a device list
    void stop_watchdog();
    double remote_timeout_s_ = 0;
    std::mutex watch_mutex_;
    std::condition_variable watch_cv_;
    mutable std::atomic<uint64_t> wait_in_progress_{0};  // the wait's serial number; 0: none
    mutable std::atomic<uint64_t> wait_serial_{0};
    bool watch_stop_ = false;
    std::thread watchdog_;

    std::vector<ggml_backend *> backends_;
    std::vector<Device> devices_;
    std::vector<std::vector<std::pair<ggml_backend_device *, ggml_backend_buffer_type *>>> matmul_bufts_;  // per device
    std::vector<double> split_;                                                                            // per device: its share of the layers
    std::vector<int> layer_device_;
    int io_device_ = 0;
    ggml_backend * cpu_ = nullptr;
    // Kept across forwards: without it ggml starts and joins its worker threads on every graph,
    // which is a visible share of a small draft model's step.
    ggml_threadpool * threadpool_ = nullptr;
    int n_threads_ = 1;
    bool own_kernels_ = false;  // for the local CPU's share (own_kernels)
    std::string own_kernels_name_;
    std::string kernels_summary_;
    AttentionKernel attention_ = AttentionKernel::Matmul;
};

int default_thread_count();

}  // namespace specula
