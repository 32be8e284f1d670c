#include "policy/round_policy.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

namespace specula {

namespace {
// Each node's path probability, in prune order (what TreeSizePolicy prices).
std::vector<double> path_probs(const TokenTree & tree) {
    std::vector<double> probs;
    for (int node : prune_order(tree)) probs.push_back(std::exp(double(tree.logp[node])));
    return probs;
}
}  // namespace

RoundPlan RoundPolicy::plan(const RoundState & state) {
    step_ = state.step;
    if (length_) length_->at_depth(state.depth);
    if (tree_size_) tree_size_->at_depth(state.depth);
    gated_ = !state.may_draft;
    kept_out_ = !state.model_draft;
    skipped_ = sized_ = false;
    sized_nodes_ = free_chain_nodes_ = 0;
    promised_ = 0.0;
    TreeBudget budget = shape_;
    asked_ = budget.max_nodes;
    if (gated_) {
        asked_ = budget.depth = budget.max_nodes = 0;
        plan_ = RoundPlan{budget};
    } else if (kept_out_ && budget.shape == TreeShape::Chain) {
        asked_ = 0;
        plan_ = plan_free_chain(state, false);
    } else if (kept_out_) {
        // The free draft alone, where the tree policy prices it.
        const bool has_free = offer_free_draft(state, budget) != nullptr;
        asked_ = budget.depth = budget.max_nodes = 0;
        plan_ = RoundPlan{budget};
        plan_.use_free_draft = has_free;
    } else if (budget.shape == TreeShape::Chain) {
        // The draft-length policy's length, as far as the cache and -n leave room; or the free
        // chain, where it is expected to give more per ms.
        asked_ = length_ ? length_->next_length_in(state.step) : 0;
        plan_ = plan_free_chain(state, true);
        if (!plan_.use_free_draft) {
            const int k = std::max(0, std::min({asked_, state.room, state.tokens_left}));
            budget.depth = budget.max_nodes = k;
            budget.branching = 1;
            plan_ = RoundPlan{budget};
        }
    } else {
        plan_ = plan_tree(state, budget);
    }
    return plan_;
}

RoundPlan RoundPolicy::plan_free_chain(const RoundState & state, bool model_may_draft) {
    TreeBudget budget = shape_;
    budget.depth = budget.max_nodes = 0;
    RoundPlan plan{budget};
    const int room = std::min(state.room, state.tokens_left);
    if (!length_ || !state.free_draft || room <= 0) return plan;
    budget.depth = budget.max_nodes = room;
    budget.branching = 1;
    const TokenTree * free = state.free_draft(budget);
    if (!free || free->empty()) return plan;
    std::vector<double> probs = path_probs(*free);
    probs.resize(std::min<size_t>(probs.size(), static_cast<size_t>(room)));
    free_chain_nodes_ = length_->free_chain_length(probs, state.step, model_may_draft);
    for (int i = 0; i < free_chain_nodes_; ++i) promised_ += probs[i];
    plan.use_free_draft = free_chain_nodes_ > 0;
    return plan;
}

// The free draft within the tree policy's size and the cache's room, its chances read against the
// policy's calibration; nullptr when none is offered (or there is no tree policy to price it).
const TokenTree * RoundPolicy::offer_free_draft(const RoundState & state, TreeBudget budget) const {
    if (!tree_size_ || !state.free_draft) return nullptr;
    budget.calibration = static_cast<float>(tree_size_->gamma());
    budget.depth = budget.max_nodes = std::min(tree_size_->max_nodes(), state.room);
    if (budget.depth <= 0) return nullptr;
    const TokenTree * free = state.free_draft(budget);
    return free && !free->empty() ? free : nullptr;
}

RoundPlan RoundPolicy::plan_tree(const RoundState & state, TreeBudget budget) {
    RoundPlan plan;
    if (tree_size_) {
        budget.calibration = static_cast<float>(tree_size_->gamma());
        // A draft that costs no drafter forward (prompt lookup) sets the bar a model draft must beat.
        const TokenTree * free = offer_free_draft(state, budget);
        const bool has_free = free != nullptr;
        const double free_rate = has_free ? tree_size_->best_prefix(path_probs(*free), 0.0, state.step, 0).rate : 0.0;
        const TreeSizePolicy::Round round = tree_size_->plan_round(state.step, free_rate);
        skipped_ = round == TreeSizePolicy::Round::Skip;
        budget.max_nodes = skipped_ ? 0 : round == TreeSizePolicy::Round::Explore ? 1
                                                                                  : tree_size_->max_nodes();
        if (round == TreeSizePolicy::Round::Explore) budget.depth = 1;
        budget.min_path_prob = static_cast<float>(tree_size_->min_path_prob(state.step));
        budget.rank_bar = tree_size_->rank_bars(state.step);
        // No model draft beats the free one (or plain decoding): the free draft's rows may still pay.
        plan.use_free_draft = skipped_ && has_free;
    }
    budget.max_nodes = std::min(budget.max_nodes, state.room);
    budget.depth = std::min(budget.depth, state.room);
    plan.budget = budget;
    return plan;
}

int RoundPolicy::size_draft(const TokenTree & tree, int model_nodes, double draft_ms, std::span<const double> level_ms) {
    if (free_chain_nodes_ > 0) return std::min(tree.size(), free_chain_nodes_);
    if (!tree_size_ || tree.empty()) return tree.size();
    // A free draft costs no drafter level to time, and verifying none of it is a choice. A model
    // draft took a drafter level per depth of the model's own nodes (a graft goes deeper).
    const bool free = plan_.use_free_draft;
    int model_depth = 0;
    for (int i = 0; i < model_nodes; ++i) model_depth = std::max(model_depth, tree.depth[i]);
    const double priced_ms = free ? draft_ms : tree_size_->observe_draft(draft_ms, model_depth, level_ms);
    const std::vector<double> probs = path_probs(tree);
    const int n = tree_size_->choose(probs, priced_ms, step_, free ? 0 : 1);
    sized_ = true;
    sized_nodes_ = n;
    for (int i = 0; i < n; ++i) promised_ += probs[i];
    return n;
}

void RoundPolicy::observe(const RoundOutcome & round) {
    if (round.verify_only_step) {
        if (tree_size_) tree_size_->observe_step(round.step_rows, round.forward_ms);
        if (length_) length_->observe_step(round.step_rows, round.forward_ms);
    }
    // The tree policy learns the model's drafts: a graft's nodes (and a free draft) are the graft's to learn.
    if (tree_size_ && round.model_nodes > 0) {
        double promised = 0.0;
        int depth = 0, accepted = 0;
        for (int i = 0; i < round.model_nodes; ++i) {
            promised += std::exp(double(round.tree.logp[i]));
            depth = std::max(depth, round.tree.depth[i]);
        }
        while (accepted < static_cast<int>(round.accepted.size()) && round.accepted[accepted] < round.model_nodes) ++accepted;
        tree_size_->observe(promised, accepted, round.model_nodes, depth, round.verify_ms, round.step_rows);
    } else if (tree_size_) {
        tree_size_->observe_plain(round.step_rows, round.verify_ms);
    }
    if (length_) {
        length_->observe({round.tree.size(), static_cast<int>(round.accepted.size()), round.mean_entropy, round.draft_ms / 1000.0,
                          round.verify_ms / 1000.0, round.step_rows, free_chain_nodes_ > 0});
    }
}

RoundDecision RoundPolicy::decision(int drafted_nodes, int verified_nodes) const {
    const bool chain = shape_.shape == TreeShape::Chain;
    RoundDecision d{.policy = chain ? (length_ ? length_->name() : "none") : (tree_size_ ? "tree-size" : "fixed-tree"),
                    .asked = asked_,
                    .drafted_nodes = drafted_nodes,
                    .verified_nodes = verified_nodes,
                    .why = {}};
    if (chain && plan_.budget.max_nodes < asked_) {
        d.why = "asked " + std::to_string(asked_) + ", room for " + std::to_string(plan_.budget.max_nodes) + " (context or -n)";
    }
    if (!chain && skipped_) d.why = "no draft: not expected to beat the step's plain rate";
    if (gated_) d.why = "no draft: the server measured plain steps faster at this load";
    const char * kept_out_why = "no model draft: its catch-up on the prompt costs more than the request can save";
    if (kept_out_) d.why = kept_out_why;
    if (free_chain_nodes_ > 0) {
        char why[192];
        std::snprintf(why, sizeof(why), "%s; %d lookup tokens expected to give %.2f tokens",
                      kept_out_ ? kept_out_why : "no model draft: lookup's chain expected to give more per ms", free_chain_nodes_, promised_);
        d.why = why;
    } else if (sized_) {
        char why[192];
        if (plan_.use_free_draft) {
            // Lookup's path probabilities are its chances divided by the calibration (LookupGraftDrafter):
            // times the calibration, they are the tokens the policy expects.
            std::snprintf(why, sizeof(why), "%s; %d lookup nodes expected to give %.2f tokens",
                          kept_out_ ? kept_out_why : "no model draft: not expected to beat the step's plain rate", sized_nodes_,
                          tree_size_->gamma() * promised_);
        } else {
            std::snprintf(why, sizeof(why), "calibration %.2f (accepted/promised), min path prob %.3f, %d nodes promise %.2f tokens",
                          tree_size_->calibration(), plan_.budget.min_path_prob, sized_nodes_, promised_);
        }
        d.why = why;
    }
    return d;
}

}  // namespace specula
