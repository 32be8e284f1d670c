// Sampling transforms: what verification will apply identically to draft and target.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
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

// argmax and max_value scan in 16 lanes: the first maximum wins wherever it falls (a lane, the
// tail past the last full block, ties across lanes), as std::max_element's does.
TEST(Sampler, ArgmaxIsTheFirstMaximumAtEveryPositionAndLength) {
    for (size_t n : {1u, 15u, 16u, 17u, 49152u + 7u}) {
        for (size_t at : {size_t(0), n / 3, n - 1}) {
            std::vector<float> v(n, -INFINITY);
            for (size_t i = 0; i < n; i += 5) v[i] = -static_cast<float>(i % 97);
            v[at] = 10.0f;
            EXPECT_EQ(argmax(v), static_cast<int32_t>(at)) << n << " " << at;
            EXPECT_EQ(max_value(v), 10.0f);
            if (at + 1 < n) {
                v[n - 1] = 10.0f;  // a later tie does not move it
                EXPECT_EQ(argmax(v), static_cast<int32_t>(at)) << n << " " << at;
            }
            EXPECT_EQ(argmax(v), static_cast<int32_t>(std::max_element(v.begin(), v.end()) - v.begin()));
        }
    }
    EXPECT_EQ(max_value(std::vector<float>(20, -INFINITY)), -INFINITY);
}

// A model whose weights hold NaN (or whose activations overflow) gives NaN logits. Compared
// directly they broke the sorts' strict weak order (undefined behaviour), took the argmax when at
// index 0 and turned whole distributions into NaN; now a NaN logit weighs as -inf, on every path.
TEST(Sampler, NanLogitsWeighNothing) {
    std::vector<float> logits(40);
    for (size_t i = 0; i < logits.size(); ++i) logits[i] = std::sin(static_cast<float>(i));
    for (size_t i : {0u, 5u, 16u, 17u, 39u}) logits[i] = NAN;
    const int32_t best = 33;  // sin(33) = 0.9999
    SamplingParams plain, top_k, nucleus, greedy;
    plain.temperature = top_k.temperature = nucleus.temperature = 0.8f;
    top_k.top_k = 30;
    nucleus.top_p = 0.9f, nucleus.min_p = 0.01f;
    for (SamplerPath path : sampler_paths()) {
        SCOPED_TRACE(sampler_path_name(path));
        EXPECT_EQ(argmax_on(path, logits), best);
        for (const SamplingParams & params : {plain, top_k, nucleus, greedy}) {
            std::vector<float> p;
            processed_probs_on(path, logits, params, p);
            for (size_t i = 0; i < p.size(); ++i) {
                EXPECT_TRUE(std::isfinite(p[i])) << i;
                if (std::isnan(logits[i])) {
                    EXPECT_EQ(p[i], 0.0f) << i;
                }
            }
            EXPECT_NEAR(sum(p), 1.0, 1e-5);
            EXPECT_GT(p[best], 0.0f);
        }
        std::vector<float> scratch;
        const SoftmaxStats st = softmax_stats_on(path, logits, scratch);
        EXPECT_TRUE(std::isfinite(st.log_z) && std::isfinite(st.entropy)) << st.log_z << " " << st.entropy;
        EXPECT_EQ(st.log_prob(logits[0]), -INFINITY);
    }
    for (int k : {3, 38}) {  // the one-pass path and the sort
        const std::vector<int32_t> ids = top_k_ids(logits, k);
        EXPECT_EQ(ids.front(), best);
        const size_t finite = std::count_if(logits.begin(), logits.end(), [](float l) { return !std::isnan(l); });
        for (size_t r = 0; r < ids.size(); ++r) EXPECT_EQ(std::isnan(logits[ids[r]]), r >= finite) << k << " " << r;
    }
    // Nothing but NaN: nothing to draw; token 0, as for an all -inf row, and no NaN anywhere.
    const std::vector<float> all_nan(20, NAN);
    EXPECT_EQ(argmax(all_nan), 0);
    for (const SamplingParams & params : {plain, top_k, nucleus}) {
        std::vector<float> p;
        processed_probs(all_nan, params, p);
        EXPECT_EQ(sum(p), 0.0);
        Rng rng(1);
        EXPECT_EQ(sample_from(p, rng), 0);
    }
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

TEST(Sampler, SoftmaxStatsMatchADoublePrecisionReference) {
    // A vocabulary-sized spread of logits, with tokens a compact draft vocabulary cannot propose.
    std::vector<float> logits(8192);
    Rng rng(3);
    for (auto & l : logits) l = static_cast<float>(30.0 * rng.uniform() - 20.0);
    for (size_t i = 0; i < logits.size(); i += 7) logits[i] = -INFINITY;
    double m = -1e30, z = 0, s = 0;
    for (float l : logits) m = std::max(m, double(l));
    for (float l : logits) {
        if (!std::isfinite(l)) continue;
        z += std::exp(l - m);
        s += std::exp(l - m) * (l - m);
    }
    std::vector<float> scratch;
    const SoftmaxStats st = softmax_stats(logits, scratch);
    EXPECT_NEAR(st.log_z, std::log(z), 1e-5);
    EXPECT_NEAR(st.entropy, std::log(z) - s / z, 1e-4);
    EXPECT_NEAR(st.log_prob(logits[1]), logits[1] - m - std::log(z), 1e-5);

    SamplingParams t;
    t.temperature = 0.8f;
    std::vector<float> p;
    processed_probs(logits, t, p);
    double zt = 0;
    for (float l : logits) zt += std::isfinite(l) ? std::exp((l - m) / 0.8) : 0.0;
    for (size_t i = 0; i < logits.size(); ++i) {
        const double ref = std::isfinite(logits[i]) ? std::exp((logits[i] - m) / 0.8) / zt : 0.0;
        ASSERT_NEAR(p[i], ref, 1e-6 * std::max(ref, 1e-3)) << i;
    }
}

// Every instruction-set path of the vocabulary loops this CPU runs gives the portable path's bits:
// softmax statistics, the argmax, and processed distributions (greedy, plain temperature, and the
// sorted top-k/top-p/min-p path), on vocabulary-sized rows with masked (-inf) logits, ties and a
// tail past the last 16-lane block. Prints which paths ran, since machines differ.
TEST(Sampler, EveryInstructionSetPathGivesThePortableBits) {
    const std::vector<SamplerPath> paths = sampler_paths();
    std::string names;
    for (SamplerPath path : paths) names += std::string(" ") + sampler_path_name(path);
    std::printf("[sampler] paths compared on this CPU:%s\n", names.c_str());
    if (paths.size() == 1) GTEST_SKIP() << "this CPU runs the portable path only";
    SamplingParams greedy, plain, shaped;
    plain.temperature = 0.7f;
    shaped.temperature = 1.3f, shaped.top_k = 50, shaped.top_p = 0.9f, shaped.min_p = 0.01f;
    auto bits_equal = [](std::span<const float> a, std::span<const float> b) {
        return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
    };
    for (size_t n : {size_t(7), size_t(49152 + 7), size_t(262144)}) {
        std::vector<float> logits(n);
        Rng rng(n);
        for (auto & l : logits) l = static_cast<float>(40.0 * rng.uniform() - 25.0);
        for (size_t i = 3; i < n; i += 11) logits[i] = -INFINITY;
        logits[n / 2] = logits[n - 1] = 16.0f;  // a tie for the maximum, the first inside, the second in the tail
        std::vector<float> scratch, ref, got;
        const SoftmaxStats st = softmax_stats_on(SamplerPath::Portable, logits, scratch);
        for (SamplerPath path : paths) {
            SCOPED_TRACE(std::string(sampler_path_name(path)) + ", vocabulary " + std::to_string(n));
            const SoftmaxStats s = softmax_stats_on(path, logits, scratch);
            EXPECT_TRUE(bits_equal(std::span(&s.max_logit, 1), std::span(&st.max_logit, 1)));
            EXPECT_TRUE(bits_equal(std::span(&s.log_z, 1), std::span(&st.log_z, 1)));
            EXPECT_TRUE(bits_equal(std::span(&s.entropy, 1), std::span(&st.entropy, 1)));
            EXPECT_EQ(argmax_on(path, logits), argmax_on(SamplerPath::Portable, logits));
            for (const SamplingParams & sp : {greedy, plain, shaped}) {
                processed_probs_on(SamplerPath::Portable, logits, sp, ref);
                processed_probs_on(path, logits, sp, got);
                EXPECT_TRUE(bits_equal(got, ref)) << "temperature " << sp.temperature << ", top-k " << sp.top_k;
            }
        }
    }
}

TEST(Sampler, TopKIdsAgreeWithAFullSortTiesByIdFirst) {
    std::vector<float> scores(500);
    Rng rng(5);
    for (auto & x : scores) x = static_cast<float>(static_cast<int>(rng.uniform() * 40));  // many ties
    std::vector<int32_t> order(scores.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return scores[a] > scores[b]; });
    for (int k : {0, 1, 3, 16, 40}) {
        EXPECT_EQ(top_k_ids(scores, k), std::vector<int32_t>(order.begin(), order.begin() + k)) << k;
    }
    // k = 0 (a request's top_logprobs: 0) read past an empty list before any comparison (ASan).
    EXPECT_TRUE(top_k_ids(scores, -1).empty());
}

// The reference the draws must reproduce: one running double sum in index order over the entries
// not yet drawn, the first to pass u x their sum taken.
std::vector<int32_t> sequential_draws(const std::vector<float> & p, int k, Rng & rng) {
    std::vector<int32_t> drawn;
    for (int j = 0; j < k; ++j) {
        double left = 0.0;
        for (size_t i = 0; i < p.size(); ++i) {
            if (std::find(drawn.begin(), drawn.end(), static_cast<int32_t>(i)) == drawn.end()) left += p[i];
        }
        const double r = rng.uniform() * left;
        double acc = 0.0;
        int32_t pick = -1;
        for (size_t i = 0; i < p.size(); ++i) {
            if (p[i] <= 0.0f || std::find(drawn.begin(), drawn.end(), static_cast<int32_t>(i)) != drawn.end()) continue;
            acc += p[i];
            pick = static_cast<int32_t>(i);
            if (r < acc) break;
        }
        if (pick < 0) break;
        drawn.push_back(pick);
    }
    return drawn;
}

TEST(Sampler, DrawsEqualASequentialRunningSumAtEverySizeAndChunkBoundary) {
    // Sizes around the 256-entry chunks the draws sum at once, zeros in runs (whole chunks among
    // them) and the mass piled at either end; the draws may differ from the reference only where
    // rounding puts the uniform within a hair of a boundary, which these seeds never do.
    int compared = 0;
    for (size_t n : {1u, 2u, 15u, 16u, 17u, 255u, 256u, 257u, 511u, 1000u, 4096u, 49152u}) {
        for (int shape = 0; shape < 4; ++shape) {
            std::vector<float> p(n);
            Rng fill(static_cast<uint64_t>(n * 4 + shape));
            for (size_t i = 0; i < n; ++i) {
                float v = static_cast<float>(fill.uniform());
                if (shape == 1 && (i / 300) % 2 == 1) v = 0.0f;  // zero runs longer than a chunk
                if (shape == 2) v *= i + 1 == n ? 1e4f : 1.0f;   // mass at the end
                if (shape == 3) v = i < 3 ? 1.0f : v * 1e-6f;    // mass at the start
                p[i] = v;
            }
            if (shape == 1) p[0] = 0.5f;  // at least one drawable entry
            const double total = std::accumulate(p.begin(), p.end(), 0.0);
            for (float & x : p) x = static_cast<float>(x / total);
            for (int k : {1, 4}) {
                Rng a(77 + n + shape), b(77 + n + shape);
                for (int rep = 0; rep < 50; ++rep) {
                    const auto got = k == 1 ? std::vector<int32_t>{sample_from(p, a)} : sample_without_replacement(p, k, a);
                    const auto want = sequential_draws(p, k, b);
                    ASSERT_EQ(got, want) << "n " << n << " shape " << shape << " k " << k << " draw " << rep;
                    ++compared;
                }
            }
        }
    }
    EXPECT_EQ(compared, 12 * 4 * 2 * 50);
}

TEST(Sampler, DrawsWithoutReplacementAreDistinctAndFollowTheDistribution) {
    const std::vector<float> p = {0.5f, 0.0f, 0.3f, 0.2f};
    Rng rng(9);
    std::vector<int> first(4, 0), second(4, 0);
    const int n = 30000;
    for (int i = 0; i < n; ++i) {
        const auto d = sample_without_replacement(p, 4, rng);
        ASSERT_EQ(d.size(), 3u);  // the zero-probability token is never drawn
        ASSERT_NE(d[0], d[1]);
        first[d[0]]++;
        second[d[1]]++;
    }
    // P(second = j) = sum_i p_i p_j / (1 - p_i).
    double chi2 = 0;
    for (int j : {0, 2, 3}) {
        double e2 = 0;
        for (int i : {0, 2, 3}) {
            if (i != j) e2 += p[i] * p[j] / (1 - p[i]);
        }
        chi2 += std::pow(first[j] - n * p[j], 2) / (n * p[j]) + std::pow(second[j] - n * e2, 2) / (n * e2);
    }
    EXPECT_LT(chi2, 22.5);  // 4 dof, p = 0.0002
}

// llama.cpp's "infill" sampler (llama_sampler_infill_apply) on a few tokens: its three outcomes.
TEST(Sampler, InfillMergesPrefixesDropsTheUnlikelyAndFallsBackToTheEndToken) {
    auto v = std::make_shared<InfillVocabulary>();
    v->pieces = {"a", "ab", "x", "", "y", "", "z", "w"};
    v->end_of_generation = {0, 0, 0, 0, 0, 1, 0, 0};
    v->end_token = 5;
    SamplingParams params;
    params.temperature = 1.0f;
    params.infill = v;
    std::vector<float> p;
    // "a" takes "ab"'s probability; "x" and "y" fall below 0.2; the end token stays.
    const float ninf = -INFINITY;
    processed_probs(std::vector<float>{2.0f, 1.5f, 1.0f, ninf, -3.0f, -5.0f, ninf, ninf}, params, p);
    const double e[] = {std::exp(2.0), std::exp(1.5), std::exp(1.0), std::exp(-3.0), std::exp(-5.0)};
    const double z = e[0] + e[1] + e[2] + e[3] + e[4];
    const double kept = (e[0] + e[1]) / z + e[4] / z;
    EXPECT_NEAR(p[0], (e[0] + e[1]) / z / kept, 1e-6);
    EXPECT_NEAR(p[5], e[4] / z / kept, 1e-6);
    EXPECT_EQ(p[1], 0.0f);
    EXPECT_EQ(p[2], 0.0f);
    EXPECT_EQ(p[4], 0.0f);
    // End-of-generation tokens above a third of the average candidate: only they remain.
    processed_probs(std::vector<float>{2.0f, ninf, 1.0f, ninf, 0.0f, 1.0f, 0.5f, ninf}, params, p);
    EXPECT_EQ(p, (std::vector<float>{0, 0, 0, 0, 0, 1, 0, 0}));
    // No text candidate reaches 0.2: the end token alone.
    processed_probs(std::vector<float>{0.0f, ninf, 0.0f, ninf, 0.0f, -30.0f, 0.0f, ninf}, params, p);
    EXPECT_NEAR(p[0] + p[2] + p[4] + p[6], 1.0, 1e-6);  // four of 1/4: all kept
    processed_probs(std::vector<float>{0.0f, ninf, 0.0f, 0.0f, 0.0f, -30.0f, 0.0f, 0.0f}, params, p);
    EXPECT_EQ(p, (std::vector<float>{0, 0, 0, 0, 0, 1, 0, 0}));
    // Greedy requests are untouched: the argmax is what the sampler would keep.
    params.temperature = 0.0f;
    processed_probs(std::vector<float>{2.0f, 1.5f, 1.0f, ninf, -3.0f, -5.0f, ninf, ninf}, params, p);
    EXPECT_EQ(p, (std::vector<float>{1, 0, 0, 0, 0, 0, 0, 0}));
}

}  // namespace
}  // namespace specula
