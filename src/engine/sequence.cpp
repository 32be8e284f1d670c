#include "engine/sequence.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "specula/error.h"
#include "runtime/kv_cache.h"

namespace specula {

namespace {
using clock_type = std::chrono::steady_clock;
double ms_since(clock_type::time_point t0) { return std::chrono::duration<double, std::milli>(clock_type::now() - t0).count(); }

// Target features of the given block rows, each row the drafter's feature layers concatenated.
void gather_features(const ForwardOutput & out, std::span<const int> rows, std::vector<float> & dst) {
    dst.clear();
    for (int r : rows) out.append_tap_rows(r, 1, dst);
}

// Each node's path probability, in prune order (what TreeSizePolicy prices).
std::vector<double> path_probs(const TokenTree & tree) {
    std::vector<double> probs;
    for (int node : prune_order(tree)) probs.push_back(std::exp(double(tree.logp[node])));
    return probs;
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

Sequence::Sequence(SequenceParts parts, std::span<const int32_t> prompt, const GenerationOptions & options,
                   std::function<bool(int32_t)> is_end, int prefill_chunk)
    : p_(std::move(parts)), options_(options), is_end_(std::move(is_end)), chunk_(prefill_chunk), rng_(options.sampling.seed), history_(prompt.begin(), prompt.end()) {
    run_.speculative = true;
    run_.n_prompt = static_cast<int>(prompt.size());
    if (prompt.empty()) throw Error("empty prompt");
    if (prefill_chunk < 1) throw Error("prefill chunk must be positive");
    if (p_.cache.size() != 0) throw Error("a sequence starts on an empty KV cache");
    if (static_cast<int>(prompt.size()) >= p_.cache.capacity()) {
        throw Error("prompt is " + std::to_string(prompt.size()) + " tokens, longer than the " +
                    std::to_string(p_.cache.capacity()) + "-token context");
    }
    verify_ = p_.verify;
    if (!verify_) {
        const SamplingParams & sp = options_.sampling;
        verify_ = [sp](const TokenTree & t, const TargetLogits & l, Rng & r) {
            return sp.greedy() ? verify_greedy(t, l) : verify_sampled(t, l, sp, r);
        };
    }
    if (p_.drafter) {
        p_.drafter->reset();
        feature_layers_ = p_.drafter->feature_layers();
    }
}

bool Sequence::done() const {
    if (prefilling()) return false;
    return stopped_ || emitted_ >= options_.n_predict || p_.cache.size() >= p_.cache.capacity();
}

void Sequence::plan(const StepShare & step, bool may_draft) {
    if (done()) throw Error("plan: the sequence is done");
    const auto t0 = clock_type::now();
    if (t_start_ == clock_type::time_point{}) t_start_ = t0;
    in_prefill_block_ = prefilling();
    drafting_ = false;
    if (in_prefill_block_) {
        // The prompt minus its last token goes into the cache; the last token is the first root.
        const int n = std::min(chunk_, run_.n_prompt - 1 - prefilled_);
        block_ = ForwardBatch::causal(std::span(history_).subspan(prefilled_, n), p_.cache.size(), {});
        block_.tap_layers = feature_layers_;
        last_rows_ = 0;
        return;
    }
    if (t_gen_ == clock_type::time_point{}) t_gen_ = t0;

    step_ = step;
    base_ = p_.cache.size();
    if (p_.policy) p_.policy->at_depth(base_);
    if (p_.tree_size) p_.tree_size->at_depth(base_);
    const int room = p_.cache.capacity() - base_ - 1;
    budget_ = p_.tree;
    free_ = Draft{};
    asked_ = budget_.max_nodes;
    gated_ = !may_draft;
    if (gated_) {
        asked_ = budget_.depth = budget_.max_nodes = 0;
    } else if (budget_.shape == TreeShape::Chain) {
        asked_ = p_.policy ? p_.policy->next_length_in(step) : 0;
        const int k = std::max(0, std::min({asked_, room, options_.n_predict - emitted_ - 1}));
        budget_.depth = budget_.max_nodes = k;
        budget_.branching = 1;
    } else {
        if (p_.tree_size) {
            budget_.calibration = static_cast<float>(p_.tree_size->gamma());
            // A draft that costs no drafter forward (prompt lookup) sets the bar a model draft must beat.
            TreeBudget free_budget = budget_;
            free_budget.depth = free_budget.max_nodes = std::min(p_.tree_size->max_nodes(), room);
            free_ = p_.drafter && free_budget.depth > 0 ? p_.drafter->free_draft(DraftRequest{history_, free_budget, &options_.sampling, &rng_})
                                                        : Draft{};
            const double free_rate = free_.tree.empty() ? 0.0 : p_.tree_size->best_prefix(path_probs(free_.tree), 0.0, step, 0).rate;
            const TreeSizePolicy::Round round = p_.tree_size->plan_round(step, free_rate);
            skipped_draft_ = round == TreeSizePolicy::Round::Skip;
            budget_.max_nodes = skipped_draft_ ? 0 : round == TreeSizePolicy::Round::Explore ? 1
                                                                                             : p_.tree_size->max_nodes();
            if (round == TreeSizePolicy::Round::Explore) budget_.depth = 1;
            budget_.min_path_prob = static_cast<float>(p_.tree_size->min_path_prob(step));
            budget_.rank_bar = p_.tree_size->rank_bars(step);
        }
        budget_.max_nodes = std::min(budget_.max_nodes, room);
        budget_.depth = std::min(budget_.depth, room);
    }
    draft_ = Draft{};
    free_draft_ = false;
    if (p_.drafter && budget_.max_nodes > 0 && budget_.depth > 0) {
        p_.drafter->start(DraftRequest{history_, budget_, &options_.sampling, &rng_});
        drafting_ = true;
    } else if (skipped_draft_ && !gated_ && !free_.tree.empty()) {
        // No model draft beats the free one (or plain decoding): the free draft's rows may still pay.
        draft_ = std::move(free_);
        free_draft_ = true;
    }
    plan_ms_ = ms_since(t0);
}

Drafter * Sequence::drafting() const { return drafting_ ? p_.drafter : nullptr; }

const ForwardBatch & Sequence::block(double draft_ms, std::span<const double> level_ms) {
    if (in_prefill_block_) return block_;
    const auto t0 = clock_type::now();
    if (drafting_) {
        if (p_.drafter->pending()) throw Error("block: the draft is still waiting for a forward");
        draft_ = p_.drafter->take();
    }
    // Grafted drafts can outgrow the budget the model drafted to; the cache holds `room` more rows.
    const int room = p_.cache.capacity() - base_ - 1;
    prune_draft(draft_, room);
    draft_ms += plan_ms_;
    draft_level_ms_.assign(level_ms.begin(), level_ms.end());
    promised_ = 0.0;
    // The decision is for observers only: not built (strings and all) when nobody observes.
    const bool observed = static_cast<bool>(p_.on_round);
    if (observed) {
        decision_ = RoundDecision{budget_.shape != TreeShape::Chain ? (p_.tree_size ? "tree-size" : "fixed-tree")
                                  : p_.policy                       ? p_.policy->name()
                                                                    : "none",
                                  asked_,
                                  draft_.tree.size(),
                                  0,
                                  {}};
        if (budget_.shape == TreeShape::Chain && budget_.max_nodes < asked_) {
            decision_.why = "asked " + std::to_string(asked_) + ", room for " + std::to_string(budget_.max_nodes) + " (context or -n)";
        }
        if (budget_.shape != TreeShape::Chain && skipped_draft_) decision_.why = "no draft: not expected to beat the step's plain rate";
        if (gated_) decision_.why = "no draft: the server measured plain steps faster at this load";
    }
    if (p_.tree_size && !draft_.tree.empty()) {
        // A free draft costs no drafter level to time, and verifying none of it is a choice. A
        // model draft took a drafter level per depth of the model's own nodes (a graft goes deeper).
        int model_depth = 0;
        for (int i = 0; i < (draft_.grafted_from < 0 ? draft_.tree.size() : draft_.grafted_from); ++i) {
            model_depth = std::max(model_depth, draft_.tree.depth[i]);
        }
        const double priced_ms =
            free_draft_ ? draft_ms : p_.tree_size->observe_draft(draft_ms, model_depth, draft_level_ms_);
        const std::vector<double> probs = path_probs(draft_.tree);
        const int n = p_.tree_size->choose(probs, priced_ms, step_, free_draft_ ? 0 : 1);
        prune_draft(draft_, n);
        for (int i = 0; i < n; ++i) promised_ += probs[i];
        if (observed) {
            char why[160];
            if (free_draft_) {
                std::snprintf(why, sizeof(why), "no model draft: not expected to beat the step's plain rate; %d lookup nodes promise %.2f tokens", n,
                              promised_);
            } else {
                std::snprintf(why, sizeof(why), "calibration %.2f (accepted/promised), min path prob %.3f, %d nodes promise %.2f tokens",
                              p_.tree_size->calibration(), budget_.min_path_prob, n, promised_);
            }
            decision_.why = why;
        }
    }
    decision_.verified_nodes = draft_.tree.size();
    draft_ms_ = draft_ms + ms_since(t0);

    block_ = tree_batch(history_.back(), draft_.tree, base_);
    block_.tap_layers = feature_layers_;
    last_rows_ = block_.n_tokens();
    return block_;
}

void Sequence::commit(double forward_ms, const std::function<bool(int32_t)> & sink, int step_rows, bool verify_only_step) {
    const ForwardOutput & out = out_;
    if (step_rows < 0) step_rows = block_.n_tokens();
    last_tokens_ = 0;
    if (in_prefill_block_) {
        const int n = block_.n_tokens();
        std::vector<int> rows(n);
        for (int i = 0; i < n; ++i) rows[i] = i;
        gather_features(out, rows, features_);
        if (p_.drafter) p_.drafter->accept(Acceptance{p_.cache.size(), prefilled_, features_});
        prefilled_ += n;
        if (!prefilling()) run_.prompt_seconds = ms_since(t_start_) / 1000.0;
        return;
    }

    const auto tv = clock_type::now();
    const VerifyResult result = verify_(draft_.tree, TargetLogits{out.logits, out.n_vocab}, rng_);
    std::vector<int> kept{0};
    for (int node : result.accepted) kept.push_back(node + 1);
    p_.cache.compact(base_, kept);
    const double verify_ms = forward_ms + ms_since(tv);
    if (p_.drafter) {
        gather_features(out, kept, features_);
        p_.drafter->accept(Acceptance{static_cast<int>(history_.size() + result.accepted.size()), base_, features_});
    }

    std::vector<int32_t> tokens;
    for (int node : result.accepted) tokens.push_back(draft_.tree.token[node]);
    tokens.push_back(result.next_token);
    for (int32_t t : tokens) {
        history_.push_back(t);
        ++emitted_;
        ++last_tokens_;
        if (!sink(t) || (options_.stop_at_end_of_generation && is_end_(t)) || emitted_ >= options_.n_predict) {
            stopped_ = true;
            break;
        }
    }
    if (verify_only_step) {
        if (p_.tree_size) p_.tree_size->observe_step(step_rows, forward_ms);
        if (p_.policy) p_.policy->observe_step(step_rows, forward_ms);
    }
    // The tree policy learns the model's drafts: a graft's nodes (and a free draft) are the graft's to learn.
    const int model_nodes = draft_.grafted_from < 0 ? draft_.tree.size() : draft_.grafted_from;
    if (p_.tree_size && model_nodes > 0) {
        double promised = 0.0;
        int depth = 0, accepted = 0;
        for (int i = 0; i < model_nodes; ++i) promised += std::exp(double(draft_.tree.logp[i])), depth = std::max(depth, draft_.tree.depth[i]);
        while (accepted < static_cast<int>(result.accepted.size()) && result.accepted[accepted] < model_nodes) ++accepted;
        p_.tree_size->observe(promised, accepted, model_nodes, depth, verify_ms, step_rows);
    } else if (p_.tree_size) {
        p_.tree_size->observe_plain(step_rows, verify_ms);
    }
    run_.speculation.add_round(draft_.tree.size(), draft_.tree.max_depth(), static_cast<int>(result.accepted.size()));
    if (p_.policy) {
        p_.policy->observe({draft_.tree.size(), static_cast<int>(result.accepted.size()), draft_.mean_entropy,
                            draft_ms_ / 1000.0, verify_ms / 1000.0, step_rows});
    }
    const double commit_ms = ms_since(tv);
    run_.speculation.forward_ms += forward_ms;
    run_.speculation.draft_ms += draft_ms_;
    run_.speculation.draft_forwards += static_cast<int>(draft_level_ms_.size());
    for (double ms : draft_level_ms_) run_.speculation.draft_level_ms += ms;
    run_.speculation.commit_ms += commit_ms;
    if (p_.on_round) {
        p_.on_round(RoundInfo{run_.speculation.rounds - 1, base_, asked_, draft_ms_, verify_ms, forward_ms, commit_ms, &draft_, &result,
                              history_, decision_, draft_level_ms_});
    }
    run_.n_generated = emitted_;
    run_.generation_seconds = ms_since(t_gen_) / 1000.0;
}

RoundReport round_report(const RoundInfo & r) {
    const TokenTree & tree = r.draft->tree;
    RoundReport report{r.round, r.base, r.draft_ms, r.verify_ms, r.forward_ms, r.commit_ms, r.decision, {}, r.result->accepted, r.result->next_token, r.result->bonus, r.result->events, {}, {r.draft_level_ms.begin(), r.draft_level_ms.end()}};
    for (int i = 0; i < tree.size(); ++i) {
        report.tree.push_back(DraftNode{tree.token[i], tree.parent[i], tree.depth[i], node_draft_prob(tree, i), std::exp(tree.logp[i])});
    }
    const std::vector<int> & exits = r.draft->exit_layer;
    if (!exits.empty()) report.exit_layer.assign(exits.begin(), exits.begin() + std::min<size_t>(exits.size(), tree.size()));
    return report;
}

StepResult step_sequences(ModelRunner & target, std::span<Sequence * const> sequences,
                          const std::function<bool(size_t, int32_t)> & sink, const StepResult & previous, bool may_draft) {
    StepResult step;
    const int n = static_cast<int>(sequences.size());
    const int decoding = static_cast<int>(std::count_if(sequences.begin(), sequences.end(), [](const Sequence * s) { return !s->prefilling(); }));
    std::vector<Drafter *> drafters;
    std::vector<char> runs_forwards(sequences.size(), 0);
    for (size_t i = 0; i < sequences.size(); ++i) {
        Sequence & s = *sequences[i];
        const StepShare share = estimate_step_share(previous.verify_rows, previous.tokens, s.last_rows(), s.last_tokens(), n - 1,
                                                    decoding - (s.prefilling() ? 0 : 1));
        s.plan(share, may_draft);
        Drafter * d = s.drafting();
        if (d && d->pending()) {
            drafters.push_back(d);
            runs_forwards[i] = 1;
        }
    }
    // The drafters' forwards level by level, batched across sequences; each sequence whose drafter
    // ran forwards is charged an equal share of the time.
    const auto td = clock_type::now();
    const DraftLevels levels = run_drafts(drafters);
    step.draft_forwards = levels.forwards;
    step.drafting = static_cast<int>(drafters.size());
    const double draft_share = drafters.empty() ? 0.0 : ms_since(td) / static_cast<double>(drafters.size());
    std::vector<double> level_share = levels.level_ms;
    for (double & ms : level_share) ms /= static_cast<double>(std::max<size_t>(1, drafters.size()));
    std::vector<BatchPart> parts;
    bool verify_only = true;
    for (size_t i = 0; i < sequences.size(); ++i) {
        Sequence * s = sequences[i];
        parts.push_back(BatchPart{runs_forwards[i] ? &s->block(draft_share, level_share) : &s->block(0.0), &s->cache(), &s->output()});
        step.rows += parts.back().batch->n_tokens();
        if (!s->prefilling()) step.verify_rows += parts.back().batch->n_tokens();
        verify_only = verify_only && !s->prefilling();
    }
    const auto t0 = clock_type::now();
    target.forward_parts(parts);
    step.forward_ms = ms_since(t0);
    for (size_t i = 0; i < sequences.size(); ++i) {
        sequences[i]->commit(
            step.forward_ms, [&](int32_t t) { return sink(i, t); }, step.rows, verify_only);
        step.tokens += sequences[i]->last_tokens();
    }
    return step;
}

}  // namespace specula
