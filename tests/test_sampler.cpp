// Sampling transforms: what verification will apply identically to draft and target.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>

#include "sample/sampler.h"

namespace specula {
namespace {

const std::vector<float> kLogits = {1.0f, 3.0f, 2.0f, 0.5f, -1.0f, 2.5f};

double sum(const std::vector<float> & p) { return std::accumulate(p.begin(), p.end(), 0.0); }

TEST(Sampler, GreedyIsOneHotAtArgmax) {
    std::vector<float> p;
    processed_probs(kLogits, SamplingParams{}, p);
    EXPECT_EQ(p, (std::vector<float>{0, 1, 0, 0, 0, 0}));
    EXPECT_EQ(argmax(kLogits), 1);
}

TEST(Sampler, TemperatureOneIsSoftmax) {
    std::vector<float> p;
    SamplingParams s;
    s.temperature = 1.0f;
    processed_probs(kLogits, s, p);
    double z = 0;
    for (float l : kLogits) z += std::exp(l);
    for (size_t i = 0; i < p.size(); ++i) EXPECT_NEAR(p[i], std::exp(kLogits[i]) / z, 1e-6);
}

TEST(Sampler, TopKTopPMinPRestrictTheSupport) {
    std::vector<float> p;
    SamplingParams s;
    s.temperature = 0.7f;
    s.top_k = 3;
    processed_probs(kLogits, s, p);
    EXPECT_GT(p[1], 0);
    EXPECT_GT(p[5], 0);
    EXPECT_GT(p[2], 0);
    EXPECT_EQ(p[0], 0);
    EXPECT_NEAR(sum(p), 1.0, 1e-6);

    s = SamplingParams{};
    s.temperature = 1.0f;
    s.top_p = 0.5f;  // softmax: p1 ~ .41, p5 ~ .25 -> keeps two
    processed_probs(kLogits, s, p);
    EXPECT_GT(p[1], 0);
    EXPECT_GT(p[5], 0);
    EXPECT_EQ(p[2], 0);

    s = SamplingParams{};
    s.temperature = 1.0f;
    s.min_p = 0.5f;  // keeps tokens with p >= 0.5 * p_max: logits >= 3 - ln 2
    processed_probs(kLogits, s, p);
    EXPECT_GT(p[5], 0);
    EXPECT_EQ(p[2], 0);
    EXPECT_NEAR(sum(p), 1.0, 1e-6);
}

TEST(Sampler, SampleFromFollowsTheDistribution) {
    const std::vector<float> p = {0.1f, 0.6f, 0.0f, 0.3f};
    Rng rng(42);
    std::vector<int> counts(4, 0);
    const int n = 20000;
    for (int i = 0; i < n; ++i) counts[sample_from(p, rng)]++;
    EXPECT_EQ(counts[2], 0);
    double chi2 = 0;
    for (int i : {0, 1, 3}) chi2 += std::pow(counts[i] - n * p[i], 2) / (n * p[i]);
    EXPECT_LT(chi2, 13.8);  // 2 dof, p = 0.001
}

}  // namespace
}  // namespace specula
