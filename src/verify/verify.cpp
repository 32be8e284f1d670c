#include "verify/verify.h"

#include <algorithm>

namespace specula {

const char * outcome_name(Outcome o) {
    switch (o) {
        case Outcome::Accepted: return "accepted";
        case Outcome::Rejected: return "rejected";
        case Outcome::Correction: return "correction";
        case Outcome::Bonus: return "bonus";
    }
    return "?";
}

VerifyResult verify_greedy(const TokenTree & tree, const TargetLogits & logits) {
    VerifyResult r;
    int cur = TokenTree::kRoot;
    while (true) {
        const int32_t want = logits.argmax_of(cur);
        int next = -1;
        for (int c = tree.first_child_of(cur); c >= 0; c = tree.next_sibling[c]) {
            const bool match = tree.token[c] == want;
            r.events.push_back({c, tree.depth[c], tree.token[c], 1.0f, match ? 1.0f : 0.0f, match ? 1.0f : 0.0f, -1.0,
                                match ? Outcome::Accepted : Outcome::Rejected});
            if (match) {
                next = c;
                break;
            }
        }
        if (next < 0) {
            r.bonus = tree.first_child_of(cur) < 0;
            r.next_token = want;
            const int d = cur == TokenTree::kRoot ? 1 : tree.depth[cur] + 1;
            r.events.push_back({-1, d, want, 1.0f, 1.0f, 1.0f, -1.0, r.bonus ? Outcome::Bonus : Outcome::Correction});
            return r;
        }
        r.accepted.push_back(next);
        cur = next;
    }
}

namespace {

// A node's children in the order they are tried: those drawn from its q first, then those
// proposed one-hot, each in tree order. The order depends on nothing sampled, so every child is,
// given the siblings tried before it, distributed as the proposal the verifier holds for it.
// One-hot last: a one-hot x tried first takes p(x) from the residual the draws are then judged
// against, and a draw of x is refused outright; tried last, x catches what the draws left of p(x).
// With one draw y ~ q the chance that some child is accepted is then p(x) + sum_{y != x} min(p, q),
// against p(x) + sum_{y != x} min(p, (1 - p(x)) q) with x first.
void trial_order(const TokenTree & tree, int node, std::vector<int> & order) {
    order.clear();
    for (int pass = 0; pass < 2; ++pass) {
        for (int c = tree.first_child_of(node); c >= 0; c = tree.next_sibling[c]) {
            if (tree.proposed_one_hot(c) == (pass == 1)) order.push_back(c);
        }
    }
}

// p <- norm(p), or the target's row again when nothing is left (only reachable through rounding, where p == q).
void renormalise(std::vector<float> & p, double sum, const TargetLogits & logits, int node, const SamplingParams & params) {
    if (sum <= 0.0) return processed_probs(logits.row_of(node), params, p);
    const float inv = static_cast<float>(1.0 / sum);
    for (float & x : p) x *= inv;
}

}  // namespace

VerifyResult verify_sampled(const TokenTree & tree, const TargetLogits & logits, const SamplingParams & params, Rng & rng,
                            int64_t root_position) {
    VerifyResult r;
    std::vector<float> p, q_left;
    std::vector<int> order;
    int cur = TokenTree::kRoot;
    while (true) {
        processed_probs(logits.row_of(cur), params, p);
        const int depth = cur == TokenTree::kRoot ? 1 : tree.depth[cur] + 1;  // of the token emitted here
        // The distribution the next drawn child was proposed from: the drafter's until a drawn
        // sibling is rejected, then q_left, the drafter's without the rejected drawn tokens.
        std::span<const float> q = tree.q_of(cur);
        trial_order(tree, cur, order);
        int next = -1;
        size_t k = 0;
        for (; k < order.size() && !tree.proposed_one_hot(order[k]); ++k) {
            const int c = order[k];
            const int32_t t = tree.token[c];
            const float qc = q[t];
            const float pc = p[t];
            const float a = qc > 0.0f ? std::min(1.0f, pc / qc) : (pc > 0.0f ? 1.0f : 0.0f);
            const double u = rng.uniform();
            const bool accept = u < a;
            r.events.push_back({c, depth, t, qc, pc, a, u, accept ? Outcome::Accepted : Outcome::Rejected});
            if (accept) {
                next = c;
                break;
            }
            // Residual: p <- norm(max(p - q, 0)). A token rejected once has residual probability
            // 0, so a one-hot duplicate of a rejected draw is refused too.
            renormalise(p, subtract_clamped(p, q), logits, cur, params);
            if (k + 1 < order.size() && !tree.proposed_one_hot(order[k + 1])) {  // the next drawn sibling was proposed from q without t
                if (q.data() != q_left.data()) q_left.assign(q.begin(), q.end());
                const float qt = q_left[t];
                q_left[t] = 0.0f;
                if (qt < 1.0f) {
                    for (float & x : q_left) x /= (1.0f - qt);
                }
                q = q_left;
            }
        }
        if (next < 0) {
            // What is left of p is drawn at the position's keyed uniform, and a one-hot child is
            // accepted when it is that token: with p(x) for the first, as rejection sampling
            // would. With no drawn child tried, the token is the one plain decoding draws here,
            // whatever the one-hot children were.
            const double u = rng.at(root_position + depth);
            const int32_t drawn = sample_at(p, u);
            double left = 1.0;  // of p, after the one-hot children refused before
            for (; k < order.size(); ++k) {
                const int c = order[k];
                const int32_t t = tree.token[c];
                const bool accept = t == drawn;
                const float a = left > 0.0 ? static_cast<float>(std::min(1.0, p[t] / left)) : 0.0f;
                r.events.push_back({c, depth, t, 1.0f, p[t], a, u, accept ? Outcome::Accepted : Outcome::Rejected});
                if (accept) {
                    next = c;
                    break;
                }
                left -= p[t];
            }
            if (next < 0) {
                r.bonus = tree.first_child_of(cur) < 0;
                r.next_token = drawn;
                r.events.push_back({-1, depth, drawn, 0.0f, p[drawn], 1.0f, u, r.bonus ? Outcome::Bonus : Outcome::Correction});
                return r;
            }
        }
        r.accepted.push_back(next);
        cur = next;
    }
}

}  // namespace specula
