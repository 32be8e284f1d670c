// Chain speculation: greedy equivalence, lossless sampling, cache bookkeeping, errors.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <thread>
#include <nlohmann/json.hpp>

#include "specula/error.h"
#include "draft/draft_model.h"
#include "draft/eagle.h"
#include "draft/lookup_graft.h"
#include "draft/ngram.h"
#include "engine/drafter_factory.h"
#include "engine/generate.h"
#include "engine/specee.h"
#include "engine/sequence.h"
#include "engine/verify_cost_probe.h"
#include "runtime/kv_cache.h"
#include "runtime/backend.h"
#include "runtime/eagle_head.h"
#include "runtime/forward.h"
#include "runtime/model.h"
#include "distribution.h"
#include "specee_predictor.h"
#include "test_models.h"

namespace specula {
namespace {

using test::accept_everything;
using test::chi2_critical;

const std::vector<std::vector<int32_t>> kPrompts = {
    {1, 450, 4996, 17354, 1701, 29916},
    {1, 822, 5713, 29898, 29876, 1125, 13, 1678},
    {1, 29871, 29896, 29892, 29871, 29906, 29892, 29871, 29941, 29892, 29871, 29896, 29892, 29871, 29906},
};

std::vector<int32_t> plain_greedy(const Model & model, ModelRunner & runner, std::span<const int32_t> prompt, int n) {
    KvCache cache(model.backend(), model.config(), 256);
    std::vector<int32_t> out;
    GenerationOptions o;
    o.n_predict = n;
    o.stop_at_end_of_generation = false;
    generate_plain(
        runner, cache, prompt, o, [](int32_t) { return false; }, [&](int32_t t) {
        out.push_back(t);
        return true; });
    return out;
}

struct Spec {
    Backend backend{BackendOptions{"cpu", 1}};
    std::unique_ptr<Model> target;
    std::unique_ptr<Model> draft_small = Model::load(test::model_path("llama_draft_small"), backend);
    ModelRunner runner;
    explicit Spec(const std::string & target_name = "llama_gqa_f32")
        : target(Model::load(test::model_path(target_name), backend)), runner(*target) {}

    std::vector<int32_t> run(Drafter & drafter, DraftPolicyKind policy, int k, std::span<const int32_t> prompt, int n,
                             const SamplingParams & sp = {}, std::function<void(const RoundInfo &)> on_round = nullptr,
                             VerifyFn verify = nullptr, KvCache * cache_out = nullptr, TreeBudget tree = {},
                             TreeSizePolicy * tree_size = nullptr) {
        KvCache local(backend, target->config(), 256);
        KvCache & cache = cache_out ? *cache_out : local;
        std::vector<double> cost(k + 1);
        for (int b = 0; b <= k; ++b) cost[b] = 1.0 + 0.1 * b;
        auto pol = make_draft_policy(policy, k, cost);
        SequenceParts parts{cache, &drafter, pol.get(), tree, std::move(on_round), std::move(verify), tree_size};
        GenerationOptions o;
        o.n_predict = n;
        o.sampling = sp;
        o.stop_at_end_of_generation = false;
        std::vector<int32_t> out;
        generate_speculative(
            runner, parts, prompt, o, [](int32_t) { return false; }, [&](int32_t t) {
            out.push_back(t);
            return true; });
        return out;
    }
};

TEST(Speculative, GreedyOutputEqualsPlainDecodingForEveryDrafterLengthAndPolicy) {
    Spec s;
    DraftModelDrafter self_draft(*s.target, 256);        // accepts (nearly) everything
    DraftModelDrafter small_draft(*s.draft_small, 256);  // accepts little
    NgramDrafter ngram(1, 3);
    std::vector<Drafter *> drafters = {&self_draft, &small_draft, &ngram};
    int total_accepted = 0;
    for (const auto & prompt : kPrompts) {
        const auto want = plain_greedy(*s.target, s.runner, prompt, 40);
        for (Drafter * d : drafters) {
            for (int k = 1; k <= 8; ++k) {
                for (auto policy : {DraftPolicyKind::Fixed, DraftPolicyKind::Heuristic, DraftPolicyKind::Cost}) {
                    int accepted = 0;
                    const auto got = s.run(*d, policy, k, prompt, 40, {}, [&](const RoundInfo & r) { accepted += int(r.result->accepted.size()); });
                    ASSERT_EQ(got, want) << d->name() << " k=" << k << " policy=" << int(policy);
                    total_accepted += accepted;
                }
            }
        }
    }
    EXPECT_GT(total_accepted, 1000);  // the accept path was exercised, not only corrections
}

TEST(Speculative, GreedyTreesEqualPlainDecoding) {
    Spec s;
    auto twin = Model::load(test::quantized_twin("llama_gqa_f32", "q4_0"), s.backend);
    DraftModelDrafter self_draft(*twin, 256);  // agrees mostly, so side branches get accepted too
    DraftModelDrafter small_draft(*s.draft_small, 256);
    int accepted_beyond_first_child = 0;
    for (const auto & prompt : kPrompts) {
        const auto want = plain_greedy(*s.target, s.runner, prompt, 40);
        for (Drafter * d : std::vector<Drafter *>{&self_draft, &small_draft}) {
            for (TreeBudget tree : {TreeBudget{TreeShape::Static, 5, 4, 16}, TreeBudget{TreeShape::Dynamic, 4, 3, 12},
                                    TreeBudget{TreeShape::Dynamic, 6, 4, 40}}) {
                auto on_round = [&](const RoundInfo & r) {
                    for (int node : r.result->accepted) {
                        accepted_beyond_first_child += r.draft->tree.first_child_of(r.draft->tree.parent[node]) != node;
                    }
                };
                const auto got = s.run(*d, DraftPolicyKind::Fixed, 4, prompt, 40, {}, on_round, nullptr, nullptr, tree);
                ASSERT_EQ(got, want) << d->name() << " tree " << tree_shape_name(tree.shape) << " nodes " << tree.max_nodes;
            }
        }
    }
    EXPECT_GT(accepted_beyond_first_child, 0);  // side branches were accepted and compacted
}

// A Gemma 3 target whose sliding window (8 positions) is far shorter than prompt + output: the
// window must hold inside chain and tree verify masks and across rollback and compaction.
TEST(Speculative, GreedyChainsAndTreesEqualPlainDecodingOnSlidingWindowGemma3) {
    Spec s("gemma3_swa");
    ASSERT_EQ(s.target->config().sliding_window, 8);
    auto twin = Model::load(test::quantized_twin("gemma3_swa", "q8_0"), s.backend);
    DraftModelDrafter twin_draft(*twin, 256);
    NgramDrafter ngram(1, 3);
    int accepted = 0;
    auto on_round = [&](const RoundInfo & r) { accepted += int(r.result->accepted.size()); };
    for (const auto & prompt : kPrompts) {
        const auto want = plain_greedy(*s.target, s.runner, prompt, 40);
        for (Drafter * d : std::vector<Drafter *>{&twin_draft, &ngram}) {
            ASSERT_EQ(s.run(*d, DraftPolicyKind::Fixed, 4, prompt, 40, {}, on_round), want) << d->name() << " chain";
        }
        for (TreeBudget tree : {TreeBudget{TreeShape::Static, 5, 4, 16}, TreeBudget{TreeShape::Dynamic, 6, 4, 40}}) {
            const auto got = s.run(twin_draft, DraftPolicyKind::Fixed, 4, prompt, 40, {}, on_round, nullptr, nullptr, tree);
            ASSERT_EQ(got, want) << "tree " << tree_shape_name(tree.shape) << " nodes " << tree.max_nodes;
        }
    }
    EXPECT_GT(accepted, 100);  // drafts were accepted, not only corrected
}

// Trees sized each round by TreeSizePolicy (the default for --tree-nodes 0): pruned to a prefix
// of their prune order, still exactly greedy decoding, for a flat and a steep cost curve.
TEST(Speculative, GreedyPolicySizedTreesEqualPlainDecoding) {
    Spec s;
    auto twin = Model::load(test::quantized_twin("llama_gqa_f32", "q4_0"), s.backend);
    DraftModelDrafter self_draft(*twin, 256);
    std::set<int> sizes;
    for (double slope : {0.0, 0.5}) {
        std::vector<double> cost;
        for (int b = 1; b <= 17; ++b) cost.push_back(1.0 + slope * (b - 1));
        for (const auto & prompt : kPrompts) {
            const auto want = plain_greedy(*s.target, s.runner, prompt, 40);
            TreeSizePolicy policy(cost);
            const auto got = s.run(
                self_draft, DraftPolicyKind::Fixed, 4, prompt, 40, {},
                [&](const RoundInfo & r) { sizes.insert(r.draft->tree.size()); }, nullptr, nullptr,
                TreeBudget{TreeShape::Dynamic, 6, 4, 0}, &policy);
            ASSERT_EQ(got, want) << "slope " << slope;
        }
    }
    EXPECT_GT(sizes.size(), 2u);  // the size really varied
}

// A quantized target on specula's own kernels (the CPU default): every row is batch-invariant, so
// each drafter, chain or tree, reproduces plain greedy decoding by construction.
TEST(Speculative, GreedyOutputOfAQuantizedTargetOnSpeculasKernelsEqualsPlainDecoding) {
    Spec s("llama_q8_0");
    ASSERT_TRUE(s.backend.own_kernels());
    auto twin = Model::load(test::quantized_twin("llama_q8_0", "q4_0"), s.backend);
    DraftModelDrafter self_draft(*twin, 256);
    DraftModelDrafter small_draft(*s.draft_small, 256);
    NgramDrafter ngram(1, 3);
    int accepted = 0;
    for (const auto & prompt : kPrompts) {
        const auto want = plain_greedy(*s.target, s.runner, prompt, 40);
        for (Drafter * d : std::vector<Drafter *>{&self_draft, &small_draft, &ngram}) {
            for (int k : {1, 3, 5, 8}) {
                for (auto policy : {DraftPolicyKind::Fixed, DraftPolicyKind::Cost}) {
                    const auto got = s.run(*d, policy, k, prompt, 40, {}, [&](const RoundInfo & r) { accepted += int(r.result->accepted.size()); });
                    ASSERT_EQ(got, want) << d->name() << " k=" << k << " policy=" << int(policy);
                }
            }
            if (d == &ngram) continue;
            for (TreeBudget tree : {TreeBudget{TreeShape::Static, 5, 4, 16}, TreeBudget{TreeShape::Dynamic, 6, 4, 16}}) {
                const auto got = s.run(*d, DraftPolicyKind::Fixed, 4, prompt, 40, {}, nullptr, nullptr, nullptr, tree);
                ASSERT_EQ(got, want) << d->name() << " tree " << tree_shape_name(tree.shape);
            }
        }
    }
    EXPECT_GT(accepted, 300);
}

double max_row_diff(const KvCache & a, const KvCache & b, int slots) {
    double m = 0.0;
    for (int layer = 0; layer < a.n_layers(); ++layer) {
        for (bool value : {false, true}) {
            for (int slot = 0; slot < slots; ++slot) {
                auto x = a.read_row(layer, value, slot), y = b.read_row(layer, value, slot);
                m = std::max(m, test::max_abs_diff(x, y));
            }
        }
    }
    return m;
}

TEST(Speculative, CachesHoldExactlyTheAcceptedSequenceAfterEveryRound) {
    Spec s;
    DraftModelDrafter drafter(*s.draft_small, 256);
    ModelRunner draft_runner(*s.draft_small);
    const TreeBudget dynamic_tree{TreeShape::Dynamic, 4, 3, 10};
    for (auto [temperature, tree] : {std::pair{0.0f, TreeBudget{}}, std::pair{1.0f, TreeBudget{}}, std::pair{0.0f, dynamic_tree},
                                     std::pair{1.0f, dynamic_tree}}) {
        SamplingParams sp;
        sp.temperature = temperature;
        sp.seed = 5;
        KvCache cache(s.backend, s.target->config(), 256);
        int checked = 0, rejected_rounds = 0;
        auto check = [&](const RoundInfo & r) {
            if (static_cast<int>(r.history.size()) - 1 != cache.size()) return;  // final, truncated round
            rejected_rounds += r.result->accepted.size() < static_cast<size_t>(r.draft->tree.size());
            KvCache plain(s.backend, s.target->config(), 256);
            s.runner.forward(ForwardBatch::causal(r.history.first(cache.size()), 0, {}), plain);
            EXPECT_LT(max_row_diff(cache, plain, cache.size()), 2e-3) << "round " << r.round;

            const KvCache & dc = drafter.cache();
            ASSERT_LE(dc.size(), cache.size());
            KvCache draft_plain(s.backend, s.draft_small->config(), 256);
            draft_runner.forward(ForwardBatch::causal(r.history.first(dc.size()), 0, {}), draft_plain);
            EXPECT_LT(max_row_diff(dc, draft_plain, dc.size()), 2e-3) << "draft cache, round " << r.round;
            ++checked;
        };
        s.run(drafter, DraftPolicyKind::Fixed, 4, kPrompts[0], 30, sp, check, nullptr, &cache, tree);
        EXPECT_GT(checked, 5);
        EXPECT_GT(rejected_rounds, 0);  // rejected drafts really were rolled back
    }
}

// ---- Lossless sampling on a tiny vocabulary --------------------------------------------------

constexpr int kTinyVocab = 10;

struct Tiny {
    const int V;
    Backend backend{BackendOptions{"cpu", 1}};
    std::unique_ptr<Model> target, draft;
    ModelRunner runner;
    explicit Tiny(int n_vocab = kTinyVocab)
        : V(n_vocab),
          target(Model::load(test::tiny_vocab_model("tiny_target_v" + std::to_string(V), V, 101), backend)),
          draft(Model::load(test::tiny_vocab_model("tiny_draft_v" + std::to_string(V), V, 202), backend)),
          runner(*target) {}

    // Exact joint distribution of the first n generated tokens under the processed target,
    // indexed t1 * V^(n-1) + ... + tn.
    std::vector<double> exact_joint(std::span<const int32_t> prefix, const SamplingParams & sp, int n = 2) {
        std::vector<double> joint(static_cast<size_t>(std::pow(V, n)), 0.0);
        KvCache cache(backend, target->config(), 64);
        ForwardOutput out = runner.forward(ForwardBatch::causal(prefix, 0, {int32_t(prefix.size() - 1)}), cache);
        std::vector<float> first;
        processed_probs(out.logits_row(0), sp, first);
        std::function<void(const std::vector<float> &, double, size_t, int)> extend = [&](const std::vector<float> & p, double mass,
                                                                                          size_t index, int depth) {
            for (int32_t t = 0; t < V; ++t) {
                const double m = mass * p[t];
                const size_t i = index * V + t;
                if (depth == n) {
                    joint[i] = m;
                    continue;
                }
                if (m == 0.0) continue;
                const int base = cache.size();
                const int32_t one[1] = {t};
                ForwardOutput o = runner.forward(ForwardBatch::causal(one, base, {0}), cache);
                std::vector<float> next;
                processed_probs(o.logits_row(0), sp, next);
                extend(next, m, i, depth + 1);
                cache.rollback(base);
            }
        };
        extend(first, 1.0, 0, 1);
        return joint;
    }

    // Chi-square statistic and degrees of freedom of `runs` speculative generations of as many
    // tokens as `joint` describes, against `joint`.
    std::pair<double, int> chi2(Drafter & drafter, std::span<const int32_t> prefix, const SamplingParams & base_sp,
                                const std::vector<double> & joint, int runs, VerifyFn verify, TreeBudget tree = {},
                                std::function<void(const RoundInfo &)> on_round = nullptr) {
        int n_tokens = 0;
        for (size_t cells = 1; cells < joint.size(); cells *= V) ++n_tokens;
        std::vector<int> counts(joint.size(), 0);
        auto pol = make_draft_policy(DraftPolicyKind::Fixed, 3, {});
        KvCache cache(backend, target->config(), 64);
        for (int r = 0; r < runs; ++r) {
            cache.rollback(0);
            SequenceParts parts{cache, &drafter, pol.get(), tree, on_round, verify};
            GenerationOptions o;
            o.n_predict = n_tokens;
            o.sampling = base_sp;
            o.sampling.seed = 1000 + r;
            o.stop_at_end_of_generation = false;
            size_t cell = 0;
            generate_speculative(
                runner, parts, prefix, o, [](int32_t) { return false; }, [&](int32_t t) {
                cell = cell * V + t;
                return true; });
            counts[cell]++;
        }
        std::vector<test::Cell> cells;
        for (size_t i = 0; i < joint.size(); ++i) cells.push_back({joint[i], double(counts[i])});
        return test::chi_square(cells, runs);
    }
};

TEST(Speculative, SampledOutputFollowsTheTargetDistributionAndABrokenVerifierFails) {
    Tiny t;
    const std::vector<int32_t> prefix = {1, 2, 3, 1, 2};
    DraftModelDrafter model_drafter(*t.draft, 64);
    NgramDrafter ngram(1, 2);
    SamplingParams plain_t;
    plain_t.temperature = 1.0f;
    SamplingParams shaped;
    shaped.temperature = 0.8f, shaped.top_k = 6, shaped.top_p = 0.95f, shaped.min_p = 0.02f;
    const int runs = 4000;
    for (const SamplingParams & sp : {plain_t, shaped}) {
        const auto joint = t.exact_joint(prefix, sp);
        for (Drafter * d : std::vector<Drafter *>{&model_drafter, &ngram}) {
            auto [stat, dof] = t.chi2(*d, prefix, sp, joint, runs, nullptr);
            std::printf("[distribution] %-11s T=%.1f top_k=%d: chi2 = %.1f, dof = %d, critical = %.1f\n", d->name(),
                        sp.temperature, sp.top_k, stat, dof, chi2_critical(dof));
            EXPECT_LT(stat, chi2_critical(dof)) << d->name();
        }
        // The n-gram drafter's proposals are deterministic (no q): accepting them unchecked must
        // show as well as accepting a sampled draft model's.
        auto broken = [&sp](const TokenTree & tree, const TargetLogits & l, Rng & rng) { return accept_everything(tree, l, sp, rng); };
        for (Drafter * d : std::vector<Drafter *>{&model_drafter, &ngram}) {
            auto [stat, dof] = t.chi2(*d, prefix, sp, joint, runs, broken);
            std::printf("[distribution] %-11s broken verifier T=%.1f: chi2 = %.1f (critical %.1f)\n", d->name(), sp.temperature, stat,
                        chi2_critical(dof));
            EXPECT_GT(stat, chi2_critical(dof)) << d->name() << ": the distribution test cannot tell a broken verifier";
        }
    }
}

// A tree verifier that forgets the residual between siblings: tries each child against the
// untouched p. Subtly wrong; the test must notice.
VerifyResult no_residual(const TokenTree & tree, const TargetLogits & logits, const SamplingParams & sp, Rng & rng) {
    VerifyResult r;
    std::vector<float> p;
    int cur = TokenTree::kRoot;
    while (true) {
        processed_probs(logits.row_of(cur), sp, p);
        int next = -1;
        for (int c = tree.first_child_of(cur); c >= 0 && next < 0; c = tree.next_sibling[c]) {
            const std::span<const float> q = tree.q_of(cur);
            if (rng.uniform() < std::min(1.0f, p[tree.token[c]] / q[tree.token[c]])) next = c;
        }
        if (next < 0) {
            r.next_token = sample_from(p, rng);
            return r;
        }
        r.accepted.push_back(cur = next);
    }
}

TEST(Speculative, SampledTreesFollowTheTargetDistributionAndABrokenTreeVerifierFails) {
    Tiny t;
    const std::vector<int32_t> prefix = {4, 2, 3, 1, 2};
    DraftModelDrafter model_drafter(*t.draft, 64);
    SamplingParams sp;
    sp.temperature = 1.0f;
    const auto joint = t.exact_joint(prefix, sp);
    const int runs = 4000;
    for (TreeBudget tree : {TreeBudget{TreeShape::Dynamic, 2, 3, 9}, TreeBudget{TreeShape::Static, 3, 4, 12}}) {
        auto [stat, dof] = t.chi2(model_drafter, prefix, sp, joint, runs, nullptr, tree);
        std::printf("[distribution] %s tree: chi2 = %.1f, dof = %d, critical = %.1f\n", tree_shape_name(tree.shape), stat, dof, chi2_critical(dof));
        EXPECT_LT(stat, chi2_critical(dof));
    }
    auto broken = [&sp](const TokenTree & tree, const TargetLogits & l, Rng & rng) { return no_residual(tree, l, sp, rng); };
    for (TreeBudget tree : {TreeBudget{TreeShape::Dynamic, 2, 3, 9}, TreeBudget{TreeShape::Static, 3, 4, 12}}) {
        auto [stat, dof] = t.chi2(model_drafter, prefix, sp, joint, runs, broken, tree);
        std::printf("[distribution] %s tree verifier without residual: chi2 = %.1f (critical %.1f)\n", tree_shape_name(tree.shape), stat,
                    chi2_critical(dof));
        EXPECT_GT(stat, chi2_critical(dof)) << tree_shape_name(tree.shape);
    }
}

// A chain verifier that is right at depth 1 and wrong after: a rejection at depth >= 2 draws the
// correction from p instead of the residual norm(max(p - q, 0)). Only chains verified deeper than
// one token can show it.
VerifyResult residual_at_depth_one_only(const TokenTree & tree, const TargetLogits & logits, const SamplingParams & sp, Rng & rng) {
    VerifyResult r;
    std::vector<float> p;
    int cur = TokenTree::kRoot;
    for (int depth = 1;; ++depth) {
        processed_probs(logits.row_of(cur), sp, p);
        const int c = tree.first_child_of(cur);
        if (c < 0) {
            r.next_token = sample_from(p, rng);
            r.bonus = true;
            return r;
        }
        const std::span<const float> q = tree.q_of(cur);
        const int32_t x = tree.token[c];
        if (rng.uniform() < std::min(1.0f, p[x] / q[x])) {
            r.accepted.push_back(cur = c);
            continue;
        }
        if (depth == 1) {
            for (size_t i = 0; i < p.size(); ++i) p[i] = std::max(0.0f, p[i] - q[i]);
        }
        r.next_token = sample_from(p, rng);
        return r;
    }
}

// Chains drafted three deep at T > 0 by every drafter with a draft distribution (a draft model,
// EAGLE-1 and EAGLE-3 heads): the joint law of the first four tokens (the first round drafts 3, so
// acceptance, correction and bonus are exercised at every depth of a chain), on a 4-token
// vocabulary so that 6000 runs fill enough of the 256 cells. A verifier wrong only beyond depth 1
// must fail, as must one that accepts everything.
TEST(Speculative, SampledChainsThreeDeepFollowTheTargetDistributionAndBrokenVerifiersFail) {
    Tiny t(4);
    const std::vector<int32_t> prefix = {1, 2, 3, 1, 2};
    DraftModelDrafter model_drafter(*t.draft, 64);
    auto eagle1 = EagleHead::load(test::tiny_vocab_eagle_head("eagle1", 4, 303), *t.target, t.backend);
    auto eagle3 = EagleHead::load(test::tiny_vocab_eagle_head("eagle3", 4, 303), *t.target, t.backend);
    EagleDrafter eagle1_drafter(*eagle1, 64), eagle3_drafter(*eagle3, 64);
    SamplingParams sp;
    sp.temperature = 2.0f;  // flatter p and q: more of the 256 cells are populated and more chains reach depth 3
    const auto joint = t.exact_joint(prefix, sp, 4);
    const int runs = 6000;
    for (auto [name, drafter] : {std::pair<const char *, Drafter *>{"draft model", &model_drafter},
                                 std::pair<const char *, Drafter *>{"eagle1", &eagle1_drafter},
                                 std::pair<const char *, Drafter *>{"eagle3", &eagle3_drafter}}) {
        SCOPED_TRACE(name);
        int three_deep = 0, accepted_three = 0;
        auto on_round = [&](const RoundInfo & r) {
            if (r.round != 0) return;
            three_deep += r.draft->tree.max_depth() == 3;
            accepted_three += r.result->accepted.size() == 3;
        };
        auto [stat, dof] = t.chi2(*drafter, prefix, sp, joint, runs, nullptr, {}, on_round);
        std::printf("[distribution] %s chain k=3, 4 tokens: chi2 = %.1f, dof = %d, critical = %.1f; 3 accepted in %d of %d first rounds\n",
                    name, stat, dof, chi2_critical(dof), accepted_three, runs);
        EXPECT_LT(stat, chi2_critical(dof));
        EXPECT_EQ(three_deep, runs) << "the first round must draft 3 tokens";
        EXPECT_GT(accepted_three, runs / 40) << "whole 3-token chains must be accepted sometimes";
        for (auto [broken_name, broken] :
             {std::pair<const char *, VerifyFn>{"residual at depth 1 only",
                                                [&sp](const TokenTree &tree, const TargetLogits &l, Rng &rng) {
                                                    return residual_at_depth_one_only(tree, l, sp, rng);
                                                }},
              std::pair<const char *, VerifyFn>{"accept everything", [&sp](const TokenTree &tree, const TargetLogits &l, Rng &rng) {
                                                    return accept_everything(tree, l, sp, rng);
                                                }}}) {
            auto [bstat, bdof] = t.chi2(*drafter, prefix, sp, joint, runs, broken);
            std::printf("[distribution] %s, broken chain verifier (%s), k=3: chi2 = %.1f (critical %.1f)\n", name, broken_name, bstat,
                        chi2_critical(bdof));
            EXPECT_GT(bstat, chi2_critical(bdof)) << broken_name;
        }
    }
}

// EAGLE-1 and EAGLE-3 heads at T > 0, chains, dynamic and static trees: their drafts carry the
// head's processed distribution q, sampled without replacement, and the output must follow the
// target's law. Broken chain and tree verifiers (both tree shapes) fed the same drafts must fail.
TEST(Speculative, SampledEagleChainsAndTreesFollowTheTargetDistributionAndBrokenVerifiersFail) {
    Tiny t;
    const std::vector<int32_t> prefix = {4, 2, 3, 1, 2};
    SamplingParams sp;
    sp.temperature = 1.0f;
    const auto joint = t.exact_joint(prefix, sp);
    const int runs = 4000;
    const TreeBudget dynamic_tree{TreeShape::Dynamic, 2, 3, 9}, static_tree{TreeShape::Static, 3, 4, 12};
    auto broken_chain = [&sp](const TokenTree & tr, const TargetLogits & l, Rng & rng) { return accept_everything(tr, l, sp, rng); };
    auto broken_tree = [&sp](const TokenTree & tr, const TargetLogits & l, Rng & rng) { return no_residual(tr, l, sp, rng); };
    for (const std::string kind : {"eagle1", "eagle3"}) {
        auto head = EagleHead::load(test::tiny_vocab_eagle_head(kind, kTinyVocab, 303), *t.target, t.backend);
        EagleDrafter drafter(*head, 64);
        int accepted = 0;
        auto count = [&](const RoundInfo & r) { accepted += int(r.result->accepted.size()); };
        for (TreeBudget shape : {TreeBudget{}, dynamic_tree, static_tree}) {
            auto [stat, dof] = t.chi2(drafter, prefix, sp, joint, runs, nullptr, shape, count);
            std::printf("[distribution] %s %s: chi2 = %.1f, dof = %d, critical = %.1f\n", kind.c_str(), tree_shape_name(shape.shape), stat,
                        dof, chi2_critical(dof));
            EXPECT_LT(stat, chi2_critical(dof)) << kind << " " << tree_shape_name(shape.shape);
        }
        EXPECT_GT(accepted, runs / 2) << kind << ": the accept path must be exercised";
        auto [cstat, cdof] = t.chi2(drafter, prefix, sp, joint, runs, broken_chain);
        std::printf("[distribution] %s chain, verifier accepting everything: chi2 = %.1f (critical %.1f)\n", kind.c_str(), cstat,
                    chi2_critical(cdof));
        EXPECT_GT(cstat, chi2_critical(cdof)) << kind;
        for (TreeBudget shape : {dynamic_tree, static_tree}) {
            auto [tstat, tdof] = t.chi2(drafter, prefix, sp, joint, runs, broken_tree, shape);
            std::printf("[distribution] %s %s tree, verifier without residual: chi2 = %.1f (critical %.1f)\n", kind.c_str(),
                        tree_shape_name(shape.shape), tstat, chi2_critical(tdof));
            EXPECT_GT(tstat, chi2_critical(tdof)) << kind << " " << tree_shape_name(shape.shape);
        }
    }
}

// SpecEE's lossless mode: early-exited tokens as drafts. A predictor that always exits at layer 1
// (drafts far from the target) and one that always exits at the last layer must both leave plain
// greedy decoding's output. At the last layer the candidates come from the target itself (its
// top 4 as a draft model), so the exited drafts are its own tokens and are accepted: the accept
// path, and the drafter's hand-over of the last accepted position's features after a rejection.
TEST(Speculative, GreedyEarlyExitDraftsEqualPlainDecoding) {
    for (const std::string target : {"llama_gqa_f32", "gemma3_swa_q8_0"}) {
        Spec s(target);
        const int L = s.target->config().n_layer;
        auto head = EagleHead::load(test::eagle_head_path("eagle3", target), *s.target, s.backend);
        for (int exit_layer : {1, L}) {
            test::PredictorSpec spec;
            spec.layers = {exit_layer};
            spec.output_bias = 100.0f;
            auto predictor = ExitPredictor::load(test::write_predictor(spec, *s.target, "always_" + target + std::to_string(exit_layer)), *s.target);
            std::unique_ptr<Drafter> candidates = exit_layer == L ? std::unique_ptr<Drafter>(std::make_unique<DraftModelDrafter>(*s.target, 256))
                                                                  : std::make_unique<EagleDrafter>(*head, 256);
            EarlyExitDrafter drafter(*s.target, *predictor, 0.5f, std::move(candidates), 256);
            int accepted = 0;
            for (const auto & prompt : kPrompts) {
                const auto want = plain_greedy(*s.target, s.runner, prompt, 40);
                const auto got = s.run(drafter, DraftPolicyKind::Fixed, 4, prompt, 40, {}, [&](const RoundInfo & r) { accepted += int(r.result->accepted.size()); });
                ASSERT_EQ(got, want) << target << " exit at " << exit_layer;
            }
            EXPECT_GT(drafter.exit_stats().exited(), 0) << target;
            if (exit_layer == L) {
                EXPECT_GT(accepted, 0) << target << ": the accept path must be exercised";
            }
        }
    }
}

// The same with the online scheduling level: predictors at every layer of a 3-layer target, the
// offline schedule the last layer alone; after kOnlineWindow exits there, the drafts exit at
// layer 1 (far from the target) and the output must still be plain greedy decoding's.
TEST(Speculative, GreedyEarlyExitDraftsWithTheOnlineLevelEqualPlainDecoding) {
    const std::string target = "gemma3_swa_q8_0";
    Spec s(target);
    ASSERT_EQ(s.target->config().n_layer, 3);
    auto head = EagleHead::load(test::eagle_head_path("eagle3", target), *s.target, s.backend);
    test::PredictorSpec spec;
    spec.layers = {1, 2, 3};
    spec.offline_layers = std::vector<int32_t>{3};
    spec.output_bias = 100.0f;
    auto predictor = ExitPredictor::load(test::write_predictor(spec, *s.target, "always_online_" + target), *s.target);
    EarlyExitDrafter drafter(*s.target, *predictor, 0.5f, std::make_unique<EagleDrafter>(*head, 256), 256, true);
    for (const auto & prompt : kPrompts) {
        const auto want = plain_greedy(*s.target, s.runner, prompt, 40);
        ASSERT_EQ(s.run(drafter, DraftPolicyKind::Fixed, 4, prompt, 40), want) << target;
    }
    EXPECT_GT(drafter.exit_stats().exits_at.at(1), 0) << "the online level must probe below the offline schedule";
    EXPECT_GT(drafter.exit_stats().exits_at.at(3), 0);
}

// The same drafts at T > 0: the output must follow the target's law, and a verifier that accepts
// every draft must be caught.
TEST(Speculative, SampledEarlyExitDraftsFollowTheTargetDistributionAndABrokenVerifierFails) {
    Tiny t;
    const std::vector<int32_t> prefix = {4, 2, 3, 1, 2};
    SamplingParams sp;
    sp.temperature = 1.0f;
    const auto joint = t.exact_joint(prefix, sp);
    const int runs = 4000;
    auto head = EagleHead::load(test::tiny_vocab_eagle_head("eagle3", kTinyVocab, 303), *t.target, t.backend);
    test::PredictorSpec spec;
    spec.layers = {t.target->config().n_layer};
    spec.output_bias = 100.0f;
    auto predictor = ExitPredictor::load(test::write_predictor(spec, *t.target, "always_tiny"), *t.target);
    EarlyExitDrafter drafter(*t.target, *predictor, 0.5f, std::make_unique<EagleDrafter>(*head, 64), 64);
    int accepted = 0;
    auto [stat, dof] = t.chi2(drafter, prefix, sp, joint, runs, nullptr, {}, [&](const RoundInfo & r) { accepted += int(r.result->accepted.size()); });
    std::printf("[distribution] specee chain: chi2 = %.1f, dof = %d, critical = %.1f\n", stat, dof, chi2_critical(dof));
    EXPECT_LT(stat, chi2_critical(dof));
    // Measured: 137 drafts accepted over the 4000 runs (one-hot drafts, accepted with p(token)).
    EXPECT_GT(accepted, runs / 40) << "the accept path must be exercised";
    auto broken = [&sp](const TokenTree & tr, const TargetLogits & l, Rng & rng) { return accept_everything(tr, l, sp, rng); };
    auto [bstat, bdof] = t.chi2(drafter, prefix, sp, joint, runs, broken);
    std::printf("[distribution] specee chain, verifier accepting everything: chi2 = %.1f (critical %.1f)\n", bstat, chi2_critical(bdof));
    EXPECT_GT(bstat, chi2_critical(bdof));
}

TEST(Speculative, TraceHasOneLinePerDecisionWithTheDocumentedFields) {
    Spec s;
    DraftModelDrafter drafter(*s.draft_small, 256);
    const std::string path = test::scratch_file("trace.jsonl");
    SamplingParams sp;
    sp.temperature = 1.0f;
    sp.seed = 3;
    {
        TraceWriter w(path, [](int32_t t) { return std::string("t").append(std::to_string(t)); });
        s.run(drafter, DraftPolicyKind::Fixed, 3, kPrompts[1], 20, sp,
              [&](const RoundInfo & r) { w.round(round_report(r)); });
    }
    std::ifstream in(path);
    std::string line;
    int lines = 0, emitted = 0;
    while (std::getline(in, line)) {
        auto j = nlohmann::json::parse(line);
        if (j["kind"] == "round") continue;  // checked by TraceRecordsEachRoundsTreeAndPolicyDecision
        ASSERT_EQ(j["kind"], "token");
        for (const char * k : {"round", "position", "token", "text", "q", "p", "accept_prob", "draw", "outcome", "draft_len", "draft_ms", "verify_ms"}) {
            ASSERT_TRUE(j.contains(k)) << k;
        }
        const std::string o = j["outcome"];
        emitted += o == "accepted" || o == "correction" || o == "bonus";
        ++lines;
    }
    EXPECT_GT(lines, 0);
    EXPECT_GE(emitted, 20);
}

// Catches a trace that loses or garbles a round's tree (tokens, parents, depths, draft
// probabilities), the accepted path or the policy's decision: the tree rebuilt from the trace's
// round lines must equal what the drafter handed to the verifier, round by round.
TEST(Speculative, TraceRecordsEachRoundsTreeAndPolicyDecision) {
    Spec s;
    DraftModelDrafter drafter(*s.target, 256);  // drafts what the target accepts: the policy keeps drafting trees
    const std::string path = test::scratch_file("trace_tree.jsonl");
    SamplingParams sp;
    sp.temperature = 1.0f;
    sp.seed = 5;
    std::vector<TokenTree> drafted;
    std::vector<std::vector<int>> accepted;
    std::vector<RoundDecision> decisions;
    {
        TraceWriter w(path, [](int32_t t) { return std::string("t").append(std::to_string(t)); });
        // A flat verify cost far above the drafter's real time (microseconds per level, a
        // millisecond under sanitizers or load): every node is free to verify, so the policy keeps
        // whole trees whatever the machine does (with a rising cost it often kept one node).
        TreeSizePolicy tree_size(std::vector<double>(10, 100.0));
        s.run(
            drafter, DraftPolicyKind::Fixed, 3, kPrompts[1], 24, sp,
            [&](const RoundInfo & r) {
                drafted.push_back(r.draft->tree);
                accepted.push_back(r.result->accepted);
                decisions.push_back(r.decision);
                w.round(round_report(r));
            },
            nullptr, nullptr, TreeBudget{TreeShape::Dynamic, 3, 3, 0}, &tree_size);
    }
    ASSERT_FALSE(drafted.empty());
    std::ifstream in(path);
    std::string line;
    size_t round = 0;
    int branching_rounds = 0;
    while (std::getline(in, line)) {
        const auto j = nlohmann::json::parse(line);
        if (j["kind"] != "round") {
            if (j["outcome"] == "accepted") {  // an accepted token names its node in the round's tree
                const TokenTree & t = drafted.at(round - 1);
                EXPECT_EQ(j["token"].get<int32_t>(), t.token.at(j["node"].get<int>()));
            }
            continue;
        }
        ASSERT_LT(round, drafted.size());
        EXPECT_EQ(j["round"].get<size_t>(), round);
        const auto & n = j["tree"];
        TokenTree rebuilt;
        for (size_t i = 0; i < n["token"].size(); ++i) {
            rebuilt.add(n["parent"][i].get<int>(), n["token"][i].get<int32_t>(), std::log(n["path_prob"][i].get<float>()));
        }
        const TokenTree & want = drafted[round];
        EXPECT_EQ(rebuilt.token, want.token) << "round " << round;
        EXPECT_EQ(rebuilt.parent, want.parent) << "round " << round;
        EXPECT_EQ(rebuilt.depth, want.depth) << "round " << round;
        EXPECT_EQ(n["depth"].get<std::vector<int>>(), want.depth);
        for (int i = 0; i < want.size(); ++i) {
            EXPECT_NEAR(n["q"][i].get<float>(), node_draft_prob(want, i), 1e-6f);
            EXPECT_NEAR(n["path_prob"][i].get<float>(), std::exp(want.logp[i]), 1e-6f);
            EXPECT_LT(node_draft_prob(want, i), 1.0f);  // a sampled draft model's q, not the deterministic 1
        }
        for (int i = 0; i < want.size(); ++i) branching_rounds += want.children(i).size() > 1 || want.children(TokenTree::kRoot).size() > 1;
        EXPECT_EQ(j["accepted"].get<std::vector<int>>(), accepted[round]);
        // The forward is part of the verify time; the commit follows the forward.
        EXPECT_GE(j["forward_ms"].get<double>(), 0.0);
        EXPECT_LE(j["forward_ms"].get<double>(), j["verify_ms"].get<double>());
        EXPECT_GE(j["commit_ms"].get<double>(), 0.0);
        EXPECT_EQ(j["policy"], "tree-size");
        EXPECT_EQ(j["verified_nodes"].get<int>(), want.size());
        EXPECT_EQ(j["drafted_nodes"].get<int>(), decisions[round].drafted_nodes);
        EXPECT_GE(j["drafted_nodes"].get<int>(), want.size());
        // A round the policy chose not to draft says so; one that drafted, how it sized the tree.
        EXPECT_NE(j["why"].get<std::string>().find(want.size() == 0 ? "no draft" : "calibration"), std::string::npos) << j["why"];
        ++round;
    }
    EXPECT_EQ(round, drafted.size());
    EXPECT_GT(branching_rounds, 0) << "no round drafted a real tree: the test would not see parents garbled";
}

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

// A drafter that hands out one fixed tree: what a model drafter proposes, without a model.
class FixedTreeDrafter : public Drafter {
public:
    explicit FixedTreeDrafter(TokenTree tree) : tree_(std::move(tree)) {}
    const char * name() const override { return "fixed"; }
    void start(const DraftRequest &) override {}
    Draft take() override { return Draft{tree_, 0.0f, {}}; }
    void accept(const Acceptance &) override {}
    void reset() override {}

private:
    TokenTree tree_;
};

// Catches: the lookup continuation not grafted (or grafted as a duplicate of a child the model
// already proposed), grafted nodes without a path probability below their parent's, or a graft at
// T > 0, where lossless tree sampling needs every node drawn from its parent's draft distribution.
TEST(Speculative, LookupGraftAddsThePromptContinuationToTheModelsTreeAtTemperatureZero) {
    TokenTree model_tree;
    const int a = model_tree.add(TokenTree::kRoot, 7, std::log(0.6f));
    model_tree.add(TokenTree::kRoot, 9, std::log(0.3f));
    model_tree.add(a, 8, std::log(0.4f));
    // "5 6 7 8 4 3 ... 5 6": lookup continues the trailing "5 6" with "7 8 4 3".
    const std::vector<int32_t> history = {5, 6, 7, 8, 4, 3, 1, 5, 6};
    auto drafter = LookupGraftDrafter(std::make_unique<FixedTreeDrafter>(model_tree), 1, 3);
    EXPECT_STREQ(drafter.name(), "fixed+lookup");
    SamplingParams greedy;
    drafter.start(DraftRequest{history, TreeBudget{TreeShape::Dynamic, 4, 2, 4}, &greedy, nullptr});
    Draft grafted = drafter.take();
    const TokenTree t = grafted.tree;
    ASSERT_EQ(t.size(), 5);  // a chain of 4 (the round's nodes): 7 and 8 were the model's; 4 and 3 are new, below 8
    EXPECT_EQ(grafted.grafted_from, 3);
    EXPECT_EQ(t.token[3], 4);
    EXPECT_EQ(t.parent[3], 2);
    EXPECT_EQ(t.token[4], 3);
    EXPECT_EQ(t.parent[4], 3);
    EXPECT_EQ(t.depth[4], 4);
    // Before any chain was checked against the text, each step is priced at the prior.
    EXPECT_FLOAT_EQ(t.logp[3], t.logp[2] + std::log(float(LookupGraftDrafter::kPriorStepProb)));
    EXPECT_FLOAT_EQ(t.logp[4], t.logp[3] + std::log(float(LookupGraftDrafter::kPriorStepProb)));
    // Pruned, the grafted nodes stay a suffix and grafted_from follows them.
    prune_draft(grafted, 4);  // path probabilities 7: 0.6, 8: 0.4, 9: 0.3, 4: 0.2, 3: 0.1
    EXPECT_EQ(grafted.tree.token, (std::vector<int32_t>{7, 9, 8, 4}));
    EXPECT_EQ(grafted.grafted_from, 3);
    prune_draft(grafted, 2);
    EXPECT_EQ(grafted.tree.token, (std::vector<int32_t>{7, 8}));
    EXPECT_EQ(grafted.grafted_from, -1);
    // A continuation the model did not propose at all becomes a new child of the root.
    TokenTree other;
    other.add(TokenTree::kRoot, 9, std::log(0.9f));
    EXPECT_EQ(graft_chain(other, std::vector<int32_t>{7, 8}, std::vector<float>{std::log(0.5f), std::log(0.5f)}), 2);
    EXPECT_EQ(other.children(TokenTree::kRoot), (std::vector<int>{0, 1}));
    EXPECT_FLOAT_EQ(other.logp[1], std::log(0.5f));
    // A path both propose is priced by the likelier estimate, and the continuation below it too.
    TokenTree doubted;
    doubted.add(TokenTree::kRoot, 7, std::log(0.1f));
    EXPECT_EQ(graft_chain(doubted, std::vector<int32_t>{7, 8}, std::vector<float>{std::log(0.8f), std::log(0.5f)}), 1);
    EXPECT_FLOAT_EQ(doubted.logp[0], std::log(0.8f));
    EXPECT_FLOAT_EQ(doubted.logp[1], std::log(0.8f) + std::log(0.5f));

    SamplingParams sampled;
    sampled.temperature = 1.0f;
    drafter.start(DraftRequest{history, TreeBudget{TreeShape::Dynamic, 4, 2, 8}, &sampled, nullptr});
    EXPECT_EQ(drafter.take().tree.token, model_tree.token);
}

// Catches: lookup's step probabilities not learned from the text that followed its chains (a
// chain that keeps holding priced like one that never does), learned past a chain's first
// mismatch, or a free draft (the lookup chain alone, for rounds without a model draft) that
// differs from lookup's continuation or is offered at T > 0.
TEST(Speculative, LookupGraftLearnsHowOftenItsChainsHoldAndDraftsThemAlone) {
    SamplingParams greedy;
    const TreeBudget depth3{TreeShape::Dynamic, 3, 2, 3};  // lookup's chain: as many tokens as the round's nodes
    // A text of period 5: lookup's continuation always holds.
    std::vector<int32_t> periodic = {5, 6, 7, 8, 9, 5, 6};
    LookupGraftDrafter holds(std::make_unique<FixedTreeDrafter>(TokenTree{}), 1, 3);
    for (int round = 0; round < 20; ++round) {
        const TokenTree chain = holds.free_draft(DraftRequest{periodic, depth3, &greedy, nullptr}).tree;
        ASSERT_EQ(chain.size(), 3);
        for (int i = 0; i < 3; ++i) {
            EXPECT_EQ(chain.token[i], periodic[periodic.size() - 5 + i]);
            EXPECT_EQ(chain.parent[i], i - 1);
            EXPECT_FLOAT_EQ(chain.logp[i], (i > 0 ? chain.logp[i - 1] : 0.0f) + std::log(float(holds.step_prob(i + 1))));
        }
        periodic.insert(periodic.end(), chain.token.begin(), chain.token.end());
    }
    for (int depth = 1; depth <= 3; ++depth) EXPECT_GT(holds.step_prob(depth), 0.9) << depth;
    // The tree policy will scale path probabilities by its calibration: lookup's own leave the root divided by it.
    TreeBudget calibrated = depth3;
    calibrated.calibration = 0.5f;
    const TokenTree halved = holds.free_draft(DraftRequest{periodic, calibrated, &greedy, nullptr}).tree;
    ASSERT_EQ(halved.size(), 3);
    EXPECT_FLOAT_EQ(halved.logp[0], std::log(float(holds.step_prob(1)) / 0.5f));
    EXPECT_FLOAT_EQ(halved.logp[1], halved.logp[0] + std::log(float(holds.step_prob(2))));
    // Each root is searched once, kMaxDepth deep, and the whole chain is checked against the text:
    // steps deeper than a round's nodes are learned too.
    EXPECT_GT(holds.step_prob(4), 0.9);

    // A text that never goes on as lookup proposes: the first step falls, deeper ones are never reached.
    LookupGraftDrafter fails(std::make_unique<FixedTreeDrafter>(TokenTree{}), 1, 3);
    const std::vector<int32_t> base = {5, 6, 7, 8, 9, 5, 6};
    for (int round = 0; round < 20; ++round) {
        ASSERT_EQ(fails.free_draft(DraftRequest{base, depth3, &greedy, nullptr}).tree.size(), 3);
        std::vector<int32_t> went_on = base;
        went_on.push_back(42);
        EXPECT_TRUE(fails.free_draft(DraftRequest{went_on, depth3, &greedy, nullptr}).tree.empty());  // no earlier "42"
    }
    EXPECT_LT(fails.step_prob(1), 0.1);
    EXPECT_DOUBLE_EQ(fails.step_prob(2), LookupGraftDrafter::kPriorStepProb);
    fails.reset();
    EXPECT_DOUBLE_EQ(fails.step_prob(1), LookupGraftDrafter::kPriorStepProb);

    SamplingParams sampled;
    sampled.temperature = 1.0f;
    EXPECT_TRUE(holds.free_draft(DraftRequest{base, depth3, &sampled, nullptr}).tree.empty());
}

// A model drafter too slow to ever pay: the tree policy stops drafting with it after its first round.
class SlowTreeDrafter : public FixedTreeDrafter {
public:
    using FixedTreeDrafter::FixedTreeDrafter;
    void start(const DraftRequest &) override { std::this_thread::sleep_for(std::chrono::milliseconds(50)); }
};

// Catches: rounds where the tree policy drafts no model tree (its drafter is far too slow to pay)
// not offering the drafter's free draft, so that a text repeating itself gets no lookup chain
// verified; or a free draft changing the greedy text. The bundled trained target continues a
// repeated token pattern, which lookup proposes.
TEST(Speculative, RoundsWithoutAModelDraftStillVerifyTheLookupChain) {
    Backend backend{BackendOptions{"cpu", 1}};
    const auto target = Model::load(test::shipped_model("specula-target.gguf"), backend);
    ModelRunner runner(*target);
    std::vector<int32_t> prompt = {1};
    for (int i = 0; i < 6; ++i) prompt.insert(prompt.end(), {450, 4996, 17354, 1701, 822, 5713, 13});
    for (auto & t : prompt) t %= target->config().n_vocab;
    const auto want = plain_greedy(*target, runner, prompt, 48);
    TokenTree guess;
    guess.add(TokenTree::kRoot, want[0], 0.0f);
    LookupGraftDrafter drafter(std::make_unique<SlowTreeDrafter>(guess), 1, 3);
    std::vector<double> curve;
    for (int b = 1; b <= 17; ++b) curve.push_back(1.0 + 0.1 * (b - 1));
    TreeSizePolicy tree_size(curve);
    auto policy = make_draft_policy(DraftPolicyKind::Fixed, 4, std::vector<double>(5, 1.0));
    KvCache cache(backend, target->config(), 256);
    int free_rounds = 0, free_accepted = 0, model_rounds = 0;
    SequenceParts parts{cache, &drafter, policy.get(), TreeBudget{TreeShape::Dynamic, 6, 2, 16},
                        [&](const RoundInfo & r) {
                            const bool free = r.decision.why.rfind("no model draft", 0) == 0;
                            free_rounds += free;
                            model_rounds += !free && r.draft->tree.size() > 0;
                            if (free) free_accepted += static_cast<int>(r.result->accepted.size());
                        },
                        nullptr, &tree_size};
    GenerationOptions o;
    o.n_predict = 48;
    o.stop_at_end_of_generation = false;
    std::vector<int32_t> got;
    generate_speculative(
        runner, parts, prompt, o, [](int32_t) { return false; }, [&](int32_t t) {
        got.push_back(t);
        return true; });
    EXPECT_EQ(got, want);
    EXPECT_EQ(model_rounds, 1);
    EXPECT_GT(free_accepted, 16) << free_rounds << " rounds without a model draft";
}

// Catches: prompt lookup not grafted by default into the trees the tree policy sizes (where its
// nodes are priced and pruned), or grafted by default into chains and fixed-size trees, where
// nothing prices them; or an explicit --lookup / --no-lookup not obeyed.
TEST(Speculative, PromptLookupIsGraftedByDefaultIntoPolicySizedTreesOnly) {
    EngineOptions o;
    EXPECT_TRUE(drafting_rules(o, DrafterKind::Eagle3).lookup);
    EXPECT_TRUE(drafting_rules(o, DrafterKind::Eagle).lookup);
    EXPECT_FALSE(drafting_rules(o, DrafterKind::DraftModel).lookup);  // a chain by default
    EXPECT_FALSE(drafting_rules(o, DrafterKind::Ngram).lookup);
    o.tree = TreeShape::Dynamic;
    EXPECT_TRUE(drafting_rules(o, DrafterKind::DraftModel).lookup);
    o.tree_nodes = 8;
    EXPECT_FALSE(drafting_rules(o, DrafterKind::Eagle3).lookup);
    o.tree_nodes = 0;
    o.tree = TreeShape::Chain;
    EXPECT_FALSE(drafting_rules(o, DrafterKind::Eagle3).lookup);
    o.drafter.lookup = true;
    EXPECT_TRUE(drafting_rules(o, DrafterKind::Eagle3).lookup);
    o.tree.reset();
    o.drafter.lookup = false;
    EXPECT_FALSE(drafting_rules(o, DrafterKind::Eagle3).lookup);
}

// Catches a verify-cost curve that keeps a stalled sample: 1 token timed at 1.7 s (seen on a
// loaded machine) made the tree policy verify 32 nodes every round for the whole run.
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

TEST(Speculative, BadSetupsGiveClearErrors) {
    auto message = [](const EngineOptions & o) {
        try {
            Engine::open(o);
        } catch (const Error & e) {
            return std::string(e.what());
        }
        return std::string("<no error>");
    };
    EngineOptions o;
    o.model_path = test::model_path("llama_gqa_f32");
    o.n_threads = 1;
    o.drafter = {DrafterKind::DraftModel, test::model_path("qwen2_bias")};
    EXPECT_NE(message(o).find("has a different vocabulary"), std::string::npos) << message(o);
    o.drafter = {DrafterKind::DraftModel, test::model_path("llama_draft_small")};
    o.n_ctx = 8;
    o.draft_max = 8;
    EXPECT_NE(message(o).find("does not fit the 8-token context"), std::string::npos) << message(o);
    o.n_ctx = 256;
    o.tree = TreeShape::Dynamic;
    o.drafter = {DrafterKind::Ngram};
    EXPECT_NE(message(o).find("the n-gram drafter drafts chains only"), std::string::npos) << message(o);
    o.tree.reset();
    o.drafter = {DrafterKind::Ngram, "", 3, 1};
    EXPECT_NE(message(o).find("n-gram sizes must satisfy 1 <= min <= max"), std::string::npos) << message(o);
}

// Catches a DrafterSpec whose kind and path disagree slipping through to a crash or a silent
// plain run: a file kind with no file, a file for a kind that takes none.
TEST(Speculative, DrafterSpecErrorsNameTheProblem) {
    auto message = [](DrafterSpec spec) {
        EngineOptions o;
        o.model_path = test::model_path("llama_gqa_f32");
        o.n_threads = 1;
        o.drafter = std::move(spec);
        return test::error_message([&] { Engine::open(o); });
    };
    EXPECT_EQ(message({DrafterKind::Eagle3}), "the eagle3 drafter needs a GGUF path");
    EXPECT_EQ(message({DrafterKind::Eagle}), "the eagle drafter needs a GGUF path");
    EXPECT_EQ(message({DrafterKind::DraftModel}), "the draft drafter needs a GGUF path");
    EXPECT_EQ(message({DrafterKind::Ngram, "x.gguf"}), "the ngram drafter takes no file, but was given x.gguf");
    EXPECT_EQ(message({DrafterKind::None, "x.gguf"}), "the none drafter takes no file, but was given x.gguf");
    EXPECT_EQ(message({DrafterKind::Ngram, "", 1, 3, true}),
              "prompt lookup (--lookup) grafts into a model drafter's trees: add --draft, --eagle or --eagle3 (--ngram drafts by lookup alone)");
    EXPECT_EQ(message({DrafterKind::None, "", 1, 3, true}),
              "prompt lookup (--lookup) grafts into a model drafter's trees: add --draft, --eagle or --eagle3");
}

}  // namespace
}  // namespace specula
