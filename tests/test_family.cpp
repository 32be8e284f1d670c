// The model family shipped in models/: loads in specula and in libllama, one vocabulary, heads fit
// the target, and a bench twin of the target computes the same logits.
#include <gtest/gtest.h>

#include <cmath>

#include "runtime/kv_cache.h"
#include "llama_peer.h"
#include "runtime/backend.h"
#include "runtime/eagle_head.h"
#include "runtime/forward.h"
#include "runtime/model.h"
#include "sample/sampler.h"
#include "test_models.h"
#include "tokenizer/tokenizer.h"
#include "twin.h"

namespace specula {
namespace {

const char * kHeldOut =
    "def _read_config(path, encoding='utf-8'):\n"
    "    \"\"\"Return the parsed configuration stored at *path*.\"\"\"\n"
    "    with open(path, encoding=encoding) as f:\n"
    "        return json.load(f)\n";

TEST(Family, ModelsLoadInSpeculaAndLibllamaWithOneVocabulary) {
    Backend backend(BackendOptions{"cpu", 1});
    const Tokenizer target_vocab(test::shipped_model("specula-target.gguf"));
    for (const char * name : {"specula-target.gguf", "specula-draft.gguf"}) {
        auto model = Model::load(test::shipped_model(name), backend);
        const Tokenizer vocab(test::shipped_model(name));
        EXPECT_EQ(vocab.fingerprint(), target_vocab.fingerprint()) << name;

        // specula and libllama agree on the model's logits.
        const auto tokens = vocab.tokenize(kHeldOut);
        LlamaPeer peer(test::shipped_model(name), 256, 1, backend.flash_attention());
        EXPECT_EQ(peer.n_vocab(), model->config().n_vocab) << name;
        ModelRunner runner(*model);
        KvCache cache(backend, model->config(), 256);
        std::vector<int32_t> rows(tokens.size());
        for (size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<int32_t>(i);
        ForwardOutput ours = runner.forward(ForwardBatch::causal(tokens, 0, rows), cache);
        const std::vector<float> ref = peer.decode(tokens, true);
        const double diff = test::max_abs_diff(ref, ours.logits);
        EXPECT_LT(diff, 1e-2) << name;
    }
    // Text round-trips through the tokenizer, indentation and newlines included.
    EXPECT_EQ(target_vocab.detokenize(target_vocab.tokenize(kHeldOut, false)), kHeldOut);
}

TEST(Family, HeadsFitTheTarget) {
    Backend backend(BackendOptions{"cpu", 1});
    auto target = Model::load(test::shipped_model("specula-target.gguf"), backend);
    auto e3 = EagleHead::load(test::shipped_model("specula-eagle3.gguf"), *target, backend);
    EXPECT_EQ(e3->config().kind, EagleKind::Eagle3);
    EXPECT_EQ(e3->config().target_layers.size(), 3u);
    auto e1 = EagleHead::load(test::shipped_model("specula-eagle1.gguf"), *target, backend);
    EXPECT_EQ(e1->config().kind, EagleKind::Eagle1);
    EXPECT_EQ(Tokenizer(test::shipped_model("specula-eagle3.gguf")).fingerprint(), Tokenizer(test::shipped_model("specula-target.gguf")).fingerprint());
}

TEST(Family, BenchTwinComputesTheTargetsLogits) {
    const std::string twin_path = test::scratch_file("twin-of-specula-target.gguf");
    write_bench_twin(test::shipped_model("specula-target.gguf"), "llama-100m", "f16", twin_path);
    Backend backend(BackendOptions{"cpu", 2});
    auto target = Model::load(test::shipped_model("specula-target.gguf"), backend);
    auto twin = Model::load(twin_path, backend);
    const Tokenizer vocab(test::shipped_model("specula-target.gguf"));
    const auto tokens = vocab.tokenize(kHeldOut);
    std::vector<int32_t> rows(tokens.size());
    for (size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<int32_t>(i);
    ModelRunner rt(*target), rw(*twin);
    KvCache ct(backend, target->config(), 256), cw(backend, twin->config(), 256);
    ForwardOutput a = rt.forward(ForwardBatch::causal(tokens, 0, rows), ct);
    ForwardOutput b = rw.forward(ForwardBatch::causal(tokens, 0, rows), cw);
    const double diff = test::max_abs_diff(a.logits, b.logits);
    for (size_t i = 0; i < rows.size(); ++i) EXPECT_EQ(argmax(a.logits_row(i)), argmax(b.logits_row(i))) << i;
    std::printf("[family] twin (llama-100m shape, f16) vs target: max |logit diff| = %.3g over %zu positions\n", diff, rows.size());
    EXPECT_LT(diff, 5e-2);
}

}  // namespace
}  // namespace specula
