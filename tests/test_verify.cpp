// The verifiers called directly, on hand-built drafts and target distributions whose accept and
// reject decisions can be worked out by hand: greedy and sampled, chains and trees.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <vector>

#include "distribution.h"
#include "draft/lookup_graft.h"
#include "sample/sampler.h"
#include "tree/token_tree.h"
#include "verify/verify.h"

namespace specula {
namespace {

constexpr int kVocab = 4;
constexpr float kNever = -std::numeric_limits<float>::infinity();  // a logit the target never draws

// Target logits, one row per block row (row 0: the root, row i + 1: node i).
struct Logits {
    std::vector<float> data;
    void row(std::vector<float> logits) { data.insert(data.end(), logits.begin(), logits.end()); }
    // A row whose argmax is `token`.
    void argmax_row(int32_t token) {
        std::vector<float> r(kVocab, 0.0f);
        r[token] = 5.0f;
        row(r);
    }
    TargetLogits view() const { return TargetLogits{data, kVocab}; }
};

std::vector<Outcome> outcomes(const VerifyResult & r) {
    std::vector<Outcome> out;
    for (const VerifyEvent & e : r.events) out.push_back(e.outcome);
    return out;
}

SamplingParams at_temperature_1() {
    SamplingParams sp;
    sp.temperature = 1.0f;
    return sp;
}

TEST(VerifyGreedy, AChainStopsAtTheFirstTokenTheTargetDisagreesWithAndEmitsTheTargets) {
    const TokenTree chain = TokenTree::chain(std::vector<int32_t>{1, 2, 3});
    Logits l;
    l.argmax_row(1);  // root: the target wants 1, drafted 1
    l.argmax_row(3);  // after 1: wants 3, drafted 2
    l.argmax_row(0);
    l.argmax_row(0);
    const VerifyResult r = verify_greedy(chain, l.view());
    EXPECT_EQ(r.accepted, (std::vector<int>{0}));
    EXPECT_EQ(r.next_token, 3);
    EXPECT_FALSE(r.bonus);
    EXPECT_EQ(outcomes(r), (std::vector<Outcome>{Outcome::Accepted, Outcome::Rejected, Outcome::Correction}));
}

TEST(VerifyGreedy, AChainAcceptedWholeEndsWithTheTargetsBonusToken) {
    const TokenTree chain = TokenTree::chain(std::vector<int32_t>{1, 2});
    Logits l;
    l.argmax_row(1);
    l.argmax_row(2);
    l.argmax_row(3);  // after the last node
    const VerifyResult r = verify_greedy(chain, l.view());
    EXPECT_EQ(r.accepted, (std::vector<int>{0, 1}));
    EXPECT_EQ(r.next_token, 3);
    EXPECT_TRUE(r.bonus);
}

TEST(VerifyGreedy, AnEmptyDraftEmitsTheTargetsArgmaxAtTheRoot) {
    Logits l;
    l.argmax_row(2);
    const VerifyResult r = verify_greedy(TokenTree{}, l.view());
    EXPECT_TRUE(r.accepted.empty());
    EXPECT_EQ(r.next_token, 2);
}

TEST(VerifyGreedy, ATreeFollowsTheSiblingTheTargetAgreesWith) {
    TokenTree tree;
    const int a = tree.add(TokenTree::kRoot, 1, 0.0f);  // node 0
    const int b = tree.add(TokenTree::kRoot, 2, 0.0f);  // node 1, a's sibling
    tree.add(a, 3, 0.0f);                               // node 2, under the refused sibling
    const int b_child = tree.add(b, 0, 0.0f);           // node 3
    Logits l;
    l.argmax_row(2);  // root: the second sibling
    l.argmax_row(1);  // node 0's row (never reached)
    l.argmax_row(0);  // node 1: its child 0
    l.argmax_row(1);  // node 2's row (never reached)
    l.argmax_row(1);  // after node 3: no children, the bonus
    const VerifyResult r = verify_greedy(tree, l.view());
    EXPECT_EQ(r.accepted, (std::vector<int>{b, b_child}));
    EXPECT_EQ(r.next_token, 1);
    EXPECT_TRUE(r.bonus);
    EXPECT_EQ(outcomes(r), (std::vector<Outcome>{Outcome::Rejected, Outcome::Accepted, Outcome::Accepted, Outcome::Bonus}));
}

TEST(VerifySampled, ADraftDistributionEqualToTheTargetsIsAlwaysAccepted) {
    // p = q at every node: min(1, p/q) = 1, whatever the draws.
    const std::vector<float> root_logits{0.3f, 1.2f, -0.5f, 0.0f}, next_logits{-1.0f, 0.0f, 2.0f, 0.5f};
    const SamplingParams sp = at_temperature_1();
    for (uint64_t seed = 0; seed < 200; ++seed) {
        Rng draw(seed);
        std::vector<float> p_root, p_next;
        processed_probs(root_logits, sp, p_root);
        processed_probs(next_logits, sp, p_next);
        TokenTree chain = TokenTree::chain(std::vector<int32_t>{sample_from(p_root, draw), sample_from(p_next, draw)});
        chain.q = {p_root, p_next};
        Logits l;
        l.row(root_logits);
        l.row(next_logits);
        l.row(root_logits);
        Rng rng(seed);
        const VerifyResult r = verify_sampled(chain, l.view(), sp, rng, 0);
        ASSERT_EQ(r.accepted, (std::vector<int>{0, 1})) << "seed " << seed;
        EXPECT_TRUE(r.bonus);
    }
}

TEST(VerifySampled, ATokenTheTargetNeverDrawsIsRejectedAndTheCorrectionComesFromTheResidual) {
    // p = (1/2, 1/2, 0, 0), q = (1/2, 0, 1/2, 0), drafted 2: p(2) = 0 refuses it, and the residual
    // max(p - q, 0) leaves token 1 alone. Drawn from p instead, half the corrections would be 0.
    TokenTree chain = TokenTree::chain(std::vector<int32_t>{2});
    chain.q = {{0.5f, 0.0f, 0.5f, 0.0f}};
    Logits l;
    l.row({0.0f, 0.0f, kNever, kNever});
    l.row({0.0f, 0.0f, 0.0f, 0.0f});
    for (uint64_t seed = 0; seed < 100; ++seed) {
        Rng rng(seed);
        const VerifyResult r = verify_sampled(chain, l.view(), at_temperature_1(), rng, 0);
        ASSERT_TRUE(r.accepted.empty()) << "seed " << seed;
        ASSERT_EQ(r.next_token, 1) << "seed " << seed;
        EXPECT_FALSE(r.bonus);
        EXPECT_EQ(outcomes(r), (std::vector<Outcome>{Outcome::Rejected, Outcome::Correction}));
    }
}

TEST(VerifySampled, ADeterministicProposalTheTargetRefusesIsNeverTheCorrection) {
    // No q (an n-gram draft): the proposal is one-hot on 0, the target gives it p = 0; the
    // correction comes from p without token 0, here tokens 1 and 3 alike.
    const TokenTree chain = TokenTree::chain(std::vector<int32_t>{0});
    Logits l;
    l.row({kNever, 0.0f, kNever, 0.0f});
    l.row({0.0f, 0.0f, 0.0f, 0.0f});
    int ones = 0;
    for (uint64_t seed = 0; seed < 200; ++seed) {
        Rng rng(seed);
        const VerifyResult r = verify_sampled(chain, l.view(), at_temperature_1(), rng, 0);
        ASSERT_TRUE(r.accepted.empty());
        ASSERT_TRUE(r.next_token == 1 || r.next_token == 3) << "seed " << seed << ": " << r.next_token;
        ones += r.next_token == 1;
    }
    EXPECT_GT(ones, 60);
    EXPECT_LT(ones, 140);
}

TEST(VerifySampled, ATreeWithTwoSiblingsAcceptsTheOneTheTargetDraws) {
    // The root's children 2 (first) and 1, proposed without replacement from q = (0, 1/2, 1/2, 0);
    // the target draws only 1. Child 2 is refused (p = 0); the residual p is still one-hot on 1,
    // and the second child, proposed from q without 2 (one-hot on 1), is accepted with
    // min(1, 1/1) = 1. Its own child is then checked against its row.
    TokenTree tree;
    tree.add(TokenTree::kRoot, 2, std::log(0.5f));
    const int second = tree.add(TokenTree::kRoot, 1, std::log(0.5f));
    const int grandchild = tree.add(second, 3, std::log(0.5f));
    tree.q = {{0.0f, 0.5f, 0.5f, 0.0f}, {}, {0.0f, 0.0f, 0.0f, 1.0f}, {}};
    Logits l;
    l.row({kNever, 0.0f, kNever, kNever});  // root: only 1
    l.row({0.0f, 0.0f, 0.0f, 0.0f});        // node 0 (never reached)
    l.row({kNever, kNever, kNever, 0.0f});  // node 1: only 3
    l.row({0.0f, kNever, kNever, kNever});  // node 2: the bonus, only 0
    for (uint64_t seed = 0; seed < 100; ++seed) {
        Rng rng(seed);
        const VerifyResult r = verify_sampled(tree, l.view(), at_temperature_1(), rng, 0);
        ASSERT_EQ(r.accepted, (std::vector<int>{second, grandchild})) << "seed " << seed;
        EXPECT_EQ(r.next_token, 0);
        EXPECT_TRUE(r.bonus);
        EXPECT_EQ(outcomes(r), (std::vector<Outcome>{Outcome::Rejected, Outcome::Accepted, Outcome::Accepted, Outcome::Bonus}));
    }
}

TEST(VerifySampled, AcceptsWithProbabilityPOverQ) {
    // p(1) = 1/4 under q(1) = 1: accepted with probability 1/4, which the recorded draws show.
    TokenTree chain = TokenTree::chain(std::vector<int32_t>{1});
    chain.q = {{0.0f, 1.0f, 0.0f, 0.0f}};
    Logits l;
    l.row({0.0f, 0.0f, 0.0f, 0.0f});
    l.row({0.0f, 0.0f, 0.0f, 0.0f});
    int accepted = 0;
    for (uint64_t seed = 0; seed < 400; ++seed) {
        Rng rng(seed);
        const VerifyResult r = verify_sampled(chain, l.view(), at_temperature_1(), rng, 0);
        const VerifyEvent & e = r.events.front();
        EXPECT_NEAR(e.accept_prob, 0.25f, 1e-6f);
        EXPECT_EQ(r.accepted.size() == 1, e.draw < 0.25) << "seed " << seed;
        if (r.accepted.empty()) {
            EXPECT_NE(r.next_token, 1) << "the residual has no mass on the refused token";
        }
        accepted += static_cast<int>(r.accepted.size());
    }
    EXPECT_GT(accepted, 60);
    EXPECT_LT(accepted, 140);
}

// A grafted one-hot token x = 1 beside one draw y ~ q that proposes x most of the time
// (q(1) = 0.9, p(1) = 0.5). Tried after the draw, x catches what the draw left of p(1): some child
// is accepted with p(x) + sum_{y != x} min(p(y), q(y)) = 0.6. Tried first, x would take p(1) from
// the residual and a draw of 1 would be refused: 0.5 + sum_{y != x} min(p(y), 0.5 q(y)) = 0.55.
TEST(VerifySampled, AGraftedTokenIsTriedAfterTheDrawsAndCatchesWhatTheyLeftOfItsProbability) {
    const std::vector<float> p = {0.2f, 0.5f, 0.2f, 0.1f}, q = {0.05f, 0.9f, 0.05f, 0.0f};
    Logits l;
    l.row({std::log(p[0]), std::log(p[1]), std::log(p[2]), std::log(p[3])});
    l.row({0.0f, 0.0f, 0.0f, 0.0f});
    l.row({0.0f, 0.0f, 0.0f, 0.0f});
    const int runs = 20000;
    int accepted = 0;
    Rng rng(99);
    for (int run = 0; run < runs; ++run) {
        TokenTree tree;
        tree.q = {q};
        const int grafted = tree.add_one_hot(TokenTree::kRoot, 1, 0.0f);  // first in tree order
        const int drawn = tree.add(TokenTree::kRoot, sample_from(q, rng), std::log(0.9f));
        const VerifyResult r = verify_sampled(tree, l.view(), at_temperature_1(), rng, run);  // a key per run
        ASSERT_EQ(r.events.front().node, drawn) << "run " << run;
        if (r.events.front().outcome == Outcome::Rejected && r.events.size() > 1) {
            ASSERT_EQ(r.events[1].node, grafted);
        }
        accepted += !r.accepted.empty();
    }
    const double rate = double(accepted) / runs;  // standard error 0.0035
    EXPECT_NEAR(rate, 0.6, 0.015);
}

// A head's tree with a prompt-lookup chain grafted beside it, as at T > 0: over a 6-token
// vocabulary the head draws two root children without replacement from q1 and one child below
// each from q2, and lookup proposes the chain 2 3 (p1(2) = 0.16, q1(2) = 0.4: the head draws 2
// too in 70% of the trees, so the duplicate is exercised). The first two emitted
// tokens (the second drawn from its row when only one is) must follow p1(a) p2(b | a).
struct GraftedTrees {
    static constexpr int kV = 6;
    const std::vector<float> root_logits = {0.2f, -0.4f, 0.0f, 0.5f, -1.0f, 0.3f};
    const std::vector<float> q1 = {0.1f, 0.1f, 0.4f, 0.05f, 0.3f, 0.05f};
    const std::vector<int32_t> chain = {2, 3};
    // Target and head rows below a first token a: a's own shape, rotated.
    std::vector<float> logits_after(int32_t a) const {
        std::vector<float> r(kV);
        for (int i = 0; i < kV; ++i) r[i] = root_logits[(i + a + 1) % kV] * 1.5f;
        return r;
    }
    std::vector<float> q2_after(int32_t a) const {
        std::vector<float> q(kV);
        for (int i = 0; i < kV; ++i) q[i] = q1[(i + 2 * a) % kV];
        return q;
    }
    static int32_t draw(std::vector<float> q, Rng & rng) { return sample_from(q, rng); }

    TokenTree tree(Rng & rng, bool sampled) const {
        TokenTree t;
        t.q.push_back(q1);
        std::vector<float> left = q1;
        for (int k = 0; k < 2; ++k) {
            const int32_t a = draw(left, rng);
            left[a] = 0.0f;  // sample_from renormalises
            t.add(TokenTree::kRoot, a, std::log(q1[a]));
        }
        for (int node : t.children(TokenTree::kRoot)) {
            const std::vector<float> q2 = q2_after(t.token[node]);
            t.q.resize(t.size() + 1);
            t.q[node + 1] = q2;
            t.add(node, draw(q2, rng), t.logp[node] + std::log(0.5f));
        }
        graft_chain(t, chain, std::vector<float>{std::log(0.5f), std::log(0.5f)}, 0.0f, sampled);
        return t;
    }
    // Observed (a, b) counts against p1(a) p2(b | a): chi-square and degrees of freedom.
    std::pair<double, int> chi2(int runs, bool sampled) const {
        SamplingParams sp;
        sp.temperature = 1.0f;
        std::vector<float> p1, p2;
        processed_probs(root_logits, sp, p1);
        std::vector<double> counts(kV * kV, 0.0);
        Rng rng(1234);
        for (int run = 0; run < runs; ++run) {
            const TokenTree t = tree(rng, sampled);
            std::vector<float> data(root_logits);
            for (int i = 0; i < t.size(); ++i) {
                const std::vector<float> row = logits_after(t.token[i]);  // below depth 1 only the third token reads it
                data.insert(data.end(), row.begin(), row.end());
            }
            const VerifyResult r = verify_sampled(t, TargetLogits{data, kV}, sp, rng, int64_t{8} * run);  // a key per run
            std::vector<int32_t> out;
            for (int node : r.accepted) out.push_back(t.token[node]);
            out.push_back(r.next_token);
            if (out.size() < 2) {
                processed_probs(logits_after(out[0]), sp, p2);
                out.push_back(sample_from(p2, rng));
            }
            counts[out[0] * kV + out[1]] += 1.0;
        }
        std::vector<test::Cell> cells;
        for (int32_t a = 0; a < kV; ++a) {
            processed_probs(logits_after(a), sp, p2);
            for (int32_t b = 0; b < kV; ++b) cells.push_back({double(p1[a]) * p2[b], counts[a * kV + b]});
        }
        return test::chi_square(cells, runs);
    }
};

// Catches: a grafted lookup token judged as if the head had drawn it (accepted with
// min(1, p/q) instead of p), merged into the head's duplicate draw, or a rejected grafted token
// left in the residual, so that the head's duplicate gets accepted after it: the control grafts
// as at T = 0 (merged, judged against the head's q), which the same test must refuse.
TEST(VerifySampled, LookupChainsGraftedBesideTheHeadsDrawsFollowTheTargetDistributionAndAMergedGraftFails) {
    const GraftedTrees trees;
    Rng rng(7);
    const TokenTree t = trees.tree(rng, true);
    const int grafted = t.size() - 2;
    ASSERT_EQ(t.parent[grafted], TokenTree::kRoot);
    EXPECT_TRUE(t.proposed_one_hot(grafted));
    EXPECT_FLOAT_EQ(node_draft_prob(t, grafted), 1.0f);
    EXPECT_FALSE(t.proposed_one_hot(0));

    const int runs = 40000;
    const auto [stat, dof] = trees.chi2(runs, true);
    std::printf("[distribution] lookup chain beside the head's draws: chi2 = %.1f, dof = %d, critical = %.1f\n", stat, dof,
                test::chi2_critical(dof));
    EXPECT_LT(stat, test::chi2_critical(dof));
    const auto [merged, mdof] = trees.chi2(runs, false);
    std::printf("[distribution] lookup chain merged into the head's draws: chi2 = %.1f (critical %.1f)\n", merged,
                test::chi2_critical(mdof));
    EXPECT_GT(merged, test::chi2_critical(mdof));
}

}  // namespace
}  // namespace specula
