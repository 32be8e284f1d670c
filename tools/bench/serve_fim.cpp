#include "serve_fim.h"

#include <httplib.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "bench_util.h"
#include "runtime/backend.h"
#include "serve_common.h"
#include "specula/error.h"

namespace specula::bench {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

constexpr int kPrefixLines = 256, kSuffixLines = 64, kChunkLines = 32, kSiblings = 3;  // llama.vim's n_prefix, n_suffix; its ring chunks

std::vector<std::string> lines_of(const fs::path & p) {
    std::ifstream in(p);
    std::vector<std::string> lines;
    for (std::string l; std::getline(in, l);) lines.push_back(l);
    return lines;
}

std::string joined(const std::vector<std::string> & lines, size_t from, size_t to) {
    std::string s;
    for (size_t i = from; i < to && i < lines.size(); ++i) s += lines[i] + "\n";
    return s;
}

// One request of the replay, the same for every configuration.
struct FimRequest {
    std::string file;
    json body;
};

std::vector<FimRequest> sessions(const ServeBenchOptions & o) {
    std::vector<fs::path> files;
    for (const auto & e : fs::directory_iterator(o.fim)) {
        if (e.is_regular_file()) files.push_back(e.path());
    }
    std::sort(files.begin(), files.end());
    if (files.size() < 2) throw Error("--fim " + o.fim + ": the folder needs at least two files (one typed, its siblings as extra context)");
    std::vector<FimRequest> out;
    for (int f = 0; f < o.fim_files && f < static_cast<int>(files.size()); ++f) {
        const std::vector<std::string> lines = lines_of(files[f]);
        json extra = json::array();
        for (int s = 1; s <= kSiblings && s < static_cast<int>(files.size()); ++s) {
            const fs::path & sibling = files[(f + s) % files.size()];
            extra.push_back({{"filename", sibling.filename().string()}, {"text", joined(lines_of(sibling), 0, kChunkLines)}});
        }
        // The session starts a third into the file, where code above and below the cursor both exist.
        const size_t start = lines.size() / 3;
        for (size_t i = start; i < start + static_cast<size_t>(o.fim_lines) && i < lines.size(); ++i) {
            const std::string & line = lines[i];
            const size_t indent = line.find_first_not_of(" \t");
            json body = {{"input_prefix", joined(lines, i > kPrefixLines ? i - kPrefixLines : 0, i)},
                         {"input_suffix", "\n" + joined(lines, i + 1, i + 1 + kSuffixLines)},
                         {"input_extra", extra},
                         {"prompt", line},
                         {"n_predict", o.fim_predict},
                         {"n_indent", indent == std::string::npos ? 0 : static_cast<int>(indent)},
                         {"samplers", {"top_k", "temperature"}},
                         {"top_k", 1},
                         {"temperature", 0},
                         {"cache_prompt", true},
                         {"stream", false}};
            out.push_back({files[f].filename().string(), std::move(body)});
        }
    }
    return out;
}

double percentile(std::vector<double> xs, double q) {
    if (xs.empty()) return 0;
    std::sort(xs.begin(), xs.end());
    const double rank = q * double(xs.size() - 1);
    const size_t lo = static_cast<size_t>(rank), hi = std::min(lo + 1, xs.size() - 1);
    return xs[lo] + (rank - double(lo)) * (xs[hi] - xs[lo]);
}

}  // namespace

int run_fim(ServeBenchOptions & o) {
    if (o.fim_files < 1 || o.fim_lines < 1 || o.fim_predict < 1) throw Error("--fim-files, --fim-lines and --fim-predict must be at least 1");
    if (o.n_ctx == 0) o.n_ctx = 4096;  // llama-server's layout gives input_extra what a 2048-token batch leaves
    const std::vector<FimRequest> requests = sessions(o);
    const int threads = o.threads > 0 ? o.threads : default_thread_count();
    const ServeConfigs serve = serve_configs(o);
    print_machine(measure_machine_load());
    std::printf(
        "%zu requests: %d files of %s, %d lines typed each, %d siblings' first %d lines as input_extra, n_predict %d (greedy), "
        "1 slot, %d threads, context %d, draft max %d\n%s\n",
        requests.size(), o.fim_files, o.fim.c_str(), o.fim_lines, kSiblings, kChunkLines, o.fim_predict, threads, o.n_ctx,
        o.draft_max, serve.note.c_str());
    ScratchDir scratch;
    json results = json::array();
    std::vector<std::string> first_texts;  // the plain configuration's replies: every other must give them too
    // gen tok/s: generated tokens over the servers' own generation time (timings.predicted_ms), so speculation's
    // gain shows apart from the prompt, which dominates an editor's latency.
    std::printf("\n%-13s %-12s %9s %9s %9s %14s %12s %10s %12s\n", "server", "config", "p50 ms", "p95 ms", "mean ms", "prompt eval/req",
                "prompt ms/req", "gen tok/s", "tok/forward");
    for (const Config & c : serve.configs) {
        const json warm = with_prompt(request_template(c, 8, true), "def hello():", false);
        StartedServer s = start_server(o, c, 1, 4, threads, o.n_ctx, scratch.path, "fim", warm);
        httplib::Client cli("127.0.0.1", s.port);
        cli.set_read_timeout(600);
        std::vector<double> latency, evaluated;
        double prompt_ms = 0, predicted_ms = 0;
        long generated = 0, forwards = 0;
        std::vector<std::string> texts;
        for (const FimRequest & q : requests) {
            const auto t0 = serve_clock::now();
            const auto res = cli.Post("/infill", q.body.dump(), "application/json");
            const double ms = seconds_since(t0) * 1000.0;
            if (!res || res->status != 200) {
                throw Error(c.server + " " + c.name + ", " + q.file + ": /infill failed: " + (res ? std::to_string(res->status) + " " + res->body.substr(0, 300) : httplib::to_string(res.error())));
            }
            const json r = json::parse(res->body);
            latency.push_back(ms);
            evaluated.push_back(r["timings"].value("prompt_n", 0.0));
            const int n = r["timings"].value("predicted_n", 0);
            generated += n;
            prompt_ms += r["timings"].value("prompt_ms", 0.0);
            predicted_ms += r["timings"].value("predicted_ms", 0.0);
            // specula: its rounds are the target's forwards; llama-server: each accepted draft token saves one.
            if (r.contains("speculation")) forwards += r["speculation"].value("rounds", 0);
            else forwards += n - r["timings"].value("draft_n_accepted", 0);
            texts.push_back(r.value("content", ""));
        }
        if (first_texts.empty()) first_texts = texts;
        size_t differ = 0;
        for (size_t i = 0; i < texts.size(); ++i) differ += texts[i] != first_texts[i];
        double mean = 0;
        for (double x : latency) mean += x / double(latency.size());
        double eval_mean = 0;
        for (double x : evaluated) eval_mean += x / double(evaluated.size());
        const double per_forward = forwards > 0 ? double(generated) / double(forwards) : 0.0;
        const double prompt_ms_mean = prompt_ms / double(requests.size());
        const double gen_rate = predicted_ms > 0 ? 1000.0 * double(generated) / predicted_ms : 0.0;
        std::printf("%-13s %-12s %9.1f %9.1f %9.1f %14.1f %12.1f %10.1f %12.2f%s\n", c.server.c_str(), c.name.c_str(), percentile(latency, 0.5),
                    percentile(latency, 0.95), mean, eval_mean, prompt_ms_mean, gen_rate, per_forward,
                    differ ? ("  (" + std::to_string(differ) + " replies differ from the first configuration's)").c_str() : "");
        std::fflush(stdout);
        results.push_back({{"server", c.server}, {"config", c.name}, {"latency_ms_p50", percentile(latency, 0.5)}, {"latency_ms_p95", percentile(latency, 0.95)}, {"latency_ms_mean", mean}, {"prompt_evaluated_mean", eval_mean}, {"prompt_ms_mean", prompt_ms_mean}, {"generation_tokens_per_second", gen_rate}, {"tokens_per_forward", per_forward}, {"generated", generated}, {"replies_differing", differ}});
    }
    if (!o.json_path.empty()) {
        write_result(o.json_path, json{{"kind", "fim"}, {"model", o.model}, {"draft", o.draft}, {"fim", o.fim}, {"threads", threads}, {"n_ctx", o.n_ctx}, {"draft_max", o.draft_max}, {"results", results}}.dump(2) + "\n");
    }
    return 0;
}

}  // namespace specula::bench
