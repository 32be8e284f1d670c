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

void register_left_out(CLI::App & app, const CommandHelp & command) {
    const std::string name = command.name;
    CLI::App * sub = app.add_subcommand(name, std::string(command.description) + " [not in this build: scripts/build.sh]");
    sub->set_help_flag();     // `specula NAME --help` fails too: this build has no such command to describe
    sub->prefix_command();    // every argument after the name is left unparsed
    sub->fallthrough(false);  // not even --help or --quiet is handed to the main command
    // Thrown while parsing (main prints it as one `specula: error:` line, exit 1), before anything runs.
    sub->callback([name] { throw Error(left_out_message(name)); });
}

}  // namespace

void register_bench(CLI::App & app, Commands &) { register_left_out(app, command::bench); }

void register_make_model(CLI::App & app, Commands &) {
    register_left_out(app, command::make_model);
    register_left_out(app, command::make_twin);
    register_left_out(app, command::compact_eagle3);
}

void register_convert(CLI::App & app, Commands &) { register_left_out(app, command::convert_eagle); }

void register_serve(CLI::App & app, Commands &) { register_left_out(app, command::serve); }

void register_specee(CLI::App & app, Commands &) {
    register_left_out(app, command::specee_features);
    register_left_out(app, command::specee_eval);
}

void register_features(CLI::App & app, Commands &) { register_left_out(app, command::target_features); }

void register_draft_vocab(CLI::App & app, Commands &) { register_left_out(app, command::draft_vocab); }

}  // namespace specula::cli
