// The verifiers called directly, on hand-built drafts and target distributions whose accept and
// reject decisions can be worked out by hand: greedy and sampled, chains and trees.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

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
        const VerifyResult r = verify_sampled(chain, l.view(), sp, rng);
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
        const VerifyResult r = verify_sampled(chain, l.view(), at_temperature_1(), rng);
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
        const VerifyResult r = verify_sampled(chain, l.view(), at_temperature_1(), rng);
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
        const VerifyResult r = verify_sampled(tree, l.view(), at_temperature_1(), rng);
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
        const VerifyResult r = verify_sampled(chain, l.view(), at_temperature_1(), rng);
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

}  // namespace
}  // namespace specula
