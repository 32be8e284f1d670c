// The public API (include/specula/): the per-round observer, the token-id API, streamed text that
// never splits a UTF-8 character.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "specula/specula.h"
#include "test_models.h"
#include "tokenizer/utf8.h"

namespace specula {
namespace {

std::unique_ptr<Engine> open_engine(DrafterSpec drafter) {
    EngineOptions o;
    o.model_path = test::shipped_model("specula-target.gguf");
    o.drafter = std::move(drafter);
    o.draft_policy = DraftPolicyKind::Fixed;
    o.draft_max = 4;
    o.n_ctx = 256;
    o.n_threads = 1;
    return Engine::open(o);
}

// Whether `s` ends on a UTF-8 character boundary: its last lead byte has all its continuation bytes.
bool ends_on_character(const std::string & s) {
    size_t i = s.size();
    while (i > 0 && (static_cast<uint8_t>(s[i - 1]) & 0xC0) == 0x80) --i;
    if (i == 0) return s.empty();
    const uint8_t lead = static_cast<uint8_t>(s[i - 1]);
    const size_t need = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3
                                       : lead >= 0xC0   ? 2
                                                        : 1;
    return s.size() - (i - 1) == need;
}

// Catches: an observer called more or less than once per round, or reports whose counts disagree
// with the run's statistics (every round emits its accepted drafts plus one target token; a chain
// is never drafted past n_predict, a tree's last round may be: its extra tokens are not generated).
// A networked drafter's round reports one time per drafter level (a forward per tree level, fewer
// where cascade drafting took lookup's tokens), which add up to no more than the round's drafting
// time and, over the rounds, to the run's.
TEST(Api, ObserverGetsOneConsistentReportPerRound) {
    // The draft model (a chain) with and without cascade drafting, the EAGLE-3 head alone, and the
    // head with its default prompt-lookup graft.
    const std::string draft = test::shipped_model("specula-draft.gguf");
    for (const DrafterSpec & drafter : {DrafterSpec{DrafterKind::DraftModel, draft, 1, 3, false},
                                        DrafterSpec{DrafterKind::DraftModel, draft, 1, 3, false, 0, "", false},
                                        DrafterSpec{DrafterKind::Eagle3, test::shipped_model("specula-eagle3.gguf"), 1, 3, false},
                                        DrafterSpec{DrafterKind::Eagle3, test::shipped_model("specula-eagle3.gguf"), 1, 3}}) {
        const bool cascade = drafter.kind == DrafterKind::DraftModel && drafter.cascade.value_or(true);
        SCOPED_TRACE(std::string(drafter_kind_name(drafter.kind)) + (drafter.lookup.value_or(true) ? " (default lookup)" : "") +
                     (cascade ? " (cascade drafting)" : ""));
        auto engine = open_engine(drafter);
        GenerationOptions g;
        g.n_predict = 40;
        g.stop_at_end_of_generation = false;
        std::vector<RoundReport> reports;
        g.on_round = [&](const RoundReport & r) { reports.push_back(r); };
        const GenerationStats s = engine->generate("def main():\n    parser = argparse.", g, [](const std::string &) { return true; });
        ASSERT_EQ(static_cast<int>(reports.size()), s.speculation.rounds);
        int emitted = 0, drafted = 0;
        double forward_ms = 0, draft_ms = 0, commit_ms = 0, level_ms = 0;
        int levels = 0;
        for (size_t i = 0; i < reports.size(); ++i) {
            const RoundReport & r = reports[i];
            forward_ms += r.forward_ms;
            draft_ms += r.draft_ms;
            commit_ms += r.commit_ms;
            int depth = 0;
            for (const DraftNode & n : r.tree) depth = std::max(depth, n.depth);
            if (!r.tree.empty() && !drafter.lookup.value_or(true)) {  // grafted nodes take no drafter level
                if (cascade) {                                        // nor do lookahead tokens the draft model ranked first
                    EXPECT_GE(static_cast<int>(r.draft_level_ms.size()), 1) << "round " << i;
                    EXPECT_LE(static_cast<int>(r.draft_level_ms.size()), depth) << "round " << i;
                } else {
                    EXPECT_GE(static_cast<int>(r.draft_level_ms.size()), depth) << "round " << i;
                }
            }
            double round_levels = 0;
            for (double ms : r.draft_level_ms) {
                EXPECT_GT(ms, 0.0);
                round_levels += ms;
            }
            EXPECT_LE(round_levels, r.draft_ms + 1e-9) << "round " << i;
            level_ms += round_levels;
            levels += static_cast<int>(r.draft_level_ms.size());
            EXPECT_EQ(r.round, static_cast<int>(i));
            EXPECT_EQ(r.decision.verified_nodes, static_cast<int>(r.tree.size()));
            EXPECT_LE(r.accepted.size(), r.tree.size());
            EXPECT_NE(r.next_token, -1);
            if (i > 0) {
                EXPECT_EQ(r.position, reports[i - 1].position + static_cast<int>(reports[i - 1].accepted.size()) + 1);
            }
            emitted += static_cast<int>(r.accepted.size()) + 1;
            drafted += static_cast<int>(r.tree.size());
        }
        EXPECT_EQ(emitted, s.speculation.emitted);
        if (drafter.kind == DrafterKind::DraftModel) {
            EXPECT_EQ(emitted, s.n_generated);
        } else {
            EXPECT_GE(emitted, s.n_generated);
            EXPECT_LT(emitted - static_cast<int>(reports.back().accepted.size()) - 1, s.n_generated);
        }
        EXPECT_EQ(drafted, s.speculation.drafted);
        EXPECT_GT(s.speculation.accepted, 0);
        // The run's time split is the rounds' times added up, and fits in the generation time.
        EXPECT_DOUBLE_EQ(s.speculation.forward_ms, forward_ms);
        EXPECT_DOUBLE_EQ(s.speculation.draft_ms, draft_ms);
        EXPECT_DOUBLE_EQ(s.speculation.commit_ms, commit_ms);
        EXPECT_EQ(s.speculation.draft_forwards, levels);
        EXPECT_NEAR(s.speculation.draft_level_ms, level_ms, 1e-9);
        EXPECT_GT(levels, 0);
        EXPECT_GT(forward_ms, 0.0);
        EXPECT_LE(forward_ms + draft_ms + commit_ms, s.generation_seconds * 1000.0 + 1e-6);
    }
}

// Catches: the token-id API drifting from the text API (a different prompt tokenization, or
// tokens lost on the way out), and bad ids reaching the model.
TEST(Api, TokenIdsInAndOutMatchTheTextApi) {
    auto engine = open_engine({DrafterKind::DraftModel, test::shipped_model("specula-draft.gguf"), 1, 3});
    GenerationOptions g;
    g.n_predict = 24;
    g.stop_at_end_of_generation = false;
    const std::string prompt = "import numpy as np\n";
    std::string text;
    engine->generate(prompt, g, [&](const std::string & piece) { return text += piece, true; });
    std::vector<int32_t> ids;
    const GenerationStats s = engine->generate(engine->tokenize(prompt), g, [&](int32_t t) { return ids.push_back(t), true; });
    EXPECT_EQ(static_cast<int>(ids.size()), s.n_generated);
    std::string pieces;
    for (int32_t t : ids) pieces += engine->piece(t);
    EXPECT_EQ(pieces, text);
    EXPECT_NE(test::error_message([&] { engine->generate(std::vector<int32_t>{1, -5}, g, [](int32_t) { return true; }); })
                  .find("prompt token id -5 is outside the"),
              std::string::npos);
}

// Catches a streamed piece that ends inside a UTF-8 character (token pieces are bytes).
TEST(Api, Utf8StreamHoldsBackIncompleteCharacters) {
    const std::string text = "a\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80z";  // a é € 😀 z
    Utf8Stream stream;
    std::string out;
    for (char byte : text) {
        const std::string piece = stream.push(std::string(1, byte));
        EXPECT_TRUE(ends_on_character(piece)) << piece;
        out += piece;
    }
    out += stream.flush();
    EXPECT_EQ(out, text);
    Utf8Stream cut;  // an unfinished character at the end is still returned, by flush()
    EXPECT_EQ(cut.push("\xe2\x82"), "");
    EXPECT_EQ(cut.flush(), "\xe2\x82");
}

// Catches Engine::generate's text pieces splitting a character: a sampled run from a multi-byte
// prompt on the bundled byte-fallback vocabulary.
TEST(Api, StreamedPiecesNeverSplitAUtf8Character) {
    auto engine = open_engine({DrafterKind::Ngram, "", 1, 3});
    GenerationOptions g;
    g.n_predict = 60;
    g.sampling.temperature = 1.5f;
    g.sampling.seed = 7;
    std::string all;
    engine->generate("\xc3\xa9t\xc3\xa9 \xe2\x82\xac \xc3\xa9t\xc3\xa9", g, [&](const std::string & piece) {
        EXPECT_TRUE(ends_on_character(piece)) << piece;
        all += piece;
        return true;
    });
    EXPECT_FALSE(all.empty());
}

}  // namespace
}  // namespace specula
