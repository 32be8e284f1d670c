#include "rpc_bench.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "bench_util.h"
#include "common/loopback.h"
#include "link_proxy.h"
#include "specula/error.h"
#include "specula/specula.h"

namespace specula::bench {

namespace {

using json = nlohmann::json;

// An rpc-server on 127.0.0.1 for the benchmark's life; its connection log goes to /dev/null.
class LocalRpcServer {
public:
    explicit LocalRpcServer(int threads) : port_(free_loopback_port()) {
        const std::string bin = peer_binary("ggml-rpc-server"), port = std::to_string(port_), t = std::to_string(threads);
        const char * argv[] = {bin.c_str(), "-H", "127.0.0.1", "-p", port.c_str(), "-t", t.c_str(), nullptr};
        pid_ = fork();
        if (pid_ < 0) throw Error("could not start " + bin);
        if (pid_ == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);  // no orphaned server when the benchmark is interrupted
            const int null = open("/dev/null", O_WRONLY);
            dup2(null, 1);
            dup2(null, 2);
            execv(bin.c_str(), const_cast<char **>(argv));
            _exit(127);
        }
        for (int i = 0; i < 300 && !accepts_connections("127.0.0.1", port); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
        if (!accepts_connections("127.0.0.1", port)) throw Error(bin + " did not start listening on 127.0.0.1:" + port);
    }
    ~LocalRpcServer() {
        kill(pid_, SIGTERM);
        waitpid(pid_, nullptr, 0);
    }
    std::string endpoint() const { return "127.0.0.1:" + std::to_string(port_); }

private:
    int port_;
    pid_t pid_ = -1;
};

std::vector<std::string> split_devices(const std::string & list) {
    std::vector<std::string> out;
    size_t begin = 0;
    while (begin <= list.size()) {
        const size_t comma = list.find(',', begin);
        out.push_back(list.substr(begin, comma == std::string::npos ? std::string::npos : comma - begin));
        if (comma == std::string::npos) break;
        begin = comma + 1;
    }
    return out;
}

struct Mode {
    std::string name;
    DrafterSpec drafter;
    std::optional<TreeShape> tree;
    int tree_nodes = 0;  // 0: sized from the measured verify cost
    DraftPolicyKind policy = DraftPolicyKind::Cost;
    int draft_max = 8;
};

struct Measured {
    std::vector<double> tok_s;  // per rep
    double round_trips_per_token = 0;
    double accepted_length = 0;  // tokens per target forward (speculative modes)
};

}  // namespace

int run_rpc_bench(const RpcBenchOptions & o) {
    if (o.reps < 1 || o.n_gen < 1 || o.n_prompts < 1) throw Error("bench rpc: reps, n-gen and prompts must be positive");
    for (double d : o.delays_ms) {
        if (!(d >= 0.0 && d <= 1000.0)) throw Error("bench rpc: a delay must be within 0..1000 ms");
    }
    const PromptSet set = read_prompt_set(prompt_set_path(o.prompts));
    std::vector<PromptText> prompts;
    for (const PromptText & p : set.prompts) {
        bool seen = false;
        for (const PromptText & q : prompts) seen |= q.category == p.category;
        if (!seen && static_cast<int>(prompts.size()) < o.n_prompts) prompts.push_back(p);
    }

    std::vector<std::unique_ptr<LocalRpcServer>> servers;
    std::string device = o.device;
    if (device.empty()) {
        for (int i = 0; i < 2; ++i) servers.push_back(std::make_unique<LocalRpcServer>(o.server_threads));
        device = "RPC[" + servers[0]->endpoint() + "],RPC[" + servers[1]->endpoint() + "]";
    }
    std::vector<Mode> modes = {{"plain", {}, std::nullopt}};
    if (!o.eagle3.empty()) {
        // The policies size drafts from the verify cost measured through the link; the fixed
        // shapes show what a given draft size gains at each latency.
        modes.push_back({"eagle3 dynamic tree", {DrafterKind::Eagle3, o.eagle3}, TreeShape::Dynamic});
        modes.push_back({"eagle3 tree, 16 nodes", {DrafterKind::Eagle3, o.eagle3}, TreeShape::Dynamic, 16});
        modes.push_back({"eagle3 chain", {DrafterKind::Eagle3, o.eagle3}, TreeShape::Chain});
        modes.push_back({"eagle3 chain, k=4", {DrafterKind::Eagle3, o.eagle3}, TreeShape::Chain, 0, DraftPolicyKind::Fixed, 4});
    }
    if (!o.draft.empty()) {
        modes.push_back({"draft chain", {DrafterKind::DraftModel, o.draft}, TreeShape::Chain});
        modes.push_back({"draft chain, k=4", {DrafterKind::DraftModel, o.draft}, TreeShape::Chain, 0, DraftPolicyKind::Fixed, 4});
    }

    const MachineLoad load = measure_machine_load();
    print_machine(load);
    std::printf("target %s on %s%s; %zu prompts x %d tokens, %d reps\n", o.model.c_str(), device.c_str(),
                servers.empty() ? "" : " (rpc-servers started here)", prompts.size(), o.n_gen, o.reps);
    std::printf("%8s  %-22s %22s %9s %12s %9s\n", "delay", "mode", "tok/s med [min-max]", "speedup", "trips/token", "tok/fwd");

    json rows = json::array();
    for (double delay : o.delays_ms) {
        // One proxy per rpc-server: the links of this latency.
        std::vector<std::unique_ptr<LinkProxy>> proxies;
        std::string linked;
        for (const std::string & d : split_devices(device)) {
            std::string entry = d;
            if (d.rfind("RPC[", 0) == 0 && d.size() > 5 && d.back() == ']') {
                const std::string endpoint = d.substr(4, d.size() - 5);
                const size_t colon = endpoint.rfind(':');
                if (colon == std::string::npos) throw Error("bench rpc: device '" + d + "': expected RPC[host:port]");
                proxies.push_back(std::make_unique<LinkProxy>(endpoint.substr(0, colon), std::stoi(endpoint.substr(colon + 1)), delay));
                entry = "RPC[127.0.0.1:" + std::to_string(proxies.back()->port()) + "]";
            }
            linked += (linked.empty() ? "" : ",") + entry;
        }
        if (proxies.empty()) throw Error("bench rpc: the device list has no RPC[host:port] entry");
        auto round_trips = [&] {
            long n = 0;
            for (auto & p : proxies) n += p->round_trips();
            return n;
        };

        double plain_median = 0;
        for (const Mode & mode : modes) {
            EngineOptions e;
            e.model_path = o.model;
            e.device = linked;
            e.split = o.split;
            e.n_threads = o.threads;
            e.kernels = o.kernels;
            e.n_ctx = 1024;
            e.drafter = mode.drafter;
            e.tree = mode.tree;
            e.tree_nodes = mode.tree_nodes;
            e.draft_policy = mode.policy;
            e.draft_max = mode.draft_max;
            auto engine = Engine::open(e);
            GenerationOptions g;
            g.n_predict = o.n_gen;
            g.stop_at_end_of_generation = false;
            std::vector<std::vector<int32_t>> tokens;
            for (const PromptText & p : prompts) tokens.push_back(engine->tokenize(p.text, set.chat));
            auto sink = [](int32_t) { return true; };
            const std::string kernels = engine->generate(tokens[0], g, sink).kernels;  // untimed: builds the graphs of every shape
            if (delay == o.delays_ms.front() && mode.name == "plain") std::printf("kernels: %s\n", kernels.c_str());

            Measured m;
            long trips = 0, generated = 0;
            SpeculationStats spec;
            for (int rep = 0; rep < o.reps; ++rep) {
                double seconds = 0;
                long n = 0;
                for (const auto & prompt : tokens) {
                    for (auto & p : proxies) p->reset_counts();
                    const GenerationStats s = engine->generate(prompt, g, sink);
                    trips += round_trips();
                    seconds += s.generation_seconds;
                    n += s.n_generated;
                    spec.rounds += s.speculation.rounds;
                    spec.emitted += s.speculation.emitted;
                }
                generated += n;
                m.tok_s.push_back(seconds > 0 ? n / seconds : 0.0);
            }
            m.round_trips_per_token = generated ? static_cast<double>(trips) / generated : 0.0;
            m.accepted_length = spec.mean_accepted_length();
            const Summary s = summarize(m.tok_s);
            if (mode.name == "plain") plain_median = s.median;
            const double speedup = plain_median > 0 ? s.median / plain_median : 0.0;
            std::printf("%5.1f ms  %-22s %8.1f [%5.1f-%5.1f] %8.2fx %12.1f %9s\n", delay, mode.name.c_str(), s.median, s.min, s.max,
                        speedup, m.round_trips_per_token,
                        mode.name == "plain" ? "-" : std::to_string(m.accepted_length).substr(0, 4).c_str());
            std::fflush(stdout);
            rows.push_back({{"delay_ms", delay}, {"mode", mode.name}, {"tok_s_median", s.median}, {"tok_s_min", s.min}, {"tok_s_max", s.max}, {"speedup_vs_plain", speedup}, {"round_trips_per_token", m.round_trips_per_token}, {"tokens_per_target_forward", m.accepted_length}});
        }
    }
    if (!o.json_path.empty()) {
        json out = {{"cpu", load.cpu}, {"machine_busy_fraction", load.busy_fraction}, {"model", o.model}, {"device", device}, {"split", o.split}, {"kernels", kernels_name(o.kernels)}, {"n_gen", o.n_gen}, {"reps", o.reps}, {"prompts", prompts.size()}, {"rows", rows}};
        write_result(o.json_path, out.dump(2) + "\n");
    }
    return 0;
}

}  // namespace specula::bench
