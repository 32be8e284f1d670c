// The commands of a build configured with -DSPECULA_ALL_COMMANDS=OFF (scripts/demo.sh's first
// build, which compiles only what the demo runs: generate, chat, report). Each left-out command is
// still a command of the CLI, listed by --help: run with any arguments (--help included), it fails
// with one line naming how to get it, exit 1. Its code and the libraries behind it (the server, the
// benchmarks, the converters, the model writer, the feature dumps) are not compiled.
#include <CLI/CLI.hpp>
#include <string>

#include "commands.h"
#include "specula/error.h"

namespace specula::cli {

std::string left_out_message(const std::string & name) {
    return "`specula " + name +
           "` is not in this build (configured with -DSPECULA_ALL_COMMANDS=OFF, as scripts/demo.sh's quick first build is): run "
           "scripts/build.sh";
}

namespace {

void register_left_out(CLI::App & app, const std::string & name, const std::string & description) {
    CLI::App * sub = app.add_subcommand(name, description + " [not in this build: scripts/build.sh]");
    sub->set_help_flag();     // `specula NAME --help` fails too: this build has no such command to describe
    sub->prefix_command();    // every argument after the name is left unparsed
    sub->fallthrough(false);  // not even --help or --quiet is handed to the main command
    // Thrown while parsing (main prints it as one `specula: error:` line, exit 1), before anything runs.
    sub->callback([name] { throw Error(left_out_message(name)); });
}

}  // namespace

void register_bench(CLI::App & app, Commands &) { register_left_out(app, "bench", "benchmarks against llama.cpp on the same model (not tests)"); }

void register_make_model(CLI::App & app, Commands &) {
    register_left_out(app, "make-model", "write a random-weight llama-family or Gemma 3 GGUF (tests, cost benchmarks)");
    register_left_out(app, "make-twin", "write a bench twin: a bigger-shaped model computing the same function as a llama target");
    register_left_out(app, "compact-eagle3", "give an EAGLE-3 head a compact draft vocabulary: the corpus's most frequent tokens, via d2t");
}

void register_convert(CLI::App & app, Commands &) {
    register_left_out(app, "convert-eagle", "convert a public EAGLE-1 / EAGLE-3 checkpoint (config.json + safetensors) to GGUF");
}

void register_serve(CLI::App & app, Commands &) {
    register_left_out(app, "serve", "OpenAI-compatible HTTP server: many sequences speculate at once, one target forward per step");
}

void register_specee(CLI::App & app, Commands &) {
    register_left_out(app, "specee-features", "SpecEE training data: the target's replies, its EAGLE-3 head's top 4 and their logits at every layer");
    register_left_out(app, "specee-eval", "SpecEE predictors on held-out prompts against plain decoding in the same run");
}

void register_features(CLI::App & app, Commands &) {
    register_left_out(app, "target-features", "drafter training data: the target's layer features and top-k log-probabilities for token sequences");
}

void register_draft_vocab(CLI::App & app, Commands &) {
    register_left_out(app, "draft-vocab", "a trimmed draft vocabulary for --draft-vocab FILE: a corpus's most frequent tokens");
}

}  // namespace specula::cli
