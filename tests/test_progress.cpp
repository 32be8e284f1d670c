// Progress of long work on stderr (src/common/progress.h), through the CLI: not a terminal here,
// so one line per step; stdout and the written file are the same with and without it; --quiet
// silences it.
#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <sstream>

#include "test_models.h"

namespace specula {
namespace {

std::string slurp(const std::string & path) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
}

// Catches progress that is missing, redrawn with \r into a log, skips or repeats a step, leaks
// into stdout or changes the output file, or that --quiet (before or after the subcommand) does
// not silence.
TEST(Progress, OneLinePerStepOnStderrAndQuietSilencesIt) {
    const std::string cli = SPECULA_CLI;
    const std::string model = test::scratch_file("progress.gguf");
    const test::CommandRun loud = test::run_command(cli + " make-model -o " + model);
    ASSERT_EQ(loud.exit_code, 0) << loud.err;
    const std::string loud_file = slurp(model);
    EXPECT_EQ(loud.err.find('\r'), std::string::npos);
    std::istringstream lines(loud.err);
    const std::regex step("\\[specula\\] writing " + std::regex_replace(model, std::regex("[.^$|()\\[\\]{}*+?\\\\]"), "\\$&") +
                          ": (\\d+)/(\\d+) \\S+, (ETA|took) \\d+s");
    int n = 0, total = 0;
    for (std::string line; std::getline(lines, line);) {
        std::smatch m;
        ASSERT_TRUE(std::regex_match(line, m, step)) << line;
        EXPECT_EQ(std::stoi(m[1].str()), ++n);
        total = std::stoi(m[2].str());
    }
    EXPECT_GT(n, 1);
    EXPECT_EQ(n, total);

    for (const std::string & args : {" --quiet make-model -o " + model, " make-model -o " + model + " -q"}) {
        const test::CommandRun quiet = test::run_command(cli + args);
        ASSERT_EQ(quiet.exit_code, 0) << quiet.err;
        EXPECT_EQ(quiet.err, "") << args;
        EXPECT_EQ(quiet.out, loud.out) << args;
        EXPECT_EQ(slurp(model), loud_file) << args;
    }
}

// Catches model loading that shows no progress, or progress that changes the generated text:
// a speculative generate prints one line per loading step (weights, tokenizer, drafter), its
// stdout is the same with --quiet, and --quiet drops exactly those lines.
TEST(Progress, ModelLoadingShowsItsStepsAndLeavesTheTextAlone) {
    const std::string cli = SPECULA_CLI;
    const std::string target = test::shipped_model("specula-target.gguf"), draft = test::shipped_model("specula-draft.gguf");
    const std::string args = " generate -m " + target + " --draft " + draft + " -p 'def main():' -n 12";
    const test::CommandRun loud = test::run_command(cli + args);
    ASSERT_EQ(loud.exit_code, 0) << loud.err;
    for (const std::string step : {"1/3 weights", "2/3 tokenizer", "3/3 drafter"}) {
        EXPECT_NE(loud.err.find("[specula] loading " + target + ": " + step), std::string::npos) << step << "\n"
                                                                                                 << loud.err;
    }
    const test::CommandRun quiet = test::run_command(cli + " --quiet" + args);
    ASSERT_EQ(quiet.exit_code, 0) << quiet.err;
    EXPECT_EQ(quiet.out, loud.out);
    EXPECT_EQ(quiet.err.find("[specula] loading"), std::string::npos) << quiet.err;
}

}  // namespace
}  // namespace specula
