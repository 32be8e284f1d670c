#include <CLI/CLI.hpp>
#include <cstdio>
#include <fstream>
#include <memory>

#include "commands.h"
#include "specula/error.h"
#include "report.h"

namespace specula::cli {

void register_report(CLI::App & app, Commands & commands) {
    struct Args {
        std::vector<std::string> traces;
        std::string bench;
        std::string out;
    };
    auto args = std::make_shared<Args>();
    CLI::App * sub = app.add_subcommand("report", "write a self-contained HTML report of speculative runs (--trace files) or of a bench spec JSON");
    sub->add_option("traces", args->traces, "trace files (JSON lines from generate --trace); several are shown side by side");
    sub->add_option("--bench", args->bench, "a `bench spec --json` result instead of traces");
    sub->add_option("-o,--output", args->out, "HTML file to write")->required();
    sub->callback([args, &commands] {
        commands.run = [args] {
            nlohmann::json data;
            if (!args->bench.empty()) {
                if (!args->traces.empty()) throw Error("give trace files or --bench, not both");
                std::ifstream in(args->bench);
                if (!in) throw Error(args->bench + ": cannot open the bench result");
                nlohmann::json b = nlohmann::json::parse(in, nullptr, false);
                if (b.is_discarded() || !b.is_object() || !b.contains("results") || !b["results"].is_array()) {
                    throw Error(args->bench + ": not a `bench spec --json` result (no \"results\" list)");
                }
                data = {{"kind", "bench"}, {"bench", std::move(b)}};
            } else {
                if (args->traces.empty()) throw Error("no trace files given (specula report RUN.jsonl [MORE.jsonl...] -o report.html)");
                data = {{"kind", "traces"}, {"runs", nlohmann::json::array()}};
                for (const auto & t : args->traces) data["runs"].push_back(report::read_trace(t));
            }
            report::write_page(args->out, data);
            std::fprintf(stderr, "[specula] wrote %s\n", args->out.c_str());
            return 0;
        };
    });
}

}  // namespace specula::cli
