#pragma once
// The flags every command that opens an Engine or a ModelBundle shares (device, kernels, drafter, policy,
// tree) and the default model, defined once so that `generate` and `serve` cannot drift apart.
#include <CLI/CLI.hpp>
#include <string>
#include <string_view>

namespace specula {
struct EngineOptions;
struct SamplingParams;
}  // namespace specula

namespace specula::cli {

// A string flag parsed into an enum as it is read: a bad value is one `specula: error:` line.
template <class Enum>
void add_choice(CLI::App * sub, const std::string & name, Enum & out, Enum (*parse)(std::string_view), const std::string & help) {
    sub->add_option_function<std::string>(
        name, [&out, parse](const std::string & value) { out = parse(value); }, help);
}

// --draft-vocab N|FILE (DrafterSpec::vocab, vocab_file): a value of digits alone is a count, any
// other a file `specula draft-vocab` wrote (a file named by digits: ./NAME). `what` starts the help.
void add_draft_vocab_flag(CLI::App * sub, int & count, std::string & file, const std::string & what);
// no_spec: set by --no-spec (plain decoding), read by choose_model_and_drafter.
void add_engine_flags(CLI::App * sub, EngineOptions & engine, bool & no_spec);
// The sampling flags of the commands that generate (--temp ... --seed, the penalties).
void add_sampling_flags(CLI::App * sub, SamplingParams & sampling);

// What the flags left to defaults. No -m: SmolLM2-135M-Instruct from the model cache
// scripts/fetch_models.sh fills (same variable, same default), fetched on first use, drafting with
// its EAGLE-3 head from models/ unless another drafter was chosen. No drafter: prompt lookup
// (n-gram chains, and in a server the suffix cache of earlier requests), whose drafts cost no
// forward and which the cost policy verifies only where they pay, so that speculation is the
// default for any model. --no-spec: plain decoding (an error beside a drafter or SpecEE). Throws
// Error when the model cannot be fetched or the flags contradict each other.
void choose_model_and_drafter(EngineOptions & engine, bool no_spec);
// How `engine` (as choose_model_and_drafter left it) decodes, for generate's and serve's mode lines:
// "plain decoding (no drafter)", "speculative, drafting by prompt lookup (n-grams)", ...
std::string decoding_mode(const EngineOptions & engine);

}  // namespace specula::cli
