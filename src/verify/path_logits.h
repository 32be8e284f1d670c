#pragma once
// The target's rows as verification must read them under per-request logit processing
// (sample/logits_state.h): the root's row processed with the sequence's state, node i's row with
// the state after the path root..i (a node's children see the state after its token). Rows are
// processed lazily, when the verifier reads them: a grammar over a 262k-token vocabulary costs
// real time per row, and a round reads only the accepted path's rows.
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "sample/logits_state.h"
#include "tree/token_tree.h"
#include "verify/verify.h"

namespace specula {

class PathLogits {
public:
    // A round's draft, before the target's forward; `root`: the sequence's state, nullptr when
    // nothing is processed. Both must stay put until the round is verified.
    void begin(const TokenTree & tree, const LogitsState * root);
    // Per node: 1 where its token, or an ancestor's, is banned at its parent. Verification never
    // accepts such a node, so the target's forward can leave it (and its row) out.
    std::span<const char> skipped() const { return skipped_; }
    // After the forward: `raw` holds the block's rows, node i's at block row block_row[i + 1] (the
    // root's at block_row[0]), each n_vocab wide; -1 for skipped nodes.
    // The spans stay valid until the next begin().
    void set_rows(std::span<const float> raw, int n_vocab, std::span<const int> block_row);
    // A node's (TokenTree::kRoot: the root's) row as verification reads it, and that row's argmax
    // (sample/logits_state.h: processed_argmax, without processing the whole row where it can).
    std::span<const float> row(int node);
    int32_t argmax(int node);
    // The verifier's view of the rows: row() for each node it reads.
    TargetLogits view();

private:
    std::span<const float> raw_row(int node) const;
    const LogitsState & state_after(int node) { return *states_.after(node, tree_->parent, tree_->token); }

    const TokenTree * tree_ = nullptr;
    const LogitsState * root_ = nullptr;
    std::vector<char> skipped_;
    PathStates states_;
    std::span<const float> raw_;
    int n_vocab_ = 0;
    std::vector<int> block_row_;
    std::vector<std::vector<float>> rows_;  // [n + 1] processed rows (kept allocated across rounds)
    std::vector<char> processed_;           // [n + 1] whether rows_ holds this round's row
    std::vector<float> scratch_;            // argmax()'s row
};

}  // namespace specula
