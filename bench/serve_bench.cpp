#include "serve_bench.h"

#include <fcntl.h>
#include <httplib.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <thread>

#include "bench_util.h"
#include "common/loopback.h"
#include "common/progress.h"
#include "specula/error.h"
#include "runtime/backend.h"

namespace specula::bench {
namespace {

using json = nlohmann::json;
using clock_type = std::chrono::steady_clock;

double seconds_since(clock_type::time_point t0) { return std::chrono::duration<double>(clock_type::now() - t0).count(); }

std::string log_tail(const std::string & path, size_t n = 600) {
    std::stringstream s;
    s << std::ifstream(path).rdbuf();
    std::string t = s.str();
    if (t.size() > n) t = "..." + t.substr(t.size() - n);
    // One error line: the log's lines joined.
    while (!t.empty() && t.back() == '\n') t.pop_back();
    for (size_t i; (i = t.find('\n')) != std::string::npos;) t.replace(i, 1, " | ");
    return t.empty() ? "(empty)" : t;
}

// A server process started here, its output in a log file, stopped (SIGTERM, then SIGKILL) when
// this goes out of scope; it dies with the benchmark too (PR_SET_PDEATHSIG).
class ServerProcess {
public:
    ServerProcess(const std::string & name, std::vector<std::string> argv, std::string log_path, int port)
        : name_(name), log_(std::move(log_path)), port_(port) {
        std::vector<char *> args;
        for (auto & a : argv) args.push_back(a.data());
        args.push_back(nullptr);
        const pid_t parent = ::getpid();
        pid_ = ::fork();
        if (pid_ < 0) throw Error("cannot start " + name + ": fork failed");
        if (pid_ == 0) {
            ::prctl(PR_SET_PDEATHSIG, SIGTERM);
            if (::getppid() != parent) ::_exit(127);
            const int fd = ::open(log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
            const int null_fd = ::open("/dev/null", O_RDONLY);
            if (fd >= 0) ::dup2(fd, 1), ::dup2(fd, 2);
            if (null_fd >= 0) ::dup2(null_fd, 0);
            ::execv(args[0], args.data());
            ::_exit(127);
        }
    }
    ~ServerProcess() {
        if (pid_ <= 0) return;
        ::kill(pid_, SIGTERM);
        for (int i = 0; i < 200 && ::waitpid(pid_, nullptr, WNOHANG) == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
        if (::waitpid(pid_, nullptr, WNOHANG) == 0) {
            ::kill(pid_, SIGKILL);
            ::waitpid(pid_, nullptr, 0);
        }
    }
    ServerProcess(const ServerProcess &) = delete;
    ServerProcess & operator=(const ServerProcess &) = delete;

    // Until GET /health answers 200 (both servers answer 503 while loading).
    void wait_ready(double timeout_s) {
        const auto t0 = clock_type::now();
        httplib::Client cli("127.0.0.1", port_);
        cli.set_connection_timeout(1);
        while (seconds_since(t0) < timeout_s) {
            int status = 0;
            if (::waitpid(pid_, &status, WNOHANG) == pid_) {
                pid_ = 0;
                throw Error(name_ + " exited during start-up (" + exit_text(status) + "); its log " + log_ + " ends: " + log_tail(log_));
            }
            if (auto res = cli.Get("/health"); res && res->status == 200) return;
            std::this_thread::sleep_for(std::chrono::milliseconds(200));
        }
        throw Error(name_ + " did not answer GET /health with 200 within " + std::to_string(int(timeout_s)) + " s; its log " + log_ +
                    " ends: " + log_tail(log_));
    }

private:
    static std::string exit_text(int status) {
        if (WIFEXITED(status)) return WEXITSTATUS(status) == 127 ? "could not be executed" : "exit code " + std::to_string(WEXITSTATUS(status));
        return "signal " + std::to_string(WTERMSIG(status));
    }
    std::string name_, log_;
    int port_;
    pid_t pid_ = 0;
};

// ---------------------------------------------------------------------------------------------
// The client: streaming /v1/completions or /v1/chat/completions, as an OpenAI client would use
// either server.

struct RequestResult {
    size_t prompt = 0;
    int tokens = 0;
    double seconds = 0, ttft = 0;
    long drafted = 0, accepted = 0;
    std::string text, error;
};

// `body` carries "prompt" (a completion) or "messages" (a chat completion).
RequestResult stream_completion(int port, const json & body) {
    const bool chat = body.contains("messages");
    RequestResult r;
    httplib::Client cli("127.0.0.1", port);
    cli.set_read_timeout(600);
    std::string raw, pending;
    int text_chunks = 0;
    bool done = false;
    const auto t0 = clock_type::now();
    // One `data:` event of the stream: text pieces, usage, speculation counters.
    auto read_chunk = [&](const std::string & data) {
        const json j = json::parse(data, nullptr, false);
        if (j.is_discarded()) return void(r.error = "unparsable event: " + data.substr(0, 200));
        if (j.contains("error")) return void(r.error = "error event: " + j.at("error").dump());
        for (const auto & c : j.value("choices", json::array())) {
            // A chat chunk's delta may carry no content, or a null one (a role or finish chunk).
            const json & holder = chat ? c.value("delta", json::object()) : c;
            const json piece_json = holder.value(chat ? "content" : "text", json());
            const std::string piece = piece_json.is_string() ? piece_json.get<std::string>() : "";
            if (piece.empty()) continue;
            if (r.text.empty()) r.ttft = seconds_since(t0);
            r.text += piece;
            ++text_chunks;
        }
        if (j.contains("usage") && j.at("usage").is_object()) r.tokens = j.at("usage").value("completion_tokens", 0);
        // specula: per-request speculation stats; llama-server: its timings' draft counters.
        if (j.contains("speculation")) r.drafted = j["speculation"].value("drafted", 0L), r.accepted = j["speculation"].value("accepted", 0L);
        if (j.contains("timings") && j["timings"].contains("draft_n")) {
            r.drafted = j["timings"].value("draft_n", 0L), r.accepted = j["timings"].value("draft_n_accepted", 0L);
        }
    };
    auto on_event = [&](const std::string & data) {
        if (data == "[DONE]") return void(done = true);
        try {
            read_chunk(data);
        } catch (const json::exception & e) {
            r.error = std::string("unexpected chunk (") + e.what() + "): " + data.substr(0, 200);
        }
    };
    httplib::Request req;
    req.method = "POST";
    req.path = chat ? "/v1/chat/completions" : "/v1/completions";
    req.set_header("Content-Type", "application/json");
    req.body = body.dump();
    req.content_receiver = [&](const char * data, size_t n, uint64_t, uint64_t) {
        raw.append(data, n);
        pending.append(data, n);
        for (size_t end; (end = pending.find("\n\n")) != std::string::npos;) {
            const std::string event = pending.substr(0, end);
            pending.erase(0, end + 2);
            if (event.rfind("data: ", 0) == 0) on_event(event.substr(6));
        }
        return true;
    };
    const auto res = cli.send(req);
    r.seconds = seconds_since(t0);
    if (!res) r.error = "HTTP request failed: " + httplib::to_string(res.error());
    else if (res->status != 200) r.error = "HTTP " + std::to_string(res->status) + ": " + raw.substr(0, 300);
    else if (r.error.empty() && !done) r.error = "stream ended without [DONE]";
    if (r.tokens == 0) r.tokens = text_chunks;  // a server without a usage chunk streams a token per chunk
    return r;
}

// ---------------------------------------------------------------------------------------------
// Configurations and the workload

struct Config {
    std::string server;  // "specula" | "llama-server"
    std::string name;    // e.g. "plain", "draft model", "n-gram"
    bool speculative = false;
};

struct LoadRun {
    double wall = 0;
    std::vector<RequestResult> requests;
};

// The request for one prompt of the set: a user message for a chat set, else the raw prompt.
json with_prompt(json request, const std::string & text, bool chat) {
    if (chat) request["messages"] = json::array({{{"role", "user"}, {"content", text}}});
    else request["prompt"] = text;
    return request;
}

// `clients` threads; every client sends the same number of requests (ceil(prompts / clients)),
// one after another, prompt (client + clients x i) mod n: the whole set at every concurrency.
LoadRun run_load(int port, const std::vector<PromptText> & prompts, bool chat, int clients, const json & request) {
    const size_t per_client = (prompts.size() + clients - 1) / clients;
    LoadRun run;
    run.requests.resize(per_client * clients);
    std::vector<std::thread> threads;
    const auto t0 = clock_type::now();
    for (int c = 0; c < clients; ++c) {
        threads.emplace_back([&, c] {
            for (size_t i = 0; i < per_client; ++i) {
                const size_t slot = c + clients * i, prompt = slot % prompts.size();
                run.requests[slot] = stream_completion(port, with_prompt(request, prompts[prompt].text, chat));
                run.requests[slot].prompt = prompt;
            }
        });
    }
    for (auto & t : threads) t.join();
    run.wall = seconds_since(t0);
    return run;
}

std::vector<std::string> server_argv(const ServeBenchOptions & o, const Config & c, int clients, int threads, int port) {
    const std::string t = std::to_string(threads);
    if (c.server == "specula") {
        std::vector<std::string> a = {o.specula_bin, "serve", "-m", o.model, "--parallel", std::to_string(clients), "-t", t,
                                      "-c", std::to_string(o.n_ctx), "--host", "127.0.0.1", "--port", std::to_string(port)};
        if (c.speculative) {
            if (!o.eagle3.empty()) a.insert(a.end(), {"--eagle3", o.eagle3});
            else if (!o.draft.empty()) a.insert(a.end(), {"--draft", o.draft});
            else a.push_back("--ngram");
            a.insert(a.end(), {"--draft-max", std::to_string(o.draft_max)});
            std::istringstream extra(o.specula_args);
            for (std::string arg; extra >> arg;) a.push_back(arg);
        }
        return a;
    }
    // llama-server's -c is the total over its slots.
    std::vector<std::string> a = {o.llama_server_bin, "-m", o.model, "--parallel", std::to_string(clients), "-t", t, "-tb", t,
                                  "-c", std::to_string(o.n_ctx * clients), "--host", "127.0.0.1", "--port", std::to_string(port),
                                  "--no-webui"};
    if (c.speculative) {
        // Without --spec-type, v0.5.0 infers the type from the draft GGUF's metadata and, for a
        // plain model, does not speculate at all.
        if (!o.eagle3.empty()) a.insert(a.end(), {"-md", o.eagle3, "-td", t, "--spec-type", "draft-eagle3"});
        else if (!o.draft.empty()) a.insert(a.end(), {"-md", o.draft, "-td", t, "--spec-type", "draft-simple"});
        else a.insert(a.end(), {"--spec-type", "ngram-simple"});
        a.insert(a.end(), {"--spec-draft-n-max", std::to_string(o.draft_max), "--spec-draft-n-min", "0", "--spec-draft-p-min", "0"});
    }
    return a;
}

json request_template(const ServeBenchOptions & o, const Config & c) {
    json r = {{"max_tokens", o.n_gen}, {"temperature", 0}, {"seed", 42}, {"stream", true}, {"stream_options", {{"include_usage", true}}}, {"ignore_eos", true}};
    // specula keeps no prompt cache across requests; neither may llama-server, or its repeated
    // prompts would skip prefill.
    if (c.server == "llama-server") r["cache_prompt"] = false;
    return r;
}

double percentile(std::vector<double> xs, double q) {
    if (xs.empty()) return 0.0;
    std::sort(xs.begin(), xs.end());
    return xs[std::min(xs.size() - 1, static_cast<size_t>(q * xs.size()))];
}

struct Row {
    const Config * config = nullptr;
    int clients = 0;
    Summary aggregate, per_request, ttft_ms;
    double ttft_p90_ms = 0, acceptance = -1;
    int same = 0, compared = 0, requests = 0;
    std::vector<double> aggregate_reps;
    Summary vs_plain;  // speculative rows: aggregate / the same server's plain aggregate, per rep (n = 0: none)
};

void validate(ServeBenchOptions & o) {
    if (!std::filesystem::is_regular_file(o.model)) throw Error("model " + o.model + ": no such file");
    if (!o.draft.empty() && !std::filesystem::is_regular_file(o.draft)) throw Error("draft model " + o.draft + ": no such file");
    if (!o.eagle3.empty() && !std::filesystem::is_regular_file(o.eagle3)) throw Error("EAGLE-3 head " + o.eagle3 + ": no such file");
    if (!o.draft.empty() && !o.eagle3.empty()) throw Error("--draft and --eagle3: give one drafter for the speculative configurations");
    if (o.clients.empty() || *std::min_element(o.clients.begin(), o.clients.end()) < 1) throw Error("--clients: counts must be at least 1");
    if (o.reps < 1) throw Error("--reps must be at least 1");
    if (o.n_gen < 1 || o.n_gen >= o.n_ctx) throw Error("--n-gen must be between 1 and the context (" + std::to_string(o.n_ctx) + ")");
    if (o.draft_max < 1) throw Error("--draft-max must be at least 1");
    for (const auto & s : o.servers) {
        if (s != "specula" && s != "llama-server") throw Error("--servers: unknown server '" + s + "' (specula, llama-server)");
    }
    auto has = [&](const char * s) { return std::find(o.servers.begin(), o.servers.end(), s) != o.servers.end(); };
    if (has("specula")) {
        if (o.specula_bin.empty()) o.specula_bin = std::filesystem::read_symlink("/proc/self/exe").string();
        if (::access(o.specula_bin.c_str(), X_OK) != 0) throw Error("specula binary " + o.specula_bin + " is missing or not executable");
    }
    if (has("llama-server")) {
        if (o.llama_server_bin.empty()) o.llama_server_bin = peer_binary("llama-server");
        if (::access(o.llama_server_bin.c_str(), X_OK) != 0) {
            throw Error("llama-server binary " + o.llama_server_bin + " is missing: build it with `cmake --build build --target peers`");
        }
    }
}

void print_row(const Row & r, double best_llama) {
    char accept[16] = "-", vs[16] = "-", vs_plain[40] = "-";
    if (r.acceptance >= 0) std::snprintf(accept, sizeof accept, "%.2f", r.acceptance);
    if (r.vs_plain.n > 0) std::snprintf(vs_plain, sizeof vs_plain, "%.2fx [%.2f..%.2f]", r.vs_plain.median, r.vs_plain.min, r.vs_plain.max);
    if (best_llama > 0) std::snprintf(vs, sizeof vs, "%.2fx", r.aggregate.median / best_llama);
    std::printf("%-13s %-12s %7d %9.1f [%7.1f .. %7.1f] %-19s %9.1f %9.0f %9.0f %7s %5d/%-5d %8s\n", r.config->server.c_str(),
                r.config->name.c_str(), r.clients, r.aggregate.median, r.aggregate.min, r.aggregate.max, vs_plain, r.per_request.median,
                r.ttft_ms.median, r.ttft_p90_ms, accept, r.same, r.compared, vs);
}

// The servers of one concurrency, one per configuration, started and warmed up; rows[first_row + i]
// is configuration i's row.
struct RunningServers {
    std::vector<std::unique_ptr<ServerProcess>> processes;
    std::vector<int> ports;
    std::vector<json> requests;
};

RunningServers start_servers(const ServeBenchOptions & o, const std::vector<Config> & configs, const PromptSet & set, int clients,
                             int threads, const std::filesystem::path & scratch, std::vector<Row> & rows) {
    RunningServers s;
    for (const Config & c : configs) {
        const int port = free_loopback_port();
        const std::string log = (scratch / (c.server + "-" + std::to_string(clients) + (c.speculative ? "-spec" : "") + ".log")).string();
        const std::vector<std::string> argv = server_argv(o, c, clients, threads, port);
        std::string command;
        for (const auto & a : argv) command += (command.empty() ? "" : " ") + a;
        std::printf("%s %s, %d clients: %s\n", c.server.c_str(), c.name.c_str(), clients, command.c_str());
        std::fflush(stdout);
        s.processes.push_back(std::make_unique<ServerProcess>(c.server, argv, log, port));
        s.processes.back()->wait_ready(o.startup_timeout);
        const json request = request_template(o, c);
        {  // Warm-up (graphs, caches): one short request, not measured.
            json warm = with_prompt(request, set.prompts[0].text, set.chat);
            warm["max_tokens"] = std::min(o.n_gen, 8);
            if (const auto w = stream_completion(port, warm); !w.error.empty()) {
                throw Error(c.server + " " + c.name + ": warm-up request failed: " + w.error);
            }
        }
        s.ports.push_back(port);
        s.requests.push_back(request);
        Row row;
        row.config = &c;
        row.clients = clients;
        rows.push_back(std::move(row));
    }
    return s;
}

// What one configuration's requests gave over all reps, before it is summarized into its Row.
struct ConfigSamples {
    std::vector<double> per_request, ttft;
    long drafted = 0, accepted = 0;
};

// One load run's requests into the row, the samples and the raw records; `reference` holds each
// server's plain answer per prompt, which the row compares its texts with.
void record_run(const ServeBenchOptions & o, const Config & c, const PromptSet & set, int clients, int rep, const LoadRun & run, Row & row,
                ConfigSamples & samples, std::map<size_t, std::string> & reference, json & raw) {
    long tokens = 0;
    for (const auto & r : run.requests) {
        if (!r.error.empty()) throw Error(c.server + " " + c.name + ", " + std::to_string(clients) + " clients: " + r.error);
        if (r.tokens != o.n_gen) {
            throw Error(c.server + " " + c.name + ": a request produced " + std::to_string(r.tokens) + " of " + std::to_string(o.n_gen) +
                        " tokens");
        }
        tokens += r.tokens;
        samples.per_request.push_back(r.tokens / r.seconds);
        samples.ttft.push_back(1000.0 * r.ttft);
        samples.drafted += r.drafted, samples.accepted += r.accepted;
        if (!c.speculative && !reference.count(r.prompt)) reference[r.prompt] = r.text;
        if (reference.count(r.prompt)) row.same += reference[r.prompt] == r.text, ++row.compared;
        raw.push_back({{"server", c.server}, {"config", c.name}, {"clients", clients}, {"rep", rep}, {"category", set.prompts[r.prompt].category}, {"prompt", set.prompts[r.prompt].name}, {"tokens", r.tokens}, {"seconds", r.seconds}, {"ttft_s", r.ttft}, {"drafted", r.drafted}, {"accepted", r.accepted}});
    }
    row.requests += static_cast<int>(run.requests.size());
    row.aggregate_reps.push_back(tokens / run.wall);
}

// The rows of one concurrency (rows[first_row + i] for configuration i) from their samples; a
// speculative row's ratio is against the same server's plain row, rep by rep.
void summarize_rows(const std::vector<Config> & configs, const std::vector<ConfigSamples> & samples, int reps, size_t first_row,
                    std::vector<Row> & rows) {
    for (size_t ci = 0; ci < configs.size(); ++ci) {
        Row & row = rows[first_row + ci];
        row.aggregate = summarize(row.aggregate_reps);
        row.per_request = summarize(samples[ci].per_request);
        row.ttft_ms = summarize(samples[ci].ttft);
        row.ttft_p90_ms = percentile(samples[ci].ttft, 0.9);
        if (configs[ci].speculative && samples[ci].drafted > 0) row.acceptance = double(samples[ci].accepted) / samples[ci].drafted;
        if (configs[ci].speculative) {
            for (size_t pi = 0; pi < configs.size(); ++pi) {
                if (configs[pi].server != configs[ci].server || configs[pi].speculative) continue;
                std::vector<double> ratios;
                for (int rep = 0; rep < reps; ++rep) ratios.push_back(row.aggregate_reps[rep] / rows[first_row + pi].aggregate_reps[rep]);
                row.vs_plain = summarize(ratios);
            }
        }
    }
}

// The table, printed, and its rows as JSON.
json print_results(const std::vector<Row> & rows) {
    std::printf(
        "\naggregate = all tokens / wall time; per-request = tokens / request time (median); TTFT = time to first token;\n"
        "vs plain = aggregate / the same server's plain aggregate, rep by rep (the reps take turns), median [min..max];\n"
        "accept = accepted / drafted tokens; same = responses identical to the server's plain text; vs = aggregate / best llama-server\n");
    std::printf("%-13s %-12s %7s %9s %-21s %-19s %9s %9s %9s %7s %11s %8s\n", "server", "config", "clients", "agg tok/s", " [min .. max]",
                "vs plain [min..max]", "req tok/s", "TTFT ms", "TTFT p90", "accept", "same", "vs llama");
    json results = json::array();
    for (const Row & r : rows) {
        double best_llama = 0;
        for (const Row & q : rows) {
            if (q.clients == r.clients && q.config->server == "llama-server") best_llama = std::max(best_llama, q.aggregate.median);
        }
        print_row(r, best_llama);
        auto summary = [](const Summary & s) { return json{{"median", s.median}, {"min", s.min}, {"max", s.max}, {"n", s.n}}; };
        results.push_back({{"server", r.config->server}, {"config", r.config->name}, {"speculative", r.config->speculative}, {"clients", r.clients}, {"aggregate_tok_s", summary(r.aggregate)}, {"aggregate_tok_s_reps", r.aggregate_reps}, {"per_request_tok_s", summary(r.per_request)}, {"ttft_ms", summary(r.ttft_ms)}, {"ttft_p90_ms", r.ttft_p90_ms}, {"vs_plain_per_rep", r.vs_plain.n > 0 ? summary(r.vs_plain) : json(nullptr)}, {"acceptance", r.acceptance < 0 ? json(nullptr) : json(r.acceptance)}, {"identical_to_plain", r.same}, {"compared", r.compared}, {"requests", r.requests}, {"vs_best_llama_server", best_llama > 0 ? json(r.aggregate.median / best_llama) : json(nullptr)}});
    }
    return results;
}

}  // namespace

int run_serve_bench(const ServeBenchOptions & options) {
    ServeBenchOptions o = options;
    validate(o);
    const std::string prompts_path = prompt_set_path(o.prompts);
    const PromptSet set = read_prompt_set(prompts_path);
    const std::vector<PromptText> & prompts = set.prompts;
    const int threads = o.threads > 0 ? o.threads : default_thread_count();
    const std::string drafter = !o.eagle3.empty() ? "EAGLE-3" : !o.draft.empty() ? "draft model"
                                                                                 : "n-gram";
    const MachineLoad load = measure_machine_load();
    print_machine(load);
    std::printf("%zu %s prompts, %d tokens each (ignore_eos, T = 0), %d threads, context %d per slot, draft max %d, %d reps\n",
                prompts.size(), set.chat ? "chat" : "completion", o.n_gen, threads, o.n_ctx, o.draft_max, o.reps);
    const std::string note = !o.eagle3.empty()
                                 ? "speculative configurations use the EAGLE-3 head " + o.eagle3 + " (specula --eagle3, llama-server -md --spec-type draft-eagle3)"
                             : !o.draft.empty() ? "speculative configurations use the draft model " + o.draft + " (specula --draft, llama-server -md)"
                                                : "no drafter given: the speculative configurations draft by n-gram (specula --ngram, llama-server --spec-type ngram-simple)";
    std::printf("%s\n", note.c_str());

    const bool llama_speculates = o.eagle3.empty() || llama_cpp_runs_eagle3_on(o.model);
    if (!llama_speculates) std::printf("note: %s\n", llama_eagle3_absent_note(o.model).c_str());
    std::vector<Config> configs;
    for (const auto & s : o.servers) {
        configs.push_back({s, "plain", false});
        if (s != "llama-server" || llama_speculates) configs.push_back({s, drafter, true});
    }
    const std::filesystem::path scratch = std::filesystem::temp_directory_path() / ("specula-serve-bench-" + std::to_string(::getpid()));
    std::filesystem::create_directories(scratch);
    // Gone however the run ends: a server that fails to start throws with its log's tail in the message.
    struct RemoveOnExit {
        std::filesystem::path dir;
        ~RemoveOnExit() {
            std::error_code ec;
            std::filesystem::remove_all(dir, ec);
        }
    } remove_scratch{scratch};

    // Reference texts per server: its plain configuration's first answer to each prompt.
    std::map<std::string, std::map<size_t, std::string>> reference;
    std::vector<Row> rows;
    json raw = json::array();
    Progress progress("bench serve", int64_t(o.clients.size()) * int64_t(configs.size()) * o.reps);
    // Per concurrency every configuration's server runs at once and the reps take turns (plain,
    // speculative, the peer's plain, ...): a machine's speed can drift within a minute, and
    // configurations measured one after another would carry the drift into their ratio.
    for (int clients : o.clients) {
        const size_t first_row = rows.size();
        const RunningServers servers = start_servers(o, configs, set, clients, threads, scratch, rows);
        std::vector<ConfigSamples> samples(configs.size());
        for (int rep = 0; rep < o.reps; ++rep) {
            for (size_t ci = 0; ci < configs.size(); ++ci) {
                const Config & c = configs[ci];
                const LoadRun run = run_load(servers.ports[ci], prompts, set.chat, clients, servers.requests[ci]);
                progress.step(std::to_string(clients) + " clients, " + c.server + " " + c.name + ", rep " + std::to_string(rep + 1) + "/" +
                              std::to_string(o.reps));
                record_run(o, c, set, clients, rep, run, rows[first_row + ci], samples[ci], reference[c.server], raw);
            }
        }
        summarize_rows(configs, samples, o.reps, first_row, rows);
    }
    const json results = print_results(rows);
    if (!o.json_path.empty()) {
        const json j = {{"kind", "serve"}, {"model", o.model}, {"draft", o.draft}, {"eagle3", o.eagle3}, {"prompts", prompts_path}, {"chat", set.chat}, {"threads", threads}, {"n_gen", o.n_gen}, {"n_ctx_per_slot", o.n_ctx}, {"draft_max", o.draft_max}, {"reps", o.reps}, {"machine_busy_fraction", load.busy_fraction}, {"loadavg_1m", load.loadavg_1m}, {"machine_idle", load.idle()}, {"cpu", load.cpu}, {"note", note}, {"results", results}, {"requests", raw}};
        std::ofstream(o.json_path) << j.dump(2) << "\n";
        std::printf("wrote %s\n", o.json_path.c_str());
    }
    return 0;
}

}  // namespace specula::bench
