#include "spec_bench.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "bench_util.h"
#include "common/progress.h"
#include "engine/verify_cost_probe.h"
#include "policy/tree_size.h"
#include "report.h"
#include "spec_tables.h"
#include "specula/error.h"
#include "tokenizer/tokenizer.h"

namespace specula::bench {

namespace {

using json = nlohmann::json;

void validate(const SpecBenchOptions & o) {
    if (o.model.empty()) throw Error("bench spec needs a target (-m)");
    if (!o.specee.empty() && o.eagle3.empty()) throw Error("--specee takes its candidates from an EAGLE-3 head: add --eagle3 FILE");
    if (o.specee_threshold > 1.0f) throw Error("--specee-threshold must be within 0..1 (1: never exit)");
    if (o.draft.empty() && o.eagle3.empty() && o.llamacpp) {
        throw Error(
            "bench spec needs a drafter llama.cpp also runs: a draft model (--draft) and/or an EAGLE-3 head (--eagle3); "
            "with --no-llamacpp and neither, specula's plain decoding and prompt lookup alone");
    }
    if (o.reps < 1) throw Error("--reps must be at least 1");
    if (o.n_gen < 1) throw Error("-n must be at least 1");
    if (o.draft_max < 1) throw Error("--draft-max must be at least 1");
    if (o.temps.empty()) throw Error("--temps needs at least one temperature");
    int depth_from = 0;
    double row_depth_from = 0.0;
    if (!o.cost_curve_from.empty()) {
        cost_curve_of(o.cost_curve_from, static_cast<size_t>(std::max(o.draft_max, kAutoTreeMaxNodes) + 1), depth_from, row_depth_from);
    }
    // Before minutes of runs: a page that cannot be written fails now, not at the end.
    if (!o.html_path.empty() && !std::ofstream(o.html_path)) throw Error(o.html_path + ": cannot open the report for writing");
    for (float t : o.temps) {
        if (t < 0) throw Error("temperatures must be >= 0");
    }
}

// Same sampling in every engine; prompt i gets seed + i (the same in every mode and rep).
GenerationOptions generation_options(const SpecBenchOptions & o, float temp, const std::vector<Prompt> & prompts, size_t prompt) {
    GenerationOptions g;
    g.n_predict = o.n_gen;
    g.sampling.temperature = temp;
    g.sampling.seed = o.seed + prompt;
    g.grammar = prompts[prompt].grammar;
    // As --ignore-eos for llama.cpp: always n tokens. A grammar's text ends where it is complete:
    // past it the grammar allows only the end of generation, which every drafter would draft.
    g.stop_at_end_of_generation = !g.grammar.empty();
    return g;
}

std::map<CellKey, Cell> run_matrix(const SpecBenchOptions & o, SpeculaRig & rig, const LlamaSetup & llama,
                                   const std::vector<Prompt> & prompts) {
    // Warm-up (untimed): builds specula's graphs for every batch shape the modes use.
    for (const Mode & mode : kModes) {
        if (is_specula(mode.kind) && available(mode, o) && runs_at(mode, o.temps[0])) {
            run_specula(rig, mode, prompts[0], 0, generation_options(o, o.temps[0], prompts, 0), o.draft_max);
        }
    }
    std::map<CellKey, Cell> cells;
    int64_t n_modes = 0;
    for (const Mode & mode : kModes) n_modes += available(mode, o);
    Progress progress("bench spec", int64_t(o.reps) * int64_t(o.temps.size()) * int64_t(prompts.size()) * n_modes);
    for (int rep = 0; rep < o.reps; ++rep) {
        for (size_t t = 0; t < o.temps.size(); ++t) {
            for (size_t i = 0; i < prompts.size(); ++i) {
                const GenerationOptions g = generation_options(o, o.temps[t], prompts, i);
                for (size_t m = 0; m < kModes.size(); ++m) {
                    if (!available(kModes[m], o) || !runs_at(kModes[m], o.temps[t])) continue;
                    Run r;
                    const bool fa = kModes[m].llama_flash_attn;
                    switch (kModes[m].kind) {
                        case Kind::LlamaSpec: r = run_llama_spec(o, llama, prompts[i], g.sampling, o.draft, "draft-simple", fa); break;
                        case Kind::LlamaEagle3: r = run_llama_spec(o, llama, prompts[i], g.sampling, o.eagle3, "draft-eagle3", fa); break;
                        case Kind::LlamaPlain: r = run_llama_plain(o, llama, prompts[i], g.sampling, fa); break;
                        default: r = run_specula(rig, kModes[m], prompts[i], i, g, o.draft_max);
                    }
                    add_run(cells[{int(t), prompts[i].category, int(m)}], rep, r);
                    add_run(cells[{int(t), kAllCategories, int(m)}], rep, r);
                    char detail[256];
                    std::snprintf(detail, sizeof(detail), "rep %d/%d, T=%g, prompt %zu/%zu (%s), mode %s", rep + 1, o.reps, o.temps[t], i + 1,
                                  prompts.size(), prompts[i].category.c_str(), kModes[m].name);
                    progress.step(detail);
                }
            }
        }
    }
    return cells;
}

}  // namespace

int run_spec_bench(const SpecBenchOptions & o) {
    validate(o);
    const std::string prompts_path = prompt_set_path(o.prompts);
    const PromptSet prompt_set = read_prompt_set(prompts_path, /*schemas_allowed=*/true);
    const bool constrained = std::any_of(prompt_set.prompts.begin(), prompt_set.prompts.end(), [](const PromptText & p) { return !p.json_schema.empty(); });
    if (constrained && !o.specee.empty()) throw Error(prompts_path + ": SpecEE's lossy mode takes no grammar: run a prompt set with json_schema without --specee");
    // Fail on a missing peer before spending minutes on specula's runs.
    LlamaSetup llama;
    if (o.llamacpp) {
        llama.spec_bin = peer_binary("llama-speculative-simple");
        llama.plain_bin = peer_binary("llama-completion");
    }
    const MachineLoad load = measure_machine_load();
    print_machine(load);

    const ScratchDir scratch;
    const Tokenizer tokenizer(o.model);
    const std::vector<Prompt> prompts = load_prompts(prompt_set, tokenizer, scratch);
    size_t longest = 0;
    for (const auto & p : prompts) longest = std::max(longest, p.tokens.size());
    // Room for the prompt, n tokens and a final draft (llama-speculative-simple overshoots by up to k).
    const int n_ctx = static_cast<int>(longest) + o.n_gen + std::max(o.draft_max, 64) + 8;

    if (o.llamacpp && !o.eagle3.empty() && !llama_cpp_runs_eagle3_on(o.model)) std::printf("note: %s\n", llama_eagle3_absent_note(o.model).c_str());
    // The specula rig's context also holds the cost curve's depth probe (measure_cost_curve).
    SpeculaRig rig(o, std::max(n_ctx, static_cast<int>(longest) + o.n_gen / 2 + kDepthProbeTokens + std::max(o.draft_max, kAutoTreeMaxNodes) + 1));
    if (const int trained = rig.target->config().n_ctx_train; trained > 0 && n_ctx > trained) {
        std::printf("warning: %d-token context exceeds the target's trained %d: shorten -n or the prompts\n", n_ctx, trained);
    }
    llama.threads = rig.backend.n_threads();
    llama.n_ctx = n_ctx;
    llama.log_file = scratch.path / "llama.log";
    rig.cost = measure_cost_curve(rig, prompts, o.n_gen, o.draft_max, o.cost_curve_from);
    if (!o.cost_curve_from.empty()) std::printf("verify cost curve from %s (not measured)\n", o.cost_curve_from.c_str());
    print_cost(rig.cost);
    rig.tree.max_nodes = o.tree_nodes;
    std::printf("tree modes: depth %d, branching %d, nodes per verify: ", rig.tree.depth, rig.tree.branching);
    if (o.tree_nodes > 0) std::printf("%d\n", o.tree_nodes);
    else std::printf("chosen each round (at most %d)\n", kAutoTreeMaxNodes);
    const std::vector<std::string> categories = categories_of(prompts);
    std::printf("%zu prompts in %zu categories, n = %d, k = %d, %d threads, %d reps\n", prompts.size(), categories.size(),
                o.n_gen, o.draft_max, llama.threads, o.reps);
    const auto n_constrained = std::count_if(prompts.begin(), prompts.end(), [](const Prompt & p) { return !p.grammar.empty(); });
    if (n_constrained) std::printf("%td prompts constrained by their json_schema (every mode; these stop where the JSON ends)\n", n_constrained);

    const auto cells = run_matrix(o, rig, llama, prompts);
    json rows = print_tables(o, cells, categories, rig.cost, rig.target->config().n_layer);
    const Headline h = headline(o, cells, rig.cost);
    print_headline(h, o.temps[0]);
    json j = results_json(o, prompts_path, llama.threads, load, rig.cost, h, std::move(rows));
    j["json_schema_prompts"] = n_constrained;
    if (!o.json_path.empty()) {
        write_result(o.json_path, j.dump(2) + "\n");
    }
    if (!o.html_path.empty()) {
        report::write_page(o.html_path, {{"kind", "bench"}, {"bench", j}});
        std::printf("wrote %s\n", o.html_path.c_str());
    }
    return 0;
}

}  // namespace specula::bench
