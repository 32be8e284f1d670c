#include "verify/path_logits.h"

#include <string>

#include "specula/error.h"

namespace specula {

void PathLogits::begin(const TokenTree & tree, const LogitsState * root) {
    tree_ = &tree;
    root_ = root;
    const int n = tree.size();
    skipped_.assign(n, 0);
    states_.reset(root);
    processed_.assign(n + 1, 0);
    if (!root) return;
    for (int i = 0; i < n; ++i) {  // parents come before their children
        const int parent = tree.parent[i];
        skipped_[i] = (parent != TokenTree::kRoot && skipped_[parent]) || !state_after(parent).allows(tree.token[i]);
    }
}

void PathLogits::set_rows(std::span<const float> raw, int n_vocab, std::span<const int> block_row) {
    raw_ = raw;
    n_vocab_ = n_vocab;
    block_row_.assign(block_row.begin(), block_row.end());
}

std::span<const float> PathLogits::raw_row(int node) const {
    const int r = block_row_.at(node + 1);
    if (r < 0) throw Error("verification read the row of node " + std::to_string(node) + ", which the forward skipped");
    return raw_.subspan(static_cast<size_t>(r) * n_vocab_, n_vocab_);
}

int32_t PathLogits::argmax(int node) {
    if (!root_ || processed_[node + 1]) return specula::argmax(row(node));
    const std::span<const float> raw = raw_row(node);
    scratch_.assign(raw.begin(), raw.end());
    return processed_argmax(state_after(node), scratch_);
}

std::span<const float> PathLogits::row(int node) {
    const std::span<const float> raw = raw_row(node);
    if (!root_) return raw;
    if (rows_.size() < processed_.size()) rows_.resize(processed_.size());
    std::vector<float> & dst = rows_[node + 1];
    if (!processed_[node + 1]) {
        dst.assign(raw.begin(), raw.end());
        state_after(node).apply(dst);
        processed_[node + 1] = 1;
    }
    return dst;
}

TargetLogits PathLogits::view() {
    return TargetLogits{raw_, n_vocab_, [this](int node) { return row(node); }, [this](int node) { return argmax(node); }};
}

}  // namespace specula
