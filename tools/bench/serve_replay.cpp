#include "serve_replay.h"

#include <atomic>
#include <cmath>
#include <cstdio>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "bench_util.h"
#include "common/progress.h"
#include "runtime/backend.h"
#include "serve_common.h"
#include "sharegpt.h"
#include "specula/error.h"
#include "tokenizer/tokenizer.h"

namespace specula::bench {
namespace {

using json = nlohmann::json;

constexpr double kAllAtOnce = std::numeric_limits<double>::infinity();
// A short chat exchange no sample holds, so that warming a server up caches none of their prompts.
constexpr const char * kWarmUpMessage = "Say hello.";

// What both workloads read and print first.
struct Replay {
    ConversationSet set;
    int threads = 0;
    MachineLoad load;
    ServeConfigs serve;
};

Replay open_replay(const ServeBenchOptions & o) {
    if (o.slots < 1) throw Error("--slots must be at least 1");
    if (o.max_tokens < 1 || o.max_tokens + kTemplateAllowance >= o.n_ctx) {
        throw Error("--max-tokens must be at least 1 and leave room for a prompt in the context (" + std::to_string(o.n_ctx) + ")");
    }
    Replay r;
    r.set = read_conversation_set(o.dataset);
    r.threads = o.threads > 0 ? o.threads : default_thread_count();
    r.serve = serve_configs(o);
    r.load = measure_machine_load();
    print_machine(r.load);
    std::printf(
        "%zu conversations from %s (sha256 %s%s), seed %u, replies capped at %d tokens (ignore_eos, T = 0), %d slots, %d threads, "
        "context %d per slot, draft max %d\n%s\n",
        r.set.conversations.size(), r.set.path.c_str(), r.set.sha256.c_str(), r.set.pinned ? ", the pinned ShareGPT serving set" : "",
        o.seed, o.max_tokens, o.slots, r.threads, o.n_ctx, o.draft_max, r.serve.note.c_str());
    return r;
}

json settings_json(const ServeBenchOptions & o, const Replay & r, const char * kind) {
    return {{"kind", kind}, {"model", o.model}, {"draft", o.draft}, {"eagle3", o.eagle3}, {"dataset", r.set.path}, {"dataset_sha256", r.set.sha256}, {"dataset_pinned", r.set.pinned}, {"seed", o.seed}, {"max_tokens_cap", o.max_tokens}, {"slots", o.slots}, {"threads", r.threads}, {"n_ctx_per_slot", o.n_ctx}, {"draft_max", o.draft_max}, {"llama_server_cache_prompt", true}, {"machine_busy_fraction", r.load.busy_fraction}, {"loadavg_1m", r.load.loadavg_1m}, {"machine_idle", r.load.idle()}, {"cpu", r.load.cpu}, {"note", r.serve.note}};
}

void write_json(const std::string & path, const json & j) {
    if (!path.empty()) write_result(path, j.dump(2) + "\n");
}

// Every configuration's server, started once; `queue` requests may wait for a slot at once.
std::vector<StartedServer> start_all(const ServeBenchOptions & o, const Replay & r, int queue, const std::filesystem::path & scratch) {
    std::vector<StartedServer> servers;
    for (const Config & c : r.serve.configs) {
        const json warm = with_prompt(request_template(c, 8, true), kWarmUpMessage, true);
        servers.push_back(start_server(o, c, o.slots, queue, r.threads, o.n_ctx, scratch, std::to_string(o.slots) + " slots", warm));
    }
    return servers;
}

// A request's failure or a reply of another length than asked (ignore_eos) ends the run.
void check(const Config & c, const RequestResult & q, int max_tokens, const std::string & where) {
    if (!q.error.empty()) throw Error(c.server + " " + c.name + ", " + where + ": " + q.error);
    if (q.tokens != max_tokens) {
        throw Error(c.server + " " + c.name + ", " + where + ": a reply of " + std::to_string(q.tokens) + " tokens, not max_tokens " +
                    std::to_string(max_tokens));
    }
}

json acceptance_json(const Config & c, long drafted, long accepted) {
    return c.speculative && drafted > 0 ? json(double(accepted) / double(drafted)) : json(nullptr);
}

// ---------------------------------------------------------------------------------------------
// The request-rate sweep

std::vector<double> parse_rates(const std::vector<std::string> & texts) {
    std::vector<double> rates;
    for (const std::string & t : texts) {
        if (t == "inf") {
            rates.push_back(kAllAtOnce);
            continue;
        }
        size_t used = 0;
        double rate = 0;
        try {
            rate = std::stod(t, &used);
        } catch (const std::exception &) {
            used = 0;
        }
        if (used != t.size() || !(rate > 0) || !std::isfinite(rate)) throw Error("--request-rates: '" + t + "' is not a positive number or inf");
        rates.push_back(rate);
    }
    if (rates.empty()) throw Error("--request-rates: give at least one rate");
    return rates;
}

std::string rate_text(double rate) {
    if (std::isinf(rate)) return "inf";
    char s[32];
    std::snprintf(s, sizeof s, "%g", rate);
    return s;
}

// Send times from the start: the first at 0, then exponential gaps of mean 1 / rate (a Poisson
// process), drawn from mt19937_64 so that a seed gives the same times everywhere.
std::vector<double> poisson_arrivals(size_t n, double rate, uint64_t seed) {
    std::vector<double> at(n, 0.0);
    if (std::isinf(rate)) return at;
    std::mt19937_64 rng(seed);
    for (size_t i = 1; i < n; ++i) {
        const double u = double(rng() >> 11) * 0x1.0p-53;  // [0, 1)
        at[i] = at[i - 1] - std::log1p(-u) / rate;
    }
    return at;
}

struct RateRun {
    double duration = 0;  // first send to last reply
    std::vector<RequestResult> results;
};

RateRun run_arrivals(int port, const Config & c, const std::vector<ReplayTurn> & requests, const std::vector<double> & arrivals) {
    RateRun run;
    run.results.resize(requests.size());
    std::vector<std::thread> threads;
    const auto t0 = serve_clock::now();
    for (size_t i = 0; i < requests.size(); ++i) {
        threads.emplace_back([&, i] {
            std::this_thread::sleep_until(t0 + std::chrono::duration_cast<serve_clock::duration>(std::chrono::duration<double>(arrivals[i])));
            run.results[i] = stream_completion(port, with_prompt(request_template(c, requests[i].max_tokens, true), requests[i].prompt, true));
        });
    }
    for (auto & t : threads) t.join();
    run.duration = seconds_since(t0);
    return run;
}

// One configuration at one rate: its row of the table and of the JSON.
json rate_row(const Config & c, double rate, const std::vector<ReplayTurn> & requests, const RateRun & run, json & raw) {
    std::vector<double> ttft, tpot, itl, e2el;
    long output = 0, input = 0, cached = 0, drafted = 0, accepted = 0;
    bool cache_reported = false;
    for (size_t i = 0; i < run.results.size(); ++i) {
        const RequestResult & q = run.results[i];
        check(c, q, requests[i].max_tokens, "request rate " + rate_text(rate));
        ttft.push_back(1000 * q.ttft), e2el.push_back(1000 * q.seconds);
        if (q.tokens > 1) tpot.push_back(1000 * (q.seconds - q.ttft) / (q.tokens - 1));
        for (size_t k = 1; k < q.chunk_times.size(); ++k) itl.push_back(1000 * (q.chunk_times[k] - q.chunk_times[k - 1]));
        output += q.tokens, input += std::max(q.prompt_tokens, 0), drafted += q.drafted, accepted += q.accepted;
        if (q.cached_tokens >= 0) cached += q.cached_tokens, cache_reported = true;
        raw.push_back({{"server", c.server}, {"config", c.name}, {"request_rate", rate_text(rate)}, {"prompt_len", requests[i].prompt_len}, {"prompt_tokens", q.prompt_tokens}, {"cached_tokens", q.cached_tokens < 0 ? json(nullptr) : json(q.cached_tokens)}, {"max_tokens", requests[i].max_tokens}, {"tokens", q.tokens}, {"ttft_s", q.ttft}, {"e2el_s", q.seconds}, {"chunks", q.chunk_times.size()}, {"drafted", q.drafted}, {"accepted", q.accepted}});
    }
    return {{"server", c.server}, {"config", c.name}, {"speculative", c.speculative}, {"request_rate", std::isinf(rate) ? json("inf") : json(rate)}, {"requests", run.results.size()}, {"duration_s", run.duration}, {"request_throughput", double(run.results.size()) / run.duration}, {"output_throughput", double(output) / run.duration}, {"total_input_tokens", input}, {"total_output_tokens", output}, {"cached_tokens", cache_reported ? json(cached) : json(nullptr)}, {"ttft_ms", to_json(distribution(ttft))}, {"tpot_ms", to_json(distribution(tpot))}, {"itl_ms", to_json(distribution(itl))}, {"e2el_ms", to_json(distribution(e2el))}, {"acceptance", acceptance_json(c, drafted, accepted)}};
}

void print_rate_rows(const json & rows) {
    std::printf(
        "\nTTFT = time to first token; TPOT = time per output token after the first; ITL = time between streamed chunks (a chunk\n"
        "may carry several tokens of a speculative round); E2E = whole request; all in ms, p50/p90/p99 over the requests; req/s and\n"
        "out tok/s = completed requests and output tokens / (first send to last reply); accept = accepted / drafted; cached = the\n"
        "prompt tokens the server reports reused (- when it reports none)\n");
    std::printf("%-13s %-12s %5s %6s %8s %-17s %-17s %-17s %-20s %6s %7s\n", "server", "config", "rate", "req/s", "out tok/s", "TTFT p50/90/99",
                "TPOT p50/90/99", "ITL p50/90/99", "E2E p50/90/99", "accept", "cached");
    auto trio = [](const json & d) {
        char s[48];
        std::snprintf(s, sizeof s, "%.0f/%.0f/%.0f", d.at("p50").get<double>(), d.at("p90").get<double>(), d.at("p99").get<double>());
        return std::string(s);
    };
    for (const json & r : rows) {
        char accept[16] = "-", cached[24] = "-";
        if (!r.at("acceptance").is_null()) std::snprintf(accept, sizeof accept, "%.2f", r.at("acceptance").get<double>());
        if (!r.at("cached_tokens").is_null()) std::snprintf(cached, sizeof cached, "%ld", r.at("cached_tokens").get<long>());
        const std::string rate = r.at("request_rate").is_string() ? "inf" : rate_text(r.at("request_rate").get<double>());
        std::printf("%-13s %-12s %5s %6.2f %8.1f %-17s %-17s %-17s %-20s %6s %7s\n", r.at("server").get<std::string>().c_str(),
                    r.at("config").get<std::string>().c_str(), rate.c_str(), r.at("request_throughput").get<double>(),
                    r.at("output_throughput").get<double>(), trio(r.at("ttft_ms")).c_str(), trio(r.at("tpot_ms")).c_str(),
                    trio(r.at("itl_ms")).c_str(), trio(r.at("e2el_ms")).c_str(), accept, cached);
    }
}

// ---------------------------------------------------------------------------------------------
// Multi-turn conversations

struct TurnResult {
    size_t conversation = 0;
    int turn = 0;
    RequestResult result;
};

// `slots` clients; each takes the next conversation and holds it for all its turns.
std::vector<TurnResult> run_conversations(int port, const Config & c, const std::vector<ReplayConversation> & conversations, int clients) {
    std::vector<std::vector<TurnResult>> per_client(clients);
    std::atomic<size_t> next{0};
    std::vector<std::thread> threads;
    for (int k = 0; k < clients; ++k) {
        threads.emplace_back([&, k] {
            for (size_t ci; (ci = next++) < conversations.size();) {
                json messages = json::array();
                for (size_t t = 0; t < conversations[ci].turns.size(); ++t) {
                    const ReplayTurn & turn = conversations[ci].turns[t];
                    messages.push_back({{"role", "user"}, {"content", turn.prompt}});
                    json request = request_template(c, turn.max_tokens, true);
                    request["messages"] = messages;
                    RequestResult q = stream_completion(port, request);
                    if (!q.error.empty()) {  // the conversation cannot go on; check() reports it
                        per_client[k].push_back({ci, int(t), std::move(q)});
                        break;
                    }
                    messages.push_back({{"role", "assistant"}, {"content", q.text}});
                    per_client[k].push_back({ci, int(t), std::move(q)});
                }
            }
        });
    }
    for (auto & t : threads) t.join();
    std::vector<TurnResult> all;
    for (auto & v : per_client) all.insert(all.end(), std::make_move_iterator(v.begin()), std::make_move_iterator(v.end()));
    return all;
}

// One configuration's turns: a row per turn for the table and the JSON.
json turn_rows(const Config & c, const std::vector<ReplayConversation> & conversations, int turns, const std::vector<TurnResult> & results,
               json & raw) {
    std::vector<std::vector<double>> ttft(turns), prompt(turns), cached(turns);
    long drafted = 0, accepted = 0;
    for (const TurnResult & r : results) {
        const RequestResult & q = r.result;
        check(c, q, conversations[r.conversation].turns[r.turn].max_tokens,
              "conversation " + conversations[r.conversation].id + " turn " + std::to_string(r.turn + 1));
        ttft[r.turn].push_back(1000 * q.ttft);
        prompt[r.turn].push_back(q.prompt_tokens);
        if (q.cached_tokens >= 0) cached[r.turn].push_back(q.cached_tokens);
        drafted += q.drafted, accepted += q.accepted;
        const ReplayTurn & turn = conversations[r.conversation].turns[r.turn];
        raw.push_back({{"server", c.server}, {"config", c.name}, {"conversation", conversations[r.conversation].id}, {"turn", r.turn + 1}, {"prompt_len", turn.prompt_len}, {"prompt_tokens", q.prompt_tokens}, {"cached_tokens", q.cached_tokens < 0 ? json(nullptr) : json(q.cached_tokens)}, {"max_tokens", turn.max_tokens}, {"tokens", q.tokens}, {"ttft_s", q.ttft}, {"e2el_s", q.seconds}, {"drafted", q.drafted}, {"accepted", q.accepted}});
    }
    json per_turn = json::array();
    for (int t = 0; t < turns; ++t) {
        per_turn.push_back({{"turn", t + 1}, {"ttft_ms", to_json(distribution(ttft[t]))}, {"prompt_tokens_mean", distribution(prompt[t]).mean}, {"cached_tokens_mean", cached[t].empty() ? json(nullptr) : json(distribution(cached[t]).mean)}});
    }
    return {{"server", c.server}, {"config", c.name}, {"speculative", c.speculative}, {"acceptance", acceptance_json(c, drafted, accepted)}, {"turns", per_turn}};
}

void print_turn_rows(const json & rows) {
    std::printf(
        "\nper turn over the conversations: TTFT = time to first token (ms, p50/p90/p99); prompt = the prompt tokens the server\n"
        "counts (mean); cached = of those, the ones it reports reused from the conversation's earlier turns (mean; - when it\n"
        "reports none); accept = accepted / drafted over all turns\n");
    std::printf("%-13s %-12s %4s %-17s %8s %8s %6s\n", "server", "config", "turn", "TTFT p50/90/99", "prompt", "cached", "accept");
    for (const json & r : rows) {
        char accept[16] = "-";
        if (!r.at("acceptance").is_null()) std::snprintf(accept, sizeof accept, "%.2f", r.at("acceptance").get<double>());
        for (const json & t : r.at("turns")) {
            char ttft[48], cached[24] = "-";
            const json & d = t.at("ttft_ms");
            std::snprintf(ttft, sizeof ttft, "%.0f/%.0f/%.0f", d.at("p50").get<double>(), d.at("p90").get<double>(), d.at("p99").get<double>());
            if (!t.at("cached_tokens_mean").is_null()) std::snprintf(cached, sizeof cached, "%.0f", t.at("cached_tokens_mean").get<double>());
            std::printf("%-13s %-12s %4d %-17s %8.0f %8s %6s\n", r.at("server").get<std::string>().c_str(), r.at("config").get<std::string>().c_str(),
                        t.at("turn").get<int>(), ttft, t.at("prompt_tokens_mean").get<double>(), cached, accept);
        }
    }
}

}  // namespace

int run_rate_sweep(ServeBenchOptions & o) {
    if (o.n_ctx == 0) o.n_ctx = 2048;
    if (o.num_prompts < 1) throw Error("--num-prompts must be at least 1");
    const std::vector<double> rates = parse_rates(o.request_rates);
    const Replay r = open_replay(o);
    const Tokenizer tokenizer(o.model);
    const auto sample = sample_conversations(r.set, tokenizer, size_t(o.num_prompts) * rates.size(), 1, o.seed, o.max_tokens, o.n_ctx);
    std::printf(
        "request rates %s: %d requests each, every rate its own sample; llama-server with cache_prompt true\n",
        [&] {
            std::string s;
            for (double rate : rates) s += (s.empty() ? "" : ",") + rate_text(rate);
            return s;
        }()
            .c_str(),
        o.num_prompts);
    const ScratchDir scratch;
    const std::vector<StartedServer> servers = start_all(o, r, o.num_prompts, scratch.path);
    json rows = json::array(), raw = json::array();
    Progress progress("bench serve", int64_t(rates.size() * r.serve.configs.size()));
    // Rate by rate every configuration in turn: a machine's speed drifts less within a rate's runs.
    for (size_t ri = 0; ri < rates.size(); ++ri) {
        std::vector<ReplayTurn> requests;
        for (size_t i = 0; i < size_t(o.num_prompts); ++i) requests.push_back(sample[ri * o.num_prompts + i].turns[0]);
        const std::vector<double> arrivals = poisson_arrivals(requests.size(), rates[ri], uint64_t(o.seed) + 1 + ri);
        for (size_t ci = 0; ci < r.serve.configs.size(); ++ci) {
            const Config & c = r.serve.configs[ci];
            const RateRun run = run_arrivals(servers[ci].port, c, requests, arrivals);
            servers[ci].process->check_running();  // a server gone says why before its requests' errors do
            progress.step("rate " + rate_text(rates[ri]) + ", " + c.server + " " + c.name);
            rows.push_back(rate_row(c, rates[ri], requests, run, raw));
        }
    }
    print_rate_rows(rows);
    json j = settings_json(o, r, "serve-request-rates");
    j["num_prompts"] = o.num_prompts, j["results"] = rows, j["requests"] = raw;
    write_json(o.json_path, j);
    return 0;
}

int run_multi_turn(ServeBenchOptions & o) {
    if (o.n_ctx == 0) o.n_ctx = 4096;
    if (o.turns < 1) throw Error("--turns must be at least 1");
    if (o.conversations < 1) throw Error("--conversations must be at least 1");
    const Replay r = open_replay(o);
    const Tokenizer tokenizer(o.model);
    const auto conversations = sample_conversations(r.set, tokenizer, o.conversations, o.turns, o.seed, o.max_tokens, o.n_ctx);
    std::printf(
        "%d conversations of %d turns, %d clients at a time, each reply sent back as an assistant message; llama-server with "
        "cache_prompt true\n",
        o.conversations, o.turns, o.slots);
    const ScratchDir scratch;
    const std::vector<StartedServer> servers = start_all(o, r, o.slots, scratch.path);
    json rows = json::array(), raw = json::array();
    Progress progress("bench serve", int64_t(r.serve.configs.size()));
    for (size_t ci = 0; ci < r.serve.configs.size(); ++ci) {
        const Config & c = r.serve.configs[ci];
        const std::vector<TurnResult> results = run_conversations(servers[ci].port, c, conversations, o.slots);
        servers[ci].process->check_running();
        progress.step(c.server + " " + c.name);
        rows.push_back(turn_rows(c, conversations, o.turns, results, raw));
    }
    print_turn_rows(rows);
    json j = settings_json(o, r, "serve-multi-turn");
    j["turns"] = o.turns, j["conversations"] = o.conversations, j["results"] = rows, j["requests"] = raw;
    write_json(o.json_path, j);
    return 0;
}

}  // namespace specula::bench
