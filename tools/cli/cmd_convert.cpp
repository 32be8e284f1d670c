#include <CLI/CLI.hpp>

#include "commands.h"

namespace specula::cli {

void register_convert(CLI::App & app, Commands & commands) {
    app.add_subcommand("convert-eagle", "convert a public EAGLE-1 / EAGLE-3 checkpoint to GGUF (not yet available)");
}

}  // namespace specula::cli
