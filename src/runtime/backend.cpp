#include "runtime/backend.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <set>
#include <string>
#include <thread>

#include "specula/error.h"
#include "common/loopback.h"
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
    // ggml's RPC client aborts the process when it cannot connect: ask first, then say so clearly.
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

namespace {

std::vector<std::string> split_list(const std::string & s) {
    std::vector<std::string> items;
    size_t begin = 0;
    while (true) {
        const size_t comma = s.find(',', begin);
        items.push_back(s.substr(begin, comma == std::string::npos ? std::string::npos : comma - begin));
        if (comma == std::string::npos) return items;
        begin = comma + 1;
    }
}

// The --split weights, one per device, or each device's free memory when none are given.
std::vector<double> layer_shares(const std::string & split, const std::vector<Device> & devices) {
    std::vector<double> shares;
    if (split.empty()) {
        for (const Device & d : devices) {
            size_t free = 0, total = 0;
            ggml_backend_dev_memory(d.dev, &free, &total);
            shares.push_back(static_cast<double>(free > 0 ? free : 1));
        }
        return shares;
    }
    const std::vector<std::string> items = split_list(split);
    if (items.size() != devices.size()) {
        throw Error("--split has " + std::to_string(items.size()) + " entries for " + std::to_string(devices.size()) +
                    " devices: give one share per --device entry");
    }
    double sum = 0.0;
    for (const std::string & item : items) {
        size_t used = 0;
        double share = -1.0;
        try {
            share = std::stod(item, &used);
        } catch (const std::exception &) {
            used = 0;
        }
        if (used == 0 || used != item.size() || !std::isfinite(share) || share < 0.0) {
            throw Error("--split '" + split + "': '" + item + "' is not a non-negative number");
        }
        shares.push_back(share);
        sum += share;
    }
    if (!(sum > 0.0)) throw Error("--split '" + split + "': every share is zero");
    return shares;
}

std::mutex remote_failure_mutex;
Backend::RemoteFailureHandler remote_failure_handler;
bool remote_failure_reported = false;

// One error line; then the handler (once), or the end of the process without one.
void report_remote_failure(const std::string & line) {
    std::fprintf(stderr, "specula: error: %s\n", line.c_str());
    std::fflush(stderr);
    Backend::RemoteFailureHandler handler;
    {
        std::lock_guard lock(remote_failure_mutex);
        if (remote_failure_reported) return;
        remote_failure_reported = true;
        handler = remote_failure_handler;
    }
    if (!handler) _exit(1);
    handler(line);
}

// ggml's RPC client aborts the process when an rpc-server stops answering mid-generation (a
// closed socket: the server died or the link broke): nothing can unwind to the caller from
// there, so the process ends with one error line instead of ggml's backtrace; or, with a remote
// failure handler, the handler runs and the aborting thread never returns into ggml.
void on_ggml_abort(const char * message) {
    if (std::strstr(message, "RPC") == nullptr) {  // not a remote failure: ggml's own assertion
        std::fprintf(stderr, "specula: error: %s\n", message);
        std::fflush(stderr);
        _exit(1);
    }
    report_remote_failure("an rpc-server stopped answering mid-generation (it died or the link broke); the run cannot go on");
    for (;;) std::this_thread::sleep_for(std::chrono::hours(24));
}

}  // namespace

namespace {
bool only_local_cpu(const std::vector<std::string> & names) { return names.size() == 1 && names[0] == "cpu"; }

// The device list's own errors, before any ggml backend exists (a throwing constructor runs no
// destructor): empty or repeated entries, --split without a list, specula's kernels or attention
// asked for where they cannot run.
void check_device_list(const BackendOptions & opts, const std::vector<std::string> & names) {
    for (size_t i = 0; i < names.size(); ++i) {
        if (names[i].empty()) throw Error("--device '" + opts.device + "': an empty entry in the device list");
        for (size_t j = 0; j < i; ++j) {
            if (names[j] == names[i]) throw Error("--device '" + opts.device + "': " + names[i] + " is listed twice");
        }
    }
    if (!opts.split.empty() && names.size() == 1) throw Error("--split needs a list of devices (--device cpu,RPC[host:port],...)");
    const bool on_cpu = only_local_cpu(names);
    const bool lists_cpu = std::find(names.begin(), names.end(), "cpu") != names.end();
    if (!lists_cpu && opts.kernels == Kernels::Specula) {
        throw Error("specula's own kernels run on the local CPU only; device '" + opts.device +
                    "' has no cpu entry: take --kernels ggml (or auto)");
    }
    // The KV cache's V layout follows the attention kernel, one for the whole cache.
    if (!on_cpu && opts.attention == Attention::Specula) {
        throw Error("specula's attention runs for a target on the local CPU alone; device '" + opts.device +
                    "' takes --attention flash or matmul (or auto)");
    }
}
}  // namespace

Backend::Backend(const BackendOptions & opts) {
    const std::vector<std::string> names = split_list(opts.device);
    check_device_list(opts, names);
    choose_kernels(opts, names);
    capture_library_log();  // ggml's info lines (e.g. per-tensor repacking) are noise for users
    ggml_backend_dev_t cpu_dev = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    if (!cpu_dev) throw Error("ggml has no CPU backend");
    try {
        open_devices(opts, names, cpu_dev);
        split_ = layer_shares(opts.split, devices_);
        if (remote()) start_remote(opts, cpu_dev);
        for (const Device & d : devices_) matmul_bufts_.push_back(weight_buffer_types(d, cpu_dev));
        set_n_threads(opts.n_threads > 0 ? opts.n_threads : default_thread_count());
        if (!only_local_cpu(names)) describe_placement();
    } catch (...) {
        stop_watchdog();
        for (ggml_backend_t b : backends_) ggml_backend_free(b);
        backends_.clear();
        throw;
    }
}

// Whose kernels compute the matmuls and which attention kernel runs, and the run summary's line.
// "auto" never runs slower than ggml: without a SIMD body for this CPU, specula's portable loops
// would, so ggml's kernels (NEON, AVX, ...) take the matmuls and the attention.
void Backend::choose_kernels(const BackendOptions & opts, const std::vector<std::string> & names) {
    const bool on_cpu = only_local_cpu(names);
    const bool lists_cpu = std::find(names.begin(), names.end(), "cpu") != names.end();
    kernels::check_cpu_path_override();
    const kernels::CpuPath path = kernels::detected_cpu_path();
    const bool simd = path != kernels::CpuPath::Generic;
    own_kernels_ = lists_cpu && (opts.kernels == Kernels::Specula || (opts.kernels == Kernels::Auto && simd));
    if (own_kernels_) {
        own_kernels_name_ = std::string("specula's, ") + kernels::cpu_path_name(path) + " path";
        if (!simd) own_kernels_name_ += " (portable C++: specula has no SIMD path for this CPU)";
    }
    // A device list's summary is per device (describe_placement).
    if (on_cpu && own_kernels_) {
        kernels_summary_ = own_kernels_name_;
    } else if (on_cpu && opts.kernels == Kernels::Ggml) {
        kernels_summary_ = "ggml's (--kernels ggml)";
    } else if (on_cpu) {
        kernels_summary_ =
            "ggml's: specula has no SIMD path for this CPU (--kernels specula runs its portable one); "
            "greedy speculative output can differ from plain decoding at near-ties";
    }
    switch (opts.attention) {
        case Attention::Auto:
            attention_ = !on_cpu ? AttentionKernel::Flash : own_kernels_ ? AttentionKernel::Specula
                                                                         : AttentionKernel::Matmul;
            break;
        case Attention::Flash: attention_ = AttentionKernel::Flash; break;
        case Attention::Matmul: attention_ = AttentionKernel::Matmul; break;
        case Attention::Specula: attention_ = AttentionKernel::Specula; break;
    }
}

// Each listed device initialised once (the local CPU's backend shared by its entries), then the
// CPU's own backend, last in backends_.
void Backend::open_devices(const BackendOptions & opts, const std::vector<std::string> & names, ggml_backend_dev_t cpu_dev) {
    for (const std::string & name : names) {
        if (name == "cpu") {
            devices_.push_back({name, nullptr, cpu_dev, true});
            continue;
        }
        ggml_backend_dev_t dev = name.rfind("RPC[", 0) == 0 ? rpc_device(name) : ggml_backend_dev_by_name(name.c_str());
        if (!dev) {
            std::string available;
            for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
                available += std::string(available.empty() ? "" : ", ") + ggml_backend_dev_name(ggml_backend_dev_get(i));
            }
            throw Error("device '" + name + "' not found (this build has: " + available + ")");
        }
        for (const Device & d : devices_) {
            if (d.dev == dev) throw Error("--device '" + opts.device + "': " + name + " is the same device as " + d.name);
        }
        ggml_backend_t b = ggml_backend_dev_init(dev, nullptr);
        if (!b) throw Error("could not initialise device '" + name + "'");
        backends_.push_back(b);
        devices_.push_back({name, b, dev, false});
    }
    cpu_ = ggml_backend_dev_init(cpu_dev, nullptr);
    if (!cpu_) throw Error("could not initialise the CPU backend");
    backends_.push_back(cpu_);
    for (Device & d : devices_) {
        if (d.cpu) d.backend = cpu_;
    }
}

// With an rpc-server in the list: its failures end the run with one line, its waits are watched,
// and the embedding and the head run on a local CPU entry (one of their own if none is listed).
void Backend::start_remote(const BackendOptions & opts, ggml_backend_dev_t cpu_dev) {
    // A write to a closed socket must fail, not kill the process silently with SIGPIPE.
    std::signal(SIGPIPE, SIG_IGN);
    ggml_set_abort_callback(on_ggml_abort);
    if (!(opts.remote_timeout_s > 0.0)) throw Error("the rpc-server timeout must be positive");
    remote_timeout_s_ = opts.remote_timeout_s;
    watchdog_ = std::thread([this] { watch_remote_waits(); });
    for (size_t i = 0; i < devices_.size(); ++i) {
        if (devices_[i].cpu) io_device_ = static_cast<int>(i);
    }
    if (!devices_[io_device_].cpu) {
        devices_.push_back({"cpu", cpu_, cpu_dev, true});
        split_.push_back(0.0);
        io_device_ = static_cast<int>(devices_.size()) - 1;
    }
}

// The buffer types a device's matmul weights may take, preferred first.
std::vector<std::pair<ggml_backend_dev_t, ggml_backend_buffer_type_t>> Backend::weight_buffer_types(const Device & d,
                                                                                                    ggml_backend_dev_t cpu_dev) const {
    std::vector<std::pair<ggml_backend_dev_t, ggml_backend_buffer_type_t>> bufts;
    if (!d.cpu) bufts.push_back({d.dev, ggml_backend_dev_buffer_type(d.dev)});
    if (d.cpu && backends_.size() == 1) {
        // Repacked layouts (e.g. Q4_0 -> 8x8 interleaved) are what make ggml's CPU matmuls fast.
        ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(cpu_dev);
        auto get_extra = reinterpret_cast<ggml_backend_dev_get_extra_bufts_t>(
            ggml_backend_reg_get_proc_address(reg, "ggml_backend_dev_get_extra_bufts"));
        if (get_extra) {
            for (ggml_backend_buffer_type_t * p = get_extra(cpu_dev); p && *p; ++p) bufts.push_back({cpu_dev, *p});
        }
    }
    bufts.push_back({cpu_dev, ggml_backend_dev_buffer_type(cpu_dev)});
    return bufts;
}

Backend::~Backend() {
    stop_watchdog();
    for (ggml_backend_t b : backends_) ggml_backend_free(b);
    if (threadpool_) ggml_threadpool_free(threadpool_);
}

Backend::RemoteWait::RemoteWait(const Backend & backend) : backend_(backend) {
    if (backend_.remote_timeout_s_ > 0) backend_.wait_in_progress_ = ++backend_.wait_serial_;
}

Backend::RemoteWait::~RemoteWait() { backend_.wait_in_progress_ = 0; }

void Backend::stop_watchdog() {
    if (!watchdog_.joinable()) return;
    {
        std::lock_guard<std::mutex> lock(watch_mutex_);
        watch_stop_ = true;
    }
    watch_cv_.notify_all();
    watchdog_.join();
}

// Checks a few times a second; the process cannot be unblocked from inside ggml's wait on the
// socket, so a wait past the timeout is reported as a dead server is (report_remote_failure). The wait is
// timed in the watchdog's own ticks, each counting at most a quarter second: a process suspended
// (Ctrl-Z, a debugger) and resumed does not count the suspension as waiting.
void Backend::watch_remote_waits() {
    using Clock = std::chrono::steady_clock;
    const auto tick_cap = std::chrono::milliseconds(250);
    Clock::duration waited{};
    uint64_t watched = 0;
    Clock::time_point last = Clock::now();
    std::unique_lock<std::mutex> lock(watch_mutex_);
    while (!watch_cv_.wait_for(lock, std::chrono::milliseconds(100), [&] { return watch_stop_; })) {
        const Clock::time_point now = Clock::now();
        const Clock::duration tick = std::min<Clock::duration>(now - last, tick_cap);
        last = now;
        const uint64_t wait = wait_in_progress_;
        if (wait == 0 || wait != watched) {
            watched = wait;
            waited = Clock::duration{};
            continue;
        }
        waited += tick;
        if (waited > std::chrono::duration<double>(remote_timeout_s_)) {
            char line[160];
            std::snprintf(line, sizeof(line), "an rpc-server did not answer within %g s (--rpc-timeout); the run cannot go on", remote_timeout_s_);
            report_remote_failure(line);
            return;  // the forward stays blocked on its socket; the handler has failed its work
        }
    }
}

void Backend::set_remote_failure_handler(RemoteFailureHandler handler) {
    std::lock_guard lock(remote_failure_mutex);
    remote_failure_handler = std::move(handler);
}

bool Backend::remote() const {
    for (const Device & d : devices_) {
        if (d.name.rfind("RPC[", 0) == 0) return true;
    }
    return false;
}

void Backend::place_layers(int n_layer) {
    if (devices_.size() == 1) return;  // one device runs every layer of any model
    if (!layer_device_.empty()) {
        if (static_cast<int>(layer_device_.size()) != n_layer) {
            throw Error("the device list's layer split serves one model (" + std::to_string(layer_device_.size()) +
                        " layers), not a second one of " + std::to_string(n_layer));
        }
        return;
    }
    double total = 0.0;
    for (double s : split_) total += s;
    // Contiguous ranges: device d runs the layers whose index falls below its cumulative share.
    layer_device_.assign(n_layer, 0);
    double cumulative = 0.0;
    int il = 0;
    for (size_t d = 0; d < devices_.size(); ++d) {
        cumulative += split_[d];
        const int end = d + 1 == devices_.size() ? n_layer : static_cast<int>(std::lround(cumulative / total * n_layer));
        for (; il < end; ++il) layer_device_[il] = static_cast<int>(d);
    }
    describe_placement();
}

void Backend::describe_placement() {
    std::string summary;
    for (size_t d = 0; d < devices_.size(); ++d) {
        std::string runs;
        const auto first = std::find(layer_device_.begin(), layer_device_.end(), static_cast<int>(d));
        if (first != layer_device_.end()) {  // contiguous: the range ends at the last layer on d
            const int begin = static_cast<int>(first - layer_device_.begin());
            const int end = static_cast<int>(layer_device_.rend() - std::find(layer_device_.rbegin(), layer_device_.rend(), static_cast<int>(d)));
            runs = end - begin == 1 ? "layer " + std::to_string(begin) : "layers " + std::to_string(begin) + "-" + std::to_string(end - 1);
        }
        if (io_device_ == static_cast<int>(d) && devices_.size() > 1) runs += std::string(runs.empty() ? "" : ", ") + "output head";
        if (runs.empty() && !layer_device_.empty()) runs = "no layers";
        const Device & device = devices_[d];
        summary += std::string(summary.empty() ? "" : "; ") + (own_kernels_ && device.cpu ? own_kernels_name_ : "ggml's") + " on " +
                   (device.cpu ? "the local CPU" : device.name);
        if (!runs.empty()) summary += " (" + runs + ")";
    }
    kernels_summary_ = summary + "; attention: ggml's " + attention_kernel_name(attention_) + " on every layer";
}

int Backend::device_of(int layer) const {
    if (layer == kIo) return io_device_;
    if (devices_.size() == 1) return 0;  // also serves a drafter of another depth than the target
    if (layer < 0 || layer >= static_cast<int>(layer_device_.size())) {
        throw Error("layer " + std::to_string(layer) + " has no device: the device list's split places " +
                    std::to_string(layer_device_.size()) + " layers");
    }
    return layer_device_[layer];
}

const std::vector<std::pair<ggml_backend_device *, ggml_backend_buffer_type *>> & Backend::matmul_weight_bufts(int layer) const {
    return matmul_bufts_[device_of(layer)];
}

ggml_backend_buffer_type * Backend::default_buft(int layer) const {
    return ggml_backend_get_default_buffer_type(backend_of(layer));
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
