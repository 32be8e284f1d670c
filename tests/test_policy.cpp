// Draft-size policies as pure functions of what they observe.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "engine/generation_mode.h"
#include "policy/catch_up_gate.h"
#include "policy/draft_length.h"
#include "policy/round_policy.h"
#include "policy/speculation_gate.h"
#include "specula/error.h"
#include "policy/tree_size.h"
#include "policy/verify_cost.h"
#include "build_tree.h"
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

// The startup curve timed next to a busy neighbour (the Qwen2.5-Coder-1.5B pair on 2 Zen 4 cores):
// 2 rows as cheap as 1, 5 rows 1.48x; the rounds then cost 46 ms for 2 rows and 49 ms for 5.
const std::vector<double> kMistimedCurve = {32.6, 33.3, 46.8, 49.2, 48.2, 49.8};
double mistimed_truth(int rows) {
    const double ms[] = {36.0, 46.0, 47.5, 48.5, 49.0, 50.0};
    return ms[rows - 1];
}

// Catches: one scale for every size (rounds of 2 rows then price 5 rows at 1.41x the curve's
// 48.7 ms, 69 ms against the 49 they cost), and sizes priced by their last round alone.
TEST(VerifyCost, EachSizeIsPricedByWhatItsRoundsCost) {
    VerifyCost v(kMistimedCurve);
    for (int r = 0; r < 30; ++r) v.observe(2, mistimed_truth(2));
    EXPECT_NEAR(v.ms(2), mistimed_truth(2), 0.02 * mistimed_truth(2));
    for (int r = 0; r < 10; ++r) v.observe(5, mistimed_truth(5));
    EXPECT_NEAR(v.ms(5), mistimed_truth(5), 0.05 * mistimed_truth(5));
    EXPECT_NEAR(v.ms(2), mistimed_truth(2), 0.05 * mistimed_truth(2));
    EXPECT_NEAR(v.ms(3) / v.ms(6), kMistimedCurve[2] / kMistimedCurve[5], 1e-9) << "sizes no round verified keep the fit's shape";
    v.observe(5, 3.0 * mistimed_truth(5));  // one stalled round moves the price by a part only
    EXPECT_LT(v.ms(5), 1.5 * mistimed_truth(5));
}

// On that curve the cost policy drafted 1 token in most rounds where 4 (5 rows) were faster: 10 ms
// a drafted token, each position accepted with 0.86 given the ones before it. Catches rounds priced
// by one scale of the curve.
TEST(CostPolicy, DraftsTheLengthItsRoundsTimeFastestOnAMistimedCurve) {
    const double kAcceptance = 0.86;
    auto p = make_draft_policy(DraftPolicyKind::Cost, 4, kMistimedCurve);
    std::mt19937 gen(5);
    std::uniform_real_distribution<double> u(0.0, 1.0);
    std::vector<int> chosen(5, 0);
    for (int r = 0; r < 400; ++r) {
        const int k = p->next_length();
        int accepted = 0;
        while (accepted < k && u(gen) < kAcceptance) ++accepted;
        p->observe({k, accepted, 1.0f, k * 0.010, mistimed_truth(k + 1) / 1000.0, k + 1});
        if (r >= 200) ++chosen[k];
    }
    EXPECT_GT(chosen[4], 150) << "4 drafted tokens in " << chosen[4] << " of the last 200 rounds, 1 in " << chosen[1];
}

// Every verify row attends over the whole context: deep in a long one an extra row costs far more
// than the curve measured near its start says, and more than the one-row forward's growth
// suggests. Rounds at depth 2,000 of a curve measured at depth 100, costing (SmolLM2-135M's shape
// on a Zen 4 CPU) 2.5 us per context token for the first row and 1 us for each further row.
// Catches: a model with one scale for the whole curve (it prices 4 extra rows at depth 2,000 at
// about a third of their cost), and one that moves the curve at the depth it was measured at.
TEST(VerifyCost, ExtraRowsCostMoreDeeperInTheContext) {
    const std::vector<double> curve = {4.0, 4.1, 4.3, 4.8, 5.3, 6.5, 6.7, 7.0};
    auto truth = [&](int n, int depth) { return curve[n - 1] + (depth - 100) * (2.5e-3 + 1.0e-3 * (n - 1)); };
    VerifyCost v(curve, 100);
    for (int r = 0; r < 60; ++r) v.observe(1 + r % 5, curve[r % 5] * 1.1);  // at the measured depth: a scale only
    for (int n = 1; n <= 8; ++n) EXPECT_NEAR(v.ms(n), 1.1 * curve[n - 1], 1e-3) << n;
    v.at_depth(2000);
    for (int r = 0; r < 60; ++r) {
        const int n = 1 + 2 * (r % 3);  // plain, 3 and 5 rows, as rounds that skip, explore and draft
        v.observe(n, truth(n, 2000));
    }
    EXPECT_NEAR(v.ms(1), truth(1, 2000), 0.15 * truth(1, 2000));
    const double extra = truth(5, 2000) - truth(1, 2000);
    EXPECT_NEAR(v.extra_ms(1, 4), extra, 0.15 * extra);
    EXPECT_NEAR(v.extra_ms(1, 7), truth(8, 2000) - truth(1, 2000), 0.2 * (truth(8, 2000) - truth(1, 2000))) << "a size not observed";
}

// Deep in a long document every round verifies the same rows (one drafted node: 2 rows), and
// their time fits any split between the curve's scale and the depth term. The prior for the depth
// term, timed at startup (measure_row_depth_ms), decides that split: an extra row keeps its cost.
// Catches: a prior of 0 there (every round's time went to the scale, an extra row at depth 1,878
// was priced at 0.4 ms instead of 4.4, and the policies drafted every round at a loss).
TEST(VerifyCost, RoundsOfOneSizeKeepTheMeasuredDepthGrowthOfARow) {
    const std::vector<double> curve = {3.5, 3.6, 3.8, 4.1};
    const double row_depth_ms = 2.5e-3;  // what the startup probe measured
    auto truth = [&](int n, int depth) { return 2.7 * curve[n - 1] + row_depth_ms * (n - 1) * (depth - 128); };
    for (const double prior : {row_depth_ms, 0.0}) {
        VerifyCost v(curve, 128, prior);
        v.at_depth(1878);
        for (int r = 0; r < 60; ++r) v.observe(2, truth(2, 1878));
        EXPECT_NEAR(v.ms(2), truth(2, 1878), 0.01 * truth(2, 1878)) << "the rounds seen are priced as they cost";
        const double extra = truth(2, 1878) - truth(1, 1878);
        if (prior > 0.0) {
            EXPECT_NEAR(v.extra_ms(1, 1), extra, 0.25 * extra);
        } else {
            EXPECT_LT(v.extra_ms(1, 1), 0.25 * extra) << "without the prior (the control): the extra row looks nearly free";
        }
    }
}

// Catches: a policy that drafts as if alone inside a big shared step, where every draft token
// makes all the other sequences wait (drafting should shrink as the batch grows).
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

// The verify-cost curve `bench spec` measured for the bundled target (ms of a target forward of 1..33
// tokens at depth 152, tests/fixtures/bench-spec-bundled.json) and its draft model's
// 0.21 ms per drafted token.
const std::vector<double> kMeasuredTargetCurve = {0.824, 1.705, 1.857, 1.947, 2.261, 2.381, 2.811, 3.283, 3.284, 3.764, 3.561,
                                                  4.198, 3.916, 4.373, 4.581, 4.356, 4.952, 5.398, 5.403, 5.737, 5.948, 6.556,
                                                  6.814, 7.078, 7.571, 7.072, 7.953, 7.783, 6.984, 7.292, 7.19, 8.009, 8.167};

// Catches: a cost policy that prices its draft on its own rows' verify cost while 7 other busy
// sequences share the forward (the marginal cost of rows grows with the step's total rows on a
// measured curve), i.e. one that ignores StepShare.
TEST(CostPolicy, DraftsShorterAtEightBusySequencesOnAMeasuredCurve) {
    auto p = make_draft_policy(DraftPolicyKind::Cost, 8, kMeasuredTargetCurve);
    for (int r = 0; r < 60; ++r) {
        // 4 drafted, 2 or 3 accepted (~0.6 per position), 0.21 ms per drafted token, the curve's time.
        p->observe({4, 2 + r % 2, 1.0f, 4 * 0.21e-3, kMeasuredTargetCurve[4] / 1000.0, 5});
    }
    const int alone = p->next_length_in(StepShare{});
    ASSERT_GE(alone, 2);
    // 7 others, each drafting as much and emitting what such a round emits.
    const int others = 7;
    const StepShare busy{others * (alone + 1), others * (1.0 + 0.6 * alone)};
    EXPECT_LT(p->next_length_in(busy), alone);
}

// Catches: sequences of a step planning as if alone because the previous step did not have them
// (a first step, a sequence that just joined), or a prefilling neighbour counted as emitting, or
// its prompt chunk counted as rows the draft shares the step's time with.
TEST(StepShare, CountsAtLeastARootPerOtherDecodingSequence) {
    // Nothing before: 7 others, 5 of them decoding (2 prefilling, their chunks not counted).
    const StepShare first = estimate_step_share(0, 0, 0, 0, 7, 5);
    EXPECT_EQ(first.other_rows, 5);
    EXPECT_DOUBLE_EQ(first.other_tokens, 5.0);
    EXPECT_EQ(first.other_sequences, 7);
    // A previous step of 40 rows and 12 tokens, 5 rows and 2 tokens of them ours.
    const StepShare next = estimate_step_share(40, 12, 5, 2, 7, 7);
    EXPECT_EQ(next.other_rows, 35);
    EXPECT_DOUBLE_EQ(next.other_tokens, 10.0);
    // Alone.
    EXPECT_EQ(estimate_step_share(5, 2, 5, 2, 0, 0).other_rows, 0);
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
    for (int r = 0; r < 50; ++r) p.observe(2.0, 0, 3, 2, cost[3]);
    EXPECT_LT(p.calibration(), 0.01);
    EXPECT_LT(p.choose(probs, 0.5), trusting);
    // And the drafter's forwards now need very likely paths to be worth it.
    p.observe_draft(1.0, 2);
    EXPECT_GT(p.min_path_prob(), 1.0);
}

// Catches: a tree policy that lets a sequence of a busy step draft as if alone. Its drafter's
// forwards hold up the whole step, whose plain rate is that of every sequence together, so the
// path probability a level must promise grows with what the others emit per forward.
TEST(TreeSizePolicy, NeedsLikelierPathsInABusyStep) {
    TreeSizePolicy p(kMeasuredTargetCurve);
    p.observe_draft(0.8, 4);  // 0.2 ms per drafter level
    const double alone = p.min_path_prob();
    EXPECT_GT(alone, 0.0);
    EXPECT_DOUBLE_EQ(p.min_path_prob(StepShare{}), alone);
    // 7 others with a root row each, each emitting a token per step.
    const double busy = p.min_path_prob(StepShare{7, 7.0});
    EXPECT_NEAR(busy / alone, 8.0 * kMeasuredTargetCurve[0] / kMeasuredTargetCurve[7], 1e-9);
    EXPECT_GT(busy, 2.0 * alone);
}

// Catches: a tree policy that drafts in every round of a busy step. Sixteen sequences stepping
// together emit 16 tokens per forward of 16 rows without drafting; a round that drafts L levels
// adds L drafter forwards and its rows' verify cost to the whole step for the tokens its depths
// accept, which pays alone but not there. Skipping must not last: a round explores to keep
// learning every 8th skip alone, every 8 x 16th in a step of 16 sequences (exploring delays them
// all), and an exploring round drafts one node at one level, not a whole tree.
TEST(TreeSizePolicy, SkipsDraftingWhereTheStepsPlainRateIsHigher) {
    using Round = TreeSizePolicy::Round;
    TreeSizePolicy p(kMeasuredTargetCurve);
    EXPECT_EQ(p.plan_round(StepShare{15, 15.0}), Round::Draft);  // nothing seen yet: draft to learn
    for (int r = 0; r < 40; ++r) {
        p.observe_draft(0.3, 4);                                       // 0.075 ms per drafter level
        p.observe(3.0, r % 2 ? 3 : 2, 4, 4, kMeasuredTargetCurve[4]);  // a chain of 4 verified, 2.5 accepted
    }
    // Alone: two levels, 2.94 tokens for 0.15 + 1.857 ms, beat 1 per 0.824 ms. Busy: 16 tokens per
    // 4.47 ms beat every depth's draft (at best 3.38 tokens per ms, one level).
    EXPECT_EQ(p.plan_round(StepShare{}), Round::Draft);
    int drafted = 0, explored = 0;
    for (int r = 0; r < 16; ++r) {
        const Round round = p.plan_round(StepShare{15, 15.0});
        drafted += round == Round::Draft, explored += round == Round::Explore;
    }
    EXPECT_EQ(drafted, 0) << "a whole draft in a busy step it does not pay in";
    // (A busy step's extra row costs more of its time: rarer than every 8th where that passes 1%.)
    EXPECT_TRUE(explored == 1 || explored == 2) << "busy, the others unknown: every 8th round explores, or rarer";
    explored = 0;
    for (int r = 0; r < 256; ++r) explored += p.plan_round(StepShare{15, 15.0, 15}) == Round::Explore;
    EXPECT_TRUE(explored == 1 || explored == 2) << "busy with 15 others: every 128th round explores, or rarer";
}

// The draft yield a policy expects comes from the acceptance at each depth. Catches a policy that
// averages what whole rounds accepted: once it skips, the one-node rounds that explore can accept
// at most one token, so a yield averaged over them stays below what a draft would pay for and the
// policy never drafts again, while the first depth alone pays (SmolLM2's EAGLE-3 head on a chat
// prompt: 0.45 accepted at depth 1 for a 0.3 ms drafter level against a 2.5 ms token).
// Also catches timing a round that follows skipped ones: its drafter catches up on the skipped
// tokens first (1.9 ms here), which would price drafting out again.
TEST(TreeSizePolicy, ExploringRoundsThatAgreeBringDraftsBack) {
    using Round = TreeSizePolicy::Round;
    std::vector<double> curve;
    for (int n = 1; n <= 33; ++n) curve.push_back(2.5 * (n <= 4 ? 1.0 + 0.08 * (n - 1) : 1.24 + 0.2 * (n - 4)));
    TreeSizePolicy p(curve);
    p.observe_draft(1.8, 6);  // 0.3 ms per level
    p.observe_draft(1.8, 6);
    for (int r = 0; r < 10; ++r) p.observe(0.5, 0, 3, 3, curve[3]);  // ten deep drafts rejected outright
    int skipped = 0;
    while (p.plan_round(StepShare{}) == Round::Skip) ++skipped;
    EXPECT_GT(skipped, 0) << "drafts that all failed should pause drafting";
    // From here the explorations agree about half the time; each follows skipped rounds, so its
    // drafter time (a catch-up on the skipped tokens) is not the price of a level.
    int drafted = 0;
    for (int r = 0; r < 200; ++r) {
        const Round round = p.plan_round(StepShare{});
        if (round == Round::Skip) continue;
        drafted += round == Round::Draft;
        p.observe_draft(round == Round::Explore ? 1.9 : 0.3, 1);
        p.observe(0.45, r % 2, 1, 1, curve[1]);
    }
    EXPECT_GT(drafted, 100) << "a first depth that pays alone should bring drafting back";
}

// Exploring while skipping costs a drafter level and a verify row. On a flat curve (a chat's
// depth) that is a few percent of a forward and the policy explores every 8th skipped round; deep
// in a long document a row costs 45% of an 11.5 ms forward and the drafter level 1 ms, and
// exploring that often cost about 7% of the time. Catches: exploration at a fixed rate.
TEST(TreeSizePolicy, ExploresLessOftenWhereAnExplorationCostsMore) {
    using Round = TreeSizePolicy::Round;
    auto explorations = [](double one_ms, double row_share, double level_ms) {
        std::vector<double> curve;
        for (int n = 1; n <= 33; ++n) curve.push_back(one_ms * (1.0 + row_share * (n - 1)));
        TreeSizePolicy p(curve);
        p.observe_draft(6 * level_ms, 6);
        p.observe_draft(6 * level_ms, 6);
        for (int r = 0; r < 40; ++r) p.observe(0.5, 0, 3, 3, curve[3]);  // deep drafts rejected outright
        int explored = 0;
        for (int r = 0; r < 400; ++r) {
            const Round round = p.plan_round(StepShare{});
            EXPECT_NE(round, Round::Draft);
            if (round == Round::Skip) continue;
            ++explored;
            p.observe_draft(level_ms, 1);
            p.observe(0.5, 0, 1, 1, curve[1]);
        }
        return explored;
    };
    EXPECT_EQ(explorations(3.2, 0.02, 0.3), 400 / 8) << "a chat's depth: every 8th skipped round";
    const int deep = explorations(11.5, 0.45, 1.0);
    EXPECT_GT(deep, 0) << "deep in a document it still explores";
    EXPECT_LE(deep, 400 / 25) << "at most 2% of the skipped rounds' time";
}

// A free draft (prompt lookup: no drafter forward) is what a round gives without the model's
// draft. Catches: the model drafting (its levels, its catch-up) in rounds where the lookup chain
// alone is expected to give more tokens per ms, or best_prefix disagreeing with choose().
TEST(TreeSizePolicy, AModelDraftMustBeatTheFreeDraftToo) {
    using Round = TreeSizePolicy::Round;
    std::vector<double> curve;
    for (int n = 1; n <= 33; ++n) curve.push_back(4.0 * (1.0 + 0.1 * (n - 1)));
    TreeSizePolicy p(curve);
    p.observe_draft(1.8, 6);  // 0.3 ms a level
    p.observe_draft(1.8, 6);
    for (int r = 0; r < 20; ++r) p.observe(1.5, 1, 4, 3, curve[4]);  // the model's drafts: about one token a round
    ASSERT_EQ(p.plan_round(StepShare{}), Round::Draft);
    const std::vector<double> weak = {0.3, 0.1};
    const std::vector<double> strong = {0.95, 0.9, 0.85, 0.8, 0.76, 0.72, 0.68, 0.65};
    const TreeSizePolicy::Choice w = p.best_prefix(weak, 0.0, {}, 0), s = p.best_prefix(strong, 0.0, {}, 0);
    EXPECT_EQ(p.plan_round(StepShare{}, w.rate), Round::Draft) << "a weak chain does not stop the model";
    EXPECT_EQ(p.plan_round(StepShare{}, s.rate), Round::Skip) << "a chain that holds beats the model's draft";
    EXPECT_GT(s.nodes, 4);
    TreeSizePolicy q = p;
    EXPECT_EQ(q.choose(strong, 0.0, {}, 0), s.nodes);
    // Verifying none of a free draft is a choice: a chain unlikely to hold is not worth its rows.
    EXPECT_EQ(p.best_prefix(std::vector<double>{0.02}, 0.0, {}, 0).nodes, 0);
    EXPECT_EQ(p.best_prefix(std::vector<double>{0.02}, 0.0, {}, 1).nodes, 1);
}

// A sequence's first drafting round reads the whole prompt into the drafter first (an EAGLE-3
// head after a 1,774-token prompt: 142.8 ms in its first level, then 0.3-0.75 ms a level).
// Catches: that round timed whole as the price of a drafter level (24 ms a level), after which
// no draft could ever pay and the policy skipped every later round of the generation, and its
// tree priced with the catch-up (a sunk 146 ms made a 24-node tree look cheap).
TEST(TreeSizePolicy, AFirstRoundsPromptCatchUpIsNotTheDraftersPrice) {
    std::vector<double> curve;  // SmolLM2-135M-Instruct's shape on a Zen 4 CPU: flat to 4 tokens
    for (int n = 1; n <= 33; ++n) curve.push_back(n <= 4 ? 4.2 * (1.0 + 0.05 * (n - 1)) : 4.83 + 0.55 * (n - 4));
    TreeSizePolicy p(curve);
    const double priced = p.observe_draft(145.0, 6, std::vector<double>{142.8, 0.44, 0.44, 0.44, 0.44, 0.44});
    EXPECT_NEAR(priced, 6 * (145.0 - 142.8) / 5, 1e-9) << "the round is priced at its ordinary levels' time";
    EXPECT_NEAR(p.min_path_prob(), (145.0 - 142.8) / 5 / curve[0], 1e-9);
    for (int r = 0; r < 20; ++r) {
        ASSERT_EQ(p.plan_round(StepShare{}), TreeSizePolicy::Round::Draft) << "round " << r;
        EXPECT_DOUBLE_EQ(p.observe_draft(1.2, 4, std::vector<double>{0.35, 0.28, 0.28, 0.29}), 1.2) << "later rounds are timed and priced as they are";
        p.observe(2.0, 2, 4, 3, curve[4]);
    }
    // A one-level round after skips catches up too: not timed, priced at the usual level time.
    TreeSizePolicy q(curve);
    q.observe_draft(0.8, 4);
    EXPECT_NEAR(q.observe_draft(0.8, 4), 0.8, 1e-12);
    q.begin_sequence();
    EXPECT_NEAR(q.observe_draft(9.0, 1, std::vector<double>{9.0}), 0.2, 1e-12);
    EXPECT_NEAR(q.min_path_prob(), 0.2 / curve[0], 1e-12);
}

// A sequence's first drafting round also builds the drafter's graph for each new frontier size,
// so its later levels are slow too (SmolLM2's EAGLE-3 head on an AVX2 CPU, `specula generate` at
// T = 1: 2.37, 2.02, 1.02, 0.95, 1.01, 3.85 ms, against 0.2-0.3 ms once warm). Catches: their
// mean (1.8 ms) taken as the level time, after which a first round that drafted 2 nodes and had
// both rejected made every later round skip (one exploration in 33 rounds, never timed), and
// speculation ran slower than plain decoding; and a level time that warm rounds bring down only
// by a tenth a round.
TEST(TreeSizePolicy, AFirstRoundsColdLevelsDoNotPriceDraftingOut) {
    std::vector<double> curve;  // SmolLM2-135M-Instruct on an AVX2 Zen 4: one token 3.7 ms, 2 tokens 1.16x
    for (int n = 1; n <= 33; ++n) curve.push_back(3.7 * (n == 1 ? 1.0 : 1.16 + 0.3 * (n - 2)));
    TreeSizePolicy p(curve);
    ASSERT_EQ(p.plan_round(StepShare{}), TreeSizePolicy::Round::Draft);
    const std::vector<double> cold{2.37, 2.02, 1.02, 0.95, 1.01, 3.85};
    double total = 0.0;
    for (double ms : cold) total += ms;
    EXPECT_NEAR(p.observe_draft(total, 6, cold), 6 * 0.95, 1e-9) << "priced at its fastest ordinary level";
    p.observe(0.6, 0, 2, 2, curve[2]);  // 2 nodes, both rejected
    ASSERT_EQ(p.plan_round(StepShare{}), TreeSizePolicy::Round::Draft) << "a one-node draft still pays at 0.95 ms a level";
    // Warm rounds bring the level time down at once: three rounds of 0.25 ms a level.
    for (int r = 0; r < 3; ++r) {
        p.observe_draft(0.5, 2, std::vector<double>{0.25, 0.25});
        p.observe(0.9, 1, 2, 2, curve[2]);
        ASSERT_EQ(p.plan_round(StepShare{}), TreeSizePolicy::Round::Draft) << "round " << r;
    }
    p.begin_sequence();
    EXPECT_LT(p.observe_draft(5.0, 1, std::vector<double>{5.0}), 0.35) << "a catch-up round is priced at the warm level time";
}

// The shape measured in `specula serve` with SmolLM2 at 8 clients on an AVX-512 VNNI CPU: a
// one-row step 3.46 ms, each further row ~0.74 ms (8 rows 6.8 ms, 16 rows 12.7 ms), and 0.3 ms per
// drafter level. Alone a drafted token can pay; in a step of 8 sequences even a draft accepted
// whole cannot (8 tokens per 6.8 ms against at best 1 per 0.3 + 0.74 ms), so the policy must not
// draft there, not even every 64th round to explore: an exploring draft only slows the step.
// Catches exploration (or drafting) in a step where no draft can pay.
TEST(TreeSizePolicy, NeverDraftsWhereEvenAWhollyAcceptedDraftLoses) {
    std::vector<double> curve;
    for (int n = 1; n <= 33; ++n) curve.push_back(n <= 8 ? 3.46 + 0.477 * (n - 1) : 6.8 + 0.74 * (n - 8));
    TreeSizePolicy p(curve);
    for (int r = 0; r < 40; ++r) {
        p.observe_draft(1.2, 4);  // 0.3 ms per level
        p.observe(3.0, 3, 4, 4, curve[4]);
    }
    EXPECT_EQ(p.plan_round(StepShare{}), TreeSizePolicy::Round::Draft);
    int drafted = 0;
    for (int r = 0; r < 200; ++r) drafted += p.plan_round(StepShare{7, 7.0, 7}) != TreeSizePolicy::Round::Skip;
    EXPECT_EQ(drafted, 0) << "drafted in a step where even a wholly accepted draft is slower than plain decoding";
}

// A server slot's next request starts on the slot's policies (begin_sequence). Catches: a new
// request that drafts blind (a fresh policy drafts a whole tree in its first round, even in a
// busy step where no draft can pay: 16 such trees a rep at 8 clients), a prompt catch-up timed as
// a drafting round, and a timeless policy that carries one request's state into the next.
TEST(TreeSizePolicy, ANewSequenceKeepsTheMachinesTimes) {
    std::vector<double> curve;
    for (int n = 1; n <= 33; ++n) curve.push_back(n <= 8 ? 3.46 + 0.477 * (n - 1) : 6.8 + 0.74 * (n - 8));
    const StepShare busy{7, 7.0, 7};
    EXPECT_EQ(TreeSizePolicy(curve).plan_round(busy), TreeSizePolicy::Round::Draft) << "a fresh policy drafts to learn";
    TreeSizePolicy p(curve);
    for (int r = 0; r < 40; ++r) {
        p.observe_draft(1.2, 4);  // 0.3 ms per level
        p.observe(3.0, 3, 4, 4, curve[4]);
    }
    const double bar = p.min_path_prob();
    p.begin_sequence();
    EXPECT_EQ(p.plan_round(busy), TreeSizePolicy::Round::Skip);
    p.observe_draft(40.0, 4);  // the new sequence's first round: the drafter catching up on its prompt
    EXPECT_DOUBLE_EQ(p.min_path_prob(), bar);
    p.observe_draft(1.2, 4);  // later rounds are timed
    EXPECT_DOUBLE_EQ(p.min_path_prob(), bar);
    p.observe_draft(2.4, 4);
    EXPECT_GT(p.min_path_prob(), bar);

    auto heuristic = make_draft_policy(DraftPolicyKind::Heuristic, 8, {});
    const int first = heuristic->next_length();
    for (int r = 0; r < 8; ++r) heuristic->observe({first, first, 1.0f, 0.001, 0.002, first + 1});
    EXPECT_GT(heuristic->next_length(), first);
    heuristic->begin_sequence();
    EXPECT_EQ(heuristic->next_length(), first) << "a policy that measures no time starts over";
}

// The chain policy's probes (one token every 8th plain round alone) follow the same rule as the
// tree policy's explorations: never where even a draft accepted whole cannot pay. Catches probes
// that slowed every busy step of a server for drafts that could never pay there.
TEST(CostPolicy, NeverProbesWhereEvenAWhollyAcceptedDraftLoses) {
    std::vector<double> curve;
    for (int n = 1; n <= 33; ++n) curve.push_back(n <= 8 ? 3.46 + 0.477 * (n - 1) : 6.8 + 0.74 * (n - 8));
    auto p = make_draft_policy(DraftPolicyKind::Cost, 4, curve);
    for (int r = 0; r < 20; ++r) p->observe({1, 0, 1.0f, 0.0003, 0.004, 2});  // 0.3 ms a draft token, none accepted
    int alone = 0, busy = 0;
    for (int r = 0; r < 64; ++r) alone += p->next_length_in(StepShare{}) > 0;
    for (int r = 0; r < 200; ++r) busy += p->next_length_in(StepShare{7, 7.0, 7}) > 0;
    EXPECT_EQ(alone, 8) << "alone, a one-token probe every 8th plain round";
    EXPECT_EQ(busy, 0) << "probed in a step where even a wholly accepted draft is slower than plain decoding";
}

// A busy server's steps price extra rows above a single sequence's verify curve (each sequence's
// row reads its own keys): measured with SmolLM2, 8 sequences' steps 6.8 ms and 16 sequences'
// 12.7 ms (0.74 ms a row) where the one-sequence curve said 0.5. Once the observed steps vary in
// size their line sets the price; with steps of one size only, the curve still does. Catches the
// step line being ignored (the policy then over-drafts in busy steps) or used without evidence.
// A timed curve that dips (noise: 8 tokens timed cheaper than 3..7) is priced as the closest
// non-decreasing curve; a rising curve is kept as measured.
TEST(VerifyCost, NeverPricesMoreTokensBelowFewer) {
    const VerifyCost dipping({4.8, 5.4, 8.1, 8.9, 9.5, 9.8, 10.1, 7.3, 8.1, 9.0});
    for (int b = 2; b <= dipping.max_tokens(); ++b) EXPECT_GE(dipping.ms(b), dipping.ms(b - 1)) << b;
    EXPECT_DOUBLE_EQ(dipping.ms(1), 4.8);
    EXPECT_DOUBLE_EQ(dipping.ms(2), 5.4);
    EXPECT_DOUBLE_EQ(dipping.ms(4), 8.9);
    for (int b = 5; b <= 9; ++b) EXPECT_NEAR(dipping.ms(b), (9.5 + 9.8 + 10.1 + 7.3 + 8.1) / 5, 1e-9) << b;  // one pooled block
    EXPECT_DOUBLE_EQ(dipping.ms(10), 9.0);
    const std::vector<double> rising{4.8, 5.4, 5.9, 7.2, 9.0};
    const VerifyCost kept(rising);
    for (int b = 1; b <= 5; ++b) EXPECT_DOUBLE_EQ(kept.ms(b), rising[b - 1]);
}

TEST(VerifyCost, StepsOfManySequencesPriceExtraRows) {
    std::vector<double> curve;
    for (int n = 1; n <= 33; ++n) curve.push_back(3.46 + 0.5 * (n - 1));
    VerifyCost same_size(curve);
    for (int i = 0; i < 100; ++i) same_size.observe_step(8, 6.8);
    EXPECT_NEAR(same_size.extra_ms(8, 4), 2.0, 1e-9);
    VerifyCost varied(curve);
    for (int i = 0; i < 100; ++i) varied.observe_step(8 + (i % 9), 6.8 + 0.74 * (i % 9));
    EXPECT_NEAR(varied.extra_ms(8, 4), 4 * 0.74, 1e-6);
    VerifyCost cheaper(curve);  // a line below the curve does not lower the price
    for (int i = 0; i < 100; ++i) cheaper.observe_step(8 + (i % 9), 6.8 + 0.2 * (i % 9));
    EXPECT_NEAR(cheaper.extra_ms(8, 4), 2.0, 1e-9);
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
    EXPECT_EQ(test::build_tree(b, expand).tree.max_depth(), 8);
    b.min_path_prob = 0.2f;  // depth-2 nodes (0.25) are expanded, depth-3 ones (0.125) are not
    EXPECT_EQ(test::build_tree(b, expand).tree.max_depth(), 3);
}

// Catches: a dynamic tree drafted levels deeper than the policy then verifies. The bar of a
// rank prices that rank's verify row at the rate of the last chosen tree.
TEST(TreeSizePolicy, RankBarsPriceEachNodesVerifyRow) {
    // Verify cost: flat up to 4 tokens, then +1 ms per token.
    std::vector<double> cost = {1.0, 1.0, 1.0, 1.0};
    for (int b = 5; b <= 17; ++b) cost.push_back(cost.back() + 1.0);
    TreeSizePolicy p(cost);
    EXPECT_TRUE(p.rank_bars().empty());  // no tree chosen yet: no rate to beat
    const std::vector<double> probs = {0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1};
    ASSERT_EQ(p.choose(probs, 0.0), 3);  // 1 + 2.4 tokens for 1 ms
    const std::vector<float> bars = p.rank_bars();
    ASSERT_EQ(bars.size(), 16u);
    for (int k = 0; k < 3; ++k) EXPECT_EQ(bars[k], 0.0f) << k;          // rows 2-4 cost nothing extra
    for (int k = 3; k < 16; ++k) EXPECT_NEAR(bars[k], 3.4, 1e-5) << k;  // 1 ms at 3.4 tokens per ms
    // A draft that promised twice what the target accepted needs twice the probability.
    for (int r = 0; r < 200; ++r) p.observe(2.0, 1, 3, 2, cost[3]);
    EXPECT_NEAR(p.rank_bars()[3], 3.4 / p.calibration(), 1e-4);
}

TEST(TreeSizePolicy, RankBarsStopTheDynamicBuilder) {
    // Every child has probability 0.5 of its parent's path, slightly less for later siblings.
    auto expand = [](const TokenTree &, std::span<const int> frontier, std::span<const int> n) {
        std::vector<Expansion> out;
        for (size_t i = 0; i < frontier.size(); ++i) {
            Expansion e;
            for (int c = 0; c < n[i]; ++c) e.tokens.push_back(c + 1), e.logp.push_back(std::log(0.5f) - 0.01f * c);
            out.push_back(e);
        }
        return out;
    };
    TreeBudget b{TreeShape::Dynamic, 8, 2, 64};
    EXPECT_EQ(test::build_tree(b, expand).tree.max_depth(), 8);
    // Depth 1: 0.5 and 0.495. The first one's children would rank second (bar 0), the second
    // one's third (bar 0.499): only the first is expanded. Its children (0.25) would rank fourth,
    // behind the three likelier nodes, where the bar (0.3) is above them: the tree stops at depth 2.
    b.rank_bar = {0.0f, 0.0f, 0.499f, 0.3f, 0.3f, 0.3f, 0.3f, 0.3f};
    const TokenTree t = test::build_tree(b, expand).tree;
    EXPECT_EQ(t.max_depth(), 2);
    ASSERT_EQ(t.size(), 4);
    EXPECT_EQ(t.parent[2], 0);
    EXPECT_EQ(t.parent[3], 0);
    // Past the bars' end nothing is held back.
    b.rank_bar = {0.0f, 0.0f};
    EXPECT_EQ(test::build_tree(b, expand).tree.max_depth(), 8);
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

// Catches: a free chain (prompt lookup's) verified where the model's chain or a plain step is
// expected to give more per ms, or not verified where it gives more; a free chain's rounds
// teaching the cost policy the model's acceptance or drafting time.
TEST(CostPolicy, VerifiesAFreeChainWhereItBeatsTheModelsChainOrAPlainStep) {
    auto p = make_draft_policy(DraftPolicyKind::Cost, 4, {10.0, 11.0, 12.0, 13.0, 14.0});
    // The model's chains of 4: its first token accepted, 4 ms a drafted token.
    for (int r = 0; r < 30; ++r) p->observe({4, 1, 1.0f, 0.016, 0.014, 5});
    const int model_length = p->next_length_in(StepShare{});
    EXPECT_GT(model_length, 0);
    const std::vector<double> sure = {0.95, 0.9, 0.85, 0.8, 0.75}, unlikely = {0.05, 0.0025};
    EXPECT_EQ(p->free_chain_length(sure, StepShare{}, true), 4);  // at most the longest chain the curve prices
    EXPECT_EQ(p->free_chain_length(unlikely, StepShare{}, true), 0);
    // Kept out, the model's chain is no option: a likely first token beats the plain step alone.
    const std::vector<double> one_likely = {0.4, 0.01};
    EXPECT_EQ(p->free_chain_length(one_likely, StepShare{}, true), 0);
    EXPECT_EQ(p->free_chain_length(one_likely, StepShare{}, false), 1);
    // Free chains accepted whole or refused whole leave the model's acceptance and time as they were.
    for (int r = 0; r < 30; ++r) p->observe({4, r % 2 ? 4 : 0, 0.0f, 0.0, 0.014, 5, true});
    EXPECT_EQ(p->next_length_in(StepShare{}), model_length);
    // Neither of the other policies weighs one.
    auto fixed = make_draft_policy(DraftPolicyKind::Fixed, 4, {});
    EXPECT_EQ(fixed->free_chain_length(sure, StepShare{}, true), 0);
}

// Catches: a model draft after free chains priced without its catch-up on the tokens they emitted
// (the draft model then looks as cheap as ever while the free chains run, and each return to it
// costs a pass over those tokens), or that catch-up taken for the model's drafting time.
TEST(CostPolicy, ADraftAfterFreeChainsPaysForItsCatchUp) {
    auto p = make_draft_policy(DraftPolicyKind::Cost, 4, {10.0, 11.0, 12.0, 13.0, 14.0});
    for (int r = 0; r < 30; ++r) p->observe({4, 3, 1.0f, 0.016, 0.014, 5});  // 4 ms a drafted token
    const int model_length = p->next_length_in(StepShare{});
    const std::vector<double> lookup = {0.4, 0.2, 0.1, 0.05};
    ASSERT_EQ(p->free_chain_length(lookup, StepShare{}, true), 0);
    // Five free chains emit 25 tokens; the model's next draft of 4 takes 16 ms + 25 x 2 ms.
    for (int r = 0; r < 5; ++r) p->observe({4, 4, 0.0f, 0.0, 0.014, 5, true});
    p->observe({4, 3, 1.0f, 0.066, 0.014, 5});
    EXPECT_EQ(p->next_length_in(StepShare{}), model_length);  // its drafting time is still 4 ms a token
    EXPECT_EQ(p->free_chain_length(lookup, StepShare{}, true), 0);
    // After as many free chains again, the model's draft costs 50 ms more: lookup's chain pays.
    for (int r = 0; r < 5; ++r) p->observe({4, 4, 0.0f, 0.0, 0.014, 5, true});
    p->next_length_in(StepShare{});
    EXPECT_GT(p->free_chain_length(lookup, StepShare{}, true), 0);
}

// Drives a gate through `steps` steps at `decoding` sequences, where a drafting step emits
// `on_tokens` and a plain one `off_tokens` tokens, each in `ms` (plus `settle_ms` on the first step
// of a window that switched arm: an EAGLE head catching up). Returns the drafting steps.
int run_gate(SpeculationGate & gate, int decoding, int steps, double on_tokens, double off_tokens, double ms = 7.0,
             double settle_ms = 0.0) {
    int drafting = 0;
    bool last = true;
    for (int i = 0; i < steps; ++i) {
        const bool on = gate.allow(decoding);
        drafting += on;
        const double extra = on != last ? settle_ms : 0.0;
        last = on;
        gate.observe(decoding, static_cast<int>(on ? on_tokens : off_tokens), ms + extra);
    }
    return drafting;
}

// Catches: a server that keeps drafting at a load where plain steps are measurably faster (it
// would serve below plain decoding), or that stops drafting where drafts pay.
TEST(SpeculationGate, KeepsWhicheverOfDraftingAndPlainStepsMeasuredFaster) {
    const int window = 16, steps = window * 200;
    {
        SpeculationGate gate(window);  // plain faster: 8 tokens a step against drafting's 6
        const int drafting = run_gate(gate, 8, steps, 6, 8);
        EXPECT_GT(drafting, 2 * SpeculationGate::kMinWindows * window - 1);  // both arms were tried
        EXPECT_LT(drafting, steps / 10);
        EXPECT_NEAR(gate.rate(8, false), 8.0 / 7.0, 1e-9);
        EXPECT_NEAR(gate.rate(8, true), 6.0 / 7.0, 1e-9);
    }
    {
        SpeculationGate gate(window);  // drafting 3% faster in decode steps: not enough to pay for what they do not show
        EXPECT_LT(run_gate(gate, 8, steps, 10.3, 10), steps / 10);
    }
    {
        SpeculationGate gate(window);  // drafting faster: 4 tokens a step against 2
        const int drafting = run_gate(gate, 2, steps, 4, 2);
        EXPECT_GT(drafting, steps * 9 / 10);
        EXPECT_LT(drafting, steps);  // plain steps were measured too
    }
}

// Catches: a lone sequence gated by windows compared one after another, where its drafting rate
// swings with the text: even where plain steps measure faster, a lone sequence's policies decide,
// and its steps leave the estimates of shared loads alone.
TEST(SpeculationGate, LeavesALoneSequenceToItsPolicies) {
    SpeculationGate gate(16);
    EXPECT_EQ(run_gate(gate, 1, 16 * 100, 1, 4), 16 * 100);
    EXPECT_EQ(gate.rate(1, true), 0.0);
    EXPECT_EQ(gate.rate(1, false), 0.0);
}

// The windows among the first `windows` (after both arms' first kMinWindows) that explore the
// slower arm: the period starts at `base` and doubles after each look, up to 2^kMaxBackoff.
int expected_looks(int windows, int base) {
    int looks = 0;
    for (int w = base; w <= windows; w += base << std::min(looks, SpeculationGate::kMaxBackoff)) ++looks;
    return looks;
}

// Catches: a gate that never looks again after deciding (traffic changes: code drafts well, chat
// does not), one that looks so often that exploring costs what it saves, and one that does not
// look again soon once the traffic did change.
TEST(SpeculationGate, ExploresTheSlowerArmLessAndLessUntilTheTrafficChanges) {
    const int window = 16, windows = 640, warm = 2 * SpeculationGate::kMinWindows;
    SpeculationGate close_gate(window), far_gate(window);
    const int close_drafting = run_gate(close_gate, 8, window * windows, 9.5, 10.0) / window;
    const int far_drafting = run_gate(far_gate, 8, window * windows, 5.0, 10.0) / window;
    EXPECT_EQ(close_drafting - SpeculationGate::kMinWindows, expected_looks(windows - warm, SpeculationGate::kExploreClose));
    EXPECT_EQ(far_drafting - SpeculationGate::kMinWindows, expected_looks(windows - warm, SpeculationGate::kExploreFar));
    EXPECT_GE(expected_looks(windows - warm, SpeculationGate::kExploreFar), 3);
    // Drafting becomes twice as fast: the next look finds it, and from then on the gate drafts.
    const int longest = (SpeculationGate::kExploreFar << SpeculationGate::kMaxBackoff) + 1;
    EXPECT_GT(run_gate(far_gate, 8, window * longest, 20.0, 10.0), 0);
    EXPECT_GT(run_gate(far_gate, 8, window * 100, 20.0, 10.0), window * 95);
}

// Catches: loads mixed into one estimate (drafting pays at 2 sequences, not at 8), and the first
// steps after a switch (a head catching up, once) counted as the arm's steady rate.
TEST(SpeculationGate, LearnsEachLoadApartAndIgnoresTheSwitchsFirstSteps) {
    const int window = 16;
    SpeculationGate gate(window);
    // At 2 sequences drafting doubles the rate; switching to it costs a 100 ms catch-up once per switch.
    run_gate(gate, 2, window * 100, 4, 2, 7.0, 100.0);
    run_gate(gate, 8, window * 100, 6, 8);
    EXPECT_NEAR(gate.rate(2, true), 4.0 / 7.0, 1e-9);
    EXPECT_NEAR(gate.rate(2, false), 2.0 / 7.0, 1e-9);
    EXPECT_EQ(SpeculationGate::load_bucket(5), SpeculationGate::load_bucket(8));
    EXPECT_NE(SpeculationGate::load_bucket(8), SpeculationGate::load_bucket(9));
    EXPECT_GT(run_gate(gate, 2, window * 40, 4, 2), window * 36);
    EXPECT_LT(run_gate(gate, 8, window * 40, 6, 8), window * 4);
    EXPECT_THROW(SpeculationGate(SpeculationGate::kSettle), Error);
}

TEST(RoundPolicy, AChainIsThePolicysLengthWithinTheRoomAndTheTokensLeft) {
    auto length = make_draft_policy(DraftPolicyKind::Fixed, 5, {});
    RoundPolicy round(TreeBudget{}, length.get(), nullptr);
    const RoundPlan roomy = round.plan(RoundState{.depth = 10, .room = 100, .tokens_left = 100});
    EXPECT_EQ(roomy.budget.shape, TreeShape::Chain);
    EXPECT_EQ(roomy.budget.depth, 5);
    EXPECT_EQ(roomy.budget.max_nodes, 5);
    EXPECT_EQ(roomy.budget.branching, 1);
    EXPECT_TRUE(roomy.drafts());
    const RoundPlan tight = round.plan(RoundState{.depth = 10, .room = 100, .tokens_left = 2});
    EXPECT_EQ(tight.budget.max_nodes, 2);
    const RoundDecision d = round.decision(2, 2);
    EXPECT_STREQ(d.policy, "fixed");
    EXPECT_EQ(d.asked, 5);
    EXPECT_EQ(d.why, "asked 5, room for 2 (context or -n)");
}

TEST(RoundPolicy, AClosedGateDraftsNothingAndAsksNoPolicy) {
    auto length = make_draft_policy(DraftPolicyKind::Fixed, 5, {});
    RoundPolicy round(TreeBudget{TreeShape::Dynamic, 6, 2, 16}, length.get(), nullptr);
    int offered = 0;
    const RoundPlan plan = round.plan(RoundState{.depth = 10,
                                                 .room = 100,
                                                 .tokens_left = 100,
                                                 .may_draft = false,
                                                 .free_draft = [&](const TreeBudget &) -> const TokenTree * { return ++offered, nullptr; }});
    EXPECT_FALSE(plan.drafts());
    EXPECT_FALSE(plan.use_free_draft);
    EXPECT_EQ(offered, 0);
    EXPECT_EQ(round.decision(0, 0).why, "no draft: the server measured plain steps faster at this load");
}

TEST(RoundPolicy, AModelKeptOutVerifiesTheFreeDraftAlone) {
    VerifyCostCurve cost{{10.0, 11.0, 12.0, 13.0, 14.0}, 100, 0.0};
    const TreeBudget tree{TreeShape::Dynamic, 4, 2, 0};
    RoundPolicies policies = make_round_policies(GenerationMode::Speculative, DraftPolicyKind::Cost, 4, tree, cost);
    RoundPolicy round(tree, policies.length.get(), policies.tree_size.get());
    const TokenTree lookup = TokenTree::chain(std::vector<int32_t>{7, 8});
    int offered = 0;
    auto free_draft = [&](const TreeBudget &) -> const TokenTree * { return ++offered, &lookup; };
    const RoundPlan kept_out = round.plan(RoundState{.depth = 10, .room = 100, .tokens_left = 100, .model_draft = false, .free_draft = free_draft});
    EXPECT_FALSE(kept_out.drafts());
    EXPECT_TRUE(kept_out.use_free_draft);
    EXPECT_EQ(offered, 1);
    EXPECT_EQ(round.decision(0, 0).why, "no model draft: its catch-up on the prompt costs more than the request can save");
    // Without a free draft the round verifies the root alone; a chain under the fixed policy weighs none.
    const RoundPlan plain = round.plan(RoundState{.depth = 10, .room = 100, .tokens_left = 100, .model_draft = false});
    EXPECT_FALSE(plain.drafts());
    EXPECT_FALSE(plain.use_free_draft);
    auto fixed = make_draft_policy(DraftPolicyKind::Fixed, 4, {});
    RoundPolicy chain(TreeBudget{}, fixed.get(), nullptr);
    const RoundPlan chain_plan = chain.plan(RoundState{.depth = 10, .room = 100, .tokens_left = 100, .model_draft = false, .free_draft = free_draft});
    EXPECT_FALSE(chain_plan.drafts());
    EXPECT_FALSE(chain_plan.use_free_draft);
    // Allowed, the same state drafts with the model.
    EXPECT_TRUE(chain.plan(RoundState{.depth = 10, .room = 100, .tokens_left = 100, .free_draft = free_draft}).drafts());
}

// Catches: a chain round under the cost policy not verifying the free chain where it pays more than
// the model's chain (or verifying more of it than priced, or with no reason told), or a kept-out
// chain request verifying the root alone while lookup's chain pays.
TEST(RoundPolicy, AChainRoundVerifiesTheFreeChainWhereItPaysMoreThanTheModels) {
    VerifyCostCurve cost{{10.0, 11.0, 12.0, 13.0, 14.0}, 100, 0.0};
    RoundPolicies policies = make_round_policies(GenerationMode::Speculative, DraftPolicyKind::Cost, 4, TreeBudget{}, cost);
    RoundPolicy round(TreeBudget{}, policies.length.get(), policies.tree_size.get());
    // A model whose chains are mostly refused, at 4 ms a drafted token.
    for (int r = 0; r < 30; ++r) policies.length->observe({4, 0, 1.0f, 0.016, 0.014, 5});
    TokenTree lookup;
    for (int i = 0; i < 6; ++i) lookup.add(i - 1, 7 + i, std::log(0.9f) * (i + 1));
    int offered = 0;
    auto free_draft = [&](const TreeBudget & b) -> const TokenTree * {
        EXPECT_EQ(b.shape, TreeShape::Chain);
        return ++offered, &lookup;
    };
    const RoundPlan plan = round.plan(RoundState{.depth = 10, .room = 100, .tokens_left = 100, .free_draft = free_draft});
    EXPECT_FALSE(plan.drafts());
    EXPECT_TRUE(plan.use_free_draft);
    EXPECT_EQ(offered, 1);
    EXPECT_EQ(round.size_draft(lookup, 0, 0.0, {}), 4);
    EXPECT_EQ(round.decision(6, 4).why.rfind("no model draft: lookup's chain expected to give more per ms; 4 lookup tokens", 0), 0u)
        << round.decision(6, 4).why;
    // An unlikely chain leaves the round to the model's.
    TokenTree doubtful;
    doubtful.add(TokenTree::kRoot, 7, std::log(0.02f));
    const RoundPlan model = round.plan(RoundState{
        .depth = 10, .room = 100, .tokens_left = 100, .free_draft = [&](const TreeBudget &) -> const TokenTree * { return &doubtful; }});
    EXPECT_FALSE(model.use_free_draft);
    // Kept out, the free chain still beats the plain step.
    const RoundPlan kept_out = round.plan(RoundState{.depth = 10, .room = 100, .tokens_left = 2, .model_draft = false, .free_draft = free_draft});
    EXPECT_TRUE(kept_out.use_free_draft);
    EXPECT_EQ(round.size_draft(lookup, 0, 0.0, {}), 2);  // the tokens left
    EXPECT_EQ(round.decision(6, 2).why.rfind("no model draft: its catch-up on the prompt costs more than the request can save; 2 lookup", 0), 0u);
}

TEST(CatchUpGate, DraftsUntilMeasuredThenKeepsTheModelOutWhereTheCatchUpCannotPay) {
    CatchUpGate gate(20.0);
    EXPECT_TRUE(gate.allow(1000, 30));        // nothing measured
    gate.observe_catch_up(1000, 3000.0);      // 3 ms per token caught up
    EXPECT_TRUE(gate.allow(1000, 30));        // no drafting reply measured yet
    gate.observe_reply(30, 30 * 14.0, true);  // drafting: 14 ms per token, 6 saved against the 20 ms forward
    EXPECT_DOUBLE_EQ(gate.catch_up_ms_per_token(), 3.0);
    EXPECT_DOUBLE_EQ(gate.ms_per_token(true), 14.0);
    // 1,000 tokens to catch up (3,000 ms) against at most 30 replies' tokens x 6 ms: kept out.
    EXPECT_FALSE(gate.allow(1000, 200));
    // A short lag is cheap whatever the reply: allowed.
    EXPECT_TRUE(gate.allow(CatchUpGate::kMinTimedLag - 1, 1));
    // 400 tokens (1,200 ms) against a 30-token reply x 6 ms: still out; with a measured plain
    // rate of 60 ms per token (a deep context), 30 x 46 ms = 1,380 ms pays for it.
    EXPECT_FALSE(gate.allow(400, 1000));
    gate.observe_reply(30, 30 * 60.0, false);
    EXPECT_TRUE(gate.allow(400, 1000));
    // Few tokens left cap the saving whatever the mean reply.
    EXPECT_FALSE(gate.allow(400, 5));
}

TEST(CatchUpGate, LongRepliesPayForTheCatchUp) {
    CatchUpGate gate(20.0);
    gate.observe_catch_up(1000, 3000.0);
    for (int i = 0; i < 5; ++i) gate.observe_reply(500, 500 * 14.0, true);
    EXPECT_DOUBLE_EQ(gate.mean_reply(), 500.0);
    EXPECT_TRUE(gate.allow(900, 4000));    // 500 x 6 ms = 3,000 ms saved against 2,700
    EXPECT_FALSE(gate.allow(1100, 4000));  // against 3,300
}

TEST(CatchUpGate, LooksAgainLessAndLessOftenWhileTheModelStaysOut) {
    CatchUpGate gate(20.0);
    gate.observe_catch_up(1000, 3000.0);
    gate.observe_reply(20, 20 * 14.0, true);
    std::vector<int> allowed;
    for (int i = 1; i <= 200; ++i) {
        if (gate.allow(1000, 20)) allowed.push_back(i);
    }
    // Every 8th, then 16th, 32nd and 64th request kept out drafts.
    EXPECT_EQ(allowed, (std::vector<int>{8, 24, 56, 120, 184}));
    EXPECT_THROW(CatchUpGate(0.0), Error);
}

TEST(RoundPolicy, AFixedTreeIsVerifiedWholeAndCutToTheRoom) {
    RoundPolicy round(TreeBudget{TreeShape::Dynamic, 6, 2, 16}, nullptr, nullptr);
    const RoundPlan plan = round.plan(RoundState{.depth = 10, .room = 4, .tokens_left = 100});
    EXPECT_EQ(plan.budget.depth, 4);
    EXPECT_EQ(plan.budget.max_nodes, 4);
    const TokenTree chain = TokenTree::chain(std::vector<int32_t>{1, 2, 3});
    EXPECT_EQ(round.size_draft(chain, chain.size(), 1.0, {}), 3);
    EXPECT_STREQ(round.decision(3, 3).policy, "fixed-tree");
}

TEST(GenerationMode, LosslessSpecEEDraftsChainsAndSizesNoTree) {
    const TreeBudget auto_tree{TreeShape::Dynamic, 6, 2, 0};
    std::vector<double> curve;
    for (int b = 1; b <= kAutoTreeMaxNodes + 1; ++b) curve.push_back(1.0 + 0.1 * b);
    const VerifyCostCurve cost{curve, 0, 0.0};
    EXPECT_NE(make_round_policies(GenerationMode::Speculative, DraftPolicyKind::Cost, 6, auto_tree, cost).tree_size, nullptr);
    const RoundPolicies lossless = make_round_policies(GenerationMode::SpeceeLossless, DraftPolicyKind::Cost, 6, auto_tree, cost);
    EXPECT_EQ(lossless.tree_size, nullptr);
    EXPECT_NE(lossless.length, nullptr);
    EXPECT_EQ(mode_tree(GenerationMode::SpeceeLossless, auto_tree).shape, TreeShape::Chain);
    EXPECT_EQ(mode_tree(GenerationMode::Speculative, auto_tree).shape, TreeShape::Dynamic);
}

}  // namespace
}  // namespace specula
