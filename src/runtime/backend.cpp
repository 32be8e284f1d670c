#include "runtime/backend.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <set>
#include <string>
#include <thread>

#include "specula/error.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml.h"
#include "runtime/kernels/matmul.h"
#include "runtime/library_log.h"

namespace specula {

int default_thread_count() {
    // Physical cores: hyper-threads slow ggml decode down rather than up.
    std::ifstream cpuinfo("/proc/cpuinfo");
    std::set<std::pair<std::string, std::string>> cores;
    std::string line, phys, core;
    while (std::getline(cpuinfo, line)) {
        auto value = [&] { return line.substr(line.find(':') + 1); };
        if (line.rfind("physical id", 0) == 0) phys = value();
        if (line.rfind("core id", 0) == 0) {
            core = value();
            cores.insert({phys, core});
        }
    }
    if (!cores.empty()) return static_cast<int>(cores.size());
    unsigned n = std::thread::hardware_concurrency();
    return n > 0 ? static_cast<int>(n) : 1;
}

const char * attention_kernel_name(AttentionKernel k) {
    switch (k) {
        case AttentionKernel::Flash: return "flash";
        case AttentionKernel::Matmul: return "matmul";
        case AttentionKernel::Specula: return "specula";
    }
    return "?";
}

namespace {

// Whether something accepts TCP connections at host:port. ggml's RPC client aborts the process
// when it cannot connect, so specula asks first and reports a clear error instead.
bool accepts_connections(const std::string & host, const std::string & port) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo * found = nullptr;
    if (getaddrinfo(host.c_str(), port.c_str(), &hints, &found) != 0) return false;
    bool ok = false;
    for (addrinfo * a = found; a && !ok; a = a->ai_next) {
        const int fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
        if (fd < 0) continue;
        ok = connect(fd, a->ai_addr, a->ai_addrlen) == 0;
        close(fd);
    }
    freeaddrinfo(found);
    return ok;
}

// "RPC[host:port]": the first device of an rpc-server (ggml's RPC backend, which is how a model
// larger than one machine runs). Registered on first use, as llama.cpp's --rpc does.
ggml_backend_dev_t rpc_device(const std::string & name) {
    if (name.size() < 6 || name.back() != ']') throw Error("device '" + name + "': expected RPC[host:port]");
    const std::string endpoint = name.substr(4, name.size() - 5);
    const size_t colon = endpoint.rfind(':');
    if (colon == std::string::npos || colon == 0 || colon + 1 == endpoint.size()) {
        throw Error("device '" + name + "': expected RPC[host:port]");
    }
    ggml_backend_reg_t rpc = ggml_backend_reg_by_name("RPC");
    if (!rpc) throw Error("device '" + name + "': this build has no RPC backend (configure with -DSPECULA_RPC=ON)");
    using AddServer = ggml_backend_reg_t (*)(const char *);
    auto add_server = reinterpret_cast<AddServer>(ggml_backend_reg_get_proc_address(rpc, "ggml_backend_rpc_add_server"));
    if (!add_server) throw Error("device '" + name + "': ggml's RPC backend has no ggml_backend_rpc_add_server");
    if (!accepts_connections(endpoint.substr(0, colon), endpoint.substr(colon + 1))) {
        throw Error("device '" + name + "': no rpc-server answers at " + endpoint);
    }
    ggml_backend_reg_t server = add_server(endpoint.c_str());
    if (!server || ggml_backend_reg_dev_count(server) == 0) {
        throw Error("device '" + name + "': no rpc-server answers at " + endpoint);
    }
    return ggml_backend_reg_dev_get(server, 0);
}

}  // namespace

Backend::Backend(const BackendOptions & opts) {
    // Options are checked before any ggml backend exists: a throwing constructor runs no destructor.
    const bool on_cpu = opts.device == "cpu";
    if (!on_cpu && (opts.kernels == Kernels::Specula || opts.attention == Attention::Specula)) {
        throw Error("specula's own kernels run on the CPU only; device '" + opts.device + "' takes --kernels ggml (or auto)");
    }
    kernels::check_cpu_path_override();
    // "auto" never runs slower than ggml: without a SIMD body for this CPU, specula's portable
    // loops would, so ggml's kernels (NEON, AVX, ...) take the matmuls and the attention.
    const kernels::CpuPath path = kernels::detected_cpu_path();
    const bool simd = path != kernels::CpuPath::Generic;
    own_kernels_ = on_cpu && (opts.kernels == Kernels::Specula || (opts.kernels == Kernels::Auto && simd));
    if (own_kernels_) {
        kernels_summary_ = std::string("specula's, ") + kernels::cpu_path_name(path) + " path";
        if (!simd) kernels_summary_ += " (portable C++: specula has no SIMD path for this CPU)";
    } else if (!on_cpu) {
        kernels_summary_ = "ggml's, on " + opts.device;
    } else if (opts.kernels == Kernels::Ggml) {
        kernels_summary_ = "ggml's (--kernels ggml)";
    } else {
        kernels_summary_ = "ggml's: specula has no SIMD path for this CPU (--kernels specula runs its portable one); "
                           "greedy speculative output can differ from plain decoding at near-ties";
    }
    switch (opts.attention) {
        case Attention::Auto:
            attention_ = own_kernels_ ? AttentionKernel::Specula : on_cpu ? AttentionKernel::Matmul : AttentionKernel::Flash;
            break;
        case Attention::Flash: attention_ = AttentionKernel::Flash; break;
        case Attention::Matmul: attention_ = AttentionKernel::Matmul; break;
        case Attention::Specula: attention_ = AttentionKernel::Specula; break;
    }
    capture_library_log();  // ggml's info lines (e.g. per-tensor repacking) are noise for users
    ggml_backend_dev_t cpu_dev = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    if (!cpu_dev) throw Error("ggml has no CPU backend");

    if (opts.device != "cpu") {
        ggml_backend_dev_t dev = opts.device.rfind("RPC[", 0) == 0 ? rpc_device(opts.device) : ggml_backend_dev_by_name(opts.device.c_str());
        if (!dev) {
            std::string available;
            for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
                available += std::string(available.empty() ? "" : ", ") + ggml_backend_dev_name(ggml_backend_dev_get(i));
            }
            throw Error("device '" + opts.device + "' not found (this build has: " + available + ")");
        }
        ggml_backend_t b = ggml_backend_dev_init(dev, nullptr);
        if (!b) throw Error("could not initialise device '" + opts.device + "'");
        backends_.push_back(b);
        matmul_bufts_.push_back({dev, ggml_backend_dev_buffer_type(dev)});
    }

    cpu_ = ggml_backend_dev_init(cpu_dev, nullptr);
    if (!cpu_) {
        for (ggml_backend_t b : backends_) ggml_backend_free(b);
        throw Error("could not initialise the CPU backend");
    }
    backends_.push_back(cpu_);

    if (backends_.size() == 1) {
        // Repacked layouts (e.g. Q4_0 -> 8x8 interleaved) are what make ggml's CPU matmuls fast.
        ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(cpu_dev);
        auto get_extra = reinterpret_cast<ggml_backend_dev_get_extra_bufts_t>(
            ggml_backend_reg_get_proc_address(reg, "ggml_backend_dev_get_extra_bufts"));
        if (get_extra) {
            for (ggml_backend_buffer_type_t * p = get_extra(cpu_dev); p && *p; ++p) {
                matmul_bufts_.push_back({cpu_dev, *p});
            }
        }
    }
    matmul_bufts_.push_back({cpu_dev, ggml_backend_dev_buffer_type(cpu_dev)});
    try {
        set_n_threads(opts.n_threads > 0 ? opts.n_threads : default_thread_count());
    } catch (...) {
        for (ggml_backend_t b : backends_) ggml_backend_free(b);
        throw;
    }
}

Backend::~Backend() {
    for (ggml_backend_t b : backends_) ggml_backend_free(b);
    if (threadpool_) ggml_threadpool_free(threadpool_);
}

ggml_backend_buffer_type * Backend::default_buft() const {
    return ggml_backend_get_default_buffer_type(backends_.front());
}

void Backend::set_n_threads(int n) {
    n_threads_ = n;
    ggml_backend_cpu_set_n_threads(cpu_, n);
    ggml_threadpool_params params = ggml_threadpool_params_default(n);
    ggml_threadpool * pool = ggml_threadpool_new(&params);
    if (!pool) throw Error("could not start a CPU thread pool of " + std::to_string(n) + " threads");
    ggml_backend_cpu_set_threadpool(cpu_, pool);
    if (threadpool_) ggml_threadpool_free(threadpool_);
    threadpool_ = pool;
}

}  // namespace specula
