// The runtime's forward: tree masks, hidden-state taps, layer ranges; the target features a
// drafter trains on.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "specula/error.h"
#include "runtime/kv_cache.h"
#include "llama_oracle.h"
#include "runtime/backend.h"
#include "runtime/forward.h"
#include "runtime/kernels/packed_matrix.h"
#include "runtime/model.h"
#include "engine/verify_cost_probe.h"
#include "target_features.h"
#include "test_models.h"

namespace specula {
namespace {

using test::max_abs_diff;

struct Fixture : test::LoadedModel {
    using LoadedModel::LoadedModel;
    std::unique_ptr<KvCache> cache() { return std::make_unique<KvCache>(backend, model->config(), 128); }
};

const std::vector<int32_t> kPrefix = {1, 450, 4996, 17354, 1701};

TEST(Forward, TreeMaskedBranchesMatchTheirCausalForwards) {
    for (const char * variant : {"llama_gqa_f32", "qwen3_qknorm"}) {
        Fixture f(variant);
        auto cache = f.cache();
        f.runner->forward(ForwardBatch::causal(kPrefix, 0, {}), *cache);
        const int base = cache->size();

        // Two roots; the first with two children, one of which has a child.
        //   0:a -> 1:b -> 2:c ;  0:a -> 3:d -> 4:e ;  5:f
        const std::vector<int32_t> tokens = {310, 526, 2253, 825, 29889, 3186};
        const std::vector<int> parents = {-1, 0, 1, 0, 3, -1};
        const std::vector<int32_t> depth = {0, 1, 2, 1, 2, 0};
        ForwardBatch tree;
        tree.tokens = tokens;
        for (int d : depth) tree.positions.push_back(base + d);
        tree.mask = BlockMask::from_parents(parents);
        tree.logit_rows = {0, 1, 2, 3, 4, 5};
        ForwardOutput t = f.runner->forward(tree, *cache);

        const std::vector<std::vector<int>> paths = {{0, 1, 2}, {0, 3, 4}, {5}};
        for (const auto & path : paths) {
            auto plain = f.cache();
            f.runner->forward(ForwardBatch::causal(kPrefix, 0, {}), *plain);
            std::vector<int32_t> path_tokens, rows;
            for (size_t i = 0; i < path.size(); ++i) path_tokens.push_back(tokens[path[i]]), rows.push_back(int32_t(i));
            ForwardOutput p = f.runner->forward(ForwardBatch::causal(path_tokens, base, rows), *plain);
            for (size_t i = 0; i < path.size(); ++i) {
                // Different batch shapes take different matmul kernels (and the matmul attention rounds
                // probabilities to F16): rounding differs by up to ~7e-3, a wrong mask is O(1).
                EXPECT_LT(max_abs_diff(t.logits_row(path[i]), p.logits_row(i)), 2e-2) << variant << " tree row " << path[i];
            }
        }
    }
}

TEST(Forward, TapsEqualTheResidualStreamOfALayerRangeRun) {
    Fixture f("llama_gqa_f32");
    const int L = f.model->config().n_layer;
    ForwardBatch b = ForwardBatch::causal(kPrefix, 0, {0, 1, 2, 3, 4});
    b.tap_layers = {1, L};
    auto cache = f.cache();
    ForwardOutput full = f.runner->forward(b, *cache);
    ASSERT_EQ(full.taps.size(), 2u);

    // Layers [0, 1) alone give tap 1 (the stream entering layer 1); layers [1, L) fed with it
    // give the same logits, and tap L is the final pre-norm state.
    auto c2 = f.cache();
    ForwardBatch first = ForwardBatch::causal(kPrefix, 0, {});
    first.layer_end = 1;
    ForwardOutput h = f.runner->forward(first, *c2);
    EXPECT_LT(max_abs_diff(h.hidden_out, full.taps[0]), 1e-5);
    c2->rollback(0);

    auto c3 = f.cache();
    ForwardBatch rest = ForwardBatch::causal(kPrefix, 0, {0, 1, 2, 3, 4});
    rest.tokens.clear();
    rest.hidden_in = h.hidden_out;
    rest.layer_begin = 1;
    rest.tap_layers = {L};
    ForwardOutput tail = f.runner->forward(rest, *c3);
    EXPECT_LT(max_abs_diff(tail.logits, full.logits), 1e-4);
    EXPECT_LT(max_abs_diff(tail.taps[0], full.taps[1]), 1e-5);
}

// Catches a continuation segment that appends new slots, writes K/V into the wrong slots, sees
// the wrong cached prefix, or loses bits of the hidden state between segments: [0, a) then
// [a, L) into the same slots must leave the same logits and the same cache, bit for bit, as one
// full-depth forward, and a later full-depth token must then see a normal cache.
TEST(Forward, ACostProbeWithTheDraftersTapsBuildsTheGraphsOfTheVerifyBlocks) {
    // The engine times its verify-cost curve with the drafter's taps, so that the first verify
    // blocks of the generation find their graphs built (a build costs a forward or more).
    Fixture f("llama_gqa_f32");
    const std::vector<int> taps = {1, f.model->config().n_layer};
    auto cache = f.cache();
    measure_verify_cost(*f.runner, *cache, kPrefix, 4, 1, taps);
    ASSERT_EQ(cache->size(), 0);
    const size_t built = f.runner->graphs_built();
    EXPECT_GE(built, 4u);  // one a size

    // A verify block as a generation sends it: the root and three drafted nodes, every row's logits.
    ForwardBatch tree;
    tree.tokens = {310, 526, 2253, 825};
    tree.positions = {0, 1, 2, 1};
    tree.mask = BlockMask::from_parents(std::vector<int>{-1, 0, 1, 0});
    tree.logit_rows = {0, 1, 2, 3};
    tree.tap_layers = taps;
    f.runner->forward(tree, *cache);
    EXPECT_EQ(f.runner->graphs_built(), built);
    cache->rollback(0);
    tree.tap_layers.clear();  // what an untapped probe would have left to build
    f.runner->forward(tree, *cache);
    EXPECT_EQ(f.runner->graphs_built(), built + 1);
}

TEST(Forward, KeptGraphsAndTheirBuffersAreCountedUntilTheirRunnerGoes) {
    // Catches a process-wide count (what the server's /metrics reports beside its RSS) that misses
    // a built graph's buffers or keeps counting a destroyed runner's graphs.
    const size_t graphs_before = ModelRunner::kept_graphs_all(), bytes_before = ModelRunner::kept_graph_bytes_all();
    {
        Fixture f("llama_gqa_f32");
        auto cache = f.cache();
        f.runner->forward(ForwardBatch::causal(kPrefix, 0, {0}), *cache);
        const std::vector<int32_t> next = {825, 310};
        f.runner->forward(ForwardBatch::causal(next, static_cast<int>(kPrefix.size()), {1}), *cache);
        EXPECT_EQ(ModelRunner::kept_graphs_all(), graphs_before + f.runner->graphs_built());
        EXPECT_EQ(f.runner->graphs_built(), 2u);
        EXPECT_GT(ModelRunner::kept_graph_bytes_all(), bytes_before);
    }
    EXPECT_EQ(ModelRunner::kept_graphs_all(), graphs_before);
    EXPECT_EQ(ModelRunner::kept_graph_bytes_all(), bytes_before);
}

TEST(Forward, LayerSegmentsEqualOneFullForwardBitwise) {
    const std::vector<int32_t> block = {310, 526, 2253};
    const std::vector<int32_t> next = {825};
    for (const Kernels kernels : {Kernels::Specula, Kernels::Ggml}) {
        Backend backend(BackendOptions{"cpu", 1, Attention::Auto, kernels});
        auto model = Model::load(test::model_path("llama_gqa_f32"), backend);
        ModelRunner runner(*model);
        const int L = model->config().n_layer;
        const int P = static_cast<int>(kPrefix.size()), B = static_cast<int>(block.size());
        KvCache full(backend, model->config(), 64), seg(backend, model->config(), 64);
        runner.forward(ForwardBatch::causal(kPrefix, 0, {}), full);
        runner.forward(ForwardBatch::causal(kPrefix, 0, {}), seg);
        ForwardOutput want = runner.forward(ForwardBatch::causal(block, P, {0, 1, 2}), full);

        for (int a = 1; a < L; ++a) {
            seg.rollback(P);
            ForwardBatch head = ForwardBatch::causal(block, P, {});
            head.layer_end = a;
            ForwardOutput h = runner.forward(head, seg);
            ForwardBatch rest = ForwardBatch::causal(block, P, {0, 1, 2});
            rest.tokens.clear();
            rest.hidden_in = h.hidden_out;
            rest.layer_begin = a;
            rest.kv_slot_begin = P;
            ForwardOutput got = runner.forward(rest, seg);
            ASSERT_EQ(seg.size(), P + B) << kernels_name(kernels) << " a=" << a;
            EXPECT_EQ(got.logits, want.logits) << kernels_name(kernels) << " a=" << a;
            for (int l = 0; l < L; ++l) {
                for (int slot = 0; slot < P + B; ++slot) {
                    for (bool value : {false, true}) {
                        EXPECT_EQ(seg.read_row(l, value, slot), full.read_row(l, value, slot))
                            << kernels_name(kernels) << " a=" << a << " layer " << l << " slot " << slot << (value ? " V" : " K");
                    }
                }
            }
        }
        ForwardOutput after_full = runner.forward(ForwardBatch::causal(next, P + B, {0}), full);
        ForwardOutput after_seg = runner.forward(ForwardBatch::causal(next, P + B, {0}), seg);
        EXPECT_EQ(after_seg.logits, after_full.logits) << kernels_name(kernels);
    }
}

// Catches a continuation accepted where it would overwrite tokens it does not own.
TEST(Forward, MalformedContinuationsAreRefused) {
    Fixture f("llama_gqa_f32");
    auto cache = f.cache();
    ForwardBatch head = ForwardBatch::causal(kPrefix, 0, {});
    head.layer_end = 1;
    ForwardOutput h = f.runner->forward(head, *cache);
    ForwardBatch rest = ForwardBatch::causal(kPrefix, 0, {0});
    rest.tokens.clear();
    rest.hidden_in = h.hidden_out;
    rest.layer_begin = 1;
    rest.kv_slot_begin = 1;  // not the cache's last rows
    EXPECT_THROW(f.runner->forward(rest, *cache), Error);
    ForwardBatch from_zero = ForwardBatch::causal(kPrefix, 0, {0});
    from_zero.kv_slot_begin = 0;  // layer 0 takes tokens: nothing to continue
    EXPECT_THROW(f.runner->forward(from_zero, *cache), Error);
    EXPECT_EQ(cache->size(), static_cast<int>(kPrefix.size()));
}

TEST(Forward, TapsEqualLibllamaResidualStream) {
    const std::string path = test::model_path("llama_gqa_f32");
    Fixture f("llama_gqa_f32");
    ForwardBatch b = ForwardBatch::causal(kPrefix, 0, {0, 1, 2, 3, 4});
    b.tap_layers = {1};  // llama.cpp's "l_out-0": the output of layer 0 enters layer 1
    auto cache = f.cache();
    ForwardOutput ours = f.runner->forward(b, *cache);

    LayerCapture capture({0});
    LlamaPeer peer(path, 128, 1, f.backend.flash_attention(), 512, capture.hook());
    peer.decode(kPrefix, true);
    EXPECT_LT(max_abs_diff(ours.taps[0], capture.captured(0)), 2e-3);
}

TEST(Forward, MalformedBatchesAreRefused) {
    Fixture f("llama_gqa_f32");
    auto cache = f.cache();
    ForwardBatch b = ForwardBatch::causal(kPrefix, 0, {7});
    EXPECT_THROW(f.runner->forward(b, *cache), Error);
    EXPECT_EQ(cache->size(), 0);
    b = ForwardBatch::causal(std::vector<int32_t>{1, 999999}, 0, {1});
    EXPECT_THROW(f.runner->forward(b, *cache), Error);
    b = ForwardBatch::causal(kPrefix, 0, {0});
    b.tap_layers = {99};
    EXPECT_THROW(f.runner->forward(b, *cache), Error);
    KvCache small(f.backend, f.model->config(), 4);
    EXPECT_THROW(f.runner->forward(ForwardBatch::causal(kPrefix, 0, {0}), small), Error);
    EXPECT_EQ(small.size(), 0);
}

// A trimmed vocabulary's logits are the full forward's columns of its ids: its LM head a copy of
// those rows, each now beside other neighbours in its 16-row group. Bit for bit on specula's packed
// kernels (q4_0, q4_1 of tied embeddings, q6_k), whose rows are computed each alone; ggml's f32
// matmul, whose blocking follows the matrix's shape, agrees within float rounding. Scattered ids,
// as a frequency-ranked vocabulary has, and a partial last group; an id given twice is kept once.
TEST(Forward, TrimmedVocabularyLogitsAreTheFullLogitsOfItsIds) {
    for (const std::string variant : {"llama_gqa_f32", "llama_q4_0", "llama_q4_1_tied", "llama_q6_k"}) {
        Fixture f(variant);
        const int V = f.model->config().n_vocab;
        std::vector<int32_t> ids(1000);
        std::iota(ids.begin(), ids.end(), 0);
        for (int32_t t = 1003; t < V; t += 37) ids.push_back(t);
        for (int32_t t : {2, 5000, 5001, 17000, V - 1}) ids.push_back(t);
        ModelRunner trimmed(*f.model, ids);
        const std::span<const int32_t> kept = trimmed.logit_ids();
        std::vector<int32_t> want_ids = ids;
        std::sort(want_ids.begin(), want_ids.end());
        want_ids.erase(std::unique(want_ids.begin(), want_ids.end()), want_ids.end());
        ASSERT_EQ(std::vector<int32_t>(kept.begin(), kept.end()), want_ids) << variant;  // exactly the ids: the head reads no other row
        const ForwardBatch b = ForwardBatch::causal(kPrefix, 0, {2, 4});
        auto full_cache = f.cache(), trimmed_cache = f.cache();
        const ForwardOutput full = f.runner->forward(b, *full_cache);
        const ForwardOutput part = trimmed.forward(b, *trimmed_cache);
        ASSERT_EQ(part.n_vocab, static_cast<int>(kept.size())) << variant;
        // Packed where specula's kernels run (not on an F32 head); ggml's (`--kernels auto` on a CPU
        // without a specula SIMD path, SPECULA_CPU_PATH=generic) read the rows as stored.
        const bool packed = kernels::packed_matrix_of(f.model->weights().output) != nullptr;
        EXPECT_EQ(packed, f.backend.own_kernels() && variant != "llama_gqa_f32");
        for (size_t r = 0; r < 2; ++r) {
            std::vector<float> want;
            for (int32_t t : kept) want.push_back(full.logits_row(r)[t]);
            EXPECT_LE(max_abs_diff(part.logits_row(r), want), packed ? 0.0 : 1e-5) << variant << " row " << r;
        }
    }
}

TEST(Forward, TrimmedVocabulariesOfNoIdOrIdsOutsideTheVocabularyAreRefused) {
    Fixture f("llama_q4_0");
    EXPECT_EQ(test::error_message([&] { ModelRunner(*f.model, std::vector<int32_t>{}); }),
              "ModelRunner: a trimmed vocabulary needs at least one logit id");
    EXPECT_EQ(test::error_message([&] { ModelRunner(*f.model, std::vector<int32_t>{1, 32000}); }),
              "ModelRunner: logit id 32000 outside the 32000-token vocabulary");
    std::vector<int32_t> all(f.model->config().n_vocab);
    std::iota(all.begin(), all.end(), 0);
    EXPECT_TRUE(ModelRunner(*f.model, all).logit_ids().empty());  // every group: the plain runner
}

// Catches features taken at the wrong positions (a chunk's start, the cache's size) or from the
// wrong logits rows, and a wrong log-softmax or ranking: chunked features must equal, at every
// position, what one-token forwards give, with the log-probabilities and ranking recomputed here.
// Comparing 16-row chunks with one-row forwards assumes batch-invariant kernels, so specula's are
// pinned: ggml's (`--kernels auto` on a CPU without a specula SIMD path, SPECULA_CPU_PATH=generic)
// round a row differently inside a batch, by more than the bound below.
TEST(TargetFeatures, EqualOneTokenForwardsAtEveryPosition) {
    Backend backend(BackendOptions{"cpu", 1, Attention::Auto, Kernels::Specula});
    const auto model = Model::load(test::model_path("llama_gqa_f32"), backend);
    ModelRunner runner(*model);
    const int L = model->config().n_layer, E = model->config().n_embd, V = model->config().n_vocab;
    std::vector<int32_t> seq;
    for (int i = 0; i < 37; ++i) seq.push_back(static_cast<int32_t>((1 + 7919 * i) % V));
    const std::vector<int> layers = {1, L};
    const int K = 5;
    auto cache = std::make_unique<KvCache>(backend, model->config(), 128);
    const TargetFeatures got = target_features(runner, *cache, seq, layers, K, /*chunk=*/16);
    ASSERT_EQ(got.n_tokens, 37);
    ASSERT_EQ(got.width, 2 * E);
    ASSERT_EQ(got.taps.size(), static_cast<size_t>(37 * 2 * E));
    EXPECT_EQ(cache->size(), 37);

    auto one = std::make_unique<KvCache>(backend, model->config(), 128);
    for (int i = 0; i < 37; ++i) {
        ForwardBatch b = ForwardBatch::causal(std::vector<int32_t>{seq[i]}, i, {0});
        b.tap_layers = layers;
        const ForwardOutput o = runner.forward(b, *one);
        for (int t = 0; t < 2; ++t) {
            const std::vector<float> want(o.taps[t].begin(), o.taps[t].begin() + E);
            const std::vector<float> row(got.taps.begin() + (i * 2 + t) * E, got.taps.begin() + (i * 2 + t + 1) * E);
            float scale = 1.0f;  // the final state grows with depth: a relative bound
            for (float v : want) scale = std::max(scale, std::fabs(v));
            ASSERT_LT(max_abs_diff(row, want), 1e-4 * scale) << "position " << i << " tap " << layers[t];
        }
        const std::span<const float> logits = o.logits_row(0);
        double z = 0.0;
        const float top = *std::max_element(logits.begin(), logits.end());
        for (float v : logits) z += std::exp(static_cast<double>(v) - top);
        std::vector<int32_t> ids(V);
        std::iota(ids.begin(), ids.end(), 0);
        std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
        for (int k = 0; k < K; ++k) {
            ASSERT_EQ(got.top_ids[i * K + k], ids[k]) << "position " << i << " rank " << k;
            EXPECT_NEAR(got.top_logp[i * K + k], logits[ids[k]] - top - std::log(z), 1e-3) << "position " << i << " rank " << k;
        }
    }
}

TEST(TargetFeatures, MalformedRequestsAreRefused) {
    Fixture f("llama_gqa_f32");
    const int L = f.model->config().n_layer, V = f.model->config().n_vocab;
    const std::vector<int32_t> seq = {1, 2, 3};
    const std::vector<int> layers = {L};
    auto refused = [&](std::span<const int32_t> tokens, std::vector<int> taps, int k, int capacity, const char * what) {
        KvCache cache(f.backend, f.model->config(), capacity);
        try {
            target_features(*f.runner, cache, tokens, taps, k);
            ADD_FAILURE() << "accepted: " << what;
        } catch (const Error & e) {
            EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
        }
    };
    refused({}, layers, 4, 16, "empty sequence");
    refused(seq, layers, 0, 16, "top-k 0");
    refused(seq, layers, V + 1, 16, "top-k");
    refused(seq, {L + 1}, 4, 16, "tap layer");
    refused(seq, {}, 4, 16, "no tap layer");
    refused(seq, layers, 4, 2, "longer than the 2-token context");
}

}  // namespace
}  // namespace specula
