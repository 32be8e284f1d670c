#include "draft/lookup_graft.h"

#include <cmath>

#include "specula/error.h"

namespace specula {

LookupGraftDrafter::LookupGraftDrafter(std::unique_ptr<Drafter> model, int ngram_min, int ngram_max)
    : model_(std::move(model)), lookup_(ngram_min, ngram_max) {
    if (!model_) throw Error("prompt lookup grafts into a model drafter's trees: no model drafter given");
    name_ = std::string(model_->name()) + "+lookup";
}

void LookupGraftDrafter::start(const DraftRequest & request) {
    request_ = request;
    graft_ = request.sampling == nullptr || request.sampling->greedy();
    model_->start(request);
}

Draft LookupGraftDrafter::take() {
    Draft draft = model_->take();
    if (!graft_ || request_.budget.depth < 1) return draft;
    DraftRequest chain_request = request_;
    chain_request.budget = TreeBudget{TreeShape::Chain, request_.budget.depth, 1, request_.budget.depth};
    lookup_.start(chain_request);
    const Draft chain = lookup_.take();
    graft_chain(draft.tree, chain.tree.token, std::log(kStepProb));
    return draft;
}

int graft_chain(TokenTree & tree, std::span<const int32_t> chain, float step_logp) {
    int node = TokenTree::kRoot, added = 0;
    for (const int32_t token : chain) {
        int next = -1;
        for (int c = tree.first_child_of(node); c >= 0; c = tree.next_sibling[c]) {
            if (tree.token[c] == token) {
                next = c;
                break;
            }
        }
        if (next < 0) {
            next = tree.add(node, token, (node == TokenTree::kRoot ? 0.0f : tree.logp[node]) + step_logp);
            ++added;
        }
        node = next;
    }
    return added;
}

}  // namespace specula
