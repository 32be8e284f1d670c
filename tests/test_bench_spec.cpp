// `specula bench spec`'s input errors (its runs need llama.cpp's peer tools, which CI does not build;
// the benchmark itself is not a test).
#include <gtest/gtest.h>

#include <fstream>

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
    const std::string bad = test::scratch_file("bench-spec-bad-chat.json");
    std::ofstream(bad) << R"({"chat": "yes", "prompts": [{"category": "c", "name": "n", "text": "t"}]})";
    test::expect_cli_error(cli, target + " --draft " + test::shipped_model("specula-draft.gguf") + " --prompts " + bad, bad + ": expected {\"chat\": false");
}

}  // namespace
}  // namespace specula
