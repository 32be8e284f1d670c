#include "engine/sequence.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "specula/error.h"
#include "constrain/grammar_guard.h"
#include "policy/catch_up_gate.h"
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

// The draft's first nodes that its drafter drafted (the rest grafted from prompt lookup).
int model_nodes(const Draft & draft) { return draft.grafted_from < 0 ? draft.tree.size() : draft.grafted_from; }

// [root, nodes...] as one block, without the skipped nodes: node i at position base + depth(i),
// in block row node_row[i + 1] (-1: skipped); the root in row 0.
ForwardBatch tree_batch(int32_t root, const TokenTree & tree, int base, std::span<const char> skipped, std::vector<int> & node_row) {
    ForwardBatch b;
    node_row.assign(tree.size() + 1, -1);
    node_row[0] = 0;
    b.tokens.push_back(root);
    b.positions.push_back(base);
    std::vector<int> parents{-1};
    for (int i = 0; i < tree.size(); ++i) {
        if (skipped[i]) continue;
        node_row[i + 1] = static_cast<int>(b.tokens.size());
        b.tokens.push_back(tree.token[i]);
        b.positions.push_back(base + tree.depth[i]);
        parents.push_back(node_row[tree.parent[i] + 1]);  // kRoot (-1) becomes row 0
    }
    const int n = static_cast<int>(b.tokens.size());
    b.mask = BlockMask::from_parents(parents);
    b.logit_rows.resize(n);
    for (int i = 0; i < n; ++i) b.logit_rows[i] = i;
    return b;
}
}  // namespace

Sequence::Sequence(SequenceParts parts, std::span<const int32_t> prompt, const GenerationOptions & options,
                   std::function<bool(int32_t)> is_end, int prefill_chunk)
    : p_(std::move(parts)),
      options_(options),
      is_end_(std::move(is_end)),
      chunk_(prefill_chunk),
      rng_(options.sampling.seed),
      policy_(p_.tree, p_.policy, p_.tree_size),
      history_(prompt.begin(), prompt.end()) {
    run_.speculative = true;
    run_.n_prompt = static_cast<int>(prompt.size());
    if (prompt.empty()) throw Error("empty prompt");
    if (prefill_chunk < 1) throw Error("prefill chunk must be positive");
    if (static_cast<int>(prompt.size()) >= p_.cache.capacity()) {
        throw Error("prompt is " + std::to_string(prompt.size()) + " tokens, longer than the " +
                    std::to_string(p_.cache.capacity()) + "-token context");
    }
    if (p_.cache.size() >= run_.n_prompt) {
        throw Error("the KV cache holds " + std::to_string(p_.cache.size()) + " tokens, not fewer than the " +
                    std::to_string(run_.n_prompt) + "-token prompt");
    }
    logits_state_ = logits_processing(options_, prompt, p_.tokenizer);
    verify_ = p_.verify;
    if (!verify_) {
        const SamplingParams & sp = options_.sampling;
        verify_ = [sp](const TokenTree & t, const TargetLogits & l, Rng & r, int64_t root_position) {
            return sp.greedy() ? verify_greedy(t, l) : verify_sampled(t, l, sp, r, root_position);
        };
    }
    if (options_.prompt_logprobs >= 0 && options_.on_prompt_logprob) p_.cache.rollback(0);  // every prompt row's logits are asked for
    if (p_.drafter) {
        p_.cache.rollback(std::clamp(p_.drafter->keep_prefix(p_.cache.size(), run_.n_prompt), 0, p_.cache.size()));
        feature_layers_ = p_.drafter->feature_layers();
    }
    prefilled_ = p_.cache.size();
    run_.n_cached = prefilled_;
}

int Sequence::n_exact() const { return std::min(p_.cache.size(), static_cast<int>(history_.size())); }

bool Sequence::done() const {
    if (prefilling()) return false;
    return stopped_ || emitted_ >= options_.n_predict || p_.cache.size() >= p_.cache.capacity();
}

// Draft, first half: the round policy's plan, and the drafter started on it (or the free draft
// taken, or nothing drafted). The drafter's forwards are the caller's to run, batched.
Drafter * Sequence::draft(const StepShare & step, bool may_draft) {
    if (done()) throw Error("draft: the sequence is done");
    const auto t0 = clock_type::now();
    if (t_start_ == clock_type::time_point{}) t_start_ = t0;
    round_ = Round{.prefill_block = prefilling()};
    if (round_.prefill_block) {
        // The prompt minus its last token goes into the cache; the last token is the first root.
        const int n = std::min(chunk_, run_.n_prompt - 1 - prefilled_);
        std::vector<int32_t> logit_rows;
        if (options_.prompt_logprobs >= 0 && options_.on_prompt_logprob) {
            logit_rows.resize(n);
            for (int i = 0; i < n; ++i) logit_rows[i] = i;
        }
        block_ = ForwardBatch::causal(std::span(history_).subspan(prefilled_, n), p_.cache.size(), std::move(logit_rows));
        block_.tap_layers = feature_layers_;
        last_rows_ = 0;
        return nullptr;
    }
    if (t_gen_ == clock_type::time_point{}) t_gen_ = t0;

    round_.base = p_.cache.size();
    RoundState state{.depth = round_.base,
                     .room = p_.cache.capacity() - round_.base - 1,
                     .tokens_left = options_.n_predict - emitted_ - 1,
                     .step = step,
                     .may_draft = may_draft};
    state.model_draft = model_draft_allowed(std::min(state.room, state.tokens_left));
    if (p_.drafter) {
        state.free_draft = [this](const TreeBudget & budget) {
            round_.free = p_.drafter->free_draft(DraftRequest{history_, budget, &options_.sampling, &rng_, logits_state_.get()});
            return &round_.free.tree;
        };
    }
    round_.plan = policy_.plan(state);
    if (p_.drafter && round_.plan.drafts()) {
        if (catch_up_ms_ < 0.0) catch_up_lag_ = p_.drafter->catch_up(history_);
        p_.drafter->start(DraftRequest{history_, round_.plan.budget, &options_.sampling, &rng_, logits_state_.get()});
        round_.drafting = true;
    } else if (round_.plan.use_free_draft) {
        round_.draft = std::move(round_.free);
    }
    round_.plan_ms = ms_since(t0);
    return round_.drafting ? p_.drafter : nullptr;
}

// Draft, second half: the draft taken, cut to the cache's room and sized by the round policy;
// then [root, draft nodes] as the block of the target's forward.
const ForwardBatch & Sequence::block(double draft_ms, std::span<const double> level_ms) {
    if (round_.prefill_block) return block_;
    const auto t0 = clock_type::now();
    if (round_.drafting) {
        if (p_.drafter->pending()) throw Error("block: the draft is still waiting for a forward");
        round_.draft = p_.drafter->take();
    }
    // Grafted drafts can outgrow the budget the model drafted to; the cache holds `room` more rows.
    prune_draft(round_.draft, p_.cache.capacity() - round_.base - 1);
    const int drafted = round_.draft.tree.size();
    draft_ms += round_.plan_ms;
    round_.level_ms.assign(level_ms.begin(), level_ms.end());
    prune_draft(round_.draft, policy_.size_draft(round_.draft.tree, model_nodes(round_.draft), draft_ms, round_.level_ms));
    // The decision is for observers only: not built (strings and all) when nobody observes.
    if (p_.on_round) round_.decision = policy_.decision(drafted, round_.draft.tree.size());
    round_.draft_ms = draft_ms + ms_since(t0);
    if (round_.drafting && catch_up_ms_ < 0.0) report_catch_up(round_.draft_ms);

    // Nodes the request's processing bans can never be accepted: the forward leaves them out.
    path_.begin(round_.draft.tree, logits_state_.get());
    block_ = tree_batch(history_.back(), round_.draft.tree, round_.base, path_.skipped(), round_.node_row);
    block_.tap_layers = feature_layers_;
    last_rows_ = block_.n_tokens();
    return block_;
}

// Verify, then commit: the accepted path kept, the drafter told, the tokens emitted, the round
// policy told what the round gave and cost, the round counted.
void Sequence::commit(double forward_ms, const std::function<bool(int32_t)> & sink, int step_rows, bool verify_only_step) {
    if (step_rows < 0) step_rows = block_.n_tokens();
    last_tokens_ = 0;
    if (round_.prefill_block) return commit_prompt_chunk();

    const auto tv = clock_type::now();
    const VerifyResult result = verify();
    const std::vector<int> kept = keep_accepted(result);
    const double verify_ms = forward_ms + ms_since(tv);
    if (p_.drafter) {
        gather_features(out_, kept, features_);
        p_.drafter->accept(Acceptance{static_cast<int>(history_.size() + result.accepted.size()), round_.base, features_});
    }
    emit(result, sink);
    policy_.observe(RoundOutcome{.tree = round_.draft.tree,
                                 .model_nodes = model_nodes(round_.draft),
                                 .accepted = result.accepted,
                                 .mean_entropy = round_.draft.mean_entropy,
                                 .draft_ms = round_.draft_ms,
                                 .verify_ms = verify_ms,
                                 .forward_ms = forward_ms,
                                 .step_rows = step_rows,
                                 .verify_only_step = verify_only_step});
    account(result, forward_ms, verify_ms, ms_since(tv));
    if (done()) report_reply();
}

bool Sequence::model_draft_allowed(int tokens_left) {
    if (catch_up_ == CatchUp::Undecided) {
        const bool allowed = !p_.drafter || !p_.catch_up || p_.catch_up->allow(p_.drafter->catch_up(history_), tokens_left);
        catch_up_ = allowed ? CatchUp::Allowed : CatchUp::KeptOut;
    }
    return catch_up_ == CatchUp::Allowed;
}

// The first drafting round's time is mostly the drafter's pass over what it lacked.
void Sequence::report_catch_up(double draft_ms) {
    catch_up_ms_ = draft_ms;
    if (p_.catch_up) p_.catch_up->observe_catch_up(catch_up_lag_, draft_ms);
}

// The reply's rate after the catch-up, for the gate's next requests.
void Sequence::report_reply() {
    if (reply_reported_ || !p_.catch_up || catch_up_ == CatchUp::Undecided) return;
    reply_reported_ = true;
    const double ms = 1000.0 * run_.generation_seconds - std::max(0.0, catch_up_ms_);
    p_.catch_up->observe_reply(emitted_, ms, catch_up_ == CatchUp::Allowed);
}

// The chunk's rows are in the cache; the drafter reads them (and their target features).
void Sequence::commit_prompt_chunk() {
    const int n = block_.n_tokens();
    std::vector<int> rows(n);
    for (int i = 0; i < n; ++i) rows[i] = i;
    gather_features(out_, rows, features_);
    if (p_.drafter) p_.drafter->accept(Acceptance{p_.cache.size(), prefilled_, features_});
    // Row i's logits predict the prompt's token after it, the chunk's i + 1-th.
    for (size_t i = 0; i < block_.logit_rows.size(); ++i) {
        const std::span<const float> row(out_.logits.data() + i * out_.n_vocab, out_.n_vocab);
        options_.on_prompt_logprob(token_logprob(row, history_[prefilled_ + i + 1], options_.prompt_logprobs, logprob_scratch_));
    }
    prefilled_ += n;
    if (!prefilling()) run_.prompt_seconds = ms_since(t_start_) / 1000.0;
}

// The draft against the target's logits of the block: the accepted path and the target's next token.
// Each node's row processed with the state after its path (verify/path_logits.h).
VerifyResult Sequence::verify() {
    path_.set_rows(out_.logits, out_.n_vocab, round_.node_row);
    return verify_(round_.draft.tree, path_.view(), rng_, round_.base);
}

// The cache keeps the root's and the accepted path's rows (returned, block rows); the rejected nodes' rows go.
std::vector<int> Sequence::keep_accepted(const VerifyResult & result) {
    std::vector<int> kept{0};
    for (int node : result.accepted) kept.push_back(round_.node_row[node + 1]);
    p_.cache.compact(round_.base, kept);
    return kept;
}

// The accepted tokens, then the target's own, until the sink, an end token or -n stops the sequence.
// Each token's log-probability comes from the processed row that emitted it: the root's for the
// first, then each accepted node's (the rows verification read), taken before the state moves on.
void Sequence::emit(const VerifyResult & result, const std::function<bool(int32_t)> & sink) {
    std::vector<int32_t> tokens;
    std::vector<std::span<const float>> rows;
    for (int node : result.accepted) tokens.push_back(round_.draft.tree.token[node]);
    tokens.push_back(result.next_token);
    if (options_.on_logprob) {
        for (size_t k = 0; k < tokens.size(); ++k) rows.push_back(path_.row(k == 0 ? TokenTree::kRoot : result.accepted[k - 1]));
    }
    for (size_t k = 0; k < tokens.size(); ++k) {
        const int32_t t = tokens[k];
        if (!rows.empty()) report_logprob(options_, rows[k], t, logprob_scratch_);
        if (logits_state_) logits_state_->accept(t);
        history_.push_back(t);
        ++emitted_;
        ++last_tokens_;
        if (!sink(t) || (options_.stop_at_end_of_generation && is_end_(t)) || emitted_ >= options_.n_predict) {
            stopped_ = true;
            break;
        }
    }
}

// The round into the sequence's statistics and to its observer.
void Sequence::account(const VerifyResult & result, double forward_ms, double verify_ms, double commit_ms) {
    SpeculationStats & spec = run_.speculation;
    spec.add_round(round_.draft.tree.size(), round_.draft.tree.max_depth(), static_cast<int>(result.accepted.size()));
    spec.forward_ms += forward_ms;
    spec.draft_ms += round_.draft_ms;
    spec.draft_forwards += static_cast<int>(round_.level_ms.size());
    for (double ms : round_.level_ms) spec.draft_level_ms += ms;
    spec.commit_ms += commit_ms;
    run_.n_generated = emitted_;  // before the observer, which may read stats()
    run_.generation_seconds = ms_since(t_gen_) / 1000.0;
    if (p_.on_round) {
        p_.on_round(RoundInfo{.round = spec.rounds - 1,
                              .base = round_.base,
                              .draft_length = policy_.asked(),
                              .draft_ms = round_.draft_ms,
                              .verify_ms = verify_ms,
                              .forward_ms = forward_ms,
                              .commit_ms = commit_ms,
                              .draft = &round_.draft,
                              .result = &result,
                              .history = history_,
                              .decision = round_.decision,
                              .draft_level_ms = round_.level_ms});
    }
    run_.generation_seconds = ms_since(t_gen_) / 1000.0;  // the observer's time too
}

RoundReport round_report(const RoundInfo & r) {
    const TokenTree & tree = r.draft->tree;
    RoundReport report{.round = r.round,
                       .position = r.base,
                       .draft_ms = r.draft_ms,
                       .verify_ms = r.verify_ms,
                       .forward_ms = r.forward_ms,
                       .commit_ms = r.commit_ms,
                       .decision = r.decision,
                       .tree = {},
                       .accepted = r.result->accepted,
                       .next_token = r.result->next_token,
                       .bonus = r.result->bonus,
                       .events = r.result->events,
                       .exit_layer = {},
                       .draft_level_ms = {r.draft_level_ms.begin(), r.draft_level_ms.end()}};
    for (int i = 0; i < tree.size(); ++i) {
        report.tree.push_back(DraftNode{tree.token[i], tree.parent[i], tree.depth[i], node_draft_prob(tree, i), std::exp(tree.logp[i])});
    }
    const std::vector<int> & exits = r.draft->exit_layer;
    if (!exits.empty()) report.exit_layer.assign(exits.begin(), exits.begin() + std::min<size_t>(exits.size(), tree.size()));
    return report;
}

StepResult step_sequences(ModelRunner & target, std::span<Sequence * const> sequences,
                          const std::function<bool(size_t, int32_t)> & sink, const StepResult & previous, bool may_draft,
                          std::vector<std::pair<size_t, std::string>> * grammar_failures) {
    StepResult step;
    const int n = static_cast<int>(sequences.size());
    const int decoding = static_cast<int>(std::count_if(sequences.begin(), sequences.end(), [](const Sequence * s) { return !s->prefilling(); }));

    // Draft: each sequence plans its round against what the others are expected to carry, then
    // the drafters' forwards run level by level, batched across sequences; each sequence whose
    // drafter ran forwards is charged an equal share of the time.
    std::vector<Drafter *> drafters;
    std::vector<char> runs_forwards(sequences.size(), 0);
    std::vector<char> failed(sequences.size(), 0);
    // A sequence whose grammar cannot go on leaves the step, when the caller takes its failure.
    const auto isolate = [&](size_t i, const std::function<void()> & f) {
        if (!grammar_failures) return f();
        try {
            f();
        } catch (const GrammarError & e) {
            failed[i] = 1;
            grammar_failures->emplace_back(i, e.what());
        }
    };
    for (size_t i = 0; i < sequences.size(); ++i) {
        Sequence & s = *sequences[i];
        const StepShare share = estimate_step_share(previous.verify_rows, previous.tokens, s.last_rows(), s.last_tokens(), n - 1,
                                                    decoding - (s.prefilling() ? 0 : 1));
        Drafter * d = nullptr;
        isolate(i, [&] { d = s.draft(share, may_draft); });
        if (d && d->pending()) {
            drafters.push_back(d);
            runs_forwards[i] = 1;
        }
    }
    const auto td = clock_type::now();
    const DraftLevels levels = run_drafts(drafters);
    step.draft_forwards = levels.forwards;
    step.drafting = static_cast<int>(drafters.size());
    const double draft_share = drafters.empty() ? 0.0 : ms_since(td) / static_cast<double>(drafters.size());
    std::vector<double> level_share = levels.level_ms;
    for (double & ms : level_share) ms /= static_cast<double>(std::max<size_t>(1, drafters.size()));

    // Forward: every sequence's block (prompt chunk, or root and sized draft) in one target forward.
    std::vector<BatchPart> parts;
    bool verify_only = true;
    for (size_t i = 0; i < sequences.size(); ++i) {
        Sequence * s = sequences[i];
        if (failed[i]) continue;
        parts.push_back(BatchPart{runs_forwards[i] ? &s->block(draft_share, level_share) : &s->block(0.0), &s->cache(), &s->output()});
        step.rows += parts.back().batch->n_tokens();
        if (!s->prefilling()) step.verify_rows += parts.back().batch->n_tokens();
        verify_only = verify_only && !s->prefilling();
    }
    if (parts.empty()) return step;  // every sequence's grammar failed
    const auto t0 = clock_type::now();
    target.forward_parts(parts);
    step.forward_ms = ms_since(t0);

    // Verify and commit, each sequence on its own block's logits.
    for (size_t i = 0; i < sequences.size(); ++i) {
        if (failed[i]) continue;
        isolate(i, [&] {
            sequences[i]->commit(
                step.forward_ms, [&](int32_t t) { return sink(i, t); }, step.rows, verify_only);
            step.tokens += sequences[i]->last_tokens();
        });
    }
    return step;
}

GenerationStats generate_speculative(ModelRunner & target, const SequenceParts & parts, std::span<const int32_t> prompt,
                                     const GenerationOptions & options, const std::function<bool(int32_t)> & is_end, const TokenSink & sink) {
    Sequence seq(parts, prompt, options, is_end);
    Sequence * const one[1] = {&seq};
    while (!seq.done()) step_sequences(target, one, [&](size_t, int32_t t) { return sink(t); });
    return seq.stats();
}

}  // namespace specula
