#pragma once
// What bench spec runs: one generation of a mode on a prompt, in specula (SpeculaRig: the target,
// every drafter, the cost curve) or in llama.cpp's tools as subprocesses.
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "draft/early_exit.h"
#include "engine/drafter_factory.h"
#include "runtime/backend.h"
#include "runtime/exit_predictor.h"
#include "runtime/kv_cache.h"
#include "runtime/model.h"
#include "specula/report.h"
#include "specula/specula.h"
#include "spec_modes.h"
#include "tokenizer/tokenizer.h"
#include "tree/tree_builder.h"

namespace specula::bench {

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
    std::optional<bool> differs_from_plain;  // specula speculative runs at T = 0: tokens unlike specula-plain's
};

struct Prompt {
    std::string category, name, text;
    std::vector<int32_t> tokens;
    std::string file;          // the text as a file, for llama.cpp's -f (no shell quoting of prompts)
    std::string grammar;       // GBNF of the prompt's json_schema, which every mode's reply follows; empty: none
    std::string grammar_file;  // the grammar as a file, for llama.cpp's --grammar-file
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

// The prompts of `set` tokenized for the target (through its chat template for a chat set), each
// also written to a file in `scratch` for llama.cpp's -f; json_schemas compiled to GBNF (as
// llama-server compiles response_format), which also goes to a file for llama.cpp.
std::vector<Prompt> load_prompts(const PromptSet & set, const Tokenizer & tokenizer, const ScratchDir & scratch);
std::vector<std::string> categories_of(const std::vector<Prompt> & prompts);  // in order of appearance

struct CostCurve {
    int depth = 0;                  // cached tokens when measured (a typical mid-generation depth)
    std::vector<double> verify_ms;  // [b - 1]: target forward of b tokens, b = 1..max(k_max, kAutoTreeMaxNodes) + 1
    double draft_ms_per_token = 0;  // one draft-model forward of 1 token
    double row_depth_ms = 0;        // a verify row past the first: ms more per token deeper (measure_row_depth_ms)
};

// Every drafter the modes use, assembled as the engine assembles them (engine/drafter_factory.h).
struct SpeculaRig {
    Backend backend;
    std::unique_ptr<Model> target;
    Tokenizer vocab;
    ModelRunner runner;
    KvCache cache;
    DrafterFactory draft, ngram, eagle1, eagle3, eagle3_lookup;
    std::unique_ptr<Drafter> draft_drafter, draft_no_cascade_drafter, draft_lookup_drafter, ngram_drafter, eagle1_drafter, eagle3_drafter, eagle3_lookup_drafter;
    std::unique_ptr<ExitPredictor> exit_predictor;  // SpecEE: the lossy mode's decoder, the lossless mode's drafter
    float exit_threshold = 1.0f;
    std::unique_ptr<EarlyExitDecoder> exit_decoder;
    std::unique_ptr<EarlyExitDrafter> exit_drafter;
    std::map<size_t, std::vector<int32_t>> plain_tokens;  // prompt -> specula-plain's greedy reply (T = 0)
    CostCurve cost;
    TreeBudget tree;  // tree modes: the engine's defaults for a dynamic tree; 0 nodes = TreeSizePolicy

    SpeculaRig(const SpecBenchOptions & o, int n_ctx);

    Drafter & drafter_for(Kind k) {
        switch (k) {
            case Kind::SpeculaDraftNoCascade: return *draft_no_cascade_drafter;
            case Kind::SpeculaDraftLookup: return *draft_lookup_drafter;
            case Kind::SpeculaNgram: return *ngram_drafter;
            case Kind::SpeculaEagle1: return *eagle1_drafter;
            case Kind::SpeculaEagle3: return *eagle3_drafter;
            case Kind::SpeculaEagle3Lookup: return *eagle3_lookup_drafter;
            case Kind::SpeculaSpeceeLossless: return *exit_drafter;
            default: return *draft_drafter;
        }
    }
};

std::vector<double> cost_curve_of(const std::string & path, size_t max_tokens, int & depth, double & row_depth_ms);
// The curve at a typical mid-generation depth of these prompts (or curve_from's), and the draft
// model's one-token forward.
CostCurve measure_cost_curve(SpeculaRig & rig, const std::vector<Prompt> & prompts, int n_gen, int k_max, const std::string & curve_from);
Run run_specula(SpeculaRig & rig, const Mode & mode, const Prompt & prompt, size_t prompt_index, const GenerationOptions & g, int k_max);

struct LlamaSetup {
    std::string spec_bin, plain_bin;
    int threads = 0, n_ctx = 0;
    std::filesystem::path log_file;
};

Run run_llama_spec(const SpecBenchOptions & o, const LlamaSetup & s, const Prompt & p, const SamplingParams & sp,
                   const std::string & draft, const char * spec_type, bool flash_attn);
Run run_llama_plain(const SpecBenchOptions & o, const LlamaSetup & s, const Prompt & p, const SamplingParams & sp, bool flash_attn);

}  // namespace specula::bench
