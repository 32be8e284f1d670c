#include "engine/speculative.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>

#include "common/error.h"
#include "common/stats.h"
#include "kv/kv_cache.h"
#include "runtime/forward.h"

namespace specula {

namespace {
using clock_type = std::chrono::steady_clock;
double ms_since(clock_type::time_point t0) { return std::chrono::duration<double, std::milli>(clock_type::now() - t0).count(); }

// Target features of the given block rows, each row the drafter's feature layers concatenated.
void gather_features(const ForwardOutput & out, std::span<const int> rows, std::vector<float> & dst) {
    dst.clear();
    const size_t E = out.n_embd;
    for (int r : rows) {
        for (const auto & tap : out.taps) dst.insert(dst.end(), tap.begin() + r * E, tap.begin() + (r + 1) * E);
    }
}

// [root, nodes...] as one block: node i is row i + 1 at position base + depth(i).
ForwardBatch tree_batch(int32_t root, const TokenTree & tree, int base) {
    ForwardBatch b;
    const int n = tree.size() + 1;
    b.tokens.reserve(n);
    b.tokens.push_back(root);
    b.tokens.insert(b.tokens.end(), tree.token.begin(), tree.token.end());
    b.positions.resize(n);
    std::vector<int> parents(n);
    parents[0] = -1;
    b.positions[0] = base;
    for (int i = 0; i < tree.size(); ++i) {
        parents[i + 1] = tree.parent[i] + 1;  // kRoot (-1) becomes row 0
        b.positions[i + 1] = base + tree.depth[i];
    }
    b.mask = BlockMask::from_parents(parents);
    b.logit_rows.resize(n);
    for (int i = 0; i < n; ++i) b.logit_rows[i] = i;
    return b;
}
}  // namespace

std::vector<double> measure_verify_cost(ModelRunner & target, KvCache & cache, std::span<const int32_t> tokens, int max_tokens, int reps) {
    if (static_cast<int>(tokens.size()) < max_tokens) throw Error("measure_verify_cost: not enough tokens");
    const int base = cache.size();
    if (base + max_tokens > cache.capacity()) throw Error("measure_verify_cost: context too small");
    if (reps < 1) throw Error("measure_verify_cost: reps must be positive");
    std::vector<double> ms(max_tokens);
    ForwardOutput out;
    // Size by size, with an untimed first run: more sizes than the runner keeps graphs for would
    // otherwise time a graph build with every forward. The median, not the best: the curve
    // predicts what forwards cost inside a generation loop, where they are not the best case.
    for (int b = 1; b <= max_tokens; ++b) {
        std::vector<int32_t> rows(b);
        for (int i = 0; i < b; ++i) rows[i] = i;
        const ForwardBatch batch = ForwardBatch::causal(tokens.first(b), base, rows);
        std::vector<double> samples;
        for (int r = 0; r <= reps; ++r) {
            const auto t0 = clock_type::now();
            target.forward(batch, cache, out);
            if (r > 0) samples.push_back(ms_since(t0));
            cache.rollback(base);
        }
        ms[b - 1] = median(std::move(samples));
    }
    return ms;
}

GenerationStats generate_speculative(SpecContext & ctx, std::span<const int32_t> prompt, const GenerationOptions & options,
                                     const std::function<bool(int32_t)> & is_end, const TokenSink & sink) {
    GenerationStats run;
    run.speculative = true;
    run.n_prompt = static_cast<int>(prompt.size());
    if (prompt.empty()) throw Error("empty prompt");
    if (static_cast<int>(prompt.size()) >= ctx.cache.capacity()) {
        throw Error("prompt is " + std::to_string(prompt.size()) + " tokens, longer than the " +
                    std::to_string(ctx.cache.capacity()) + "-token context");
    }
    const SamplingParams & sp = options.sampling;
    Rng rng(sp.seed);
    VerifyFn verify = ctx.verify;
    if (!verify) {
        verify = [&sp](const TokenTree & t, const TargetLogits & l, Rng & r) {
            return sp.greedy() ? verify_greedy(t, l) : verify_sampled(t, l, sp, r);
        };
    }
    std::vector<int32_t> history(prompt.begin(), prompt.end());
    ctx.drafter.reset();
    const std::vector<int> feature_layers = ctx.drafter.feature_layers();
    std::vector<float> features;
    std::vector<int> rows;

    // The prompt minus its last token goes into the cache; the last token is the first root.
    auto t0 = clock_type::now();
    ForwardOutput out;
    for (size_t start = 0; start + 1 < prompt.size(); start += 512) {
        const int n = static_cast<int>(std::min<size_t>(512, prompt.size() - 1 - start));
        ForwardBatch b = ForwardBatch::causal(prompt.subspan(start, n), ctx.cache.size(), {});
        b.tap_layers = feature_layers;
        ctx.target.forward(b, ctx.cache, out);
        rows.resize(n);
        for (int i = 0; i < n; ++i) rows[i] = i;
        gather_features(out, rows, features);
        ctx.drafter.accept(Acceptance{ctx.cache.size(), static_cast<int>(start), features});
    }
    run.prompt_seconds = ms_since(t0) / 1000.0;

    t0 = clock_type::now();
    int emitted = 0;
    bool done = false;
    while (!done && emitted < options.n_predict) {
        const int base = ctx.cache.size();
        const int room = ctx.cache.capacity() - base - 1;
        if (room < 0) break;  // context full
        TreeBudget budget = ctx.tree;
        int asked = budget.max_nodes;
        if (budget.shape == TreeShape::Chain) {
            asked = ctx.policy.next_length();
            const int k = std::max(0, std::min({asked, room, options.n_predict - emitted - 1}));
            budget.depth = budget.max_nodes = k;
            budget.branching = 1;
        } else {
            if (ctx.tree_size) {
                budget.max_nodes = ctx.tree_size->max_nodes();
                budget.min_path_prob = static_cast<float>(ctx.tree_size->min_path_prob());
            }
            budget.max_nodes = std::min(budget.max_nodes, room);
            budget.depth = std::min(budget.depth, room);
        }

        auto td = clock_type::now();
        Draft draft;
        if (budget.max_nodes > 0 && budget.depth > 0) draft = ctx.drafter.draft(DraftRequest{history, budget, &sp, &rng});
        double promised = 0.0;
        RoundDecision decision{budget.shape == TreeShape::Chain ? ctx.policy.name() : ctx.tree_size ? "tree-size" : "fixed-tree",
                               asked, draft.tree.size(), 0, {}};
        if (budget.shape == TreeShape::Chain && budget.max_nodes < asked) {
            decision.why = "asked " + std::to_string(asked) + ", room for " + std::to_string(budget.max_nodes) + " (context or -n)";
        }
        if (ctx.tree_size && !draft.tree.empty()) {
            ctx.tree_size->observe_draft(ms_since(td), draft.tree.max_depth());
            std::vector<double> path_probs;
            for (int node : prune_order(draft.tree)) path_probs.push_back(std::exp(double(draft.tree.logp[node])));
            const int n = ctx.tree_size->choose(path_probs, ms_since(td));
            if (n < draft.tree.size()) draft.tree = prune_tree(draft.tree, n);
            for (int i = 0; i < n; ++i) promised += path_probs[i];
            char why[160];
            std::snprintf(why, sizeof(why), "calibration %.2f (accepted/promised), min path prob %.3f, %d nodes promise %.2f tokens",
                          ctx.tree_size->calibration(), budget.min_path_prob, n, promised);
            decision.why = why;
        }
        decision.verified_nodes = draft.tree.size();
        const double draft_ms = ms_since(td);

        auto tv = clock_type::now();
        ForwardBatch verify_batch = tree_batch(history.back(), draft.tree, base);
        verify_batch.tap_layers = feature_layers;
        ctx.target.forward(verify_batch, ctx.cache, out);
        const VerifyResult result = verify(draft.tree, TargetLogits{out.logits, out.n_vocab}, rng);
        std::vector<int> kept{0};
        for (int node : result.accepted) kept.push_back(node + 1);
        ctx.cache.compact(base, kept);
        const double verify_ms = ms_since(tv);
        gather_features(out, kept, features);
        ctx.drafter.accept(Acceptance{static_cast<int>(history.size() + result.accepted.size()), base, features});

        std::vector<int32_t> tokens;
        for (int node : result.accepted) tokens.push_back(draft.tree.token[node]);
        tokens.push_back(result.next_token);
        for (int32_t t : tokens) {
            history.push_back(t);
            ++emitted;
            if (!sink(t) || (options.stop_at_end_of_generation && is_end(t)) || emitted >= options.n_predict) {
                done = true;
                break;
            }
        }
        if (ctx.tree_size && !draft.tree.empty()) {
            ctx.tree_size->observe(promised, static_cast<int>(result.accepted.size()), draft.tree.size(), verify_ms);
        }
        run.speculation.add_round(draft.tree.size(), draft.tree.max_depth(), static_cast<int>(result.accepted.size()));
        ctx.policy.observe({draft.tree.size(), static_cast<int>(result.accepted.size()), draft.mean_entropy,
                            draft_ms / 1000.0, verify_ms / 1000.0, draft.tree.size() + 1});
        if (ctx.on_round) {
            ctx.on_round(RoundInfo{run.speculation.rounds - 1, base, asked, draft_ms, verify_ms, &draft, &result, history, decision});
        }
    }
    run.n_generated = emitted;
    run.generation_seconds = ms_since(t0) / 1000.0;
    return run;
}

}  // namespace specula
