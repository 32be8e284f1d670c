// `specula bench spec`'s input errors, and its specula-only rows on fixture models (the llama.cpp
// modes need the peer tools, which CI does not build; the benchmark itself is not a test).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include "runtime/backend.h"
#include "runtime/model.h"
#include "specee_predictor.h"
#include "test_models.h"

namespace specula {
namespace {

// Catches: a benchmark started without any drafter llama.cpp can also run (it would compare
// nothing), or a prompt set whose chat flag is not a boolean read as plain text.
TEST(BenchSpec, ClearErrors) {
    const std::string cli = SPECULA_CLI;
    const std::string target = " bench spec -m " + test::shipped_model("specula-target.gguf");
    test::expect_cli_error(cli, target, "bench spec needs a drafter llama.cpp also runs: a draft model (--draft) and/or an EAGLE-3 head (--eagle3)");
    test::expect_cli_error(cli, target + " --eagle " + test::shipped_model("specula-eagle1.gguf"), "bench spec needs a drafter llama.cpp also runs");
    test::expect_cli_error(cli, target, "with --no-llamacpp and neither, specula's plain decoding and prompt lookup alone");
    const std::string bad = test::scratch_file("bench-spec-bad-chat.json");
    std::ofstream(bad) << R"({"chat": "yes", "prompts": [{"category": "c", "name": "n", "text": "t"}]})";
    test::expect_cli_error(cli, target + " --draft " + test::shipped_model("specula-draft.gguf") + " --prompts " + bad, bad + ": expected {\"chat\": false");
    test::expect_cli_error(cli, target + " --draft " + test::shipped_model("specula-draft.gguf") + " --specee x.gguf",
                           "--specee takes its candidates from an EAGLE-3 head: add --eagle3 FILE");
    // --cost-curve-from: a file that is not there, not a run, a curve too short for this run's
    // largest verify (33 tokens), a value that is no time.
    const std::string with_draft = target + " --draft " + test::shipped_model("specula-draft.gguf") + " --cost-curve-from ";
    test::expect_cli_error(cli, with_draft + "no-such-run.json", "no-such-run.json: cannot open the run to take the cost curve from");
    const std::string run = test::scratch_file("bench-spec-curve.json");
    std::ofstream(run) << R"({"results": []})";
    test::expect_cli_error(cli, with_draft + run, run + ": not a bench spec JSON (no cost_curve.target_verify_ms)");
    std::ofstream(run) << R"({"cost_curve": {"target_verify_ms": [1.0, 1.1, 1.2]}})";
    test::expect_cli_error(cli, with_draft + run, run + ": its cost curve covers 3 tokens, this run verifies up to 33");
    std::ofstream(run) << R"({"cost_curve": {"target_verify_ms": [1.0, -1.1, 1.2]}})";
    test::expect_cli_error(cli, with_draft + run, run + ": cost_curve.target_verify_ms holds a value that is not a positive number");
}

// Catches: `-m` alone (prompt lookup, the default without a drafter) unmeasurable: with
// --no-llamacpp a run needs no drafter, and its headline is lookup's cost-policy chains.
TEST(BenchSpec, PromptLookupAloneWithNoDrafter) {
    const std::string prompts = test::scratch_file("bench-spec-lookup-prompts.json");
    std::ofstream(prompts) << R"({"chat": false, "prompts": [{"category": "code", "name": "a", "text": "a b c a b c a b"}]})";
    const std::string json_path = test::scratch_file("bench-spec-lookup.json");
    const test::CommandRun run = test::run_command(std::string(SPECULA_CLI) + " bench spec --no-llamacpp -m " + test::shipped_model("specula-target.gguf") +
                                                   " --prompts " + prompts + " -n 8 --reps 1 --temps 0 -t 1 --json " + json_path);
    ASSERT_EQ(run.exit_code, 0) << run.err << run.out;
    const nlohmann::json j = nlohmann::json::parse(std::ifstream(json_path));
    EXPECT_EQ(j["specula_spec_mode"].get<std::string>().rfind("specula-ngram-cost (", 0), 0u) << j["specula_spec_mode"];
    std::set<std::string> modes;
    for (const nlohmann::json & r : j["results"]) modes.insert(r["mode"].get<std::string>());
    EXPECT_EQ(modes, (std::set<std::string>{"specula-plain", "specula-ngram", "specula-ngram-cost"}));
}

// Catches: --cost-curve-from ignored (the run measures its own curve, and an A/B comparison's
// two arms decide on different curves), its curve taken without the depth it was measured at or
// the growth of a row's cost with depth, or the run not saying where its curve came from.
TEST(BenchSpec, CostCurveFromAnEarlierRun) {
    const std::string cli = SPECULA_CLI;
    nlohmann::json earlier;
    std::vector<double> curve;
    for (int b = 1; b <= 40; ++b) curve.push_back(1.0 + 0.25 * b);
    earlier["cost_curve"]["target_verify_ms"] = curve;
    earlier["cost_curve"]["depth"] = 77;
    earlier["cost_curve"]["row_depth_ms"] = 0.004;
    const std::string from = test::scratch_file("bench-spec-earlier.json");
    std::ofstream(from) << earlier.dump();
    const std::string prompts = test::scratch_file("bench-spec-curve-prompts.json");
    std::ofstream(prompts) << R"({"chat": false, "prompts": [{"category": "code", "name": "a", "text": "def main():"}]})";
    // The result file goes into a folder that does not exist yet: --json creates it.
    const std::string out_dir = test::scratch_file("bench-spec-curve-out");
    std::filesystem::remove_all(out_dir);
    const std::string json_path = out_dir + "/bench/run.json";
    const test::CommandRun run = test::run_command(cli + " bench spec --no-llamacpp -m " + test::shipped_model("specula-target.gguf") + " --draft " +
                                                   test::shipped_model("specula-draft.gguf") + " --prompts " + prompts +
                                                   " -n 4 --reps 1 --temps 0 -t 1 --cost-curve-from " + from + " --json " + json_path);
    ASSERT_EQ(run.exit_code, 0) << run.err << run.out;
    EXPECT_NE(run.out.find("verify cost curve from " + from + " (not measured)"), std::string::npos) << run.out;
    const nlohmann::json j = nlohmann::json::parse(std::ifstream(json_path));
    const std::vector<double> used = j["cost_curve"]["target_verify_ms"];
    ASSERT_EQ(used.size(), 33u);  // max(--draft-max, 32 nodes) + the root
    for (size_t b = 0; b < used.size(); ++b) EXPECT_EQ(used[b], curve[b]) << b;
    EXPECT_EQ(j["cost_curve"]["from"], from);
    EXPECT_EQ(j["cost_curve"]["depth"], 77) << "the policies price rows past the depth the curve was measured at";
    EXPECT_EQ(j["cost_curve"]["row_depth_ms"], 0.004) << "and by how much more deeper";
}

// Catches: SpecEE rows missing from a `bench spec` run, or with exit figures, agreement or
// tok/s that contradict the predictor. A fixture Gemma 3 target (3 layers), a random EAGLE-3
// head and a predictor at layer 2 whose probability is 0.5: at threshold 0.4 every token exits
// there, at 0.6 none does, and the lossy mode is then plain greedy decoding.
TEST(BenchSpec, SpecEERowsBesidePlainAndEagle3) {
    const std::string cli = SPECULA_CLI;
    const std::string model = test::model_path("gemma3_swa_q8_0");
    Backend backend(BackendOptions{});
    auto target = Model::load(model, backend);
    test::PredictorSpec spec;
    spec.layers = {2};
    const std::string predictor = test::write_predictor(spec, *target, "bench_half_" + std::to_string(::getpid()));
    const std::string prompts = test::scratch_file("bench-spec-prompts.json");
    std::ofstream(prompts) << R"({"chat": false, "prompts": [{"category": "code", "name": "a", "text": "def main():"},
                                                            {"category": "prose", "name": "b", "text": "The history of"}]})";
    constexpr int kTokens = 12;
    for (const double threshold : {0.4, 0.6}) {
        SCOPED_TRACE(threshold);
        const std::string json_path = test::scratch_file("bench-spec-specee.json");
        const test::CommandRun run = test::run_command(cli + " bench spec --no-llamacpp -m " + model + " --eagle3 " +
                                                       test::eagle_head_path("eagle3", "gemma3_swa_q8_0") + " --specee " + predictor +
                                                       " --specee-threshold " + std::to_string(threshold) + " --prompts " + prompts +
                                                       " -n " + std::to_string(kTokens) + " --reps 1 --temps 0,1 -t 1 --json " + json_path);
        ASSERT_EQ(run.exit_code, 0) << run.err << run.out;
        EXPECT_NE(run.out.find("specula-specee-lossy"), std::string::npos) << run.out;
        EXPECT_NE(run.out.find("teacher-forced agreement"), std::string::npos) << run.out;
        const nlohmann::json j = nlohmann::json::parse(std::ifstream(json_path));
        std::map<std::pair<double, std::string>, nlohmann::json> all;  // (temperature, mode) -> the all-prompts row
        for (const auto & row : j["results"]) {
            const std::string mode = row["mode"];
            EXPECT_EQ(mode.rfind("llamacpp", 0), std::string::npos) << "--no-llamacpp ran " << mode;
            if (row["category"] == "all") all[{row["temperature"].get<double>(), mode}] = row;
        }
        for (const double t : {0.0, 1.0}) {
            for (const char * mode : {"specula-plain", "specula-eagle3-chain", "specula-specee-lossless"}) {
                const auto row = all.find({t, mode});
                ASSERT_NE(row, all.end()) << mode << " at T=" << t;
                EXPECT_GT(row->second["tok_s"].get<double>(), 0.0) << mode;
            }
        }
        EXPECT_EQ(all.count({1.0, "specula-specee-lossy"}), 0u) << "the lossy mode decodes greedily: no T > 0 rows";
        ASSERT_EQ(all.count({0.0, "specula-specee-lossy"}), 1u);
        const nlohmann::json lossy = all.at({0.0, "specula-specee-lossy"}), lossless = all.at({0.0, "specula-specee-lossless"});
        EXPECT_GT(lossy["speedup_vs_specula_plain"].get<double>(), 0.0);
        const nlohmann::json & e = lossy["specee"];
        ASSERT_TRUE(e.is_object()) << lossy.dump();
        EXPECT_EQ(e["tokens"], 2 * kTokens);
        EXPECT_EQ(e["n_layer"], 3);
        EXPECT_EQ(e["free_running_reference_tokens"], kTokens);
        if (threshold < 0.5) {
            EXPECT_EQ(e["exit_rate"], 1.0);
            EXPECT_EQ(e["mean_exit_layer"], 2.0);
            EXPECT_EQ(e["exit_rate_by_layer"], nlohmann::json({{"2", 1.0}}));
            EXPECT_EQ(e["teacher_forced_exited"], 2 * kTokens);
            EXPECT_EQ(e["predictor_runs_per_token"], 1.0) << "one scheduled layer, probed for every token";
            EXPECT_GE(e["teacher_forced_agreement"].get<double>(), 0.0);
            EXPECT_LT(e["teacher_forced_agreement"].get<double>(), 1.0) << "a random head's best candidate at layer 2 of 3 is not always the target's token";
            EXPECT_LT(e["free_running_tokens_before_difference"].get<double>(), kTokens);
            EXPECT_EQ(lossless["specee"]["exit_rate_by_layer"], nlohmann::json({{"2", 1.0}})) << lossless.dump();
            EXPECT_GT(lossless["drafted"].get<int>(), 0);
        } else {
            EXPECT_EQ(e["exit_rate"], 0.0);
            EXPECT_EQ(e["mean_exit_layer"], 3.0);
            EXPECT_EQ(e["teacher_forced_exited"], 0);
            EXPECT_EQ(e["predictor_runs_per_token"], 1.0);
            EXPECT_EQ(e["free_running_tokens_before_difference"], kTokens) << "no exit: the lossy mode is plain greedy decoding";
            EXPECT_EQ(lossless["specee"]["exit_rate"], 0.0);
        }
    }
}

}  // namespace
}  // namespace specula
