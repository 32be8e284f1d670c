// SpecEE's offline commands (docs/specee.md):
//   specee-features: the target's own greedy replies to a prompt set, and per token the EAGLE-3
//     head's top 4 candidates and their logits at every layer (the predictors' training data,
//     tools/train/train_specee.py);
//   specee-eval: a predictor file on held-out prompts, plain decoding measured in the same run:
//     tok/s of plain, lossy and lossless, the exit profile, teacher-forced agreement, free-running
//     agreement, and whether the lossless replies equal plain's.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "engine/generate.h"
#include "engine/specee.h"
#include "engine/generation_mode.h"
#include "engine/sequence.h"
#include "policy/draft_length.h"
#include "engine/model_bundle.h"
#include "runtime/kv_cache.h"
#include "runtime/candidate_logits.h"
#include "runtime/model.h"
#include "sample/sampler.h"
#include "specula/error.h"
#include "specula/specula.h"
#include "tokenizer/tokenizer.h"

namespace specula::cli {
namespace {

struct PromptSet {
    std::string path, split = "train";
    std::string frame;  // a pretrained target's completion frame around each prompt ("{}"), else a chat
    int first = 0, skip = 0;
};

std::vector<int32_t> prompt_tokens(const Tokenizer & tok, const PromptSet & set, const std::string & text) {
    if (set.frame.empty()) return tok.tokenize_chat({{"user", text}});
    std::string framed = set.frame;
    const size_t at = framed.find("{}");
    if (at == std::string::npos) throw Error("--frame must contain {} where the prompt goes");
    framed.replace(at, 2, text);
    return tok.tokenize(framed);
}

std::vector<std::string> read_prompts(const PromptSet & s) {
    std::ifstream in(s.path);
    if (!in) throw Error("cannot open the prompt set " + s.path);
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(in);
    } catch (const std::exception &) {
        throw Error(s.path + ": not JSON");
    }
    if (!j.contains("prompts") || !j["prompts"].is_array()) throw Error(s.path + ": no \"prompts\" array");
    std::vector<std::string> out;
    int seen = 0;
    for (const auto & p : j["prompts"]) {
        if (!p.is_object() || !p.contains("prompt") || !p["prompt"].is_string()) throw Error(s.path + ": a prompt without a \"prompt\" string");
        if (p.value("split", "") != s.split) continue;
        if (seen++ < s.skip) continue;
        out.push_back(p["prompt"].get<std::string>());
        if (s.first > 0 && static_cast<int>(out.size()) == s.first) break;
    }
    if (out.empty()) throw Error(s.path + ": no prompt of split '" + s.split + "'");
    return out;
}

// Prefills all of `prompt` but its last token, handing the drafter the features of those rows.
// One full-depth step of `token` at the cache's end; taps at `taps` layers; returns the argmax.
int32_t full_step(ModelRunner & runner, KvCache & cache, int32_t token, const std::vector<int> & taps, ForwardOutput & out) {
    ForwardBatch b = ForwardBatch::causal(std::vector<int32_t>{token}, cache.size(), {0});
    b.tap_layers = taps;
    runner.forward(b, cache, out);
    return argmax(out.logits_row(0));
}

void add_common(CLI::App * sub, EngineOptions & e, PromptSet & p, int & n_predict) {
    sub->add_option("-m,--model", e.model_path, "target model GGUF")->required();
    sub->add_option_function<std::string>(
           "--eagle3", [&e](const std::string & path) { e.drafter = {DrafterKind::Eagle3, path}; },
           "EAGLE-3 head GGUF: the candidates")
        ->required();
    sub->add_option("--prompts", p.path, "prompt set JSON (tools/train/make_prompts.py)")->required();
    sub->add_option("--split", p.split, "prompts of this split")->capture_default_str();
    sub->add_option("--first", p.first, "only the first N prompts of the split (0 = all)")->capture_default_str();
    sub->add_option("--skip", p.skip, "skip the split's first N prompts")->capture_default_str();
    sub->add_option("--frame", p.frame, "completion frame around each prompt, e.g. 'Question: {}\\nAnswer:' (default: the chat template)");
    sub->add_option("-n,--n-predict", n_predict, "reply tokens per prompt")->capture_default_str();
    sub->add_option("-t,--threads", e.n_threads, "CPU threads (0 = physical cores)")->capture_default_str();
    sub->add_option("-c,--ctx-size", e.n_ctx, "context size in tokens")->capture_default_str();
}

int run_features(EngineOptions options, const PromptSet & set, int n_predict, const std::string & out_path) {
    const std::vector<std::string> prompts = read_prompts(set);
    auto t = ModelBundle::open(options);
    const Model & model = *t->model;
    const int L = model.config().n_layer;
    auto drafter = t->make_drafter(options.n_ctx);
    CandidateLogits probe(model);
    std::vector<int> taps = drafter->feature_layers();
    const size_t n_feature_taps = taps.size();
    for (int l = 1; l <= L; ++l) taps.push_back(l);
    std::ofstream out(out_path);
    if (!out) throw Error("cannot write " + out_path);
    const size_t E = model.config().n_embd;
    ForwardOutput fo;
    std::vector<float> logits(kExitCandidates), features;
    int n_tokens = 0;
    for (size_t pi = 0; pi < prompts.size(); ++pi) {
        std::vector<int32_t> history = prompt_tokens(*t->tokenizer, set, prompts[pi]);
        KvCache cache(*t->backend, model.config(), options.n_ctx);
        prefill_for_drafter(*t->runner, cache, *drafter, history);
        for (int i = 0; i < n_predict && cache.size() < cache.capacity(); ++i) {
            const int position = static_cast<int>(history.size()) - 1;
            const std::vector<int32_t> candidates = top_candidates(*drafter, history);
            const int32_t token = full_step(*t->runner, cache, history.back(), taps, fo);
            auto state = [&](int l) { return std::span<const float>(fo.taps[n_feature_taps + l - 1]).first(E); };
            nlohmann::json per_layer = nlohmann::json::array();
            if (candidates.size() == kExitCandidates) {
                for (int l = 1; l <= L; ++l) {
                    probe.compute(state(l), candidates, logits);
                    per_layer.push_back(logits);
                }
            }
            // With a predictor: decode as its lossy mode would, so that the data carries the cache
            // and candidates its exits leave (the exited rows' K/V filled from the exit state, the
            // drafter fed exit states); each token is still labelled with the full model's argmax.
            int exit_layer = -1;
            int32_t next = token;
            if (t->exit_predictor && !per_layer.empty()) {
                std::vector<float> previous(kExitCandidates), exit_in(kExitFeatures);
                const std::vector<int> & schedule = t->exit_predictor->offline_layers();
                for (size_t k = 0; k < schedule.size() && exit_layer < 0; ++k) {
                    const std::vector<float> at = per_layer[schedule[k] - 1].get<std::vector<float>>();
                    exit_features(at, previous, k == 0, exit_in);
                    if (t->exit_predictor->exit_probability(t->exit_predictor->index_of(schedule[k]), exit_in) > t->exit_threshold) {
                        exit_layer = schedule[k];
                        next = candidates[std::max_element(at.begin(), at.end()) - at.begin()];
                    }
                }
                if (exit_layer >= 0 && exit_layer < L) {
                    ForwardBatch fill;
                    fill.positions = {position};
                    fill.mask = BlockMask::causal(1);
                    fill.hidden_in.assign(state(exit_layer).begin(), state(exit_layer).end());
                    fill.kv_slot_begin = position;
                    fill.layer_begin = exit_layer;
                    fill.kv_only = true;
                    t->runner->forward(fill, cache);
                }
            }
            features.clear();
            for (size_t f = 0; f < n_feature_taps; ++f) {
                const int layer = drafter->feature_layers()[f];
                const std::span<const float> row = exit_layer >= 0 && layer >= exit_layer ? state(exit_layer) : std::span<const float>(fo.taps[f]);
                features.insert(features.end(), row.begin(), row.end());
            }
            drafter->accept(Acceptance{position + 1, position, features});
            if (!per_layer.empty()) {
                nlohmann::json row = {{"prompt", pi}, {"position", position}, {"token", token}, {"candidates", candidates}, {"logits", per_layer}};
                out << row.dump() << "\n";
                ++n_tokens;
            }
            history.push_back(next);
            if (t->tokenizer->is_end_of_generation(next)) break;
        }
        std::fprintf(stderr, "[specula] prompt %zu/%zu: %d tokens so far\n", pi + 1, prompts.size(), n_tokens);
    }
    return 0;
}

int run_eval(EngineOptions options, const PromptSet & set, int n_predict, const std::string & json_path) {
    const std::vector<std::string> prompts = read_prompts(set);
    auto t = ModelBundle::open(options);
    const Model & model = *t->model;
    const int L = model.config().n_layer;
    auto drafter = t->make_drafter(options.n_ctx);
    EarlyExitDecoder decoder(model, *t->runner, t->exit_predictor.get(), options.specee_online);
    GenerationOptions gen;
    gen.n_predict = n_predict;
    auto is_end = [&](int32_t tok) { return t->tokenizer->is_end_of_generation(tok); };

    // The lossless mode: the same predictor's exited tokens as chains of up to 6 drafts.
    EarlyExitDrafter lossless_drafter(model, *t->exit_predictor, t->exit_threshold, t->make_drafter(options.n_ctx), options.n_ctx,
                                      options.specee_online);
    auto fixed = make_draft_policy(DraftPolicyKind::Fixed, 6, {});
    double plain_s = 0, lossy_s = 0, lossless_s = 0;
    int lossless_n = 0, lossless_identical = 0;
    int plain_n = 0, lossy_n = 0, forced_exited = 0, forced_agree = 0, forced_tokens = 0, free_same_total = 0, free_identical = 0;
    EarlyExitStats forced_stats, lossy_stats;
    std::vector<double> ratios, lossless_ratios;
    for (size_t pi = 0; pi < prompts.size(); ++pi) {
        const std::vector<int32_t> prompt = prompt_tokens(*t->tokenizer, set, prompts[pi]);
        // Plain greedy: the reference text and the baseline time.
        std::vector<int32_t> plain;
        KvCache c1(*t->backend, model.config(), options.n_ctx);
        GenerationStats ps = generate_plain(*t->runner, c1, prompt, gen, is_end, [&](int32_t tok) { plain.push_back(tok); return true; });
        plain_s += ps.generation_seconds;
        plain_n += ps.n_generated;
        // Teacher-forced: the plain text fed back, each token's exit checked against it.
        KvCache c2(*t->backend, model.config(), options.n_ctx);
        const TeacherForcedExits forced = teacher_forced_exits(decoder, *t->runner, c2, *drafter, prompt, plain, t->exit_threshold);
        forced_stats.merge(forced.stats);
        forced_tokens += static_cast<int>(plain.size());
        forced_exited += forced.exited;
        forced_agree += forced.agree;
        // Free-running lossy: timed; tokens until the first difference from plain.
        std::vector<int32_t> lossy;
        KvCache c3(*t->backend, model.config(), options.n_ctx);
        GenerationStats ls = generate_early_exit(
            decoder, *t->runner, c3, *drafter, prompt, gen, t->exit_threshold, is_end,
            [&](int32_t tok) { lossy.push_back(tok); return true; }, lossy_stats);
        lossy_s += ls.generation_seconds;
        lossy_n += ls.n_generated;
        size_t same = 0;
        while (same < plain.size() && same < lossy.size() && plain[same] == lossy[same]) ++same;
        free_same_total += static_cast<int>(same);
        free_identical += same == plain.size() && same == lossy.size();
        if (ps.generation_seconds > 0 && ls.generation_seconds > 0) ratios.push_back(ls.generation_tok_s() / ps.generation_tok_s());
        std::vector<int32_t> verified;
        KvCache c4(*t->backend, model.config(), options.n_ctx);
        const SequenceParts parts =
            sequence_parts(GenerationMode::SpeceeLossless, c4, &lossless_drafter, TreeBudget{TreeShape::Chain, 6, 1, 6}, fixed.get(), nullptr);
        GenerationStats vs = generate_speculative(*t->runner, parts, prompt, gen, is_end, [&](int32_t tok) { verified.push_back(tok); return true; });
        lossless_s += vs.generation_seconds;
        lossless_n += vs.n_generated;
        lossless_identical += verified == plain;
        if (vs.generation_seconds > 0 && ps.generation_seconds > 0) lossless_ratios.push_back(vs.generation_tok_s() / ps.generation_tok_s());
        std::fprintf(stderr, "[specula] prompt %zu/%zu: plain %.1f tok/s, lossy %.1f tok/s, same for %zu of %zu tokens\n", pi + 1,
                     prompts.size(), ps.generation_tok_s(), ls.generation_tok_s(), same, plain.size());
    }
    std::sort(ratios.begin(), ratios.end());
    std::sort(lossless_ratios.begin(), lossless_ratios.end());
    const double median = ratios.empty() ? 0.0 : ratios[ratios.size() / 2];
    const double lossless_median = lossless_ratios.empty() ? 0.0 : lossless_ratios[lossless_ratios.size() / 2];
    const double lossless_tok_s = lossless_n / lossless_s;
    const double plain_tok_s = plain_n / plain_s, lossy_tok_s = lossy_n / lossy_s;
    std::printf("prompts %zu (%s split), %d plain tokens, threshold %.3f\n", prompts.size(), set.split.c_str(), plain_n, t->exit_threshold);
    std::printf("plain %.1f tok/s, lossy %.1f tok/s: %.2fx (per-prompt ratio median %.2fx, range %.2f-%.2f)\n", plain_tok_s, lossy_tok_s,
                lossy_tok_s / plain_tok_s, median, ratios.empty() ? 0.0 : ratios.front(), ratios.empty() ? 0.0 : ratios.back());
    std::printf("teacher-forced: %s; exited tokens equal to the full model's: %d/%d (%.1f%%)\n", forced_stats.summary(L).c_str(),
                forced_agree, forced_exited, forced_exited ? 100.0 * forced_agree / forced_exited : 0.0);
    std::printf("free-running: %s; mean tokens before the first difference %.1f, identical replies %d/%zu\n",
                lossy_stats.summary(L).c_str(), static_cast<double>(free_same_total) / prompts.size(), free_identical, prompts.size());
    std::printf("lossless: %.1f tok/s, %.2fx plain (per-prompt median %.2fx), replies identical to plain %d/%zu; drafter %s\n", lossless_tok_s,
                lossless_tok_s / plain_tok_s, lossless_median, lossless_identical, prompts.size(), lossless_drafter.exit_stats().summary(L).c_str());
    if (!json_path.empty()) {
        nlohmann::json j = {{"prompts", prompts.size()}, {"split", set.split}, {"threshold", t->exit_threshold}, {"plain_tok_s", plain_tok_s}, {"lossy_tok_s", lossy_tok_s}, {"ratio_median", median}, {"ratio_min", ratios.empty() ? 0.0 : ratios.front()}, {"ratio_max", ratios.empty() ? 0.0 : ratios.back()}, {"teacher_forced_exited", forced_exited}, {"teacher_forced_agree", forced_agree}, {"teacher_forced_tokens", forced_tokens}, {"teacher_forced_exits_at", forced_stats.exits_at}, {"free_exits_at", lossy_stats.exits_at}, {"free_mean_exit_layer", lossy_stats.mean_exit_layer(L)}, {"free_tokens_before_difference", free_same_total}, {"free_identical_replies", free_identical}, {"lossless_tok_s", lossless_tok_s}, {"lossless_ratio_median", lossless_median}, {"lossless_identical_replies", lossless_identical}};
        std::ofstream(json_path) << j.dump(1) << "\n";
    }
    return 0;
}

}  // namespace

void register_specee(CLI::App & app, Commands & commands) {
    struct Args {
        EngineOptions engine;
        PromptSet prompts;
        int n_predict = 128;
        std::string out;
    };
    auto fa = std::make_shared<Args>();
    CLI::App * feat = app.add_subcommand(command::specee_features.name, command::specee_features.description);
    add_common(feat, fa->engine, fa->prompts, fa->n_predict);
    feat->add_option("-o,--out", fa->out, "output JSON-lines file")->required();
    feat->add_option("--specee", fa->engine.specee_path, "exit predictors GGUF: decode with their exits (on-policy data for the next predictors)");
    feat->add_option("--specee-threshold", fa->engine.specee_threshold, "exit above this probability (default: the file's)");
    feat->callback([fa, &commands] { commands.run = [fa] { return run_features(fa->engine, fa->prompts, fa->n_predict, fa->out); }; });

    auto ea = std::make_shared<Args>();
    ea->prompts.split = "heldout";
    CLI::App * eval = app.add_subcommand(command::specee_eval.name, command::specee_eval.description);
    add_common(eval, ea->engine, ea->prompts, ea->n_predict);
    eval->add_option("--specee", ea->engine.specee_path, "exit predictors GGUF")->required();
    eval->add_option("--specee-threshold", ea->engine.specee_threshold, "exit above this probability (default: the file's)");
    eval->add_flag("--specee-online", ea->engine.specee_online, "also probe near the recent tokens' exit layers (docs/specee.md)");
    eval->add_option("--json", ea->out, "also write the figures as JSON");
    eval->callback([ea, &commands] { commands.run = [ea] { return run_eval(ea->engine, ea->prompts, ea->n_predict, ea->out); }; });
}

}  // namespace specula::cli
