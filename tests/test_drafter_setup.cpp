// Drafter setups the engine refuses, each with an error naming the problem.
#include <gtest/gtest.h>

#include <algorithm>
#include <optional>
#include <string>

#include "specula/error.h"
#include "specula/specula.h"
#include "engine/drafter_factory.h"
#include "runtime/model.h"
#include "tokenizer/tokenizer.h"
#include "test_models.h"

namespace specula {
namespace {

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
    const std::string draft = test::model_path("llama_draft_small");
    EXPECT_EQ(message({DrafterKind::DraftModel, draft, 1, 3, false, -1}),
              "the draft vocabulary (--draft-vocab) must be 0 (all) or a token count, not -1");
    EXPECT_EQ(message({DrafterKind::Ngram, "", 1, 3, std::nullopt, 4096}),
              "a trimmed draft vocabulary (--draft-vocab) is for a draft model (--draft), not the ngram drafter");
}

// The trimmed draft vocabulary keeps the first N ids and every control and end-of-generation token
// (qwen2's sit at the end of its 151k ids); N at or past the vocabulary keeps the whole of it.
TEST(Speculative, ATrimmedDraftVocabularyKeepsTheFirstIdsAndTheControlTokens) {
    const std::string path = test::model_path("qwen2_bias");
    Backend backend(BackendOptions{"cpu", 1});
    auto target = Model::load(path, backend);
    const Tokenizer vocab(path);
    DrafterFactory f = DrafterFactory::open({DrafterKind::DraftModel, path, 1, 3, false, 1000}, backend, *target, vocab);
    const std::vector<int32_t> & ids = f.draft_logit_ids;
    ASSERT_GE(ids.size(), 1000u);
    for (int32_t t = 0; t < 1000; ++t) EXPECT_EQ(ids[t], t);
    std::vector<int32_t> specials = vocab.markup_tokens();
    specials.insert(specials.end(), vocab.end_of_generation_tokens().begin(), vocab.end_of_generation_tokens().end());
    ASSERT_FALSE(specials.empty());
    for (int32_t t : specials) EXPECT_NE(std::find(ids.begin(), ids.end(), t), ids.end()) << "control token " << t;
    EXPECT_EQ(ids.size(), 1000 + specials.size());
    EXPECT_TRUE(DrafterFactory::open({DrafterKind::DraftModel, path, 1, 3, false, target->config().n_vocab}, backend, *target, vocab)
                    .draft_logit_ids.empty());
}

}  // namespace
}  // namespace specula
