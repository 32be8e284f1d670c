#include "spec_bench.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <sstream>
#include <tuple>
#include <unistd.h>

#include "bench_util.h"
#include "report.h"
#include "specula/error.h"
#include "engine/drafter_factory.h"
#include "common/progress.h"
#include "engine/generate.h"
#include "engine/model_bundle.h"
#include "engine/generation_mode.h"
#include "engine/sequence.h"
#include "engine/verify_cost_probe.h"
#include "engine/specee.h"
#include "runtime/exit_predictor.h"
#include "runtime/kv_cache.h"
#include "policy/draft_length.h"
#include "runtime/backend.h"
#include "runtime/forward.h"
#include "runtime/model.h"
#include "specula/specula.h"
#include "tokenizer/tokenizer.h"

namespace specula::bench {

namespace {

using json = nlohmann::json;

// ---------------------------------------------------------------------------------------------
// What is compared

enum class Kind {
    SpeculaPlain,
    SpeculaDraft,
    SpeculaNgram,
    SpeculaEagle1,
    SpeculaEagle3,
    SpeculaEagle3Lookup,
    SpeculaSpeceeLossy,
    SpeculaSpeceeLossless,
    LlamaSpec,
    LlamaPlain,
    LlamaEagle3
};

struct Mode {
    const char * name;
    Kind kind;
    DraftPolicyKind policy = DraftPolicyKind::Fixed;
    TreeShape tree = TreeShape::Chain;
    bool llama_flash_attn = true;  // llama.cpp modes: -fa on (its CPU default) or -fa off
};

// The generation mode a specula mode runs (llama.cpp's modes run none of them).
GenerationMode generation_mode_of(Kind kind) {
    switch (kind) {
        case Kind::SpeculaPlain: return GenerationMode::Plain;
        case Kind::SpeculaSpeceeLossy: return GenerationMode::SpeceeLossy;
        case Kind::SpeculaSpeceeLossless: return GenerationMode::SpeceeLossless;
        default: return GenerationMode::Speculative;
    }
}

// Modes of one prompt run back to back, so that load drift on a shared machine hits all alike.
const std::vector<Mode> kModes = {
    {"specula-plain", Kind::SpeculaPlain},
    {"specula-draft-fixed", Kind::SpeculaDraft, DraftPolicyKind::Fixed},
    {"specula-draft-heuristic", Kind::SpeculaDraft, DraftPolicyKind::Heuristic},
    {"specula-draft-cost", Kind::SpeculaDraft, DraftPolicyKind::Cost},
    {"specula-ngram", Kind::SpeculaNgram, DraftPolicyKind::Fixed},
    {"llamacpp-spec", Kind::LlamaSpec},
    {"llamacpp-spec-fa-off", Kind::LlamaSpec, DraftPolicyKind::Fixed, TreeShape::Chain, false},
    {"llamacpp-plain", Kind::LlamaPlain},
    {"llamacpp-plain-fa-off", Kind::LlamaPlain, DraftPolicyKind::Fixed, TreeShape::Chain, false},
    {"specula-draft-tree", Kind::SpeculaDraft, DraftPolicyKind::Fixed, TreeShape::Dynamic},
    {"specula-eagle1-chain", Kind::SpeculaEagle1, DraftPolicyKind::Fixed, TreeShape::Chain},
    {"specula-eagle1-static", Kind::SpeculaEagle1, DraftPolicyKind::Fixed, TreeShape::Static},
    {"specula-eagle1-dynamic", Kind::SpeculaEagle1, DraftPolicyKind::Fixed, TreeShape::Dynamic},
    {"specula-eagle3-chain", Kind::SpeculaEagle3, DraftPolicyKind::Fixed, TreeShape::Chain},
    {"specula-eagle3-static", Kind::SpeculaEagle3, DraftPolicyKind::Fixed, TreeShape::Static},
    {"specula-eagle3-dynamic", Kind::SpeculaEagle3, DraftPolicyKind::Fixed, TreeShape::Dynamic},       // the head alone (--no-lookup)
    {"specula-eagle3-lookup", Kind::SpeculaEagle3Lookup, DraftPolicyKind::Fixed, TreeShape::Dynamic},  // the default: + prompt lookup at T=0
    // SpecEE (docs/specee.md): the lossy early exit (greedy only) and its exits as chains of drafts.
    {"specula-specee-lossy", Kind::SpeculaSpeceeLossy},
    {"specula-specee-lossless", Kind::SpeculaSpeceeLossless, DraftPolicyKind::Fixed, TreeShape::Chain},
    {"llamacpp-eagle3", Kind::LlamaEagle3},
    {"llamacpp-eagle3-fa-off", Kind::LlamaEagle3, DraftPolicyKind::Fixed, TreeShape::Chain, false},
};
// With --eagle3, the headline compares specula's default EAGLE-3 mode with llama.cpp's EAGLE-3.
constexpr const char * kEagle3Headline = "specula-eagle3-lookup";
constexpr int kPlainMode = 0;
// The headline specula figure: the default policy (cost) with llama.cpp's draft length as its cap;
// the fixed policy drafts exactly as many tokens as llama.cpp every round.
constexpr const char * kHeadlineSpecMode = "specula-draft-cost";
constexpr const char * kFixedSpecMode = "specula-draft-fixed";
constexpr const char * kEagle3FixedMode = "specula-eagle3-chain";
constexpr const char * kAllCategories = "all";

bool is_specula(Kind k) { return k != Kind::LlamaSpec && k != Kind::LlamaPlain && k != Kind::LlamaEagle3; }
bool is_speculative(Kind k) { return k != Kind::SpeculaPlain && k != Kind::LlamaPlain && k != Kind::SpeculaSpeceeLossy; }
bool is_specee(Kind k) { return k == Kind::SpeculaSpeceeLossy || k == Kind::SpeculaSpeceeLossless; }
// The lossy mode decodes greedily: it has no rows at T > 0.
bool runs_at(const Mode & m, float temp) { return m.kind != Kind::SpeculaSpeceeLossy || temp == 0.0f; }
// Modes that need a file the user did not give, or that the pinned llama.cpp cannot run, are skipped.
bool available(const Mode & m, const SpecBenchOptions & o) {
    if (!is_specula(m.kind) && !o.llamacpp) return false;
    if (is_specee(m.kind)) return !o.specee.empty();
    if (m.kind == Kind::SpeculaDraft || m.kind == Kind::LlamaSpec) return !o.draft.empty();
    if (m.kind == Kind::SpeculaEagle1) return !o.eagle.empty();
    if (m.kind == Kind::SpeculaEagle3 || m.kind == Kind::SpeculaEagle3Lookup) return !o.eagle3.empty();
    if (m.kind == Kind::LlamaEagle3) return !o.eagle3.empty() && llama_cpp_runs_eagle3_on(o.model);
    return true;
}
int mode_index(const char * name) {
    for (size_t i = 0; i < kModes.size(); ++i) {
        if (std::string(kModes[i].name) == name) return static_cast<int>(i);
    }
    throw Error(std::string("unknown mode ") + name);
}

// Where a specula speculative run's time went, from its rounds. The first round is kept apart:
// its draft time includes the draft model's pass over the prompt.
struct RoundTimes {
    int runs = 0;
    double first_draft_ms = 0;
    double draft_ms = 0;   // rounds after the first
    int drafted = 0;       // tokens drafted in those rounds
    double verify_ms = 0;  // every round
    void add(const RoundTimes & t) {
        runs += t.runs, first_draft_ms += t.first_draft_ms, draft_ms += t.draft_ms, drafted += t.drafted, verify_ms += t.verify_ms;
    }
};

// One generation: tokens over decode time (prompt processing excluded in every engine).
struct Run {
    int tokens = 0;
    double seconds = 0.0;
    SpeculationStats spec;             // llama.cpp: totals only, no per-position counts
    std::vector<int> rounds_by_k;      // specula: rounds that drafted (chains) or verified (trees) k tokens, [k]
    std::vector<int> rounds_by_depth;  // specula: rounds whose draft was d tokens deep, [d]
    RoundTimes times;                  // specula speculative runs
    // SpecEE modes: where tokens exited; the lossy mode also its agreement with plain greedy
    // decoding (teacher-forced: exited tokens equal to plain's; free-running: tokens until the
    // first difference).
    EarlyExitStats exits;
    int forced_exited = 0, forced_agree = 0, same_prefix = 0, reference_tokens = 0;
};

// ---------------------------------------------------------------------------------------------
// Prompts

struct Prompt {
    std::string category, name, text;
    std::vector<int32_t> tokens;
    std::string file;  // the text as a file, for llama.cpp's -f (no shell quoting of prompts)
};

// A scratch directory for prompt files and llama.cpp logs, removed when the benchmark ends.
struct ScratchDir {
    std::filesystem::path path;
    ScratchDir() : path(std::filesystem::temp_directory_path() / ("specula-spec-bench-" + std::to_string(::getpid()))) {
        std::filesystem::create_directories(path);
    }
    ~ScratchDir() {
        std::error_code ec;
        std::filesystem::remove_all(path, ec);
    }
};

std::vector<Prompt> load_prompts(const PromptSet & set, const Tokenizer & tokenizer, const ScratchDir & scratch) {
    std::vector<Prompt> prompts;
    for (const auto & p : set.prompts) prompts.push_back({p.category, p.name, p.text, {}, {}});
    for (size_t i = 0; i < prompts.size(); ++i) {
        Prompt & q = prompts[i];
        // A chat set's text is a user message: every engine gets it through the model's chat template.
        const std::vector<std::pair<std::string, std::string>> messages = {{"user", q.text}};
        q.tokens = set.chat ? tokenizer.tokenize_chat(messages) : tokenizer.tokenize(q.text);
        q.file = scratch.path / ("prompt-" + std::to_string(i) + ".txt");
        // llama.cpp's -f drops one trailing newline; add one so it sees exactly this text.
        std::ofstream(q.file) << (set.chat ? tokenizer.apply_chat_template(messages, true) : q.text) << "\n";
    }
    return prompts;
}

std::vector<std::string> categories_of(const std::vector<Prompt> & prompts) {
    std::vector<std::string> cats;
    for (const auto & p : prompts) {
        if (std::find(cats.begin(), cats.end(), p.category) == cats.end()) cats.push_back(p.category);
    }
    return cats;
}

// ---------------------------------------------------------------------------------------------
// specula side: both models, one target cache, the drafters, and the cost curve measured once

struct CostCurve {
    int depth = 0;                  // cached tokens when measured (a typical mid-generation depth)
    std::vector<double> verify_ms;  // [b - 1]: target forward of b tokens, b = 1..max(k_max, kAutoTreeMaxNodes) + 1
    double draft_ms_per_token = 0;  // one draft-model forward of 1 token
    double row_depth_ms = 0;        // a verify row past the first: ms more per token deeper (measure_row_depth_ms)
};

// The engine's options for the benchmark's target: its backend settings and the drafting defaults.
EngineOptions engine_options(const SpecBenchOptions & o) {
    EngineOptions e;
    e.model_path = o.model;
    e.n_threads = o.threads;
    e.kernels = o.kernels;
    e.attention = o.attention;
    return e;
}

// Every drafter the modes use, assembled as the engine assembles them (engine/drafter_factory.h).
struct SpeculaRig {
    Backend backend;
    std::unique_ptr<Model> target;
    Tokenizer vocab;
    ModelRunner runner;
    KvCache cache;
    DrafterFactory draft, ngram, eagle1, eagle3, eagle3_lookup;
    std::unique_ptr<Drafter> draft_drafter, ngram_drafter, eagle1_drafter, eagle3_drafter, eagle3_lookup_drafter;
    std::unique_ptr<ExitPredictor> exit_predictor;  // SpecEE: the lossy mode's decoder, the lossless mode's drafter
    float exit_threshold = 1.0f;
    std::unique_ptr<EarlyExitDecoder> exit_decoder;
    std::unique_ptr<EarlyExitDrafter> exit_drafter;
    std::map<size_t, std::vector<int32_t>> plain_tokens;  // prompt -> specula-plain's greedy reply (T = 0)
    CostCurve cost;
    TreeBudget tree;  // tree modes: the engine's defaults for a dynamic tree; 0 nodes = TreeSizePolicy

    SpeculaRig(const SpecBenchOptions & o, int n_ctx)
        : backend(backend_options(engine_options(o))),
          target(Model::load(o.model, backend)),
          vocab(o.model),
          runner(*target),
          cache(backend, target->config(), n_ctx) {
        EngineOptions e = engine_options(o);
        e.n_ctx = n_ctx;
        e.tree = TreeShape::Dynamic;
        e.tree_nodes = o.tree_nodes;
        tree = drafting_rules(e, DrafterKind::DraftModel).tree;
        auto assemble = [&](DrafterFactory & source, std::unique_ptr<Drafter> & drafter, DrafterKind kind, const std::string & path,
                            bool lookup = false) {
            source = DrafterFactory::open(DrafterSpec{kind, path, e.drafter.ngram_min, e.drafter.ngram_max, lookup}, backend, *target, vocab);
            drafter = source.make(n_ctx);
        };
        if (!o.draft.empty()) assemble(draft, draft_drafter, DrafterKind::DraftModel, o.draft);
        assemble(ngram, ngram_drafter, DrafterKind::Ngram, "");
        if (!o.eagle.empty()) assemble(eagle1, eagle1_drafter, DrafterKind::Eagle, o.eagle);
        if (!o.eagle3.empty()) assemble(eagle3, eagle3_drafter, DrafterKind::Eagle3, o.eagle3);
        if (!o.eagle3.empty()) assemble(eagle3_lookup, eagle3_lookup_drafter, DrafterKind::Eagle3, o.eagle3, true);
        if (!o.specee.empty()) {
            exit_predictor = ExitPredictor::load(o.specee, *target);
            exit_threshold = o.specee_threshold < 0.0f ? exit_predictor->default_threshold() : o.specee_threshold;
            exit_decoder = std::make_unique<EarlyExitDecoder>(*target, runner, exit_predictor.get(), o.specee_online);
            exit_drafter = std::make_unique<EarlyExitDrafter>(*target, *exit_predictor, exit_threshold, eagle3.make(n_ctx), n_ctx, o.specee_online);
        }
    }

    Drafter & drafter_for(Kind k) {
        switch (k) {
            case Kind::SpeculaNgram: return *ngram_drafter;
            case Kind::SpeculaEagle1: return *eagle1_drafter;
            case Kind::SpeculaEagle3: return *eagle3_drafter;
            case Kind::SpeculaEagle3Lookup: return *eagle3_lookup_drafter;
            case Kind::SpeculaSpeceeLossless: return *exit_drafter;
            default: return *draft_drafter;
        }
    }
};

// `n` tokens cycled from the prompts: realistic ids for cost probes.
std::vector<int32_t> probe_tokens(const std::vector<Prompt> & prompts, int n) {
    std::vector<int32_t> t;
    while (static_cast<int>(t.size()) < n) {
        for (const auto & p : prompts) t.insert(t.end(), p.tokens.begin(), p.tokens.end());
    }
    t.resize(n);
    return t;
}

// Cost of one forward of 1..max_tokens tokens on `depth` cached tokens. Median of 15, not the
// engine's 2: the prediction rests on the curve's shape, and with few repetitions its 1-token point
// moves by several percent from run to run on the same machine (docs/policies.md).
std::vector<double> forward_cost(ModelRunner & runner, KvCache & cache, std::span<const int32_t> probe, int depth, int max_tokens) {
    cache.rollback(0);
    prefill(runner, cache, probe.first(depth));
    auto ms = measure_verify_cost(runner, cache, probe.subspan(depth), max_tokens, 15);
    cache.rollback(0);
    return ms;
}

// The verify-cost curve of an earlier run's JSON (`cost_curve.target_verify_ms`), at least
// max_tokens long, and the depth it was measured at (`cost_curve.depth`, left as it is where the
// file has none): the policies price extra rows by the depth past it. Throws Error naming what
// is missing.
std::vector<double> cost_curve_of(const std::string & path, size_t max_tokens, int & depth, double & row_depth_ms) {
    std::ifstream in(path);
    if (!in) throw Error(path + ": cannot open the run to take the cost curve from");
    const json j = json::parse(in, nullptr, false);
    const json * curve = j.is_object() && j.contains("cost_curve") && j["cost_curve"].is_object() ? &j["cost_curve"] : nullptr;
    if (!curve || !curve->contains("target_verify_ms") || !(*curve)["target_verify_ms"].is_array()) {
        throw Error(path + ": not a bench spec JSON (no cost_curve.target_verify_ms)");
    }
    std::vector<double> ms;
    for (const json & v : (*curve)["target_verify_ms"]) {
        if (!v.is_number() || !(v.get<double>() > 0.0)) throw Error(path + ": cost_curve.target_verify_ms holds a value that is not a positive number");
        ms.push_back(v.get<double>());
    }
    if (ms.size() < max_tokens) {
        throw Error(path + ": its cost curve covers " + std::to_string(ms.size()) + " tokens, this run verifies up to " + std::to_string(max_tokens) +
                    " (a smaller --draft-max, or a run with this one's)");
    }
    ms.resize(max_tokens);
    if (curve->contains("depth")) {
        const json & d = (*curve)["depth"];
        if (!d.is_number_integer() || d.get<int64_t>() < 0) throw Error(path + ": cost_curve.depth is not a non-negative integer");
        depth = d.get<int>();
    }
    if (curve->contains("row_depth_ms")) {
        const json & r = (*curve)["row_depth_ms"];
        if (!r.is_number() || r.get<double>() < 0.0) throw Error(path + ": cost_curve.row_depth_ms is not a non-negative number");
        row_depth_ms = r.get<double>();
    }
    return ms;
}

CostCurve measure_cost_curve(SpeculaRig & rig, const std::vector<Prompt> & prompts, int n_gen, int k_max, const std::string & curve_from) {
    CostCurve c;
    size_t prompt_tokens = 0;
    for (const auto & p : prompts) prompt_tokens += p.tokens.size();
    c.depth = static_cast<int>(prompt_tokens / prompts.size()) + n_gen / 2;
    const int max_tokens = std::max(k_max, kAutoTreeMaxNodes) + 1;
    if (!curve_from.empty()) c.verify_ms = cost_curve_of(curve_from, max_tokens, c.depth, c.row_depth_ms);
    const auto probe = probe_tokens(prompts, c.depth + kDepthProbeTokens + max_tokens);
    if (curve_from.empty()) {
        c.verify_ms = forward_cost(rig.runner, rig.cache, probe, c.depth, max_tokens);
        // The rig's context has room for the probe (run_spec_bench), as the engine's has.
        rig.cache.rollback(0);
        prefill(rig.runner, rig.cache, std::span(probe).first(c.depth));
        c.row_depth_ms = measure_row_depth_ms(rig.runner, rig.cache, std::span(probe).subspan(c.depth), c.verify_ms, 8, kDepthProbeTokens, 15);
        rig.cache.rollback(0);
    }
    if (!rig.draft.draft_model) return c;
    // A separate runner and cache: the drafter's own are private, and this leaves them untouched.
    ModelRunner draft_runner(*rig.draft.draft_model);
    KvCache draft_cache(rig.backend, rig.draft.draft_model->config(), rig.cache.capacity());
    c.draft_ms_per_token = forward_cost(draft_runner, draft_cache, probe, c.depth, 1)[0];
    return c;
}

void record_round(Run & run, const RoundInfo & r) {
    const int k = r.draft->tree.size();
    ++run.rounds_by_k[std::min<size_t>(k, run.rounds_by_k.size() - 1)];
    const size_t depth = r.draft->tree.max_depth();
    if (run.rounds_by_depth.size() <= depth) run.rounds_by_depth.resize(depth + 1, 0);
    ++run.rounds_by_depth[depth];
    run.times.verify_ms += r.verify_ms;
    if (r.round == 0) {
        ++run.times.runs;
        run.times.first_draft_ms += r.draft_ms;
    } else {
        run.times.draft_ms += r.draft_ms;
        run.times.drafted += k;
    }
}

// `prompt_index` keys plain decoding's greedy reply, which the lossy SpecEE mode is compared with.
Run run_specula(SpeculaRig & rig, const Mode & mode, const Prompt & prompt, size_t prompt_index, const GenerationOptions & g, int k_max) {
    rig.cache.rollback(0);
    const auto never_end = [](int32_t) { return false; };  // stop_at_end_of_generation is off
    std::vector<int32_t> tokens;
    const auto keep_going = [&](int32_t t) {
        tokens.push_back(t);
        return true;
    };
    Run run;
    GenerationStats s;
    const GenerationMode generation = generation_mode_of(mode.kind);
    if (generation == GenerationMode::Plain) {
        s = generate_plain(rig.runner, rig.cache, prompt.tokens, g, never_end, keep_going);
        if (g.sampling.greedy()) rig.plain_tokens[prompt_index] = tokens;
    } else if (generation == GenerationMode::SpeceeLossy) {
        s = generate_early_exit(*rig.exit_decoder, rig.runner, rig.cache, *rig.eagle3_drafter, prompt.tokens, g, rig.exit_threshold, never_end,
                                keep_going, run.exits);
        const std::vector<int32_t> & plain = rig.plain_tokens.at(prompt_index);
        while (run.same_prefix < static_cast<int>(std::min(plain.size(), tokens.size())) && plain[run.same_prefix] == tokens[run.same_prefix]) {
            ++run.same_prefix;
        }
        run.reference_tokens = static_cast<int>(plain.size());
        // Untimed, after the timed run: the plain reply fed back.
        rig.cache.rollback(0);
        const TeacherForcedExits forced = teacher_forced_exits(*rig.exit_decoder, rig.runner, rig.cache, *rig.eagle3_drafter, prompt.tokens,
                                                               plain, rig.exit_threshold);
        run.forced_exited = forced.exited;
        run.forced_agree = forced.agree;
    } else {
        if (generation == GenerationMode::SpeceeLossless) rig.exit_drafter->clear_exit_stats();
        Drafter & drafter = rig.drafter_for(mode.kind);
        run.rounds_by_k.assign(rig.cost.verify_ms.size(), 0);
        TreeBudget tree;  // a chain: the policy sets its length each round
        if (mode.tree != TreeShape::Chain) {
            tree = rig.tree;
            tree.shape = mode.tree;
        }
        // Per generation, as Engine::generate.
        const RoundPolicies policies =
            make_round_policies(generation, mode.policy, k_max, tree, VerifyCostCurve{rig.cost.verify_ms, rig.cost.depth, rig.cost.row_depth_ms});
        const SequenceParts parts = sequence_parts(generation, rig.cache, &drafter, tree, policies.length.get(), policies.tree_size.get(),
                                                   [&](const RoundInfo & r) { record_round(run, r); });
        s = generate_speculative(rig.runner, parts, prompt.tokens, g, never_end, keep_going);
        if (generation == GenerationMode::SpeceeLossless) run.exits = rig.exit_drafter->exit_stats();
    }
    run.tokens = s.n_generated;
    run.seconds = s.generation_seconds;
    run.spec = s.speculation;
    return run;
}

// ---------------------------------------------------------------------------------------------
// llama.cpp side: its own tools as subprocesses, timings parsed from their log

std::string quoted(const std::string & s) {
    std::string q = "'";
    for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return q + "'";
}

struct LlamaSetup {
    std::string spec_bin, plain_bin;
    int threads = 0, n_ctx = 0;
    std::filesystem::path log_file;
};

// Flags both tools share: same prompt, length, context, threads, and sampling equal to specula's
// SamplingParams (pure temperature: llama.cpp's default top-k 40, top-p 0.95, min-p 0.05 switched
// off). --ignore-eos: every engine generates the full n tokens.
std::string common_flags(const SpecBenchOptions & o, const LlamaSetup & s, const Prompt & p, const SamplingParams & sp,
                         bool flash_attn) {
    std::ostringstream f;
    f << " -m " << quoted(o.model) << " -f " << quoted(p.file) << " -n " << o.n_gen << " -c " << s.n_ctx << " -t "
      << s.threads << " --temp " << sp.temperature << " --seed " << sp.seed
      << " --top-k 0 --top-p 1 --min-p 0 --ignore-eos -fa " << (flash_attn ? "on" : "off") << " --log-file " << quoted(s.log_file.string()) << " </dev/null";
    return f.str();
}

// Runs a llama.cpp tool and parses its log (stdout carries only the generated text). llama.cpp
// logs through an asynchronous queue that, on a loaded machine, now and then loses the final
// summary lines of an otherwise successful run (v0.5.0; 2 runs in ~40 on one machine, 3 in a row on
// another, and 0 in 60 when retried by hand); a fresh run is the only way to get its figures, so
// such runs are repeated, and a final failure shows the log's tail.
Run run_llama(const std::string & cmd, const LlamaSetup & s, const std::function<Run(const std::string &)> & parse) {
    constexpr int kAttempts = 5;
    for (int attempt = 1;; ++attempt) {
        std::filesystem::remove(s.log_file);
        run_command(cmd);
        std::stringstream log;
        log << std::ifstream(s.log_file).rdbuf();
        try {
            return parse(log.str());
        } catch (const Error & e) {
            const std::string text = log.str();
            if (attempt == kAttempts) {
                throw Error(std::string(e.what()) + "; " + std::to_string(kAttempts) + " runs failed alike, the last with " +
                            std::to_string(text.size()) + " bytes of log ending in:\n" +
                            text.substr(text.size() > 600 ? text.size() - 600 : 0) + "\ncommand: " + cmd);
            }
            std::fprintf(stderr, "note: llama.cpp run %d of at most %d gave an incomplete log (%zu bytes), running it again\n",
                         attempt, kAttempts, text.size());
        }
    }
}

// The first match of `re` in llama.cpp's log; a clear error if the tool's output format changed.
std::smatch find_in_log(const std::string & log, const char * re, const char * tool) {
    std::smatch m;
    if (!std::regex_search(log, m, std::regex(re))) {
        throw Error(std::string("cannot find /") + re + "/ in the log of " + tool + " (has its output format changed?)");
    }
    return m;
}

// llama-speculative-simple drafting a chain of exactly draft_max (as specula's fixed policy) with
// `draft` as draft model (draft-simple) or EAGLE-3 head (draft-eagle3).
Run run_llama_spec(const SpecBenchOptions & o, const LlamaSetup & s, const Prompt & p, const SamplingParams & sp,
                   const std::string & draft, const char * spec_type, bool flash_attn) {
    const std::string cmd = s.spec_bin + common_flags(o, s, p, sp, flash_attn) + " -md " + quoted(draft) + " --spec-type " + spec_type +
                            " --spec-draft-n-max " + std::to_string(o.draft_max) + " --spec-draft-n-min 0 --spec-draft-p-min 0";
    return run_llama(cmd, s, [](const std::string & log) {
        const char * tool = "llama-speculative-simple";
        const auto dec = find_in_log(log, R"(decoded\s+(\d+) tokens in\s+([0-9.]+) seconds)", tool);
        Run run;
        run.tokens = std::stoi(dec[1]);
        run.seconds = std::stod(dec[2]);
        run.spec.drafted = std::stoi(find_in_log(log, R"(n_drafted\s*=\s*(\d+))", tool)[1]);
        run.spec.accepted = std::stoi(find_in_log(log, R"(n_accept\s*=\s*(\d+))", tool)[1]);
        // Every round emits its accepted drafts plus one target token.
        run.spec.emitted = run.tokens;
        run.spec.rounds = run.tokens - run.spec.accepted;
        return run;
    });
}

Run run_llama_plain(const SpecBenchOptions & o, const LlamaSetup & s, const Prompt & p, const SamplingParams & sp,
                    bool flash_attn) {
    return run_llama(s.plain_bin + common_flags(o, s, p, sp, flash_attn) + " -no-cnv", s, [](const std::string & log) {
        const char * tool = "llama-completion";
        const auto eval = find_in_log(log, R"(\beval time =\s+([0-9.]+) ms /\s+(\d+) runs)", tool);
        const auto sampling = find_in_log(log, R"(sampling time =\s+([0-9.]+) ms)", tool);
        // Like specula's plain loop: n tokens = the first, sampled from the prompt's logits, plus
        // one per decode; the time includes sampling.
        Run run;
        run.tokens = std::stoi(eval[2]) + 1;
        run.seconds = (std::stod(eval[1]) + std::stod(sampling[1])) / 1000.0;
        return run;
    });
}

// ---------------------------------------------------------------------------------------------
// Aggregation: per (temperature, category, mode), summed over the prompts of the category

struct Cell {
    std::vector<int> tokens;      // [rep]
    std::vector<double> seconds;  // [rep]
    SpeculationStats spec;        // over all prompts and reps
    std::vector<int> rounds_by_k, rounds_by_depth;
    RoundTimes times;      // over all prompts and reps
    EarlyExitStats exits;  // SpecEE modes, over all prompts and reps
    int forced_exited = 0, forced_agree = 0, same_prefix = 0, reference_tokens = 0, runs = 0;
};
using CellKey = std::tuple<int, std::string, int>;  // temperature index, category, mode index

void merge(SpeculationStats & into, const SpeculationStats & s) {
    into.rounds += s.rounds;
    into.drafted += s.drafted;
    into.accepted += s.accepted;
    into.emitted += s.emitted;
    into.reached_at.resize(std::max(into.reached_at.size(), s.reached_at.size()), 0);
    into.drafted_at.resize(into.reached_at.size(), 0);
    into.accepted_at.resize(into.reached_at.size(), 0);
    for (size_t d = 0; d < s.reached_at.size(); ++d) {
        into.drafted_at[d] += s.drafted_at[d];
        into.reached_at[d] += s.reached_at[d];
        into.accepted_at[d] += s.accepted_at[d];
    }
}

void add_run(Cell & c, int rep, const Run & r) {
    if (static_cast<int>(c.tokens.size()) <= rep) {
        c.tokens.resize(rep + 1, 0);
        c.seconds.resize(rep + 1, 0.0);
    }
    c.tokens[rep] += r.tokens;
    c.seconds[rep] += r.seconds;
    merge(c.spec, r.spec);
    c.rounds_by_k.resize(std::max(c.rounds_by_k.size(), r.rounds_by_k.size()), 0);
    for (size_t k = 0; k < r.rounds_by_k.size(); ++k) c.rounds_by_k[k] += r.rounds_by_k[k];
    c.times.add(r.times);
    c.exits.merge(r.exits);
    c.forced_exited += r.forced_exited;
    c.forced_agree += r.forced_agree;
    c.same_prefix += r.same_prefix;
    c.reference_tokens += r.reference_tokens;
    ++c.runs;
    c.rounds_by_depth.resize(std::max(c.rounds_by_depth.size(), r.rounds_by_depth.size()), 0);
    for (size_t d = 0; d < r.rounds_by_depth.size(); ++d) c.rounds_by_depth[d] += r.rounds_by_depth[d];
}

Summary tok_s(const Cell & c) {
    std::vector<double> v;
    for (size_t r = 0; r < c.tokens.size(); ++r) v.push_back(c.seconds[r] > 0 ? c.tokens[r] / c.seconds[r] : 0.0);
    return summarize(v);
}

// Reported per-position acceptance (accepted at depth d+1 / rounds that drafted that deep).
std::vector<double> acceptance_by_position(const SpeculationStats & s) {
    std::vector<double> a;
    for (size_t d = 0; d < s.drafted_at.size(); ++d) a.push_back(s.acceptance_at(d));
    return a;
}

// What the cost model multiplies: P(accept depth d+1 | all before accepted).
std::vector<double> acceptance_given_reached(const SpeculationStats & s) {
    std::vector<double> a;
    for (size_t d = 0; d < s.reached_at.size(); ++d) a.push_back(s.acceptance_given_reached(d));
    return a;
}

// The cost model's speedup: a round whose draft is d deep is expected to emit E(d) tokens, from
// the measured acceptance per depth (a chain's depth is its length); it costs the draft time
// measured in the run plus a verify of its size from the cost curve. Rounds are weighted by how
// often each depth and size occurred, so adaptive policies and policy-sized trees are predicted
// too. The curve gives verify costs relative to a 1-token forward; plain decoding's measured time
// per token gives their absolute size. Isolated probes run 10-20% off what forwards cost inside a
// generation loop, in either direction by machine (docs/policies.md), so the probes' own absolute
// times would shift every prediction by that much.
double verify_ms_in_run(const CostCurve & cost, size_t k, double plain_ms) { return cost.verify_ms[k] / cost.verify_ms[0] * plain_ms; }

// plain_ms: plain decoding's measured time per token (the baseline of both figures below).
double predicted_speedup(const Cell & c, const Mode & mode, const CostCurve & cost, double plain_ms) {
    if (!is_specula(mode.kind) || !is_speculative(mode.kind) || cost.verify_ms.empty() || plain_ms <= 0) return 0.0;
    const std::vector<double> alpha = acceptance_given_reached(c.spec);
    double tokens = 0, ms = c.times.first_draft_ms + c.times.draft_ms;
    for (size_t d = 0; d < c.rounds_by_depth.size(); ++d) tokens += c.rounds_by_depth[d] * expected_tokens(alpha, static_cast<int>(d));
    for (size_t k = 0; k < c.rounds_by_k.size() && k < cost.verify_ms.size(); ++k) {
        ms += c.rounds_by_k[k] * verify_ms_in_run(cost, k, plain_ms);
    }
    return ms > 0 ? tokens / ms * plain_ms : 0.0;
}

// What no drafter of this run's cost can beat: every draft accepted, a round of depth k costing k
// drafter levels (at the run's measured time per level: one token for chains, a batch of nodes
// for trees) plus a verify of k + 1 tokens, emitting k + 1 tokens. A tree of depth k emits at
// most that and verifies at least that many tokens, so trees are bounded too.
double speedup_ceiling(const Cell & c, const Mode & mode, const CostCurve & cost, double plain_ms) {
    if (!is_specula(mode.kind) || !is_speculative(mode.kind) || cost.verify_ms.empty() || plain_ms <= 0) return 0.0;
    double levels = 0;
    for (size_t d = 0; d < c.rounds_by_depth.size(); ++d) levels += static_cast<double>(d) * c.rounds_by_depth[d];
    const double level_ms = levels > 0 ? c.times.draft_ms / levels : 0.0;
    double best = 0;
    for (size_t k = 1; k < cost.verify_ms.size(); ++k) {
        best = std::max(best, (k + 1) / (k * level_ms + verify_ms_in_run(cost, k, plain_ms)) * plain_ms);
    }
    return best;
}

// One table row / JSON entry, derived from a cell and its category's specula-plain cell.
struct Row {
    std::string category;
    const Mode * mode;
    Summary tok_s;
    double speedup = 0, predicted = 0, ceiling = 0;
    const Cell * cell;
};

Row make_row(const std::map<CellKey, Cell> & cells, int t, const std::string & cat, int m, const CostCurve & cost) {
    const Cell & c = cells.at({t, cat, m});
    const double plain = tok_s(cells.at({t, cat, kPlainMode})).median;
    Row r{cat, &kModes[m], tok_s(c), 0.0, 0.0, 0.0, &c};
    r.speedup = plain > 0 ? r.tok_s.median / plain : 0.0;
    const double plain_ms = plain > 0 ? 1000.0 / plain : 0.0;
    r.predicted = predicted_speedup(c, kModes[m], cost, plain_ms);
    r.ceiling = speedup_ceiling(c, kModes[m], cost, plain_ms);
    return r;
}

// ---------------------------------------------------------------------------------------------
// Output

std::string fmt(const char * f, double v) {
    char buf[64];
    std::snprintf(buf, sizeof buf, f, v);
    return buf;
}

// SpecEE modes' exit figures: the exit profile; the lossy mode's agreement with plain greedy
// decoding, teacher-forced and free-running.
json specee_json(const Cell & c, const Mode & mode, int n_layer) {
    const EarlyExitStats & e = c.exits;
    const int n = e.exited() + e.full;
    json by_layer = json::object();
    for (size_t l = 0; l < e.exits_at.size(); ++l) {
        if (e.exits_at[l]) by_layer[std::to_string(l)] = n ? double(e.exits_at[l]) / n : 0.0;
    }
    json j = {{"tokens", n},
              {"exited", e.exited()},
              {"exit_rate", n ? double(e.exited()) / n : 0.0},
              {"mean_exit_layer", e.mean_exit_layer(n_layer)},
              {"n_layer", n_layer},
              {"exit_rate_by_layer", by_layer},
              {"predictor_runs_per_token", n ? double(e.probes) / n : 0.0}};
    if (mode.kind == Kind::SpeculaSpeceeLossy) {
        j["teacher_forced_exited"] = c.forced_exited;
        j["teacher_forced_agreement"] = c.forced_exited ? double(c.forced_agree) / c.forced_exited : 0.0;
        j["free_running_tokens_before_difference"] = c.runs ? double(c.same_prefix) / c.runs : 0.0;
        j["free_running_reference_tokens"] = c.runs ? double(c.reference_tokens) / c.runs : 0.0;
    }
    return j;
}

void print_specee(const Cell & c, const Mode & mode, int n_layer) {
    std::printf("%-11s   %s", "", c.exits.summary(n_layer).c_str());
    if (mode.kind == Kind::SpeculaSpeceeLossy && c.runs) {
        std::printf("; teacher-forced agreement %.1f%% of %d exited; free-running: %.1f of %.1f tokens before the first difference",
                    c.forced_exited ? 100.0 * c.forced_agree / c.forced_exited : 0.0, c.forced_exited, double(c.same_prefix) / c.runs,
                    double(c.reference_tokens) / c.runs);
    }
    std::printf("\n");
}

void print_row(const Row & r, int n_layer) {
    const SpeculationStats & s = r.cell->spec;
    const bool spec = is_speculative(r.mode->kind);
    std::string positions;
    const auto a = acceptance_by_position(s);
    for (size_t d = 0; d < a.size(); ++d) positions += s.drafted_at[d] ? fmt("%.2f ", a[d]) : std::string("- ");
    if (spec && positions.empty()) positions = "-";
    std::printf("%-11s %-24s %8.1f [%7.1f .. %7.1f] %7.2fx %7s %7s %9s %7s  %s\n", r.category.c_str(), r.mode->name, r.tok_s.median,
                r.tok_s.min, r.tok_s.max, r.speedup, spec ? fmt("%.3f", s.acceptance_rate()).c_str() : "-",
                spec ? fmt("%.2f", s.mean_accepted_length()).c_str() : "-",
                r.predicted > 0 ? fmt("%.2fx", r.predicted).c_str() : "-",
                r.ceiling > 0 ? fmt("%.2fx", r.ceiling).c_str() : "-", positions.c_str());
    if (is_specee(r.mode->kind)) print_specee(*r.cell, *r.mode, n_layer);
}

void print_header(float temp) {
    std::printf("\n== temperature %g ==\n", temp);
    std::printf("%-11s %-24s %8s %-20s %8s %7s %7s %9s %7s  %s\n", "category", "mode", "tok/s", " [min .. max]", "speedup",
                "accept", "tok/fwd", "predicted", "ceiling", "acceptance by position");
}

// The costs the prediction assumes, as measured inside the runs: a gap to the cost curve shows
// where the speculative loop loses time (draft sampling, verification, cache moves, ...).
json measured_costs(const Cell & c) {
    const RoundTimes & t = c.times;
    const int rounds = c.spec.rounds;
    double total_ms = 0;
    for (double s : c.seconds) total_ms += 1000.0 * s;
    return {{"draft_ms_per_token", t.drafted ? t.draft_ms / t.drafted : 0.0},
            {"first_round_draft_ms", t.runs ? t.first_draft_ms / t.runs : 0.0},  // includes the drafter's prompt pass
            {"verify_ms_per_round", rounds ? t.verify_ms / rounds : 0.0},
            {"other_ms_per_round", rounds ? (total_ms - t.first_draft_ms - t.draft_ms - t.verify_ms) / rounds : 0.0}};
}

json row_json(const Row & r, float temp, int n_layer) {
    const SpeculationStats & s = r.cell->spec;
    json j = {{"temperature", temp},
              {"category", r.category},
              {"mode", r.mode->name},
              {"tok_s", r.tok_s.median},
              {"tok_s_min", r.tok_s.min},
              {"tok_s_max", r.tok_s.max},
              {"reps", r.tok_s.n},
              {"speedup_vs_specula_plain", r.speedup}};
    if (is_speculative(r.mode->kind)) {
        j["acceptance_rate"] = s.acceptance_rate();
        j["mean_accepted_len"] = s.mean_accepted_length();
        j["rounds"] = s.rounds;
        j["drafted"] = s.drafted;
        j["accepted"] = s.accepted;
        if (is_specula(r.mode->kind)) {
            json positions = json::array();  // null: no round drafted that deep
            const auto a = acceptance_by_position(s);
            for (size_t d = 0; d < a.size(); ++d) positions.push_back(s.drafted_at[d] ? json(a[d]) : json(nullptr));
            j["acceptance_by_position"] = positions;
            j["rounds_by_size"] = r.cell->rounds_by_k;  // drafted tokens (chains) / verified nodes (trees)
            j["rounds_by_depth"] = r.cell->rounds_by_depth;
            j["predicted_speedup"] = r.predicted;
            j["speedup_ceiling"] = r.ceiling;
            j["measured_costs"] = measured_costs(*r.cell);
        }
    }
    if (is_specee(r.mode->kind)) j["specee"] = specee_json(*r.cell, *r.mode, n_layer);
    return j;
}

void print_cost(const CostCurve & c) {
    std::printf("cost curve at depth %d: ", c.depth);
    if (c.draft_ms_per_token > 0) std::printf("draft %.3f ms/token; ", c.draft_ms_per_token);
    std::printf("a row past the first %.5f ms more per token deeper; ", c.row_depth_ms);
    std::printf("target verify ms for 1..%zu tokens:", c.verify_ms.size());
    for (double v : c.verify_ms) std::printf(" %.3f", v);
    std::printf("\n");
}

void validate(const SpecBenchOptions & o) {
    if (o.model.empty()) throw Error("bench spec needs a target (-m)");
    if (!o.specee.empty() && o.eagle3.empty()) throw Error("--specee takes its candidates from an EAGLE-3 head: add --eagle3 FILE");
    if (o.specee_threshold > 1.0f) throw Error("--specee-threshold must be within 0..1 (1: never exit)");
    if (o.draft.empty() && o.eagle3.empty()) {
        throw Error("bench spec needs a drafter llama.cpp also runs: a draft model (--draft) and/or an EAGLE-3 head (--eagle3)");
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
GenerationOptions generation_options(const SpecBenchOptions & o, float temp, size_t prompt) {
    GenerationOptions g;
    g.n_predict = o.n_gen;
    g.sampling.temperature = temp;
    g.sampling.seed = o.seed + prompt;
    g.stop_at_end_of_generation = false;  // as --ignore-eos for llama.cpp: always n tokens
    return g;
}

std::map<CellKey, Cell> run_matrix(const SpecBenchOptions & o, SpeculaRig & rig, const LlamaSetup & llama,
                                   const std::vector<Prompt> & prompts) {
    // Warm-up (untimed): builds specula's graphs for every batch shape the modes use.
    for (const Mode & mode : kModes) {
        if (is_specula(mode.kind) && available(mode, o) && runs_at(mode, o.temps[0])) {
            run_specula(rig, mode, prompts[0], 0, generation_options(o, o.temps[0], 0), o.draft_max);
        }
    }
    std::map<CellKey, Cell> cells;
    int64_t n_modes = 0;
    for (const Mode & mode : kModes) n_modes += available(mode, o);
    Progress progress("bench spec", int64_t(o.reps) * int64_t(o.temps.size()) * int64_t(prompts.size()) * n_modes);
    for (int rep = 0; rep < o.reps; ++rep) {
        for (size_t t = 0; t < o.temps.size(); ++t) {
            for (size_t i = 0; i < prompts.size(); ++i) {
                const GenerationOptions g = generation_options(o, o.temps[t], i);
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

// Prints one table per temperature; returns every row as JSON.
json print_tables(const SpecBenchOptions & o, const std::map<CellKey, Cell> & cells, std::vector<std::string> categories,
                  const CostCurve & cost, int n_layer) {
    categories.push_back(kAllCategories);
    json rows = json::array();
    for (size_t t = 0; t < o.temps.size(); ++t) {
        print_header(o.temps[t]);
        for (const auto & cat : categories) {
            for (size_t m = 0; m < kModes.size(); ++m) {
                if (!available(kModes[m], o) || !runs_at(kModes[m], o.temps[t])) continue;
                const Row r = make_row(cells, int(t), cat, int(m), cost);
                print_row(r, n_layer);
                rows.push_back(row_json(r, o.temps[t], n_layer));
            }
        }
    }
    std::printf(
        "note: speedup = vs specula plain; tok/fwd = mean accepted length (tokens per target forward); "
        "predicted = cost-model speedup from measured acceptance and the cost curve;\n"
        "      ceiling = speedup if every draft were accepted, at this run's draft cost and the cost curve\n");
    if (std::any_of(o.temps.begin(), o.temps.end(), [](float t) { return t > 0; })) {
        std::printf(
            "note: at T > 0 llama.cpp drafts greedily and keeps a draft token only if the target samples the same "
            "one; specula uses rejection sampling, so acceptances differ by design\n");
    }
    return rows;
}

// The figures a dashboard wants: all prompts, first temperature.
struct Headline {
    Row spec, fixed, best, plain;
    std::optional<Row> llama_plain;  // none with --no-llamacpp
    std::optional<Row> llama_spec;   // none when llama.cpp cannot run the given drafter on this target, or with --no-llamacpp
};

Headline headline(const SpecBenchOptions & o, const std::map<CellKey, Cell> & cells, const CostCurve & cost) {
    auto all = [&](const char * mode) { return make_row(cells, 0, kAllCategories, mode_index(mode), cost); };
    const bool eagle3 = !o.eagle3.empty();
    const char * spec = eagle3 ? kEagle3Headline : kHeadlineSpecMode;
    // The mode that drafts exactly llama.cpp's chain every round: the draft model's, else EAGLE-3's.
    const char * fixed = o.draft.empty() ? kEagle3FixedMode : kFixedSpecMode;
    // llama.cpp's figure is the faster of its two attention settings.
    auto best_llama = [&](const char * fa_on, const char * fa_off) {
        const Row a = all(fa_on), b = all(fa_off);
        return b.tok_s.median > a.tok_s.median ? b : a;
    };
    Headline h{all(spec), all(fixed), all(spec), all("specula-plain"), {}, {}};
    if (o.llamacpp) {
        h.llama_plain = best_llama("llamacpp-plain", "llamacpp-plain-fa-off");
        if (eagle3 && llama_cpp_runs_eagle3_on(o.model)) h.llama_spec = best_llama("llamacpp-eagle3", "llamacpp-eagle3-fa-off");
        else if (!o.draft.empty()) h.llama_spec = best_llama("llamacpp-spec", "llamacpp-spec-fa-off");
    }
    for (const Mode & m : kModes) {
        if (!available(m, o) || !is_specula(m.kind) || !is_speculative(m.kind)) continue;
        const Row r = all(m.name);
        if (r.tok_s.median > h.best.tok_s.median) h.best = r;
    }
    return h;
}

void print_headline(const Headline & h, float temp) {
    const auto line = [](const std::string & label, const Row & r, const std::string & extra) {
        std::printf("  %-40s %8.1f  %s\n", label.c_str(), r.tok_s.median, extra.c_str());
    };
    char extra[160];
    std::printf("\nall prompts, temperature %g (tok/s, median):\n", temp);
    std::snprintf(extra, sizeof extra, "%.2fx specula plain (predicted %.2fx, ceiling %.2fx), %.2f tokens/forward",
                  h.spec.speedup, h.spec.predicted, h.spec.ceiling, h.spec.cell->spec.mean_accepted_length());
    line(std::string(h.spec.mode->name) + " (headline)", h.spec, extra);
    if (h.fixed.mode != h.spec.mode) {
        std::snprintf(extra, sizeof extra, "%.2fx specula plain, %.2f tokens/forward (k fixed, as llama.cpp)", h.fixed.speedup,
                      h.fixed.cell->spec.mean_accepted_length());
        line(h.fixed.mode->name, h.fixed, extra);
    }
    line(std::string("best: ") + h.best.mode->name, h.best, "");
    line("specula-plain", h.plain, "");
    if (h.llama_spec) {
        const double llama_gain = h.llama_plain->tok_s.median > 0 ? h.llama_spec->tok_s.median / h.llama_plain->tok_s.median : 0.0;
        std::snprintf(extra, sizeof extra, "%.2fx llama.cpp plain, %.2f tokens/forward", llama_gain,
                      h.llama_spec->cell->spec.mean_accepted_length());
        line(std::string(h.llama_spec->mode->name) + " (llama.cpp's faster -fa)", *h.llama_spec, extra);
    } else if (h.llama_plain) {
        std::printf("  llama.cpp speculative: none on this target with this drafter (see the note above)\n");
    }
    if (h.llama_plain) line(std::string(h.llama_plain->mode->name) + " (llama.cpp's faster -fa)", *h.llama_plain, "");
}

json results_json(const SpecBenchOptions & o, const std::string & prompts_path, int threads, const MachineLoad & load,
                  const CostCurve & cost, const Headline & h, json rows) {
    return {
        {"target", o.model},
        {"draft", o.draft},
        {"prompts", prompts_path},
        {"threads", threads},
        {"reps", o.reps},
        {"n_gen", o.n_gen},
        {"draft_max", o.draft_max},
        {"temperatures", o.temps},
        {"seed", o.seed},
        {"machine_busy_fraction_before", load.busy_fraction},
        {"machine_loadavg_1m", load.loadavg_1m},
        {"machine_idle", load.idle()},
        {"cpu", load.cpu},
        {"headline_temperature", o.temps[0]},
        {"specula_spec_mode", !o.eagle3.empty() ? std::string(h.spec.mode->name) + " (specula's default EAGLE-3 mode)"
                                                : std::string(h.spec.mode->name) + " (default policy, k <= draft_max = llama.cpp's k)"},
        {"specula_fixed_k_tok_s", h.fixed.tok_s.median},
        {"specula_attention", attention_name(o.attention)},
        {"specula_kernels", kernels_name(o.kernels)},
        {"llamacpp_spec_mode", h.llama_spec ? json(h.llama_spec->mode->name) : json(nullptr)},
        {"llamacpp_plain_mode", h.llama_plain ? json(h.llama_plain->mode->name) : json(nullptr)},
        {"specula_spec_tok_s", h.spec.tok_s.median},
        {"specula_spec_best_mode", h.best.mode->name},
        {"specula_spec_best_tok_s", h.best.tok_s.median},
        {"specula_plain_tok_s", h.plain.tok_s.median},
        {"llamacpp_spec_tok_s", h.llama_spec ? json(h.llama_spec->tok_s.median) : json(nullptr)},
        {"llamacpp_plain_tok_s", h.llama_plain ? json(h.llama_plain->tok_s.median) : json(nullptr)},
        {"mean_accepted_len", h.spec.cell->spec.mean_accepted_length()},
        {"llamacpp_mean_accepted_len", h.llama_spec ? json(h.llama_spec->cell->spec.mean_accepted_length()) : json(nullptr)},
        {"predicted_speedup", h.spec.predicted},
        {"measured_speedup", h.spec.speedup},
        {"speedup_ceiling", h.spec.ceiling},
        {"cost_curve", {{"depth", cost.depth}, {"target_verify_ms", cost.verify_ms}, {"draft_ms_per_token", cost.draft_ms_per_token}, {"row_depth_ms", cost.row_depth_ms}, {"from", o.cost_curve_from.empty() ? json(nullptr) : json(o.cost_curve_from)}}},
        {"results", std::move(rows)},
    };
}

}  // namespace

int run_spec_bench(const SpecBenchOptions & o) {
    validate(o);
    const std::string prompts_path = prompt_set_path(o.prompts);
    const PromptSet prompt_set = read_prompt_set(prompts_path);
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

    const auto cells = run_matrix(o, rig, llama, prompts);
    json rows = print_tables(o, cells, categories, rig.cost, rig.target->config().n_layer);
    const Headline h = headline(o, cells, rig.cost);
    print_headline(h, o.temps[0]);
    const json j = results_json(o, prompts_path, llama.threads, load, rig.cost, h, std::move(rows));
    if (!o.json_path.empty()) {
        std::ofstream(o.json_path) << j.dump(2) << "\n";
        std::printf("wrote %s\n", o.json_path.c_str());
    }
    if (!o.html_path.empty()) {
        report::write_page(o.html_path, {{"kind", "bench"}, {"bench", j}});
        std::printf("wrote %s\n", o.html_path.c_str());
    }
    return 0;
}

}  // namespace specula::bench
