#pragma once
// What bench spec prints: its runs summed per (temperature, category, mode), the tables, the
// cost model's predicted speedup and ceiling, the headline and the JSON of it all.
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "bench_util.h"
#include "spec_runs.h"

namespace specula::bench {

// The runs of one (temperature, category, mode), summed over the prompts of the category.
struct Cell {
    std::vector<int> tokens;      // [rep]
    std::vector<double> seconds;  // [rep]
    SpeculationStats spec;        // over all prompts and reps
    std::vector<int> rounds_by_k, rounds_by_depth;
    RoundTimes times;      // over all prompts and reps
    EarlyExitStats exits;  // SpecEE modes, over all prompts and reps
    int forced_exited = 0, forced_agree = 0, same_prefix = 0, reference_tokens = 0, runs = 0;
    int compared_to_plain = 0, differing_from_plain = 0;  // specula speculative runs at T = 0 (Run::differs_from_plain)
};
using CellKey = std::tuple<int, std::string, int>;  // temperature index, category, mode index

// Adds run r of repetition `rep` to its cell.
void add_run(Cell & c, int rep, const Run & r);

// One table row / JSON entry, derived from a cell and its category's specula-plain cell.
struct Row {
    std::string category;
    const Mode * mode;
    Summary tok_s;
    Summary paired;  // per rep: this mode's tok/s over specula plain's in the same rep
    double speedup = 0, predicted = 0, ceiling = 0;
    const Cell * cell;
};

// The figures a dashboard wants: all prompts, first temperature.
struct Headline {
    Row spec, fixed, best, plain;
    std::optional<Row> llama_plain;  // none with --no-llamacpp
    std::optional<Row> llama_spec;   // none when llama.cpp cannot run the given drafter on this target, or with --no-llamacpp
};

void print_cost(const CostCurve & c);
// Prints one table per temperature; returns every row as JSON.
nlohmann::json print_tables(const SpecBenchOptions & o, const std::map<CellKey, Cell> & cells, std::vector<std::string> categories,
                            const CostCurve & cost, int n_layer);
Headline headline(const SpecBenchOptions & o, const std::map<CellKey, Cell> & cells, const CostCurve & cost);
void print_headline(const Headline & h, float temp);
nlohmann::json results_json(const SpecBenchOptions & o, const std::string & prompts_path, int threads, const MachineLoad & load,
                            const CostCurve & cost, const Headline & h, nlohmann::json rows);

}  // namespace specula::bench
