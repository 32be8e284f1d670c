#include "serve_common.h"

#include <fcntl.h>
#include <httplib.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <numeric>
#include <sstream>
#include <thread>

#include "bench_util.h"
#include "common/loopback.h"
#include "specula/error.h"

namespace specula::bench {

using json = nlohmann::json;

namespace {

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

std::string exit_text(int status) {
    if (WIFEXITED(status)) return WEXITSTATUS(status) == 127 ? "could not be executed" : "exit code " + std::to_string(WEXITSTATUS(status));
    return "signal " + std::to_string(WTERMSIG(status));
}

}  // namespace

ServerProcess::ServerProcess(const std::string & name, std::vector<std::string> argv, std::string log_path, int port)
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

ServerProcess::~ServerProcess() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGTERM);
    for (int i = 0; i < 200 && ::waitpid(pid_, nullptr, WNOHANG) == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (::waitpid(pid_, nullptr, WNOHANG) == 0) {
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, nullptr, 0);
    }
}

void ServerProcess::check_running() {
    int status = 0;
    if (pid_ > 0 && ::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = 0;
        throw Error(name_ + " exited (" + exit_text(status) + "); its log " + log_ + " ends: " + log_tail(log_));
    }
}

void ServerProcess::wait_ready(double timeout_s) {
    const auto t0 = serve_clock::now();
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

RequestResult stream_completion(int port, const json & body) {
    const bool chat = body.contains("messages");
    RequestResult r;
    httplib::Client cli("127.0.0.1", port);
    cli.set_read_timeout(600);
    std::string raw, pending;
    bool done = false;
    const auto t0 = serve_clock::now();
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
            const double now = seconds_since(t0);
            if (r.text.empty()) r.ttft = now;
            r.text += piece;
            r.chunk_times.push_back(now);
        }
        if (j.contains("usage") && j.at("usage").is_object()) {
            const json & usage = j.at("usage");
            r.tokens = usage.value("completion_tokens", 0);
            r.prompt_tokens = usage.value("prompt_tokens", -1);
            if (usage.contains("prompt_tokens_details") && usage.at("prompt_tokens_details").is_object()) {
                r.cached_tokens = usage.at("prompt_tokens_details").value("cached_tokens", -1);
            }
        }
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
    if (r.tokens == 0) r.tokens = static_cast<int>(r.chunk_times.size());  // a server without a usage chunk streams a token per chunk
    return r;
}

json with_prompt(json request, const std::string & text, bool chat) {
    if (chat) request["messages"] = json::array({{{"role", "user"}, {"content", text}}});
    else request["prompt"] = text;
    return request;
}

namespace {

// llama-server queues without a bound; specula's --queue is raised to what a workload sends at once.
std::vector<std::string> server_argv(const ServeBenchOptions & o, const Config & c, int parallel, int queue, int threads, int n_ctx, int port) {
    const std::string t = std::to_string(threads);
    if (c.server == "specula") {
        std::vector<std::string> a = {o.specula_bin, "serve", "-m", o.model, "--parallel", std::to_string(parallel), "--queue",
                                      std::to_string(std::max(queue, 64)), "-t", t, "-c", std::to_string(n_ctx), "--host", "127.0.0.1",
                                      "--port", std::to_string(port)};
        if (c.speculative) {
            if (!o.eagle3.empty()) a.insert(a.end(), {"--eagle3", o.eagle3});
            else if (!o.draft.empty()) a.insert(a.end(), {"--draft", o.draft});
            else a.push_back("--ngram");
            a.insert(a.end(), {"--draft-max", std::to_string(o.draft_max)});
            std::istringstream extra(o.specula_args);
            for (std::string arg; extra >> arg;) a.push_back(arg);
        } else {
            a.push_back("--no-spec");  // without a drafter serve drafts by prompt lookup
        }
        return a;
    }
    // llama-server's -c is the total over its slots.
    std::vector<std::string> a = {o.llama_server_bin, "-m", o.model, "--parallel", std::to_string(parallel), "-t", t, "-tb", t,
                                  "-c", std::to_string(n_ctx * parallel), "--host", "127.0.0.1", "--port", std::to_string(port),
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

}  // namespace

json request_template(const Config & c, int max_tokens, bool cache_prompt) {
    json r = {{"max_tokens", max_tokens}, {"temperature", 0}, {"seed", 42}, {"stream", true}, {"stream_options", {{"include_usage", true}}}, {"ignore_eos", true}};
    if (c.server == "llama-server") r["cache_prompt"] = cache_prompt;
    return r;
}

void validate_servers(ServeBenchOptions & o) {
    if (!std::filesystem::is_regular_file(o.model)) throw Error("model " + o.model + ": no such file");
    if (!o.draft.empty() && !std::filesystem::is_regular_file(o.draft)) throw Error("draft model " + o.draft + ": no such file");
    if (!o.eagle3.empty() && !std::filesystem::is_regular_file(o.eagle3)) throw Error("EAGLE-3 head " + o.eagle3 + ": no such file");
    if (!o.draft.empty() && !o.eagle3.empty()) throw Error("--draft and --eagle3: give one drafter for the speculative configurations");
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
            throw Error("llama-server binary " + o.llama_server_bin + " is missing: build it with `cmake --build build --target peers` (a build configured with -DSPECULA_LLAMA_TOOLS=ON, the default)");
        }
    }
}

ServeConfigs serve_configs(const ServeBenchOptions & o) {
    const std::string drafter = !o.eagle3.empty() ? "EAGLE-3" : !o.draft.empty() ? "draft model"
                                                                                 : "n-gram";
    ServeConfigs out;
    out.note = !o.eagle3.empty()
                   ? "speculative configurations use the EAGLE-3 head " + o.eagle3 + " (specula --eagle3, llama-server -md --spec-type draft-eagle3)"
               : !o.draft.empty() ? "speculative configurations use the draft model " + o.draft + " (specula --draft, llama-server -md)"
                                  : "no drafter given: the speculative configurations draft by n-gram (specula --ngram, llama-server --spec-type ngram-simple)";
    const bool llama_speculates = o.eagle3.empty() || llama_cpp_runs_eagle3_on(o.model);
    if (!llama_speculates) out.note += "\nnote: " + llama_eagle3_absent_note(o.model);
    for (const auto & s : o.servers) {
        out.configs.push_back({s, "plain", false});
        if (s != "llama-server" || llama_speculates) out.configs.push_back({s, drafter, true});
    }
    return out;
}

StartedServer start_server(const ServeBenchOptions & o, const Config & c, int parallel, int queue, int threads, int n_ctx,
                           const std::filesystem::path & scratch, const std::string & label, const json & warm_up) {
    StartedServer s;
    s.port = free_loopback_port();
    const std::string log = (scratch / (c.server + "-" + label + (c.speculative ? "-spec" : "") + ".log")).string();
    const std::vector<std::string> argv = server_argv(o, c, parallel, queue, threads, n_ctx, s.port);
    std::string command;
    for (const auto & a : argv) command += (command.empty() ? "" : " ") + a;
    std::printf("%s %s, %s: %s\n", c.server.c_str(), c.name.c_str(), label.c_str(), command.c_str());
    std::fflush(stdout);
    s.process = std::make_unique<ServerProcess>(c.server, argv, log, s.port);
    s.process->wait_ready(o.startup_timeout);
    if (const auto w = stream_completion(s.port, warm_up); !w.error.empty()) {
        throw Error(c.server + " " + c.name + ": warm-up request failed: " + w.error);
    }
    return s;
}

ScratchDir::ScratchDir() : path(std::filesystem::temp_directory_path() / ("specula-serve-bench-" + std::to_string(::getpid()))) {
    std::filesystem::create_directories(path);
}

ScratchDir::~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
}

Distribution distribution(std::vector<double> xs) {
    Distribution d;
    d.n = xs.size();
    if (xs.empty()) return d;
    std::sort(xs.begin(), xs.end());
    auto at = [&](double q) {
        const double rank = q * double(xs.size() - 1);
        const size_t lo = static_cast<size_t>(std::floor(rank)), hi = std::min(lo + 1, xs.size() - 1);
        return xs[lo] + (rank - double(lo)) * (xs[hi] - xs[lo]);
    };
    d.mean = std::accumulate(xs.begin(), xs.end(), 0.0) / double(xs.size());
    d.p50 = at(0.50), d.p90 = at(0.90), d.p99 = at(0.99);
    return d;
}

json to_json(const Distribution & d) { return {{"mean", d.mean}, {"p50", d.p50}, {"p90", d.p90}, {"p99", d.p99}, {"n", d.n}}; }

}  // namespace specula::bench
