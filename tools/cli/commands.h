#pragma once
#include <functional>

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

}  // namespace specula::cli
