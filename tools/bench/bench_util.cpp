#include "bench_util.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <unistd.h>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "specula/error.h"
#include "runtime/kernels/matmul.h"
#include "common/stats.h"
#include "runtime/gguf_file.h"

namespace specula::bench {

Summary summarize(std::vector<double> s) {
    Summary r;
    if (s.empty()) return r;
    r.n = static_cast<int>(s.size());
    r.min = *std::min_element(s.begin(), s.end());
    r.max = *std::max_element(s.begin(), s.end());
    r.median = median(std::move(s));
    return r;
}

namespace {
std::pair<long long, long long> cpu_ticks() {  // (busy, total)
    std::ifstream in("/proc/stat");
    std::string cpu;
    long long v[10] = {};
    in >> cpu;
    for (auto & x : v) in >> x;
    long long total = 0;
    for (auto x : v) total += x;
    const long long idle = v[3] + v[4];
    return {total - idle, total};
}
}  // namespace

MachineLoad measure_machine_load(double seconds) {
    MachineLoad m;
    auto [b0, t0] = cpu_ticks();
    std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
    auto [b1, t1] = cpu_ticks();
    m.busy_fraction = t1 > t0 ? double(b1 - b0) / double(t1 - t0) : 0.0;
    std::ifstream("/proc/loadavg") >> m.loadavg_1m;
    m.cpu = cpu_description();
    return m;
}

std::string cpu_description() {
    std::ifstream in("/proc/cpuinfo");
    std::string line, name = "unknown CPU", family, model;
    int cpus = 0;
    auto value = [](const std::string & l) {  // "key\t: value" -> "value"
        const size_t v = l.find_first_not_of(' ', l.find(':') + 1);
        return v == std::string::npos ? std::string() : l.substr(v);
    };
    while (std::getline(in, line)) {
        if (line.rfind("processor", 0) == 0) ++cpus;
        if (cpus != 1) continue;
        if (line.rfind("model name", 0) == 0) name = value(line);
        else if (line.rfind("cpu family", 0) == 0) family = value(line);
        else if (line.rfind("model", 0) == 0 && line.rfind("model name", 0) != 0) model = value(line);
    }
    std::string out = name;
    if (!family.empty()) out += " (family " + family + " model " + model + ")";
    out += ", " + std::to_string(cpus) + " cpus, kernels " + kernels::cpu_path_name(kernels::detected_cpu_path());
    return out;
}

void print_machine(const MachineLoad & load) {
    std::printf("machine: %s; %.0f%% busy before start, loadavg %.2f%s\n", load.cpu.c_str(), load.busy_fraction * 100, load.loadavg_1m,
                load.idle() ? "" : "  ** NOT IDLE: figures are unreliable **");
}

std::string prompt_set_path(const std::string & path) { return path.empty() ? std::string(SPECULA_BENCH_PROMPTS) : path; }

PromptSet read_prompt_set(const std::string & path, bool schemas_allowed) {
    std::ifstream in(path);
    if (!in) throw Error(path + ": cannot open the prompt set");
    PromptSet set;
    try {
        const auto j = nlohmann::json::parse(in);
        set.chat = j.value("chat", false);
        for (const auto & p : j.at("prompts")) {
            PromptText t{p.at("category").get<std::string>(), p.at("name").get<std::string>(), p.at("text").get<std::string>(), {}};
            if (p.contains("json_schema")) {
                if (!schemas_allowed) throw Error(path + ": prompt '" + t.name + "' has a json_schema, which only bench spec applies");
                if (!p["json_schema"].is_object()) throw Error(path + ": the json_schema of prompt '" + t.name + "' is not an object");
                t.json_schema = p["json_schema"].dump();
            }
            set.prompts.push_back(std::move(t));
        }
    } catch (const nlohmann::json::exception & e) {
        throw Error(path + ": expected {\"chat\": false, \"prompts\": [{\"category\", \"name\", \"text\"}, ...]}: " + e.what());
    }
    if (set.prompts.empty()) throw Error(path + ": no prompts");
    for (const auto & p : set.prompts) {
        if (p.text.empty()) throw Error(path + ": prompt '" + p.name + "' is empty");
    }
    return set;
}

void write_result(const std::string & path, const std::string & text) {
    const std::filesystem::path parent = std::filesystem::path(path).parent_path();
    std::error_code ec;
    if (!parent.empty()) std::filesystem::create_directories(parent, ec);
    std::ofstream f(path);
    if (ec || !(f << text) || !f.flush()) throw Error(path + ": cannot write the result file");
    std::printf("wrote %s\n", path.c_str());
}

std::string peer_binary(const std::string & name) {
    const std::string path = std::string(SPECULA_PEER_BIN_DIR) + "/" + name;
    if (!std::filesystem::exists(path)) {
        throw Error("peer tool " + path + " is missing: build it with `cmake --build build --target peers` (a build configured with -DSPECULA_LLAMA_TOOLS=ON, the default)");
    }
    return path;
}

std::string run_command(const std::string & cmd) {
    const std::string err_file = std::filesystem::temp_directory_path() / ("specula-cmd-" + std::to_string(::getpid()) + ".err");
    FILE * p = popen((cmd + " 2>" + err_file).c_str(), "r");
    if (!p) throw Error("cannot run: " + cmd);
    std::string out;
    std::array<char, 4096> buf;
    size_t n;
    while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
    const int rc = pclose(p);
    if (rc != 0) {
        std::stringstream err;
        err << std::ifstream(err_file).rdbuf();
        std::string tail = err.str();
        if (tail.size() > 400) tail = tail.substr(tail.size() - 400);
        throw Error("command failed (" + cmd + "): " + tail);
    }
    std::filesystem::remove(err_file);
    return out;
}

namespace {
std::string target_architecture(const std::string & target_path) { return GgufFile(target_path).architecture(); }
}  // namespace

bool llama_cpp_runs_eagle3_on(const std::string & target_path) {
    static std::map<std::string, bool> known;  // asked per prompt and mode: read each file's header once
    auto it = known.find(target_path);
    if (it == known.end()) {
        const std::string arch = target_architecture(target_path);
        it = known.emplace(target_path, arch == "llama" || arch == "qwen3").first;
    }
    return it->second;
}

std::string llama_eagle3_absent_note(const std::string & target_path) {
    return "llama.cpp's EAGLE-3 is left out: v0.5.0 taps the layer inputs an EAGLE-3 head reads only in some architectures' "
           "graphs, not in " +
           target_architecture(target_path) + "'s (it aborts with \"layer input tensor is null\")";
}

}  // namespace specula::bench
