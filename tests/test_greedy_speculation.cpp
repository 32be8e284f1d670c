// Greedy speculation reproduces plain greedy decoding token for token, for every drafter, draft
// length, policy and tree shape, early-exit drafts included; the caches hold exactly the accepted
// sequence after every round.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

#include "draft/draft_model_drafter.h"
#include "draft/eagle_drafter.h"
#include "draft/early_exit.h"
#include "draft/ngram.h"
#include "runtime/eagle_head.h"
#include "runtime/kv_cache.h"
#include "runtime/exit_predictor.h"
#include "specee_predictor.h"
#include "speculative_run.h"

namespace specula {
namespace {

using test::kPrompts;
using test::plain_decoding;
using test::Spec;

TEST(Speculative, GreedyOutputEqualsPlainDecodingForEveryDrafterLengthAndPolicy) {
    Spec s;
    DraftModelDrafter self_draft(*s.target, 256);        // accepts (nearly) everything
    DraftModelDrafter small_draft(*s.draft_small, 256);  // accepts little
    DraftModelDrafter cascade_draft(*s.draft_small, 256);
    cascade_draft.cascade(1, 3, nullptr);
    NgramDrafter ngram(1, 3);
    std::vector<Drafter *> drafters = {&self_draft, &small_draft, &cascade_draft, &ngram};
    int total_accepted = 0;
    for (const auto & prompt : kPrompts) {
        const auto want = plain_decoding(*s.target, s.runner, prompt, 40);
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
        const auto want = plain_decoding(*s.target, s.runner, prompt, 40);
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

// A draft model whose logits cover some ids only (a trimmed draft vocabulary): the first 16000, or
// scattered ids as a frequency-ranked file keeps (every third id and the prompts' tokens). It
// drafts from those alone, chains and trees, and the target's verification keeps plain's output.
TEST(Speculative, GreedyDraftsOfATrimmedDraftVocabularyEqualPlainDecoding) {
    Spec s;
    auto twin = Model::load(test::quantized_twin("llama_gqa_f32", "q4_0"), s.backend);
    std::vector<int32_t> first(16000), scattered;
    std::iota(first.begin(), first.end(), 0);
    for (int32_t t = 0; t < twin->config().n_vocab; t += 3) scattered.push_back(t);
    for (const auto & prompt : kPrompts) scattered.insert(scattered.end(), prompt.begin(), prompt.end());
    for (const std::vector<int32_t> * ids : {&first, &scattered}) {
        const auto runner = std::make_shared<ModelRunner>(*twin, *ids);
        DraftModelDrafter trimmed(*twin, runner, std::make_unique<KvCache>(s.backend, twin->config(), 256));
        int accepted = 0, drafted = 0;
        auto on_round = [&](const RoundInfo & r) {
            accepted += static_cast<int>(r.result->accepted.size());
            for (int32_t t : r.draft->tree.token) {
                ++drafted;
                EXPECT_TRUE(std::binary_search(runner->logit_ids().begin(), runner->logit_ids().end(), t)) << "a draft outside the trimmed vocabulary";
            }
        };
        for (const auto & prompt : kPrompts) {
            const auto want = plain_decoding(*s.target, s.runner, prompt, 40);
            for (int k : {1, 4, 8}) {
                ASSERT_EQ(s.run(trimmed, DraftPolicyKind::Fixed, k, prompt, 40, {}, on_round), want) << "chain k=" << k;
            }
            const TreeBudget tree{TreeShape::Dynamic, 4, 3, 12};
            ASSERT_EQ(s.run(trimmed, DraftPolicyKind::Fixed, 4, prompt, 40, {}, on_round, nullptr, nullptr, tree), want) << "tree";
        }
        EXPECT_GT(drafted, 0);
        EXPECT_GT(accepted, 0);
    }
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
        const auto want = plain_decoding(*s.target, s.runner, prompt, 40);
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
            const auto want = plain_decoding(*s.target, s.runner, prompt, 40);
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
        const auto want = plain_decoding(*s.target, s.runner, prompt, 40);
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

// Catches: cascade drafting handing out a chain other than the draft model's own at T = 0 (a
// lookahead token taken where the model ranks another first, or a row of logits read for the
// wrong token), or running as many drafter forwards as drafting alone.
TEST(Speculative, CascadeDraftsAreTheDraftModelsOwnChainsInFewerForwards) {
    // A 10-token vocabulary, whose n-grams recur.
    test::Tiny t;
    ModelRunner draft_runner(*t.draft);
    DraftModelDrafter alone(*t.draft, 256), cascade(*t.draft, 256);
    cascade.cascade(1, 3, nullptr);
    SamplingParams greedy;
    int forwards_alone = 0, forwards_cascade = 0, rounds = 0;
    // Text that repeats: a passage, the draft model's own continuation of it, the passage again
    // and its continuation of all that, where lookup proposes what followed the passage before.
    for (const std::vector<int32_t> & passage : {std::vector<int32_t>{4, 2, 3, 1, 2, 8, 0, 6, 5, 9, 3, 7},
                                                 std::vector<int32_t>{7, 1, 0, 5, 2, 2, 9, 4, 6, 8, 3, 0}}) {
        std::vector<int32_t> history = passage;
        for (int copy = 0; copy < 2; ++copy) {
            const auto own = plain_decoding(*t.draft, draft_runner, history, 16);
            history.insert(history.end(), own.begin(), own.end());
            if (copy == 0) history.insert(history.end(), passage.begin(), passage.end());
        }
        alone.reset();
        cascade.reset();
        for (size_t L = passage.size() + 1; L <= history.size(); ++L) {
            const DraftRequest request{std::span(history).first(L), TreeBudget{TreeShape::Chain, 6, 1, 6}, &greedy, nullptr};
            std::vector<std::vector<int32_t>> chains;
            for (DraftModelDrafter * d : {&alone, &cascade}) {
                d->start(request);
                Drafter * one[] = {d};
                (d == &alone ? forwards_alone : forwards_cascade) += run_drafts(one).forwards;
                chains.push_back(d->take().tree.token);
                d->accept(Acceptance{static_cast<int>(L)});
            }
            ASSERT_EQ(chains[1], chains[0]) << "history of " << L << " tokens";
            ++rounds;
        }
    }
    std::printf("[cascade] %d chains of 6: %d drafter forwards alone, %d with cascade drafting\n", rounds, forwards_alone, forwards_cascade);
    EXPECT_LT(forwards_cascade, forwards_alone * 9 / 10);
}

TEST(Speculative, CachesHoldExactlyTheAcceptedSequenceAfterEveryRound) {
    Spec s;
    ModelRunner draft_runner(*s.draft_small);
    const TreeBudget dynamic_tree{TreeShape::Dynamic, 4, 3, 10};
    for (bool cascade : {false, true})
        for (auto [temperature, tree] : {std::pair{0.0f, TreeBudget{}}, std::pair{1.0f, TreeBudget{}}, std::pair{0.0f, dynamic_tree},
                                         std::pair{1.0f, dynamic_tree}}) {
            DraftModelDrafter drafter(*s.draft_small, 256);
            if (cascade) drafter.cascade(1, 3, nullptr);
            SCOPED_TRACE(cascade ? "cascade drafting" : "the draft model alone");
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
                const auto want = plain_decoding(*s.target, s.runner, prompt, 40);
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
        const auto want = plain_decoding(*s.target, s.runner, prompt, 40);
        ASSERT_EQ(s.run(drafter, DraftPolicyKind::Fixed, 4, prompt, 40), want) << target;
    }
    EXPECT_GT(drafter.exit_stats().exits_at.at(1), 0) << "the online level must probe below the offline schedule";
    EXPECT_GT(drafter.exit_stats().exits_at.at(3), 0);
}

}  // namespace
}  // namespace specula
