// Drafter setups the engine refuses, each with an error naming the problem.
#include <gtest/gtest.h>

#include <string>

#include "specula/error.h"
#include "specula/specula.h"
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
}

}  // namespace
}  // namespace specula
