// Draft-size policies as pure functions of what they observe.
#include <gtest/gtest.h>

#include <cmath>

#include "policy/draft_length.h"
#include "policy/tree_size.h"
#include "policy/verify_cost.h"
#include "tree/tree_builder.h"

namespace specula {
namespace {

TEST(VerifyCost, ScalesTheCurveByWhatRoundsReallyCost) {
    VerifyCost v({2.0, 3.0, 4.0});
    EXPECT_EQ(v.max_tokens(), 3);
    EXPECT_DOUBLE_EQ(v.ms(2), 3.0);
    // Verification keeps costing twice the curve (at any size): the whole curve doubles.
    for (int r = 0; r < 100; ++r) v.observe(1 + r % 3, 2.0 * (2.0 + r % 3));
    EXPECT_NEAR(v.ms(1), 4.0, 1e-3);
    EXPECT_NEAR(v.ms(3), 8.0, 1e-3);
    // Beyond the measured sizes (steps shared by several sequences) the curve goes on with the
    // slope of its upper half (1 ms per token here), scaled the same way.
    EXPECT_NEAR(v.ms(5), 2.0 * 6.0, 1e-3);
    v.observe(5, 12.0);
    EXPECT_NEAR(v.ms(3), 8.0, 1e-2);
}

// Catches: a policy that drafts as if alone inside a big shared step, where every draft token
// makes all the other sequences wait (the "drafting should shrink with the batch").
TEST(CostPolicy, DraftsLessWhenTheStepIsSharedWithManySequences) {
    // A curve with a fixed base and 1 ms per row: drafting pays alone, not beside 60 other rows.
    std::vector<double> cost;
    for (int b = 1; b <= 9; ++b) cost.push_back(10.0 + b);
    auto p = make_draft_policy(DraftPolicyKind::Cost, 8, cost);
    for (int r = 0; r < 50; ++r) p->observe({1, r % 2, 1.0f, 0.0, 0.0, 0});  // half the drafts accepted; no time observed
    EXPECT_GT(p->next_length_in(StepShare{}), 0);
    EXPECT_EQ(p->next_length_in(StepShare{}), p->next_length());
    EXPECT_EQ(p->next_length_in(StepShare{60, 60.0}), 0);
    // Few others emitting many tokens (drafts accepted well) change little.
    EXPECT_GT(p->next_length_in(StepShare{2, 1.0}), 0);
}

TEST(TreeSizePolicy, VerifiesFewerNodesInASharedStep) {
    std::vector<double> cost;
    for (int b = 1; b <= 17; ++b) cost.push_back(10.0 + b);
    TreeSizePolicy p(cost);
    const std::vector<double> probs = {0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1};
    EXPECT_LT(p.choose(probs, 0.0, StepShare{60, 60.0}), p.choose(probs, 0.0));
}

TEST(TreeSizePolicy, VerifiesTheNodesThatPayForTheirVerifyCost) {
    // Verify cost: flat up to 4 tokens, then +1 ms per token.
    std::vector<double> cost = {1.0, 1.0, 1.0, 1.0};
    for (int b = 5; b <= 17; ++b) cost.push_back(cost.back() + 1.0);
    TreeSizePolicy p(cost);
    EXPECT_EQ(p.max_nodes(), 16);
    // Confident nodes are all worth verifying while the curve is flat, not beyond it.
    const std::vector<double> probs = {0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1};
    EXPECT_EQ(p.choose(probs, 0.0), 3);  // 4 tokens (root + 3) cost as much as 1
    // With a flat curve everything the draft offers is verified.
    TreeSizePolicy flat(std::vector<double>(17, 1.0));
    EXPECT_EQ(flat.choose(probs, 0.0), static_cast<int>(probs.size()));
}

TEST(TreeSizePolicy, LearnsHowOptimisticTheDraftIs) {
    std::vector<double> cost;
    for (int b = 1; b <= 9; ++b) cost.push_back(1.0 + 0.25 * (b - 1));
    TreeSizePolicy p(cost);
    const std::vector<double> probs = {0.9, 0.6, 0.5, 0.45, 0.4, 0.3};
    const int trusting = p.choose(probs, 0.5);
    EXPECT_DOUBLE_EQ(p.calibration(), 1.0);
    // The target accepted nothing of what the draft promised, round after round.
    for (int r = 0; r < 50; ++r) p.observe(2.0, 0, 3, cost[3]);
    EXPECT_LT(p.calibration(), 0.01);
    EXPECT_LT(p.choose(probs, 0.5), trusting);
    // And the drafter's forwards now need very likely paths to be worth it.
    p.observe_draft(1.0, 2);
    EXPECT_GT(p.min_path_prob(), 1.0);
}

TEST(TreeSizePolicy, MinPathProbStopsTheDynamicBuilder) {
    // Every child has probability 0.5 of its parent's path: path probs 0.5, 0.25, 0.125, ...
    auto expand = [](const TokenTree & tree, std::span<const int> frontier, std::span<const int> n) {
        std::vector<Expansion> out;
        for (size_t i = 0; i < frontier.size(); ++i) {
            Expansion e;
            for (int c = 0; c < n[i]; ++c) e.tokens.push_back(c + 1), e.logp.push_back(std::log(0.5f) - 0.01f * c);
            out.push_back(e);
            (void)tree;
        }
        return out;
    };
    TreeBudget b{TreeShape::Dynamic, 8, 2, 64};
    EXPECT_EQ(build_tree(b, expand).tree.max_depth(), 8);
    b.min_path_prob = 0.2f;  // depth-2 nodes (0.25) are expanded, depth-3 ones (0.125) are not
    EXPECT_EQ(build_tree(b, expand).tree.max_depth(), 3);
}

TEST(CostPolicy, DraftsNothingWhenDraftingCannotPay) {
    // Verifying 2 tokens costs twice 1: a draft must be accepted always to break even.
    auto p = make_draft_policy(DraftPolicyKind::Cost, 4, {1.0, 2.0, 3.0, 4.0, 5.0});
    for (int r = 0; r < 20; ++r) p->observe({1, 0, 1.0f, 0.0001, 0.002, 2});
    EXPECT_EQ(p->next_length(), 0);
    // A flat curve and a draft that is always right: the longest draft.
    auto q = make_draft_policy(DraftPolicyKind::Cost, 4, {1.0, 1.0, 1.0, 1.0, 1.0});
    for (int r = 0; r < 20; ++r) q->observe({4, 4, 0.1f, 0.0001, 0.001, 5});
    EXPECT_EQ(q->next_length(), 4);
}

}  // namespace
}  // namespace specula
