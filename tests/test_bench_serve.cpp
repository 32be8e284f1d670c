// `specula bench serve` end to end on the bundled family (specula's server only: llama-server is a
// peer tool CI does not build), and its errors for missing binaries, models and failed servers.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "test_models.h"

namespace specula {
namespace {

const std::string kModels = test::shipped_model("");

std::string two_prompts() {
    const std::string path = test::scratch_dir() + "/bench-serve-prompts.json";
    std::ofstream(path) << R"({"prompts": [
        {"category": "code", "name": "def", "text": "def read_config(path):\n    with open(path) as f:\n"},
        {"category": "prose", "name": "doc", "text": "The Python standard library provides"}]})";
    return path;
}

// Catches: the C++ streaming client miscounting tokens or losing text (every request must bring
// exactly -n tokens, the speculative server's text must equal the plain one's at every
// concurrency), a server not started, not stopped or not waited for, rows or JSON fields missing.
TEST(BenchServe, SpeculaPlainAndDraftModelAtOneAndTwoClients) {
    const std::string json_path = test::scratch_dir() + "/bench-serve.json";
    std::filesystem::remove(json_path);
    const test::CommandRun run = test::run_command(std::string(SPECULA_CLI) + " bench serve -m " + kModels + "specula-target.gguf --draft " +
                                                   kModels + "specula-draft.gguf --servers specula --clients 1,2 -r 1 -n 8 -t 1 --prompts " +
                                                   two_prompts() + " --json " + json_path);
    ASSERT_EQ(run.exit_code, 0) << run.out << run.err;
    EXPECT_NE(run.out.find("vs llama"), std::string::npos) << run.out;
    const auto j = nlohmann::json::parse(std::ifstream(json_path));
    ASSERT_EQ(j.at("results").size(), 4u);
    for (const auto & r : j.at("results")) {
        EXPECT_EQ(r.at("requests"), 2) << r;
        EXPECT_EQ(r.at("identical_to_plain"), r.at("compared")) << r;
        EXPECT_EQ(r.at("compared"), 2) << r;
        EXPECT_GT(r.at("aggregate_tok_s").at("median").get<double>(), 0.0) << r;
        // A plain server reports no acceptance. A speculative one may draft nothing at all: its cost
        // policy drafts only where its measured curve says drafting pays (not under ASan, say).
        if (!r.at("speculative").get<bool>()) EXPECT_TRUE(r.at("acceptance").is_null()) << r;
        else if (!r.at("acceptance").is_null()) EXPECT_LE(r.at("acceptance").get<double>(), 1.0) << r;
    }
    ASSERT_EQ(j.at("requests").size(), 8u);
    for (const auto & q : j.at("requests")) EXPECT_EQ(q.at("tokens"), 8);
    // Progress on stderr, one line per (clients, server, rep) when stderr is not a terminal.
    for (const char * step : {"bench serve: 1/4 1 clients, specula plain, rep 1/1", "bench serve: 4/4 2 clients, specula "}) {
        EXPECT_NE(run.err.find(step), std::string::npos) << "no progress line '" << step << "' in:\n" << run.err;
    }
}

// A chat prompt set is refused by name (bench serve sends completions), not sent as plain text.
TEST(BenchServe, RefusesChatPromptSets) {
    test::expect_cli_error(SPECULA_CLI, " bench serve -m " + kModels + "specula-target.gguf --servers specula --prompts " + SPECULA_SOURCE_DIR +
                                            "/bench/prompts-chat.json",
                           "a chat prompt set; bench serve sends completions");
}

// Catches: a crash, a hang or a vague message when a server binary, a model or a server's
// start-up is wrong.
TEST(BenchServe, ClearErrors) {
    const std::string cli = SPECULA_CLI;
    const std::string m = " bench serve -m " + kModels + "specula-target.gguf --prompts " + two_prompts() + " -r 1 -n 4 --clients 1 ";
    test::expect_cli_error(cli, " bench serve -m /nonexistent.gguf", "model /nonexistent.gguf: no such file");
    test::expect_cli_error(cli, m + "--draft /nonexistent.gguf", "draft model /nonexistent.gguf: no such file");
    test::expect_cli_error(cli, m + "--servers vllm", "unknown server 'vllm'");
    test::expect_cli_error(cli, " bench serve -m " + kModels + "specula-target.gguf --servers specula --prompts /nonexistent.json", "/nonexistent.json: cannot open the prompt set");
    test::expect_cli_error(cli, m + "--servers llama-server --llama-server-bin /nonexistent/llama-server", "llama-server binary");
    test::expect_cli_error(cli, m + "--servers llama-server --llama-server-bin /bin/false", "llama-server exited during start-up (exit code 1)");
}

}  // namespace
}  // namespace specula
