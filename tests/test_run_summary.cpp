// The run's statistics and the summary lines printed from them: per-position acceptance and the
// split of each round's time.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "specula/report.h"
#include "policy/draft_length.h"
#include "trace/trace.h"

namespace specula {
namespace {

TEST(Speculative, StatsCountRoundsAndPositions) {
    SpeculationStats st;
    st.add_round(4, 4, 2);  // accepted d1, d2; d3 rejected
    st.add_round(4, 4, 4);
    st.add_round(2, 2, 0);  // d1 rejected
    EXPECT_EQ(st.rounds, 3);
    EXPECT_EQ(st.emitted, 9);
    EXPECT_DOUBLE_EQ(st.mean_accepted_length(), 3.0);
    EXPECT_EQ(st.drafted_at, (std::vector<int>{3, 3, 2, 2}));
    EXPECT_EQ(st.reached_at, (std::vector<int>{3, 2, 2, 1}));
    EXPECT_EQ(st.accepted_at, (std::vector<int>{2, 2, 1, 1}));
    // Reported acceptance: accepted at i / rounds that drafted at least i deep (docs/report.md).
    EXPECT_DOUBLE_EQ(st.acceptance_at(1), 2.0 / 3.0);
    EXPECT_DOUBLE_EQ(st.acceptance_given_reached(1), 1.0);
    EXPECT_DOUBLE_EQ(expected_tokens({1.0, 0.5}, 2), 2.5);
}

TEST(Speculative, TimeSplitAttributesEachRoundsTimeAndTheRest) {
    GenerationStats g;
    g.speculation.add_round(2, 2, 1);
    g.speculation.add_round(2, 2, 2);
    g.speculation.forward_ms = 8.0;
    g.speculation.draft_ms = 1.0;
    g.speculation.commit_ms = 0.5;
    g.generation_seconds = 0.010;  // 10 ms: 0.5 ms spent outside the rounds
    EXPECT_EQ(format_time_split(g),
              "time per round 5.00 ms: target forward 4.00 ms (80%), drafting 0.50 ms (10%), commit 0.25 ms (5%), other 0.25 ms (5%)");
    g.speculation.draft_forwards = 3;  // drafter levels, 0.8 of the 1 ms of drafting
    g.speculation.draft_level_ms = 0.8;
    EXPECT_EQ(format_time_split(g),
              "time per round 5.00 ms: target forward 4.00 ms (80%), drafting 0.50 ms (10%; 1.50 drafter levels of 0.267 ms), "
              "commit 0.25 ms (5%), other 0.25 ms (5%)");
    EXPECT_EQ(format_time_split(GenerationStats{}), "");
}

// Catches the summary printing a rate for a position no round drafted.
TEST(Speculative, SummaryPrintsADashForPositionsNeverDrafted) {
    SpeculationStats st;
    st.add_round(2, 2, 1);
    st.drafted_at.push_back(0);  // as merged stats of runs with a deeper cap look
    st.reached_at.push_back(0);
    st.accepted_at.push_back(0);
    const std::string s = format_summary(st);
    EXPECT_NE(s.find("1:1.00 2:0.00 3:-"), std::string::npos) << s;
}

}  // namespace
}  // namespace specula
