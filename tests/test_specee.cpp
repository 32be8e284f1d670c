// SpecEE early exit: the layer-segment decoder, the K/V rows of skipped layers, the predictor
// sidecar's validation.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <unistd.h>

#include "engine/specee.h"
#include "runtime/kv_cache.h"
#include "runtime/backend.h"
#include "runtime/exit_predictor.h"
#include "runtime/forward.h"
#include "runtime/model.h"
#include "specula/error.h"
#include "specula/specula.h"
#include "specee_predictor.h"
#include "test_models.h"

namespace specula {
namespace {

const std::vector<int32_t> kPrompt = {1, 450, 4996, 17354, 1701};
// Tied heads of the types the real models use (Q4_1 like SmolLM2's file, Q8_0 like Gemma 3's),
// a q/k-normed family, and Gemma 3's sliding-window layers.
const char * const kVariants[] = {"llama_q4_1_tied", "qwen3_qknorm", "gemma3_swa_q8_0"};

struct Fixture : test::LoadedModel {
    using LoadedModel::LoadedModel;
    std::unique_ptr<KvCache> prefilled() {
        auto c = std::make_unique<KvCache>(backend, model->config(), 64);
        runner->forward(ForwardBatch::causal(kPrompt, 0, {}), *c);
        return c;
    }
    int n_layer() const { return model->config().n_layer; }
};

int32_t argmax(std::span<const float> v) { return static_cast<int32_t>(std::max_element(v.begin(), v.end()) - v.begin()); }

// Plain greedy decoding with one full forward per token: the tokens after kPrompt, and the cache.
std::vector<int32_t> plain_tokens(Fixture & f, KvCache & cache, int n) {
    std::vector<int32_t> out;
    int32_t tok = kPrompt.back();
    for (int i = 0; i < n; ++i) {
        ForwardOutput o = f.runner->forward(ForwardBatch::causal(std::vector<int32_t>{tok}, cache.size(), {0}), cache);
        tok = argmax(o.logits_row(0));
        out.push_back(tok);
    }
    return out;
}

void expect_same_cache(const KvCache & a, const KvCache & b, int n_layer, const std::string & what) {
    ASSERT_EQ(a.size(), b.size()) << what;
    for (int l = 0; l < n_layer; ++l) {
        for (int slot = 0; slot < a.size(); ++slot) {
            for (bool value : {false, true}) {
                ASSERT_EQ(a.read_row(l, value, slot), b.read_row(l, value, slot)) << what << " layer " << l << " slot " << slot << (value ? " V" : " K");
            }
        }
    }
}

// Candidates that hold `want` at index 2 among three other ids.
std::vector<int32_t> candidates_with(int32_t want, int n_vocab) {
    std::vector<int32_t> c;
    for (int32_t t = 3; c.size() < 3; t += 7) {
        if (t % n_vocab != want) c.push_back(t % n_vocab);
    }
    c.insert(c.begin() + 2, want);
    return c;
}

// Catches an exit path that leaks into a step that does not exit: a saturated predictor
// (probability exactly 1) at threshold 1 must leave every token, logit and cache row of plain
// decoding, even though the step ran as several segments with probes between them.
TEST(SpecEE, NeverExitThresholdEqualsPlainBitwise) {
    for (const char * variant : kVariants) {
        Fixture f(variant);
        const int L = f.n_layer();
        test::PredictorSpec spec;
        spec.layers = {1, L};
        spec.output_bias = 100.0f;
        auto predictor = ExitPredictor::load(test::write_predictor(spec, *f.model, std::string("never_") + variant), *f.model);
        auto plain_cache = f.prefilled(), cache = f.prefilled();
        const std::vector<int32_t> want = plain_tokens(f, *plain_cache, 6);
        EarlyExitDecoder dec(*f.model, *f.runner, predictor.get());
        int32_t tok = kPrompt.back();
        for (size_t i = 0; i < want.size(); ++i) {
            ExitStep s = dec.step(*cache, tok, cache->size(), candidates_with(want[i], f.model->config().n_vocab), 1.0f, {});
            ASSERT_EQ(s.exit_layer, -1) << variant;
            ASSERT_EQ(s.token, want[i]) << variant << " token " << i;
            tok = s.token;
        }
        expect_same_cache(*cache, *plain_cache, L, variant);
        // The same predictor below threshold 1 exits at its first layer: the probes really ran.
        ExitStep s = dec.step(*cache, tok, cache->size(), candidates_with(0, f.model->config().n_vocab), 0.5f, {});
        EXPECT_EQ(s.exit_layer, 1) << variant;
    }
}

// The same with the online level: predictors at every layer, the offline schedule the last one
// alone. After kOnlineWindow full-depth tokens the step also probes 2 layers below the last
// (the recent tokens' stopping layer), and still leaves plain decoding's tokens and cache.
TEST(SpecEE, NeverExitThresholdWithTheOnlineLevelEqualsPlainBitwise) {
    Fixture f("gemma3_swa_q8_0");
    const int L = f.n_layer();
    ASSERT_EQ(L, 3);
    test::PredictorSpec spec;
    spec.layers = {1, 2, 3};
    spec.offline_layers = std::vector<int32_t>{3};
    spec.output_bias = 100.0f;
    auto predictor = ExitPredictor::load(test::write_predictor(spec, *f.model, "never_online"), *f.model);
    auto plain_cache = f.prefilled(), cache = f.prefilled();
    const std::vector<int32_t> want = plain_tokens(f, *plain_cache, kOnlineWindow + 3);
    EarlyExitDecoder dec(*f.model, *f.runner, predictor.get(), true);
    int32_t tok = kPrompt.back();
    for (size_t i = 0; i < want.size(); ++i) {
        ExitStep s = dec.step(*cache, tok, cache->size(), candidates_with(want[i], f.model->config().n_vocab), 1.0f, {});
        ASSERT_EQ(s.exit_layer, -1);
        ASSERT_EQ(s.token, want[i]) << "token " << i;
        EXPECT_EQ(dec.probe_logits().size(), i < static_cast<size_t>(kOnlineWindow) ? 1u : 2u) << "token " << i;
        tok = s.token;
    }
    expect_same_cache(*cache, *plain_cache, L, "online");
    // Below threshold 1 the first probed layer, the online one, exits.
    ExitStep s = dec.step(*cache, tok, cache->size(), candidates_with(0, f.model->config().n_vocab), 0.5f, {});
    EXPECT_EQ(s.exit_layer, 1);
    // A new sequence starts from the offline schedule again.
    dec.begin_sequence();
    s = dec.step(*cache, tok, cache->size(), candidates_with(0, f.model->config().n_vocab), 0.5f, {});
    EXPECT_EQ(s.exit_layer, 3);
}

// The online level's choice of layers: the offline ones, plus those at kOnlineOffsets from the
// stopping layers of the last kOnlineWindow tokens once there are that many, where a predictor
// exists.
TEST(SpecEE, OnlineScheduleProbesOfflineLayersAndThoseNearTheRecentStops) {
    std::vector<int> layers;
    for (int l = 8; l <= 18; ++l) layers.push_back(l);
    const std::vector<int> offline = {16, 17, 18};
    using V = std::vector<int>;
    EXPECT_EQ(online_probe_layers(layers, offline, V{}), offline);
    EXPECT_EQ(online_probe_layers(layers, offline, V{12, 12, 12, 12}), offline);  // fewer than the window
    EXPECT_EQ(online_probe_layers(layers, offline, V{12, 12, 12, 12, 12}), (V{10, 12, 14, 16, 17, 18}));
    EXPECT_EQ(online_probe_layers(layers, offline, V{18, 18, 18, 18, 18}), offline);
    EXPECT_EQ(online_probe_layers(layers, offline, V{17, 18, 18, 18, 18}), (V{15, 16, 17, 18}));
    // Only the last kOnlineWindow stops count; layers without a predictor (6, 7) are never probed.
    EXPECT_EQ(online_probe_layers(layers, offline, V{11, 18, 18, 18, 18, 18}), offline);
    EXPECT_EQ(online_probe_layers(layers, offline, V{9, 18, 18, 18, 18}), (V{9, 11, 16, 17, 18}));
    EXPECT_EQ(online_probe_layers(layers, offline, V{13, 8, 18, 18, 18, 18}), (V{8, 10, 16, 17, 18}));
}

// Catches a last-layer exit that changes the text or the cache: with the full model's token among
// the candidates, scoring them through the final norm and their own head rows must pick it, and
// no layer was skipped, so the cache equals plain decoding's bit for bit.
TEST(SpecEE, ForcedLastLayerExitWithArgmaxCandidateEqualsPlain) {
    for (const char * variant : kVariants) {
        Fixture f(variant);
        const int L = f.n_layer();
        auto plain_cache = f.prefilled(), cache = f.prefilled();
        const std::vector<int32_t> want = plain_tokens(f, *plain_cache, 6);
        EarlyExitDecoder dec(*f.model, *f.runner, nullptr);
        int32_t tok = kPrompt.back();
        for (size_t i = 0; i < want.size(); ++i) {
            ExitStep s = dec.step_forced(*cache, tok, cache->size(), candidates_with(want[i], f.model->config().n_vocab), L, {});
            ASSERT_EQ(s.exit_layer, L) << variant;
            ASSERT_EQ(s.token, want[i]) << variant << " token " << i;
            tok = s.token;
        }
        expect_same_cache(*cache, *plain_cache, L, variant);
    }
}

// Catches K/V rows of skipped layers that are stale, uninitialised, or computed differently from
// the layers' own projections: after an exit at layer e, the row of every layer l >= e must equal
// what layer l itself writes for the exit state (a one-layer continuation [l, l+1) fed that
// state), bit for bit, and the rows of layers < e those of the segment that ran them.
TEST(SpecEE, SkippedLayersKvEqualsTheirProjectionOfTheExitState) {
    for (const char * variant : kVariants) {
        Fixture f(variant);
        const int L = f.n_layer();
        for (int e = 1; e < L; ++e) {
            auto cache = f.prefilled(), ref = f.prefilled();
            const int pos = cache->size();
            EarlyExitDecoder dec(*f.model, *f.runner, nullptr);
            const std::vector<int> feature_layers = {e};
            ExitStep s = dec.step_forced(*cache, 310, pos, candidates_with(5, f.model->config().n_vocab), e, feature_layers);
            ASSERT_EQ(s.exit_layer, e);
            const std::vector<float> exit_state = s.features;  // the state entering layer e

            ForwardBatch head = ForwardBatch::causal(std::vector<int32_t>{310}, pos, {});
            head.layer_end = e;
            ForwardOutput h = f.runner->forward(head, *ref);
            ASSERT_EQ(h.hidden_out, exit_state) << variant;
            for (int l = e; l < L; ++l) {
                ForwardBatch one;
                one.positions = {pos};
                one.mask = BlockMask::causal(1);
                one.hidden_in = exit_state;
                one.kv_slot_begin = pos;
                one.layer_begin = l;
                one.layer_end = l + 1;
                if (l + 1 == L) one.tap_layers = {L};  // a last segment must return something
                f.runner->forward(one, *ref);
            }
            expect_same_cache(*cache, *ref, L, std::string(variant) + " exit at " + std::to_string(e));
            // A later full-depth token reads those rows: its logits must be finite.
            ForwardOutput next = f.runner->forward(ForwardBatch::causal(std::vector<int32_t>{526}, pos + 1, {0}), *cache);
            for (float x : next.logits) ASSERT_TRUE(std::isfinite(x)) << variant;
        }
    }
}

// Catches a K/V-only batch that is accepted where it would append rows or return outputs.
TEST(SpecEE, MalformedKvOnlyBatchesAreRefused) {
    Fixture f("llama_q4_1_tied");
    auto cache = f.prefilled();
    ForwardBatch b;
    b.positions = {5};
    b.mask = BlockMask::causal(1);
    b.hidden_in.assign(f.model->config().n_embd, 0.5f);
    b.layer_begin = 1;
    b.kv_only = true;
    EXPECT_NE(test::error_message([&] { f.runner->forward(b, *cache); }).find("K/V-only"), std::string::npos);  // no slot to continue
    b.kv_slot_begin = cache->size() - 1;
    b.logit_rows = {0};
    EXPECT_NE(test::error_message([&] { f.runner->forward(b, *cache); }).find("K/V-only"), std::string::npos);
    EXPECT_EQ(cache->size(), static_cast<int>(kPrompt.size()));
}

// Each hostile sidecar must be refused with one line naming the file and what is wrong.
TEST(SpecEE, HostilePredictorFilesAreRefusedWithOneLine) {
    Fixture f("llama_q4_1_tied");
    const int L = f.n_layer();
    struct Case {
        std::string name, expect;
        std::function<void(test::PredictorSpec &)> edit;
    };
    const std::vector<Case> cases = {
        {"arch", "not a SpecEE predictor file", [](test::PredictorSpec & s) { s.arch = "llama"; }},
        {"depth", "the target has", [&](test::PredictorSpec & s) { s.ints["specula-specee.target_block_count"] = L + 1; }},
        {"width", "the target has", [](test::PredictorSpec & s) { s.ints["specula-specee.target_embedding_length"] = 65; }},
        {"candidates", "specula-specee.candidates", [](test::PredictorSpec & s) { s.ints["specula-specee.candidates"] = 8; }},
        {"features", "specula-specee.features", [](test::PredictorSpec & s) { s.ints["specula-specee.features"] = 11; }},
        {"hidden", "specula-specee.hidden", [](test::PredictorSpec & s) { s.ints["specula-specee.hidden"] = 0; }},
        {"no_layers", "lists no layer", [](test::PredictorSpec & s) { s.layers.clear(); }},
        {"layer_past_end", "must increase", [&](test::PredictorSpec & s) { s.layers = {1, L + 1}; }},
        {"layer_zero", "must increase", [](test::PredictorSpec & s) { s.layers = {0, 1}; }},
        {"layers_unordered", "must increase", [&](test::PredictorSpec & s) { s.layers = {L, 1}; }},
        {"fc1_shape", "wrong shape", [](test::PredictorSpec & s) { s.shape_override["exit.1.fc1.weight"] = {kExitFeatures + 1, 3}; }},
        {"fc2_shape", "wrong shape", [](test::PredictorSpec & s) { s.shape_override["exit.1.fc2.weight"] = {4}; }},
        {"missing", "tensors, expected", [](test::PredictorSpec & s) { s.drop_first_tensor = true; }},
        {"extra", "tensors, expected", [](test::PredictorSpec & s) { s.extra_tensor = true; }},
        {"nan", "non-finite", [](test::PredictorSpec & s) { s.nan_weight = true; }},
        {"no_offline_layers", "offline_layers lists no layer", [](test::PredictorSpec & s) { s.offline_layers = std::vector<int32_t>{}; }},
        {"offline_layer_untrained", "offline_layers must increase within", [&](test::PredictorSpec & s) { s.layers = {L}; s.offline_layers = std::vector<int32_t>{1}; }},
        {"offline_layers_unordered", "offline_layers must increase within", [&](test::PredictorSpec & s) { s.offline_layers = std::vector<int32_t>{L, 1}; }},
    };
    for (const Case & c : cases) {
        test::PredictorSpec spec;
        spec.layers = {1, L};
        c.edit(spec);
        const std::string path = test::write_predictor(spec, *f.model, "hostile_predictor_" + c.name);
        const std::string msg = test::error_message([&] { ExitPredictor::load(path, *f.model); });
        EXPECT_NE(msg.find(c.expect), std::string::npos) << c.name << ": " << msg;
        EXPECT_NE(msg.find(path), std::string::npos) << c.name << ": " << msg;
        EXPECT_EQ(msg.find('\n'), std::string::npos) << c.name << ": " << msg;
    }
    test::PredictorSpec good;
    good.layers = {1, L};
    good.offline_layers = std::vector<int32_t>{L};
    EXPECT_NO_THROW(ExitPredictor::load(test::write_predictor(good, *f.model, "good_predictor"), *f.model));
}

// The paper's features: logits, softmax over the candidates, its change since the previous layer.
TEST(SpecEE, ExitFeaturesAreLogitsProbabilitiesAndTheirChange) {
    std::vector<float> prev(kExitCandidates), feat(kExitFeatures);
    const std::vector<float> a = {2.0f, 0.0f, 0.0f, 0.0f}, b = {0.0f, 0.0f, 0.0f, 0.0f};
    exit_features(a, prev, true, feat);
    const float p0 = std::exp(2.0f) / (std::exp(2.0f) + 3.0f);
    EXPECT_FLOAT_EQ(feat[0], 2.0f);
    EXPECT_FLOAT_EQ(feat[4], p0);
    EXPECT_FLOAT_EQ(feat[8], 0.0f);
    exit_features(b, prev, false, feat);
    EXPECT_FLOAT_EQ(feat[4], 0.25f);
    EXPECT_FLOAT_EQ(feat[8], 0.25f - p0);
    EXPECT_FLOAT_EQ(feat[9], 0.25f - (1.0f - p0) / 3.0f);
}

// Catches an offline layer whose predictor sees another change term with the online level on than
// without it: its change is taken from the previous offline layer (zeros at the first) whatever
// online layers were probed before or between; an online layer's from the probe just before it.
TEST(SpecEE, OfflineLayersKeepTheirChangeTermBesideOnlineProbes) {
    auto probs = [](const std::vector<float> & logits) {
        std::vector<float> prev(kExitCandidates), feat(kExitFeatures);
        exit_features(logits, prev, true, feat);
        return std::vector<float>(feat.begin() + kExitCandidates, feat.begin() + 2 * kExitCandidates);
    };
    const std::vector<float> a = {2.0f, 0.0f, 0.0f, 0.0f}, b = {0.0f, 1.0f, 0.0f, 0.0f}, c = {0.0f, 0.0f, 3.0f, 0.0f}, d = {1.0f, 1.0f, 1.0f, 0.0f};
    const std::vector<float> pa = probs(a), pb = probs(b), pc = probs(c), pd = probs(d);
    ExitFeatureChain chain;
    std::vector<float> feat(kExitFeatures);
    auto change = [&] { return std::vector<float>(feat.begin() + 2 * kExitCandidates, feat.end()); };
    auto diff = [](const std::vector<float> & x, const std::vector<float> & y) {
        std::vector<float> r(x.size());
        for (size_t i = 0; i < x.size(); ++i) r[i] = x[i] - y[i];
        return r;
    };
    chain.next(a, false, feat);  // online, first probe
    EXPECT_EQ(change(), std::vector<float>(kExitCandidates, 0.0f));
    chain.next(b, true, feat);  // the first offline layer: zeros, not b - a
    EXPECT_EQ(change(), std::vector<float>(kExitCandidates, 0.0f));
    chain.next(c, false, feat);  // online: from the offline probe just before
    EXPECT_EQ(change(), diff(pc, pb));
    chain.next(d, true, feat);  // offline: from the previous offline layer, not from c
    EXPECT_EQ(change(), diff(pd, pb));
    EXPECT_EQ(std::vector<float>(feat.begin(), feat.begin() + kExitCandidates), d);
}

// Catches a lossless SpecEE generation whose rounds the tree-size policy sizes: its drafts are
// chains of exited tokens whose nodes carry no draft probability (every path looks certain), so
// they run as chains of the draft-length policy whatever tree shape the options ask for, in the
// engine as in the server (engine/generation_mode.h).
TEST(SpecEE, LosslessDraftsChainsEvenWhereATreeIsAsked) {
    EngineOptions eo;
    eo.model_path = test::model_path("gemma3_swa_q8_0");
    eo.n_threads = 1;
    eo.n_ctx = 128;
    {
        Backend backend(BackendOptions{});
        auto model = Model::load(eo.model_path, backend);
        test::PredictorSpec spec;
        spec.layers = {2};
        eo.specee_path = test::write_predictor(spec, *model, "lossless_tree_" + std::to_string(::getpid()));
    }
    eo.drafter = {DrafterKind::Eagle3, test::eagle_head_path("eagle3", "gemma3_swa_q8_0")};
    eo.draft_policy = DraftPolicyKind::Fixed;
    eo.draft_max = 3;
    eo.tree = TreeShape::Dynamic;
    eo.tree_nodes = 0;  // sized per round, were it a tree
    eo.specee_threshold = 0.4f;
    eo.specee_lossless = true;
    auto engine = Engine::open(eo);
    GenerationOptions go;
    go.n_predict = 12;
    go.stop_at_end_of_generation = false;
    std::vector<std::string> policies;
    go.on_round = [&](const RoundReport & round) { policies.emplace_back(round.decision.policy); };
    engine->generate("def main():", go, [](const std::string &) { return true; });
    ASSERT_FALSE(policies.empty());
    for (const std::string & policy : policies) EXPECT_EQ(policy, "fixed");
}

}  // namespace
}  // namespace specula
