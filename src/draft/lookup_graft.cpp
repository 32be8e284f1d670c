#include "draft/lookup_graft.h"

#include <algorithm>
#include <cmath>

#include "sample/logits_state.h"
#include "specula/error.h"

namespace specula {

namespace {

// Lookup's chain is as deep as its chances are kept and the round verifies nodes; the tree policy
// prunes it like any branch.
int chain_depth(const TreeBudget & budget) { return std::min(LookupGraftDrafter::kMaxDepth, budget.max_nodes); }

float root_logp(const TreeBudget & budget) { return -std::log(std::max(budget.calibration, 0.05f)); }

}  // namespace

LookupGraftDrafter::LookupGraftDrafter(std::unique_ptr<Drafter> model, int ngram_min, int ngram_max,
                                       std::shared_ptr<const std::vector<int32_t>> markup)
    : model_(std::move(model)), lookup_(ngram_min, ngram_max, std::move(markup)) {
    if (!model_) throw Error("prompt lookup grafts into a model drafter's trees: no model drafter given");
    name_ = std::string(model_->name()) + "+lookup";
}

void LookupGraftDrafter::reset() {
    model_->reset();
    forget_chances();
}

int LookupGraftDrafter::keep_prefix(int n_common, int n_prompt) {
    forget_chances();
    return model_->keep_prefix(n_common, n_prompt);
}

void LookupGraftDrafter::copy_state(const Drafter & other) {
    forget_chances();
    const auto * from = dynamic_cast<const LookupGraftDrafter *>(&other);
    if (from) model_->copy_state(*from->model_);
    else model_->reset();
}

void LookupGraftDrafter::forget_chances() {
    lookup_.reset();
    unchecked_.clear();
    searched_ = ProposedChain{};
    reached_ = {};
    held_ = {};
}

double LookupGraftDrafter::step_prob(int depth) const {
    const int d = std::clamp(depth, 1, kMaxDepth) - 1;
    return (held_[d] + kPriorStepProb * kPriorChains) / (reached_[d] + kPriorChains);
}

void LookupGraftDrafter::learn(std::span<const int32_t> history) {
    for (auto it = unchecked_.begin(); it != unchecked_.end();) {
        if (history.size() < it->root) {  // the text was rewound past this chain's root
            it = unchecked_.erase(it);
            continue;
        }
        const size_t seen = std::min(it->tokens.size(), history.size() - it->root);
        size_t held = 0;
        while (held < seen && history[it->root + held] == it->tokens[held]) ++held;
        if (held == seen && seen < it->tokens.size()) {  // holds so far: wait for more text
            ++it;
            continue;
        }
        for (size_t d = 0; d <= held && d < it->tokens.size() && d < kMaxDepth; ++d) {
            reached_[d] = kDecay * reached_[d] + 1.0;
            held_[d] = kDecay * held_[d] + (d < held ? 1.0 : 0.0);
        }
        it = unchecked_.erase(it);
    }
}

std::vector<int32_t> LookupGraftDrafter::lookup_chain(const DraftRequest & request, int depth) {
    if (depth < 1) return {};
    // A round may ask twice (its free draft weighed, then the model's draft grafted): one search,
    // one chain to check, as deep as lookup's chances are kept.
    if (searched_.root != request.history.size()) {
        learn(request.history);
        DraftRequest chain_request = request;
        chain_request.budget = TreeBudget{TreeShape::Chain, kMaxDepth, 1, kMaxDepth};
        // Sampled, the model drafter's draws depend on which rounds it drafted, which lookup's
        // chains decide: a seeded request's text must not depend on other requests.
        if (request.sampled()) lookup_.start_from_history(chain_request);
        else lookup_.start(chain_request);
        searched_ = ProposedChain{request.history.size(), lookup_.take().tree.token};
        if (!searched_.tokens.empty()) {
            if (unchecked_.size() >= kMaxUnchecked) unchecked_.pop_front();
            unchecked_.push_back(searched_);
        }
    }
    const auto & chain = searched_.tokens;
    return {chain.begin(), chain.begin() + std::min<size_t>(chain.size(), static_cast<size_t>(depth))};
}

std::vector<float> LookupGraftDrafter::chain_logp(size_t length) const {
    std::vector<float> logp;
    for (size_t i = 0; i < length; ++i) logp.push_back(static_cast<float>(std::log(step_prob(static_cast<int>(i) + 1))));
    return logp;
}

LookupGraftDrafter::Chain LookupGraftDrafter::continuation(const DraftRequest & request) {
    const int depth = chain_depth(request.budget);
    if (request.processing) {
        std::vector<int32_t> forced = request.processing->forced_tokens(depth);
        if (!forced.empty()) {
            const size_t n = forced.size();
            return Chain{std::move(forced), std::vector<float>(n, static_cast<float>(std::log(kForcedStepProb))), true};
        }
    }
    std::vector<int32_t> chain = lookup_chain(request, depth);
    std::vector<float> logp = chain_logp(chain.size());
    return Chain{std::move(chain), std::move(logp)};
}

void LookupGraftDrafter::start(const DraftRequest & request) {
    request_ = request;
    model_->start(request);
}

Draft LookupGraftDrafter::take() {
    Draft draft = model_->take();
    const Chain chain = continuation(request_);
    // Lookup's continuation is a chain round's free chain, weighed against the model's, not grafted.
    if (request_.budget.shape == TreeShape::Chain && !chain.forced) return draft;
    const int model_nodes = draft.tree.size();
    if (graft_chain(draft.tree, chain.tokens, chain.step_logp, root_logp(request_.budget), request_.sampled()) > 0) draft.grafted_from = model_nodes;
    return draft;
}

Draft LookupGraftDrafter::free_draft(const DraftRequest & request) {
    Draft draft;
    const Chain chain = continuation(request);
    graft_chain(draft.tree, chain.tokens, chain.step_logp, root_logp(request.budget));
    if (!draft.tree.empty()) draft.grafted_from = 0;
    return draft;
}

namespace {

// graft_chain below `node`, whose path probability is `node_logp` (the chain's own for a node it
// added or followed, the model's for a draw it continues).
int graft_below(TokenTree & tree, int node, float node_logp, std::span<const int32_t> chain, std::span<const float> step_logp, bool sampled) {
    int added = 0;
    float chain_logp = node_logp;
    for (size_t i = 0; i < chain.size(); ++i) {
        chain_logp += step_logp[i];
        // Under sampling a drawn child is no proposal at probability one: the chain's token goes
        // beside the draws as a one-hot node, which the verifier tries after them.
        const bool beside_draws = sampled && !tree.q_of(node).empty();
        int next = -1;
        for (int c = tree.first_child_of(node); c >= 0; c = tree.next_sibling[c]) {
            if (tree.token[c] != chain[i]) continue;
            if (beside_draws) {
                // A draw of the chain's token: accepted, it takes the text where the chain goes, so
                // the chain goes on below it. No one-hot copy beside it: the verifier would try it
                // only after the draw was rejected, which leaves the token no residual probability.
                return added + graft_below(tree, c, tree.logp[c], chain.subspan(i + 1), step_logp.subspan(i + 1), sampled);
            }
            next = c;
            break;
        }
        if (next < 0) {
            const float logp = (node == TokenTree::kRoot ? node_logp : tree.logp[node]) + step_logp[i];
            next = beside_draws ? tree.add_one_hot(node, chain[i], logp) : tree.add(node, chain[i], logp);
            ++added;
        } else {
            // Two estimates of the same path: the likelier one prices it, and with it the lookup
            // continuation below (a repeated text the model also proposes, but doubts).
            tree.logp[next] = std::max(tree.logp[next], chain_logp);
        }
        node = next;
    }
    return added;
}

}  // namespace

int graft_chain(TokenTree & tree, std::span<const int32_t> chain, std::span<const float> step_logp, float root_logp, bool sampled) {
    if (step_logp.size() < chain.size()) throw Error("graft_chain: a step probability per chain token is needed");
    return graft_below(tree, TokenTree::kRoot, root_logp, chain, step_logp.first(chain.size()), sampled);
}

}  // namespace specula
