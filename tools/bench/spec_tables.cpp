#include "spec_tables.h"

#include <algorithm>
#include <cstdio>

#include "policy/draft_length.h"

namespace specula::bench {

namespace {

using json = nlohmann::json;

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

Row make_row(const std::map<CellKey, Cell> & cells, int t, const std::string & cat, int m, const CostCurve & cost) {
    const Cell & c = cells.at({t, cat, m});
    const double plain = tok_s(cells.at({t, cat, kPlainMode})).median;
    const Cell & plain_cell = cells.at({t, cat, kPlainMode});
    std::vector<double> paired;
    for (size_t rep = 0; rep < c.tokens.size() && rep < plain_cell.tokens.size(); ++rep) {
        const double mine = c.seconds[rep] > 0 ? c.tokens[rep] / c.seconds[rep] : 0.0;
        const double base = plain_cell.seconds[rep] > 0 ? plain_cell.tokens[rep] / plain_cell.seconds[rep] : 0.0;
        if (base > 0) paired.push_back(mine / base);
    }
    Row r{cat, &kModes[m], tok_s(c), summarize(paired), 0.0, 0.0, 0.0, &c};
    r.speedup = plain > 0 ? r.tok_s.median / plain : 0.0;
    const double plain_ms = plain > 0 ? 1000.0 / plain : 0.0;
    r.predicted = predicted_speedup(c, kModes[m], cost, plain_ms);
    r.ceiling = speedup_ceiling(c, kModes[m], cost, plain_ms);
    return r;
}

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
    if (r.cell->differing_from_plain) {
        std::printf("%-11s   WARNING: text unlike specula-plain's in %d of %d runs at T=0\n", "", r.cell->differing_from_plain,
                    r.cell->compared_to_plain);
    }
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
              {"speedup_vs_specula_plain", r.speedup},
              {"speedup_per_rep", {{"median", r.paired.median}, {"min", r.paired.min}, {"max", r.paired.max}}}};
    if (r.cell->compared_to_plain) {
        j["compared_to_plain_runs"] = r.cell->compared_to_plain;
        j["identical_to_plain_runs"] = r.cell->compared_to_plain - r.cell->differing_from_plain;
    }
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

}  // namespace

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
    if (r.differs_from_plain) {
        ++c.compared_to_plain;
        c.differing_from_plain += *r.differs_from_plain;
    }
    ++c.runs;
    c.rounds_by_depth.resize(std::max(c.rounds_by_depth.size(), r.rounds_by_depth.size()), 0);
    for (size_t d = 0; d < r.rounds_by_depth.size(); ++d) c.rounds_by_depth[d] += r.rounds_by_depth[d];
}

void print_cost(const CostCurve & c) {
    std::printf("cost curve at depth %d: ", c.depth);
    if (c.draft_ms_per_token > 0) std::printf("draft %.3f ms/token; ", c.draft_ms_per_token);
    std::printf("a row past the first %.5f ms more per token deeper; ", c.row_depth_ms);
    std::printf("target verify ms for 1..%zu tokens:", c.verify_ms.size());
    for (double v : c.verify_ms) std::printf(" %.3f", v);
    std::printf("\n");
}

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
    int compared = 0, differing = 0;
    for (const auto & [key, c] : cells) {
        if (std::get<1>(key) != kAllCategories) continue;
        compared += c.compared_to_plain;
        differing += c.differing_from_plain;
    }
    if (compared) std::printf("T=0: specula's speculative texts identical to specula-plain's in %d of %d runs\n", compared - differing, compared);
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

Headline headline(const SpecBenchOptions & o, const std::map<CellKey, Cell> & cells, const CostCurve & cost) {
    auto all = [&](const char * mode) { return make_row(cells, 0, kAllCategories, mode_index(mode), cost); };
    const bool eagle3 = !o.eagle3.empty();
    const bool lookup_only = o.draft.empty() && !eagle3;
    const char * spec = eagle3 ? kEagle3Headline : lookup_only ? kLookupHeadline
                                                               : kHeadlineSpecMode;
    // The mode that drafts exactly llama.cpp's chain every round: the draft model's, else EAGLE-3's
    // (with no drafter, lookup's chain of --draft-max).
    const char * fixed = lookup_only ? kLookupFixedMode : o.draft.empty() ? kEagle3FixedMode
                                                                          : kFixedSpecMode;
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
    char extra[200];
    std::printf("\nall prompts, temperature %g (tok/s, median):\n", temp);
    std::snprintf(extra, sizeof extra, "%.2fx specula plain [per rep %.2f .. %.2f] (predicted %.2fx, ceiling %.2fx), %.2f tokens/forward",
                  h.spec.speedup, h.spec.paired.min, h.spec.paired.max, h.spec.predicted, h.spec.ceiling, h.spec.cell->spec.mean_accepted_length());
    line(std::string(h.spec.mode->name) + " (headline)", h.spec, extra);
    if (h.fixed.mode != h.spec.mode) {
        std::snprintf(extra, sizeof extra, "%.2fx specula plain, %.2f tokens/forward (k fixed, as llama.cpp)", h.fixed.speedup,
                      h.fixed.cell->spec.mean_accepted_length());
        line(h.fixed.mode->name, h.fixed, extra);
    }
    std::snprintf(extra, sizeof extra, "%.2fx specula plain [per rep %.2f .. %.2f]", h.best.speedup, h.best.paired.min, h.best.paired.max);
    line(std::string("best: ") + h.best.mode->name, h.best, extra);
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
        {"specula_spec_mode", std::string(h.spec.mode->name) + (!o.eagle3.empty() ? " (specula's default EAGLE-3 mode)"
                                                                : o.draft.empty() ? " (prompt lookup: the default without a drafter)"
                                                                                  : " (default policy, k <= draft_max = llama.cpp's k)")},
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

}  // namespace specula::bench
