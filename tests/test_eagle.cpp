// EAGLE heads: loading and fit checks, greedy equivalence, the head's cache after every round,
// and EAGLE-3 logits against llama.cpp's own eagle3 implementation.
#include <gtest/gtest.h>

#include <cmath>

#include "specula/error.h"
#include "draft/eagle_drafter.h"
#include "eagle3_vocab.h"
#include "engine/generate.h"
#include "engine/sequence.h"
#include "engine/verify_cost_probe.h"
#include "runtime/kv_cache.h"
#include "policy/tree_size.h"
#include "llama_oracle.h"
#include "runtime/backend.h"
#include "runtime/eagle_head.h"
#include "runtime/forward.h"
#include "runtime/model.h"
#include "speculative_run.h"
#include "test_models.h"
#include "tokenizer/tokenizer.h"

namespace specula {
namespace {

const std::vector<int32_t> kPrompt = {1, 822, 5713, 29898, 29876, 1125, 13, 1678, 565, 302, 529, 29871, 29906};

struct Fixture {
    Backend backend{BackendOptions{"cpu", 1}};
    std::unique_ptr<Model> target = Model::load(test::model_path("llama_gqa_f32"), backend);
    ModelRunner runner{*target};

    std::vector<int32_t> plain(int n) { return test::plain_decoding(*target, runner, kPrompt, n); }

    std::vector<int32_t> speculative(Drafter & d, TreeBudget tree, int n, std::function<void(const RoundInfo &)> on_round = nullptr,
                                     KvCache * cache_out = nullptr) {
        KvCache local(backend, target->config(), 256);
        KvCache & cache = cache_out ? *cache_out : local;
        auto policy = make_draft_policy(DraftPolicyKind::Fixed, 4, {});
        SequenceParts parts{cache, &d, policy.get(), tree, std::move(on_round), nullptr};
        GenerationOptions o;
        o.n_predict = n;
        o.stop_at_end_of_generation = false;
        std::vector<int32_t> out;
        generate_speculative(
            runner, parts, kPrompt, o, [](int32_t) { return false; }, [&](int32_t t) {
            out.push_back(t);
            return true; });
        return out;
    }
};

TEST(Eagle, GreedyOutputEqualsPlainDecodingForEveryHeadAndShape) {
    Fixture f;
    const auto want = f.plain(40);
    for (const auto & [kind, n_draft] : std::vector<std::pair<std::string, int>>{{"eagle1", 0}, {"eagle3", 0}, {"eagle3", 4000}}) {
        auto head = EagleHead::load(test::eagle_head_path(kind, "llama_gqa_f32", n_draft), *f.target, f.backend);
        EagleDrafter drafter(*head, 256);
        for (TreeBudget tree : {TreeBudget{TreeShape::Chain, 4, 1, 4}, TreeBudget{TreeShape::Static, 5, 4, 16},
                                TreeBudget{TreeShape::Dynamic, 5, 4, 24}}) {
            int drafted = 0;
            const auto got = f.speculative(drafter, tree, 40, [&](const RoundInfo & r) { drafted += r.draft->tree.size(); });
            EXPECT_EQ(got, want) << kind << " d2t=" << n_draft << " " << tree_shape_name(tree.shape);
            EXPECT_GT(drafted, 40) << "the head drafted nothing";
        }
    }
}

// Python source of the kind the bundled family was trained on (not from its corpus).
const char * kCodePrompt =
    "class TestCase(unittest.TestCase):\n"
    "    def test_fibonacci(self):\n";

// The bundled heads were trained for the bundled target and accept often, so the accept path
// (compaction of accepted tree paths, the head's catch-up over several newly verified positions)
// runs in most rounds, unlike with random heads. Chains under every draft-length policy, a static
// tree, a fixed-size dynamic tree and the Engine's default for heads (a dynamic tree sized every
// round by TreeSizePolicy) must all reproduce plain greedy decoding; the acceptance floors keep
// the test from passing on corrections alone (a head that stopped accepting would fail them).
TEST(Eagle, TrainedHeadsAcceptAndDecodeExactlyGreedilyWithEveryPolicyAndTree) {
    constexpr int kGenerate = 40, kCtx = 256, kDraftMax = 6;
    Backend backend{BackendOptions{"cpu", 1}};
    auto target = Model::load(test::shipped_model("specula-target.gguf"), backend);
    ModelRunner runner(*target);
    const std::vector<int32_t> prompt = Tokenizer(test::shipped_model("specula-target.gguf")).tokenize(kCodePrompt);
    GenerationOptions o;
    o.n_predict = kGenerate;
    o.stop_at_end_of_generation = false;
    auto never_end = [](int32_t) { return false; };
    std::vector<int32_t> want;
    {
        KvCache cache(backend, target->config(), kCtx);
        generate_plain(runner, cache, prompt, o, never_end, [&](int32_t t) {
            want.push_back(t);
            return true;
        });
    }
    // The cost policy and the tree size read a verify-cost curve: measured, as the Engine does, so
    // that it scales with the drafts' measured times when the machine is loaded or sanitized.
    std::vector<double> cost;
    {
        KvCache cache(backend, target->config(), kCtx);
        std::vector<int32_t> tiled;
        while (static_cast<int>(tiled.size()) <= kAutoTreeMaxNodes) tiled.insert(tiled.end(), prompt.begin(), prompt.end());
        cost = measure_verify_cost(runner, cache, tiled, kAutoTreeMaxNodes + 1, 1);
    }

    for (const std::string kind : {"eagle1", "eagle3"}) {
        auto head = EagleHead::load(test::shipped_model("specula-" + kind + ".gguf"), *target, backend);
        EagleDrafter drafter(*head, kCtx);
        // Floors at about a third of the least that was measured (docs/validation.md): drafts are
        // accepted, whole multi-token paths too. The cost policy and the policy-sized tree decide
        // from measured times, so their floors only ask that drafts were accepted at all (the cost
        // policy may find that drafting does not pay on a loaded machine and draft little).
        struct Mode {
            std::string name;
            DraftPolicyKind policy;
            TreeBudget tree;
            bool sized;
            int min_accepted, min_path;
        };
        const std::vector<Mode> modes = {
            {"chain fixed", DraftPolicyKind::Fixed, {}, false, 6, 2},
            {"chain heuristic", DraftPolicyKind::Heuristic, {}, false, 6, 2},
            {"chain cost", DraftPolicyKind::Cost, {}, false, 1, 1},
            {"static tree", DraftPolicyKind::Fixed, {TreeShape::Static, 5, 4, 16}, false, 6, 2},
            {"dynamic tree", DraftPolicyKind::Fixed, {TreeShape::Dynamic, 6, 4, 24}, false, 6, 2},
            {"policy-sized dynamic tree", DraftPolicyKind::Fixed, {TreeShape::Dynamic, 6, 4, 0}, true, 1, 1},
        };
        for (const Mode & m : modes) {
            KvCache cache(backend, target->config(), kCtx);
            auto policy = make_draft_policy(m.policy, kDraftMax, cost);
            TreeSizePolicy tree_size(cost);
            int deepest_accepted = 0;
            SequenceParts parts{cache, &drafter, policy.get(), m.tree,
                                [&](const RoundInfo & r) { deepest_accepted = std::max(deepest_accepted, int(r.result->accepted.size())); },
                                nullptr, m.sized ? &tree_size : nullptr};
            std::vector<int32_t> got;
            const GenerationStats st = generate_speculative(runner, parts, prompt, o, never_end, [&](int32_t t) {
                got.push_back(t);
                return true;
            });
            const SpeculationStats & sp = st.speculation;
            std::printf("[eagle-trained] %s %-25s %2d rounds, %3d drafted, %2d accepted (%.2f tokens per round, deepest %d)\n",
                        kind.c_str(), m.name.c_str(), sp.rounds, sp.drafted, sp.accepted, sp.mean_accepted_length(), deepest_accepted);
            EXPECT_EQ(got, want) << kind << " " << m.name;
            EXPECT_GE(sp.accepted, m.min_accepted) << kind << " " << m.name;
            EXPECT_GE(deepest_accepted, m.min_path) << kind << " " << m.name;
        }
    }
}

// After every round the head's cache must equal one written from scratch from the target's
// features of the accepted sequence: entry P = (token P+1, target features at P), for P < root,
// from the first position its prompt window keeps (the whole 13-token prompt, or with a window of
// 5 positions 7.. in slots 0..). Catches self-fed drafts left in the cache, entries at the wrong
// positions or slots, and a window that drops entries after the prompt.
TEST(Eagle, HeadCacheHoldsTargetFeatureEntriesForTheAcceptedSequence) {
    Fixture f;
    for (const std::string kind : {"eagle1", "eagle3"}) {
        for (const int window : {EagleDrafter::kPromptWindow, 5}) {
            auto head = EagleHead::load(test::eagle_head_path(kind, "llama_gqa_f32"), *f.target, f.backend);
            EagleDrafter drafter(*head, 256, window);
            ModelRunner head_runner(*head);
            const auto layers = head->config().target_layers;
            const int first = std::max(0, static_cast<int>(kPrompt.size()) - 1 - window);
            int checked = 0;
            auto check = [&](const RoundInfo & r) {
                const KvCache & hc = drafter.cache();
                if (hc.size() == 0) return;
                ASSERT_EQ(drafter.first_position(), first) << kind << " window " << window;
                ASSERT_EQ(first + hc.size(), r.base) << "entries past the verified root: self-fed drafts leaked";
                KvCache tc(f.backend, f.target->config(), 256);
                ForwardBatch tb = ForwardBatch::causal(r.history.first(r.base), 0, {});
                tb.tap_layers = layers;
                ForwardOutput to = f.runner.forward(tb, tc);
                ForwardBatch hb = ForwardBatch::causal(r.history.subspan(first + 1, hc.size()), first, {});
                const int E = f.target->config().n_embd;
                for (int p = first; p < r.base; ++p) {
                    for (const auto & tap : to.taps) hb.hidden_in.insert(hb.hidden_in.end(), tap.begin() + p * E, tap.begin() + (p + 1) * E);
                }
                KvCache fresh(f.backend, 1, head->shape().n_embd_kv, 256);
                head_runner.forward(hb, fresh);
                double diff = 0.0;
                for (int slot = 0; slot < hc.size(); ++slot) {
                    for (bool value : {false, true}) {
                        auto a = hc.read_row(0, value, slot), b = fresh.read_row(0, value, slot);
                        diff = std::max(diff, test::max_abs_diff(a, b));
                    }
                }
                EXPECT_LT(diff, 5e-3) << kind << " window " << window << " round " << r.round;
                ++checked;
            };
            f.speculative(drafter, TreeBudget{TreeShape::Dynamic, 4, 3, 12}, 30, check);
            EXPECT_GT(checked, 3);
        }
    }
}

// compact-eagle3 keeps the lm_head rows of the most frequent tokens: their logits are unchanged,
// the rest cannot be proposed, and the compact head still decodes exactly greedily.
TEST(Eagle, CompactVocabularyKeepsTheFrequentTokensLogits) {
    Fixture f;
    const std::string full_path = test::eagle_head_path("eagle3", "llama_gqa_f32");
    const int V = f.target->config().n_vocab;
    std::vector<int64_t> counts(V, 0);
    for (int id = 0; id < V; ++id) counts[id] = (id * 7919) % 1000;  // an arbitrary frequency table
    const std::string compact_path = test::scratch_file("eagle3-compact.gguf");
    const CompactVocabResult r = write_compact_eagle3(full_path, counts, 3000, compact_path);
    EXPECT_EQ(r.kept, 3000);
    EXPECT_GT(r.coverage, 3000.0 / V);
    EXPECT_NE(test::error_message([&] { write_compact_eagle3(compact_path, counts, 100, compact_path + ".x"); }).find("already has a compact"),
              std::string::npos);

    auto full = EagleHead::load(full_path, *f.target, f.backend);
    auto compact = EagleHead::load(compact_path, *f.target, f.backend);
    ASSERT_EQ(compact->d2t().size(), 3000u);
    const int E = f.target->config().n_embd, n = 6;
    std::vector<float> features(static_cast<size_t>(n) * 3 * E);
    Rng rng(4);
    for (auto & x : features) x = static_cast<float>(rng.uniform() - 0.5);
    ForwardBatch b = ForwardBatch::causal(std::span(kPrompt).first(n), 0, {0, 1, 2, 3, 4, 5});
    b.hidden_in = features;
    KvCache c1(f.backend, 1, full->shape().n_embd_kv, 16), c2(f.backend, 1, compact->shape().n_embd_kv, 16);
    ModelRunner r1(*full), r2(*compact);
    const ForwardOutput a = r1.forward(b, c1), c = r2.forward(b, c2);
    double diff = 0.0;
    for (int i = 0; i < n; ++i) {
        std::vector<float> kept_rows;  // the full head's logits of the kept tokens, in draft order
        for (int64_t id : compact->d2t()) kept_rows.push_back(a.logits_row(i)[id]);
        diff = std::max(diff, test::max_abs_diff(c.logits_row(i), kept_rows));
    }
    EXPECT_LT(diff, 2e-2);  // the kept rows are re-stored as F16, as they were

    // Every kept id is at least as frequent as every dropped one.
    std::vector<char> kept(V, 0);
    for (int32_t id : compact->d2t()) kept[id] = 1;
    int64_t min_kept = 1 << 30, max_dropped = -1;
    for (int id = 0; id < V; ++id) {
        if (kept[id]) min_kept = std::min(min_kept, counts[id]);
        else max_dropped = std::max(max_dropped, counts[id]);
    }
    EXPECT_GE(min_kept, max_dropped);

    const auto want = f.plain(40);
    EagleDrafter d(*compact, 256);
    EXPECT_EQ(f.speculative(d, TreeBudget{TreeShape::Dynamic, 4, 3, 10}, 40), want);
}

// The Engine's defaults for a head (dynamic tree sized each round from a verify-cost curve it
// measures itself) also work when the context is shorter than the largest tree.
TEST(Eagle, EngineDefaultsFitASmallContext) {
    for (int n_ctx : {16, 64}) {
        EngineOptions o;
        o.model_path = test::model_path("llama_gqa_f32");
        o.drafter = {DrafterKind::Eagle3, test::eagle_head_path("eagle3", "llama_gqa_f32")};
        o.n_threads = 1;
        o.n_ctx = n_ctx;
        auto engine = Engine::open(o);
        GenerationOptions g;
        g.n_predict = 8;
        g.stop_at_end_of_generation = false;
        const GenerationStats s = engine->generate("def f(x):", g, [](const std::string &) { return true; });
        EXPECT_EQ(s.n_generated, 8) << n_ctx;
        EXPECT_GT(s.speculation.rounds, 0);
    }
}

TEST(Eagle, MismatchedHeadsAreRefused) {
    Fixture f;
    const std::string narrow = test::eagle_head_path("eagle3", "llama_gqa_f32", 0, 32);
    EXPECT_NE(test::error_message([&] { EagleHead::load(narrow, *f.target, f.backend); }).find("expects a target hidden size of 32"), std::string::npos);
    const std::string deep = test::eagle_head_path("eagle3", "llama_gqa_f32", 0, 0, {1, 2, 9});
    EXPECT_NE(test::error_message([&] { EagleHead::load(deep, *f.target, f.backend); }).find("taps target layer 9"), std::string::npos);
    const std::string other_vocab = test::eagle_head_path("eagle3", "qwen2_bias");  // 151k-token lm_head
    EXPECT_NE(test::error_message([&] { EagleHead::load(other_vocab, *f.target, f.backend); }).find("lm_head has"), std::string::npos);
    EXPECT_NE(test::error_message([&] { EagleHead::load(test::model_path("llama_draft_small"), *f.target, f.backend); }).find("not an EAGLE head"),
              std::string::npos);
    EngineOptions o;
    o.model_path = test::model_path("llama_gqa_f32");
    o.n_threads = 1;
    o.drafter = {DrafterKind::Eagle3, test::eagle_head_path("eagle1", "llama_gqa_f32")};
    EXPECT_NE(test::error_message([&] { Engine::open(o); }).find("is an EAGLE-1 head: use --eagle"), std::string::npos);
}

// llama.cpp runs the same eagle3 GGUF: encoder (fc) on the target features, then the decoder on
// (token, g) pairs. specula's head must give the same logits and pre-norm outputs.
TEST(Eagle, Eagle3LogitsMatchLlamaCpp) {
    Fixture f;
    const std::string target_path = test::model_path("llama_gqa_f32");
    for (int n_draft : {0, 4000}) {
        const std::string head_path = test::eagle_head_path("eagle3", "llama_gqa_f32", n_draft);
        auto head = EagleHead::load(head_path, *f.target, f.backend);
        const int E = f.target->config().n_embd, n = 8;

        // Target features for the prompt's first n positions.
        KvCache tc(f.backend, f.target->config(), 64);
        ForwardBatch tb = ForwardBatch::causal(std::span(kPrompt).first(n), 0, {});
        tb.tap_layers = head->config().target_layers;
        ForwardOutput to = f.runner.forward(tb, tc);
        std::vector<float> features;
        for (int p = 0; p < n; ++p) {
            for (const auto & tap : to.taps) features.insert(features.end(), tap.begin() + p * E, tap.begin() + (p + 1) * E);
        }
        ForwardBatch hb = ForwardBatch::causal(std::span(kPrompt).subspan(1, n), 0, {0, 1, 2, 3, 4, 5, 6, 7});
        hb.hidden_in = features;
        KvCache hc(f.backend, 1, head->shape().n_embd_kv, 64);
        ModelRunner head_runner(*head);
        ForwardOutput ours = head_runner.forward(hb, hc);

        int n_vocab = 0;
        const std::vector<float> llama_logits =
            llama_eagle3_logits(target_path, head_path, std::span(kPrompt).subspan(1, n), features,
                                f.backend.flash_attention(), n_vocab);
        const int V = f.target->config().n_vocab;
        double max_diff = 0.0;
        for (int i = 0; i < n; ++i) {
            const float * ref = llama_logits.data() + static_cast<size_t>(i) * V;  // target vocabulary (d2t scattered)
            std::vector<float> mine(V, -INFINITY);
            const auto row = ours.logits_row(i);
            if (head->d2t().empty()) {
                mine.assign(row.begin(), row.end());
            } else {
                for (size_t k = 0; k < head->d2t().size(); ++k) mine[head->d2t()[k]] = row[k];
            }
            int arg_ref = 0, arg_mine = 0;
            max_diff = std::max(max_diff, test::max_abs_diff(std::span(ref, V), mine));  // infinite where the masked patterns differ
            for (int v = 0; v < V; ++v) {
                if (ref[v] > ref[arg_ref]) arg_ref = v;
                if (mine[v] > mine[arg_mine]) arg_mine = v;
            }
            EXPECT_EQ(arg_ref, arg_mine) << "row " << i;
        }
        std::printf("[eagle3 vs llama.cpp] d2t=%d: max |logit diff| = %.3g over %d rows\n", n_draft, max_diff, n);
        EXPECT_LT(max_diff, 5e-3);
    }
}

}  // namespace
}  // namespace specula
