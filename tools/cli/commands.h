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

// A build configured with -DSPECULA_ALL_COMMANDS=OFF defines the registrations of the commands it
// leaves out (all but generate, chat and report) in cmd_left_out.cpp: each such command fails with
// this message.
std::string left_out_message(const std::string & name);

}  // namespace specula::cli
