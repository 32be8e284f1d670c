// specula command line: generate | chat | serve | bench | make-model | convert | report. Every failure prints one line and exits 1.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <exception>
#include <string>

#include "commands.h"
#include "specula/error.h"
#include "common/progress.h"

int main(int argc, char ** argv) {
    CLI::App app{"specula: speculative decoding for llama-family GGUF models"};
    app.require_subcommand(1);
    bool quiet = false;
    app.add_flag("-q,--quiet", quiet, "no progress output on stderr (errors still print)");
    app.fallthrough();  // --quiet also after the subcommand
    specula::cli::Commands commands;
    specula::cli::register_generate(app, commands);
    specula::cli::register_chat(app, commands);
    specula::cli::register_bench(app, commands);
    specula::cli::register_make_model(app, commands);
    specula::cli::register_convert(app, commands);
    specula::cli::register_serve(app, commands);
    specula::cli::register_report(app, commands);
    specula::cli::register_specee(app, commands);
    specula::cli::register_features(app, commands);
    specula::cli::register_draft_vocab(app, commands);
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError & e) {
        if (e.get_exit_code() == 0) return app.exit(e);  // --help, --help-all
        // CLI11's reason (the option and the value it could not take) as every other failure: one
        // line, exit 1. A word where the command belongs is named with the commands there are.
        std::string why = e.what();
        const auto word = std::find_if(argv + 1, argv + argc, [](const char * a) { return a[0] != '-'; });
        if (app.get_subcommands().empty() && word != argv + argc) {
            std::string names;
            for (const CLI::App * sub : app.get_subcommands([](const CLI::App *) { return true; })) names += (names.empty() ? "" : ", ") + sub->get_name();
            why = "unknown command '" + std::string(*word) + "' (expected " + names + ")";
        }
        std::fprintf(stderr, "specula: error: %s (see --help)\n", why.c_str());
        return 1;
    } catch (const std::exception & e) {  // a flag's value refused by specula's own parsing
        std::fprintf(stderr, "specula: error: %s\n", e.what());
        return 1;
    }
    specula::Progress::set_quiet(quiet);
    try {
        return commands.run();
    } catch (const std::exception & e) {
        std::fflush(stdout);
        std::fprintf(stderr, "\nspecula: error: %s\n", e.what());
        return 1;
    }
}
