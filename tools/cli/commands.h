#pragma once
#include <functional>
#include <string>

namespace CLI {
class App;
}

namespace specula::cli {

// The parsed subcommand's action.
struct Commands {
    std::function<int()> run;
};

void register_generate(CLI::App & app, Commands & commands);
void register_chat(CLI::App & app, Commands & commands);
void register_bench(CLI::App & app, Commands & commands);
void register_make_model(CLI::App & app, Commands & commands);
void register_convert(CLI::App & app, Commands & commands);
void register_serve(CLI::App & app, Commands & commands);
void register_report(CLI::App & app, Commands & commands);
void register_specee(CLI::App & app, Commands & commands);
void register_features(CLI::App & app, Commands & commands);
void register_draft_vocab(CLI::App & app, Commands & commands);

// The name and --help line of each command a build configured with -DSPECULA_ALL_COMMANDS=OFF leaves
// out, written once: its registration and, in that build, its stand-in (cmd_left_out.cpp) use them.
struct CommandHelp {
    const char * name;
    const char * description;
};
namespace command {
inline constexpr CommandHelp bench{"bench", "benchmarks against llama.cpp on the same model (not tests)"};
inline constexpr CommandHelp make_model{"make-model", "write a random-weight llama-family or Gemma 3 GGUF (tests, cost benchmarks)"};
inline constexpr CommandHelp make_twin{"make-twin", "write a bench twin: a bigger-shaped model computing the same function as a llama target"};
inline constexpr CommandHelp compact_eagle3{"compact-eagle3", "give an EAGLE-3 head a compact draft vocabulary: the corpus's most frequent tokens, via d2t"};
inline constexpr CommandHelp convert_eagle{"convert-eagle", "convert a public EAGLE-1 / EAGLE-3 checkpoint (config.json + safetensors) to GGUF"};
inline constexpr CommandHelp serve{"serve", "OpenAI-compatible HTTP server: many sequences speculate at once, one target forward per step"};
inline constexpr CommandHelp specee_features{"specee-features", "SpecEE training data: the target's replies, its EAGLE-3 head's top 4 and their logits at every layer (JSON lines)"};
inline constexpr CommandHelp specee_eval{"specee-eval", "SpecEE predictors on held-out prompts against plain decoding in the same run: speed, exits, agreement"};
inline constexpr CommandHelp target_features{"target-features", "drafter training data: the target's layer features and top-k log-probabilities for token sequences (tools/train/target_features.py)"};
inline constexpr CommandHelp draft_vocab{"draft-vocab", "a trimmed draft vocabulary for --draft-vocab FILE: a corpus's most frequent tokens"};
}  // namespace command

// A build configured with -DSPECULA_ALL_COMMANDS=OFF defines the registrations of the commands it
// leaves out (all but generate, chat and report) in cmd_left_out.cpp: each such command fails with
// this message.
std::string left_out_message(const std::string & name);

}  // namespace specula::cli
