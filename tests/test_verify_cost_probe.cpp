// The verify-cost probe's retiming of stalled sizes.
#include <gtest/gtest.h>

#include <vector>

#include "engine/verify_cost_probe.h"

namespace specula {
namespace {

// Catches a verify-cost curve that keeps a stalled sample: with 1 token timed at 1.7 s (a loaded
// machine can stall one timing that long), every larger tree looks cheap per token, and the tree
// policy would verify 32 nodes every round for the whole run.
TEST(Speculative, VerifyCostRetimesSizesStalledAboveLargerOnes) {
    const std::vector<int> timed = {1, 2, 3, 4, 8};
    std::vector<double> ms = {1716.0, 1716.0, 3.1, 3.3, 0, 0, 0, 5.2};
    std::vector<int> retimed;
    retime_stalled_sizes(timed, ms, [&](int b) {
        retimed.push_back(b);
        return 2.5 + 0.2 * b;
    });
    EXPECT_EQ(retimed, (std::vector<int>{2, 1}));
    EXPECT_DOUBLE_EQ(ms[0], 2.7);
    EXPECT_DOUBLE_EQ(ms[1], 2.9);
    EXPECT_DOUBLE_EQ(ms[2], 3.1);  // plausible sizes are kept as timed
    // A stall that persists is timed at most three times.
    int calls = 0;
    std::vector<double> stuck = {50.0, 5.0};
    retime_stalled_sizes(std::vector<int>{1, 2}, stuck, [&](int) { return ++calls, 50.0; });
    EXPECT_EQ(calls, 3);
    // A size above a larger one by less than a stall but more than noise: 4 tokens timed above 5
    // and 8 (a burst over its repetitions) is timed again; 2 tokens 5% above 3 is kept.
    std::vector<double> burst = {7.3, 8.6, 8.2, 14.9, 12.6, 0, 0, 15.2};
    std::vector<int> again;
    retime_stalled_sizes(std::vector<int>{1, 2, 3, 4, 5, 8}, burst, [&](int b) { return again.push_back(b), 9.1; });
    EXPECT_EQ(again, (std::vector<int>{4}));
    EXPECT_DOUBLE_EQ(burst[3], 9.1);
    EXPECT_DOUBLE_EQ(burst[1], 8.6);
}

}  // namespace
}  // namespace specula
