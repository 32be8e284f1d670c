// What `specula generate` runs by default. Without a drafter it speculates by prompt lookup (n-gram
// chains, priced by the cost policy), and `--no-spec` decodes plainly: the same text at T = 0, the mode line naming
// each, only the default's run drafting. On the shipped target, which repeats itself under greedy
// decoding, so lookup has text to draft from.
#include <gtest/gtest.h>

#include <regex>
#include <string>

#include "runtime/kernels/matmul.h"
#include "test_models.h"

namespace specula {
namespace {

std::string generate(const std::string & flags) {
    return std::string(SPECULA_CLI) + " generate -m " + test::shipped_model("specula-target.gguf") + " -p 'def f(x):' -n 48 -t 1 --temp 0 " + flags;
}

// The drafted and accepted counts of the run summary's speculation line; -1 when there is none.
std::pair<int, int> drafted_accepted(const std::string & err) {
    std::smatch m;
    if (!std::regex_search(err, m, std::regex(R"(\[specula\] drafted (\d+), accepted (\d+) )"))) return {-1, -1};
    return {std::stoi(m[1]), std::stoi(m[2])};
}

// Catches a default that stays plain, a lookup default that changes the greedy text, and a
// --no-spec that still drafts.
TEST(DefaultMode, WithoutADrafterGenerateSpeculatesByPromptLookupAndNoSpecDecodesPlainly) {
    const test::CommandRun lookup = test::run_command(generate("")), plain = test::run_command(generate("--no-spec"));
    ASSERT_EQ(lookup.exit_code, 0) << lookup.err;
    ASSERT_EQ(plain.exit_code, 0) << plain.err;
    EXPECT_EQ(lookup.out, plain.out);
    EXPECT_NE(lookup.err.find("[specula] mode: speculative, drafting by prompt lookup (n-grams)\n"), std::string::npos) << lookup.err;
    const auto [drafted, accepted] = drafted_accepted(lookup.err);
    EXPECT_GT(drafted, 0) << lookup.err;
    EXPECT_GT(accepted, 0) << lookup.err;
    EXPECT_NE(plain.err.find("[specula] mode: plain decoding (no drafter)\n"), std::string::npos) << plain.err;
    EXPECT_EQ(drafted_accepted(plain.err).first, -1) << "--no-spec drafted: " << plain.err;
    // A drafter named beside it keeps its own mode line.
    const test::CommandRun draft = test::run_command(generate("--draft " + test::shipped_model("specula-draft.gguf")));
    ASSERT_EQ(draft.exit_code, 0) << draft.err;
    EXPECT_EQ(draft.out, plain.out);
    EXPECT_NE(draft.err.find("[specula] mode: speculative, drafting with " + test::shipped_model("specula-draft.gguf") + " (draft model)\n"),
              std::string::npos)
        << draft.err;
}

// Catches --no-spec silently ignored beside a drafter, SpecEE or --lookup.
TEST(DefaultMode, NoSpecBesideADrafterIsAnError) {
    const std::string cli = std::string(SPECULA_CLI);
    const std::string m = "generate -m " + test::shipped_model("specula-target.gguf") + " -p hi -n 2 --no-spec ";
    test::expect_cli_error(cli, m + "--ngram", "--no-spec decodes plainly: drop --draft, --eagle, --eagle3 or --ngram");
    test::expect_cli_error(cli, m + "--draft " + test::shipped_model("specula-draft.gguf"), "--no-spec decodes plainly: drop --draft");
    test::expect_cli_error(cli, m + "--lookup", "--no-spec decodes plainly: drop --lookup");
    test::expect_cli_error(cli, "serve -m " + test::shipped_model("specula-target.gguf") + " --no-spec --ngram", "--no-spec decodes plainly");
}

// `--kernels auto` where specula has no SIMD body for the CPU (forced here with SPECULA_CPU_PATH):
// ggml's kernels run, which the run summary says and the text shows (it is `--kernels ggml`'s);
// `--kernels specula` still runs the portable body. Catches an auto that keeps the slow portable
// loops, a fallback the summary does not mention, and an override that is silently ignored.
TEST(KernelsAuto, FallsBackToGgmlWhereSpeculaHasNoSimdPathAndSaysSo) {
    if (kernels::detected_cpu_path() == kernels::CpuPath::Generic) GTEST_SKIP() << "this CPU has no SIMD path to compare with";
    const std::string run = std::string(SPECULA_CLI) + " generate -m " + test::model_path("llama_q8_0") + " -p 'the quick brown' -n 12 -t 1";
    const std::string generic = "SPECULA_CPU_PATH=generic ";
    const test::CommandRun fastest = test::run_command(run), fallback = test::run_command(generic + run),
                           ggml = test::run_command(run + " --kernels ggml"), portable = test::run_command(generic + run + " --kernels specula");
    for (const test::CommandRun * r : {&fastest, &fallback, &ggml, &portable}) ASSERT_EQ(r->exit_code, 0) << r->err;
    EXPECT_NE(fastest.err.find(std::string("[specula] kernels: specula's, ") + kernels::cpu_path_name(kernels::detected_cpu_path()) + " path\n"),
              std::string::npos)
        << fastest.err;
    EXPECT_NE(fallback.err.find("[specula] kernels: ggml's: specula has no SIMD path for this CPU"), std::string::npos) << fallback.err;
    EXPECT_NE(ggml.err.find("[specula] kernels: ggml's (--kernels ggml)"), std::string::npos) << ggml.err;
    EXPECT_NE(portable.err.find("[specula] kernels: specula's, generic path (portable C++"), std::string::npos) << portable.err;
    EXPECT_EQ(fallback.out, ggml.out);
    EXPECT_EQ(portable.out, fastest.out);  // every path gives the same bits
    test::expect_cli_error("SPECULA_CPU_PATH=turbo " + std::string(SPECULA_CLI), run.substr(std::string(SPECULA_CLI).size() + 1),
                           "SPECULA_CPU_PATH=turbo: not a kernel path this CPU runs (generic, ");
}

}  // namespace
}  // namespace specula
