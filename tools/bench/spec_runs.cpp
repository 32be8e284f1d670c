#include "spec_runs.h"

#include <algorithm>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "constrain/grammar.h"
#include "engine/generate.h"
#include "engine/model_bundle.h"
#include "engine/sequence.h"
#include "engine/specee.h"
#include "engine/verify_cost_probe.h"
#include "policy/draft_length.h"
#include "policy/tree_size.h"
#include "runtime/forward.h"

namespace specula::bench {

namespace {

using json = nlohmann::json;

// The engine's options for the benchmark's target: its backend settings and the drafting defaults.
EngineOptions engine_options(const SpecBenchOptions & o) {
    EngineOptions e;
    e.model_path = o.model;
    e.n_threads = o.threads;
    e.kernels = o.kernels;
    e.attention = o.attention;
    return e;
}

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

std::string quoted(const std::string & s) {
    std::string q = "'";
    for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return q + "'";
}

// Flags both tools share: same prompt, length, context, threads, and sampling equal to specula's
// SamplingParams (pure temperature: llama.cpp's default top-k 40, top-p 0.95, min-p 0.05 switched
// off). --ignore-eos: every engine generates the full n tokens, except under a grammar, which
// allows only the end of generation once its text is complete (specula stops there too).
std::string common_flags(const SpecBenchOptions & o, const LlamaSetup & s, const Prompt & p, const SamplingParams & sp,
                         bool flash_attn) {
    std::ostringstream f;
    f << " -m " << quoted(o.model) << " -f " << quoted(p.file) << " -n " << o.n_gen << " -c " << s.n_ctx << " -t "
      << s.threads << " --temp " << sp.temperature << " --seed " << sp.seed << " --top-k 0 --top-p 1 --min-p 0"
      << (p.grammar.empty() ? " --ignore-eos" : " --grammar-file " + quoted(p.grammar_file)) << " -fa " << (flash_attn ? "on" : "off")
      << " --log-file " << quoted(s.log_file.string()) << " </dev/null";
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

}  // namespace

std::vector<Prompt> load_prompts(const PromptSet & set, const Tokenizer & tokenizer, const ScratchDir & scratch) {
    std::vector<Prompt> prompts;
    for (const auto & p : set.prompts) prompts.push_back({p.category, p.name, p.text, {}, {}, {}, {}});
    for (size_t i = 0; i < prompts.size(); ++i) {
        Prompt & q = prompts[i];
        if (const std::string & schema = set.prompts[i].json_schema; !schema.empty()) {
            try {
                q.grammar = json_schema_to_gbnf(schema);
            } catch (const Error & e) {
                throw Error("prompt '" + q.name + "': " + e.what());
            }
            q.grammar_file = scratch.path / ("grammar-" + std::to_string(i) + ".gbnf");
            std::ofstream(q.grammar_file) << q.grammar;
        }
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

SpeculaRig::SpeculaRig(const SpecBenchOptions & o, int n_ctx)
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
        DrafterSpec spec{kind, path, e.drafter.ngram_min, e.drafter.ngram_max, lookup};
        if (kind == DrafterKind::DraftModel) {
            spec.vocab = o.draft_vocab;
            spec.vocab_file = o.draft_vocab_file;
        }
        source = DrafterFactory::open(spec, backend, *target, vocab);
        drafter = source.make(n_ctx);
    };
    if (!o.draft.empty()) {
        // As generate drafts by default (cascade drafting); for the modes that compare, the same
        // draft model without cascade drafting, and with lookup's free chain weighed each round.
        assemble(draft, draft_drafter, DrafterKind::DraftModel, o.draft);
        draft.spec.cascade = false;
        draft_no_cascade_drafter = draft.make(n_ctx);
        draft.spec.cascade.reset();
        draft.spec.lookup = true;
        draft_lookup_drafter = draft.make(n_ctx);
        draft.spec.lookup = false;
    }
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
    const std::vector<int32_t> & ids = rig.draft.draft_logit_ids;
    std::unique_ptr<ModelRunner> draft_runner = ids.empty() ? std::make_unique<ModelRunner>(*rig.draft.draft_model)
                                                            : std::make_unique<ModelRunner>(*rig.draft.draft_model, ids);
    KvCache draft_cache(rig.backend, rig.draft.draft_model->config(), rig.cache.capacity());
    c.draft_ms_per_token = forward_cost(*draft_runner, draft_cache, probe, c.depth, 1)[0];
    return c;
}

// `prompt_index` keys plain decoding's greedy reply, which the lossy SpecEE mode is compared with.
Run run_specula(SpeculaRig & rig, const Mode & mode, const Prompt & prompt, size_t prompt_index, const GenerationOptions & g, int k_max) {
    rig.cache.rollback(0);
    // Only a grammar's prompts stop at the end of generation (generation_options).
    const auto is_end = [&](int32_t t) { return rig.vocab.is_end_of_generation(t); };
    std::vector<int32_t> tokens;
    const auto keep_going = [&](int32_t t) {
        tokens.push_back(t);
        return true;
    };
    Run run;
    GenerationStats s;
    const GenerationMode generation = generation_mode_of(mode.kind);
    if (generation == GenerationMode::Plain) {
        const std::unique_ptr<LogitsState> processing = logits_processing(g, prompt.tokens, &rig.vocab);
        s = generate_plain(rig.runner, rig.cache, prompt.tokens, g, is_end, keep_going, processing.get());
        if (g.sampling.greedy()) rig.plain_tokens[prompt_index] = tokens;
    } else if (generation == GenerationMode::SpeceeLossy) {
        s = generate_early_exit(*rig.exit_decoder, rig.runner, rig.cache, *rig.eagle3_drafter, prompt.tokens, g, rig.exit_threshold, is_end,
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
        SequenceParts parts = sequence_parts(generation, rig.cache, &drafter, tree, policies.length.get(), policies.tree_size.get(),
                                             [&](const RoundInfo & r) { record_round(run, r); });
        parts.tokenizer = &rig.vocab;
        s = generate_speculative(rig.runner, parts, prompt.tokens, g, is_end, keep_going);
        if (generation == GenerationMode::SpeceeLossless) run.exits = rig.exit_drafter->exit_stats();
        // Lossless at T = 0: the text must be plain decoding's (which ran this prompt first).
        if (g.sampling.greedy()) run.differs_from_plain = tokens != rig.plain_tokens.at(prompt_index);
    }
    run.tokens = s.n_generated;
    run.seconds = s.generation_seconds;
    run.spec = s.speculation;
    return run;
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

}  // namespace specula::bench
