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
    const std::string dir = test::scratch_dir();
    const std::string cli = SPECULA_CLI;
    const std::string model = dir + "/progress.gguf";
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

}  // namespace
}  // namespace specula
