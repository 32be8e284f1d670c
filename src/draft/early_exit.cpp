#include "draft/early_exit.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "runtime/kv_cache.h"
#include "runtime/model.h"
#include "sample/sampler.h"
#include "specula/error.h"

namespace specula {

EarlyExitDecoder::EarlyExitDecoder(const Model & model, ModelRunner & runner, const ExitPredictor * predictor, bool online)
    : model_(model), runner_(runner), predictor_(predictor), online_(online), probe_(model) {
    if (&runner.network() != &model) throw Error("early exit: the runner runs another network");
}

ExitStep EarlyExitDecoder::step(KvCache & cache, int32_t token, int position, std::span<const int32_t> candidates,
                                float threshold, std::span<const int> feature_layers) {
    std::vector<int> schedule;
    if (predictor_ && !candidates.empty()) {
        schedule = online_ ? online_probe_layers(predictor_->layers(), predictor_->offline_layers(), recent_stops_) : predictor_->offline_layers();
    }
    ExitFeatureChain chain;
    std::vector<float> features(kExitFeatures);
    auto exits = [&](size_t i, std::span<const float> logits) {
        const size_t mlp = predictor_->index_of(schedule[i]);
        chain.next(logits, predictor_->offline(mlp), features);
        return predictor_->exit_probability(mlp, features) > threshold;
    };
    ExitStep r = run(cache, token, position, candidates, schedule, exits, feature_layers);
    if (online_ && !schedule.empty()) {
        recent_stops_.push_back(r.exit_layer < 0 ? model_.config().n_layer : r.exit_layer);
        if (recent_stops_.size() > static_cast<size_t>(kOnlineWindow)) recent_stops_.erase(recent_stops_.begin());
    }
    return r;
}

ExitStep EarlyExitDecoder::step_forced(KvCache & cache, int32_t token, int position, std::span<const int32_t> candidates,
                                       int exit_layer, std::span<const int> feature_layers) {
    if (exit_layer < 1 || exit_layer > model_.config().n_layer) throw Error("early exit: forced exit layer out of range");
    const int schedule[] = {exit_layer};
    return run(
        cache, token, position, candidates, schedule, [](size_t, std::span<const float>) { return true; }, feature_layers);
}

ExitStep EarlyExitDecoder::run(KvCache & cache, int32_t token, int position, std::span<const int32_t> candidates,
                               std::span<const int> schedule, const std::function<bool(size_t, std::span<const float>)> & exits,
                               std::span<const int> feature_layers) {
    const int L = model_.config().n_layer;
    const size_t E = model_.config().n_embd;
    if (!schedule.empty() && candidates.size() != kExitCandidates) {
        throw Error("early exit: " + std::to_string(kExitCandidates) + " candidates needed, got " + std::to_string(candidates.size()));
    }
    ExitStep r;
    r.features.assign(feature_layers.size() * E, 0.0f);
    probe_logits_.clear();
    std::vector<float> hidden;  // the residual state entering layer `begin`
    int begin = 0, slot = -1;

    // One segment [begin, end): taps of the feature layers it covers (and of `end` itself when
    // that is the final state, which no hidden_out returns).
    auto segment = [&](int end, bool with_logits) {
        ForwardBatch b;
        b.positions = {position};
        b.mask = BlockMask::causal(1);
        if (begin == 0) {
            b.tokens = {token};
        } else {
            b.hidden_in = hidden;
            b.kv_slot_begin = slot;
        }
        b.layer_begin = begin;
        b.layer_end = end;
        std::vector<size_t> feature_of_tap;
        for (size_t f = 0; f < feature_layers.size(); ++f) {
            if (feature_layers[f] >= begin && (feature_layers[f] < end || (end == L && feature_layers[f] == L))) {
                b.tap_layers.push_back(feature_layers[f]);
                feature_of_tap.push_back(f);
            }
        }
        const bool final_state = end == L && !with_logits;
        if (final_state && std::find(b.tap_layers.begin(), b.tap_layers.end(), L) == b.tap_layers.end()) b.tap_layers.push_back(L);
        if (with_logits) b.logit_rows = {0};
        runner_.forward(b, cache, out_);
        if (begin == 0) slot = cache.size() - 1;
        for (size_t t = 0; t < feature_of_tap.size(); ++t) {
            std::copy(out_.taps[t].begin(), out_.taps[t].end(), r.features.begin() + feature_of_tap[t] * E);
        }
        if (end < L) {
            hidden = out_.hidden_out;
        } else if (final_state) {
            const size_t t = std::find(b.tap_layers.begin(), b.tap_layers.end(), L) - b.tap_layers.begin();
            hidden = out_.taps[t];
        }
        begin = end;
    };

    std::vector<float> logits(candidates.size());
    for (size_t i = 0; i < schedule.size(); ++i) {
        segment(schedule[i], false);
        probe_.compute(hidden, candidates, logits);
        probe_logits_.push_back(logits);
        if (!exits(i, logits)) continue;
        r.exit_layer = schedule[i];
        r.token = candidates[std::max_element(logits.begin(), logits.end()) - logits.begin()];
        if (r.exit_layer < L) {
            ForwardBatch fill;
            fill.positions = {position};
            fill.mask = BlockMask::causal(1);
            fill.hidden_in = hidden;
            fill.kv_slot_begin = slot;
            fill.layer_begin = r.exit_layer;
            fill.kv_only = true;
            runner_.forward(fill, cache, out_);
        }
        for (size_t f = 0; f < feature_layers.size(); ++f) {
            if (feature_layers[f] >= r.exit_layer) std::copy(hidden.begin(), hidden.end(), r.features.begin() + f * E);
        }
        return r;
    }
    if (begin < L) {
        segment(L, true);
    } else {  // the final state was probed and did not exit: the LM head alone
        ForwardBatch head;
        head.positions = {position};
        head.mask = BlockMask::causal(1);
        head.hidden_in = hidden;
        head.kv_slot_begin = slot;
        head.layer_begin = L;
        head.logit_rows = {0};
        runner_.forward(head, cache, out_);
    }
    r.logits = out_.logits;
    r.token = static_cast<int32_t>(std::max_element(r.logits.begin(), r.logits.end()) - r.logits.begin());
    return r;
}

std::vector<int32_t> top_candidates(Drafter & drafter, std::span<const int32_t> history) {
    static const SamplingParams greedy{};
    Rng rng(0);
    DraftRequest req;
    req.history = history;
    req.budget = TreeBudget{TreeShape::Dynamic, 1, kExitCandidates, kExitCandidates, 0.0f};
    req.sampling = &greedy;
    req.rng = &rng;
    drafter.start(req);
    while (const DraftForward * f = drafter.pending()) {
        f->runner->forward(*f->part.batch, *f->part.cache, *f->part.out);
        drafter.resume();
    }
    const Draft d = drafter.take();
    std::vector<int32_t> c;
    for (int node : d.tree.children(TokenTree::kRoot)) c.push_back(d.tree.token[node]);
    if (c.size() != kExitCandidates) c.clear();
    return c;
}

void EarlyExitStats::add(int exit_layer, int n_layer, int predictor_runs) {
    exits_at.resize(n_layer + 1, 0);
    probes += predictor_runs;
    if (exit_layer < 0) ++full;
    else ++exits_at[exit_layer];
}

void EarlyExitStats::merge(const EarlyExitStats & other) {
    if (exits_at.size() < other.exits_at.size()) exits_at.resize(other.exits_at.size(), 0);
    for (size_t l = 0; l < other.exits_at.size(); ++l) exits_at[l] += other.exits_at[l];
    full += other.full;
    probed += other.probed;
    probes += other.probes;
}

int EarlyExitStats::exited() const {
    int n = 0;
    for (int c : exits_at) n += c;
    return n;
}

double EarlyExitStats::mean_exit_layer(int n_layer) const {
    double sum = static_cast<double>(full) * n_layer;
    for (size_t l = 0; l < exits_at.size(); ++l) sum += static_cast<double>(l) * exits_at[l];
    const int n = exited() + full;
    return n ? sum / n : 0.0;
}

std::string EarlyExitStats::summary(int n_layer) const {
    const int n = exited() + full;
    char head[160];
    std::snprintf(head, sizeof head, "specee: exited %d/%d (%.0f%%), mean exit layer %.1f of %d; exits by layer:", exited(), n,
                  n ? 100.0 * exited() / n : 0.0, mean_exit_layer(n_layer), n_layer);
    std::string s = head;
    for (size_t l = 0; l < exits_at.size(); ++l) {
        if (exits_at[l]) s += " " + std::to_string(l) + ":" + std::to_string(exits_at[l]);
    }
    char runs[64];
    std::snprintf(runs, sizeof runs, "; predictor runs per token %.2f", n ? static_cast<double>(probes) / n : 0.0);
    s += runs;
    return s;
}

EarlyExitDrafter::EarlyExitDrafter(const Model & model, const ExitPredictor & predictor, float threshold,
                                   std::unique_ptr<Drafter> candidates, int n_ctx, bool online)
    : model_(model),
      runner_(std::make_unique<ModelRunner>(model)),
      cache_(std::make_unique<KvCache>(model.backend(), model.config(), n_ctx)),
      candidates_(std::move(candidates)),
      decoder_(model, *runner_, &predictor, online),
      threshold_(threshold),
      feature_layers_(candidates_->feature_layers()) {}

EarlyExitDrafter::~EarlyExitDrafter() = default;

void EarlyExitDrafter::reset() {
    cache_->rollback(0);
    candidates_->reset();
    decoder_.begin_sequence();
}

void EarlyExitDrafter::accept(const Acceptance & a) {
    // Rows past the accepted tokens hold rejected drafts: dropped here, and the head is handed
    // back the features of the last accepted position, which predict the next root's successor
    // (else its next draft would find its features ahead of the sequence and propose nothing).
    if (cache_->size() <= a.n_valid) return;
    cache_->rollback(a.n_valid);
    const int last = a.n_valid - 1;
    if (last < draft_root_ || last - draft_root_ >= static_cast<int>(draft_features_.size())) return;
    candidates_->accept(Acceptance{a.n_valid, last, draft_features_[last - draft_root_]});
}

void EarlyExitDrafter::start(const DraftRequest & req) {
    draft_ = Draft{};
    const int root = static_cast<int>(req.history.size()) - 1;
    // Catch up at full depth on the tokens the verifier settled that this cache never ran (the
    // prompt, a fully accepted chain's last token), handing their features to the candidates.
    if (cache_->size() < root) {
        const int first = cache_->size();
        ForwardBatch b = ForwardBatch::causal(req.history.subspan(first, root - first), first, {});
        b.tap_layers = feature_layers_;
        ForwardOutput out = runner_->forward(b, *cache_);
        std::vector<float> features;
        out.append_tap_rows(0, b.n_tokens(), features);
        candidates_->accept(Acceptance{root, first, features});
    }
    std::vector<int32_t> history(req.history.begin(), req.history.end());
    const int depth = std::min(req.budget.depth, cache_->capacity() - root - 1);
    int parent = TokenTree::kRoot;
    draft_root_ = root;
    draft_features_.clear();
    for (int d = 0; d < depth; ++d) {
        const int position = static_cast<int>(history.size()) - 1;
        const std::vector<int32_t> candidates = top_candidates(*candidates_, history);
        const ExitStep step = decoder_.step(*cache_, history.back(), position, candidates, threshold_, feature_layers_);
        candidates_->accept(Acceptance{position + 1, position, step.features});
        draft_features_.push_back(step.features);
        stats_.add(step.exit_layer, model_.config().n_layer, static_cast<int>(decoder_.probe_logits().size()));
        parent = draft_.tree.add(parent, step.token, 0.0f);
        draft_.exit_layer.push_back(step.exit_layer);
        history.push_back(step.token);
        if (step.exit_layer < 0) break;  // a full-depth token ends the chain: the verifier runs it anyway
    }
}

}  // namespace specula
