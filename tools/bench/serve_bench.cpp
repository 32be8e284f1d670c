#include "serve_bench.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include "bench_util.h"
#include "common/progress.h"
#include "serve_common.h"
#include "serve_fim.h"
#include "serve_replay.h"
#include "runtime/backend.h"
#include "specula/error.h"

namespace specula::bench {
namespace {

using json = nlohmann::json;

// ---------------------------------------------------------------------------------------------
// The closed-loop client sweep: C clients, each sending its next request when its last one ends.

struct LoadRun {
    double wall = 0;
    std::vector<RequestResult> requests;
};

// `clients` threads; every client sends the same number of requests (ceil(prompts / clients)),
// one after another, prompt (client + clients x i) mod n: the whole set at every concurrency.
LoadRun run_load(int port, const std::vector<PromptText> & prompts, bool chat, int clients, const json & request) {
    const size_t per_client = (prompts.size() + clients - 1) / clients;
    LoadRun run;
    run.requests.resize(per_client * clients);
    std::vector<std::thread> threads;
    const auto t0 = serve_clock::now();
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

struct Row {
    const Config * config = nullptr;
    int clients = 0;
    Summary aggregate, per_request, ttft_ms;
    double ttft_p90_ms = 0, acceptance = -1;
    int same = 0, compared = 0, requests = 0;
    std::vector<double> aggregate_reps;
    Summary vs_plain;  // speculative rows: aggregate / the same server's plain aggregate, per rep (n = 0: none)
};

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
    std::vector<StartedServer> servers;
    std::vector<json> requests;
};

RunningServers start_servers(const ServeBenchOptions & o, const std::vector<Config> & configs, const PromptSet & set, int clients,
                             int threads, const std::filesystem::path & scratch, std::vector<Row> & rows) {
    RunningServers s;
    for (const Config & c : configs) {
        // Every prompt comes back once per rep, and specula's slots keep their prompts' KV (its
        // prefix cache, always on): llama-server keeps its prompt cache too, so that both skip the
        // prefill of a prompt a slot has seen.
        const json request = request_template(c, o.n_gen, /*cache_prompt=*/true);
        json warm = with_prompt(request, set.prompts[0].text, set.chat);
        warm["max_tokens"] = std::min(o.n_gen, 8);
        s.servers.push_back(start_server(o, c, clients, clients, threads, o.n_ctx, scratch, std::to_string(clients) + " clients", warm));
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
        row.ttft_p90_ms = distribution(samples[ci].ttft).p90;
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

// The closed-loop workload's own settings (the servers' were checked by validate_servers).
void validate_client_sweep(const ServeBenchOptions & o) {
    if (o.clients.empty() || *std::min_element(o.clients.begin(), o.clients.end()) < 1) throw Error("--clients: counts must be at least 1");
    if (o.reps < 1) throw Error("--reps must be at least 1");
    if (o.n_gen < 1 || o.n_gen >= o.n_ctx) throw Error("--n-gen must be between 1 and the context (" + std::to_string(o.n_ctx) + ")");
}

int run_client_sweep(ServeBenchOptions & o) {
    if (o.n_ctx == 0) o.n_ctx = 512;
    validate_client_sweep(o);
    const std::string prompts_path = prompt_set_path(o.prompts);
    const PromptSet set = read_prompt_set(prompts_path);
    const std::vector<PromptText> & prompts = set.prompts;
    const int threads = o.threads > 0 ? o.threads : default_thread_count();
    const MachineLoad load = measure_machine_load();
    print_machine(load);
    std::printf(
        "%zu %s prompts, %d tokens each (ignore_eos, T = 0), %d threads, context %d per slot, draft max %d, %d reps; "
        "both servers reuse a prompt a slot has seen (specula's prefix cache, llama-server's cache_prompt true)\n",
        prompts.size(), set.chat ? "chat" : "completion", o.n_gen, threads, o.n_ctx, o.draft_max, o.reps);
    const ServeConfigs serve = serve_configs(o);
    const std::vector<Config> & configs = serve.configs;
    const std::string & note = serve.note;
    std::printf("%s\n", note.c_str());
    // Gone however the run ends: a server that fails to start throws with its log's tail in the message.
    const ScratchDir scratch_dir;
    const std::filesystem::path & scratch = scratch_dir.path;

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
                const LoadRun run = run_load(servers.servers[ci].port, prompts, set.chat, clients, servers.requests[ci]);
                progress.step(std::to_string(clients) + " clients, " + c.server + " " + c.name + ", rep " + std::to_string(rep + 1) + "/" +
                              std::to_string(o.reps));
                record_run(o, c, set, clients, rep, run, rows[first_row + ci], samples[ci], reference[c.server], raw);
            }
        }
        summarize_rows(configs, samples, o.reps, first_row, rows);
    }
    const json results = print_results(rows);
    if (!o.json_path.empty()) {
        const json j = {{"kind", "serve"}, {"model", o.model}, {"draft", o.draft}, {"eagle3", o.eagle3}, {"prompts", prompts_path}, {"chat", set.chat}, {"threads", threads}, {"n_gen", o.n_gen}, {"n_ctx_per_slot", o.n_ctx}, {"draft_max", o.draft_max}, {"reps", o.reps}, {"llama_server_cache_prompt", true}, {"machine_busy_fraction", load.busy_fraction}, {"loadavg_1m", load.loadavg_1m}, {"machine_idle", load.idle()}, {"cpu", load.cpu}, {"note", note}, {"results", results}, {"requests", raw}};
        write_result(o.json_path, j.dump(2) + "\n");
    }
    return 0;
}

}  // namespace

int run_serve_bench(const ServeBenchOptions & options) {
    ServeBenchOptions o = options;
    validate_servers(o);
    if (!o.fim.empty()) return run_fim(o);
    if (o.multi_turn) return run_multi_turn(o);
    if (!o.dataset.empty()) return run_rate_sweep(o);
    return run_client_sweep(o);
}

}  // namespace specula::bench
