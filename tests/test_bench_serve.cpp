// `specula bench serve` end to end on the bundled family and on SmolLM2 with its EAGLE-3 head
// (specula's server only: llama-server is a peer tool CI does not build), and its errors for
// missing binaries, models and failed servers.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
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
