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

VerifyResult verify_sampled(const TokenTree & tree, const TargetLogits & logits, const SamplingParams & params, Rng & rng) {
    VerifyResult r;
    std::vector<float> p, q_left;
    int cur = TokenTree::kRoot;
    while (true) {
        processed_probs(logits.row_of(cur), params, p);
        // The distribution the current child was proposed from: the drafter's until a sibling is
        // rejected, then q_left, the drafter's without the rejected tokens.
        std::span<const float> q = tree.q_of(cur);
        const bool deterministic = q.empty();
        int next = -1;
        for (int c = tree.first_child_of(cur); c >= 0; c = tree.next_sibling[c]) {
            const int32_t t = tree.token[c];
            const float qc = deterministic ? 1.0f : q[t];
            const float pc = p[t];
            const float a = qc > 0.0f ? std::min(1.0f, pc / qc) : (pc > 0.0f ? 1.0f : 0.0f);
            const double u = rng.uniform();
            const bool accept = u < a;
            r.events.push_back({c, tree.depth[c], t, qc, pc, a, u, accept ? Outcome::Accepted : Outcome::Rejected});
            if (accept) {
                next = c;
                break;
            }
            // Residual: p <- norm(max(p - q, 0)), q a one-hot on t when the proposal was deterministic.
            double sum = 0.0;
            if (deterministic) {
                p[t] = 0.0f;
                sum = probability_sum(p);
            } else {
                sum = subtract_clamped(p, q);
            }
            if (sum > 0.0) {
                const float inv = static_cast<float>(1.0 / sum);
                for (float & x : p) x *= inv;
            } else {  // p <= q everywhere: only reachable through rounding, where p == q
                processed_probs(logits.row_of(cur), params, p);
            }
            if (!deterministic && tree.next_sibling[c] >= 0) {  // the next sibling was proposed from q without t
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
            r.bonus = tree.first_child_of(cur) < 0;
            r.next_token = sample_from(p, rng);
            const int d = cur == TokenTree::kRoot ? 1 : tree.depth[cur] + 1;
            r.events.push_back({-1, d, r.next_token, 0.0f, p[r.next_token], 1.0f, -1.0,
                                r.bonus ? Outcome::Bonus : Outcome::Correction});
            return r;
        }
        r.accepted.push_back(next);
        cur = next;
    }
}

}  // namespace specula
