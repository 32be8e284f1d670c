// Per-request logit processing under speculation: penalties, logit bias, GBNF grammars and JSON
// schemas, logprobs. The states on hand-built rows; then speculative decoding (chains and trees)
// against plain decoding with the same processing: the same tokens at T = 0, the same logprobs,
// and the processed target's law at T > 0 (chi-square, with broken controls that must fail).
#include <gtest/gtest.h>
#include <llama.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "specula/specula.h"
#include "constrain/grammar.h"
#include "constrain/lazy_grammar.h"
#include "draft/draft_model_drafter.h"
#include "draft/eagle_drafter.h"
#include "draft/early_exit.h"
#include "draft/lookup_graft.h"
#include "draft/ngram.h"
#include "engine/generate.h"
#include "engine/sequence.h"
#include "runtime/backend.h"
#include "runtime/eagle_head.h"
#include "runtime/kv_cache.h"
#include "runtime/model.h"
#include "sample/logits_state.h"
#include "tokenizer/tokenizer.h"
#include "verify/path_logits.h"
#include "distribution.h"
#include "speculative_run.h"
#include "specee_predictor.h"
#include "test_models.h"

namespace specula {
namespace {

// ---- The states on hand-built rows ----------------------------------------------------------

TEST(PenaltyState, RepeatPresenceAndFrequencyPenaltiesCountTheLastTokensPromptIncluded) {
    SamplingParams p;
    p.repeat_penalty = 2.0f, p.presence_penalty = 0.5f, p.frequency_penalty = 0.25f, p.penalty_last_n = 3;
    const std::vector<int32_t> prompt = {1, 2, 2, 3};  // the last 3: token 1 has left the window
    const auto state = make_penalty_state(p, prompt, 6);
    ASSERT_NE(state, nullptr);
    std::vector<float> row = {1, 4, -2, 6, 3, 0};
    state->apply(row);
    // token 2 seen twice: -2 * 2 - (2 * 0.25 + 0.5); token 3 once: 6 / 2 - (0.25 + 0.5).
    EXPECT_EQ(row, (std::vector<float>{1, 4, -5, 2.25f, 3, 0}));

    const auto path = state->clone();
    path->accept(4);  // the window is now {2, 3, 4}
    std::vector<float> after = {1, 4, -2, 6, 3, 0};
    path->apply(after);
    EXPECT_EQ(after, (std::vector<float>{1, 4, -4.75f, 2.25f, 0.75f, 0}));
    std::vector<float> again = {1, 4, -2, 6, 3, 0};
    state->apply(again);
    EXPECT_EQ(again, row) << "accepting into a clone must leave the original as it was";
}

TEST(PenaltyState, LogitBiasIsAddedBeforeThePenaltiesAndMinusInfinityBans) {
    SamplingParams p;
    p.repeat_penalty = 2.0f;
    p.logit_bias = {{0, 1.0f}, {3, -8.0f}, {5, -INFINITY}};
    const std::vector<int32_t> prompt = {3};
    const auto state = make_penalty_state(p, prompt, 6);
    std::vector<float> row = {1, 1, 1, 6, 1, 1};
    state->apply(row);
    EXPECT_EQ(row, (std::vector<float>{2, 1, 1, -4, 1, -INFINITY}));  // token 3: (6 - 8) * 2
    EXPECT_FALSE(state->allows(5));
    EXPECT_TRUE(state->allows(3));
}

TEST(PenaltyState, NeutralSettingsProcessNothingAndBadOnesAreErrors) {
    const std::vector<int32_t> prompt = {1};
    EXPECT_EQ(make_penalty_state(SamplingParams{}, prompt, 6), nullptr);
    SamplingParams off;
    off.repeat_penalty = 3.0f, off.penalty_last_n = 0;
    EXPECT_EQ(make_penalty_state(off, prompt, 6), nullptr);
    auto error = [&](SamplingParams p) { return test::error_message([&] { make_penalty_state(p, prompt, 6); }); };
    SamplingParams p;
    p.logit_bias = {{6, 1.0f}};
    EXPECT_NE(error(p).find("token 6, outside the 6-token vocabulary"), std::string::npos) << error(p);
    p.logit_bias = {{1, NAN}};
    EXPECT_NE(error(p).find("logit_bias of token 1"), std::string::npos) << error(p);
    p = {};
    p.repeat_penalty = 0.0f;
    EXPECT_NE(error(p).find("repeat_penalty must be positive"), std::string::npos) << error(p);
    p = {};
    p.frequency_penalty = INFINITY;
    EXPECT_NE(error(p).find("frequency_penalty must be a finite number"), std::string::npos) << error(p);
    p = {};
    p.presence_penalty = 1.0f, p.penalty_last_n = -2;
    EXPECT_NE(error(p).find("penalty_last_n"), std::string::npos) << error(p);
}

TEST(TokenLogprob, IsTheLogSoftmaxAtTemperatureOneAndListsNoBannedToken) {
    const std::vector<float> row = {std::log(0.5f), -INFINITY, std::log(0.25f), std::log(0.25f)};
    std::vector<float> scratch;
    const TokenLogprob lp = token_logprob(row, 2, 5, scratch);
    EXPECT_EQ(lp.token, 2);
    EXPECT_NEAR(lp.logprob, std::log(0.25), 1e-6);
    ASSERT_EQ(lp.top.size(), 3u) << "the banned token is not an alternative";
    EXPECT_EQ(lp.top[0].first, 0);
    EXPECT_NEAR(lp.top[0].second, std::log(0.5), 1e-6);
    EXPECT_EQ(lp.top[1].first, 2);  // ties by id
    EXPECT_EQ(token_logprob(row, 0, 0, scratch).top.size(), 0u);
}

// ---- The bundled family's target and draft, with their vocabulary ---------------------------

struct Bundled {
    Backend backend{BackendOptions{"cpu", 1}};
    std::unique_ptr<Model> target = Model::load(test::shipped_model("specula-target.gguf"), backend);
    std::unique_ptr<Model> draft = Model::load(test::shipped_model("specula-draft.gguf"), backend);
    ModelRunner runner{*target};
    Tokenizer tokenizer{test::shipped_model("specula-target.gguf")};

    struct Output {
        std::vector<int32_t> tokens;
        std::vector<TokenLogprob> logprobs;
    };
    GenerationOptions options_with_logprobs(GenerationOptions o, Output & out) const {
        if (o.top_logprobs >= 0) o.on_logprob = [&out](const TokenLogprob & lp) { out.logprobs.push_back(lp); };
        return o;
    }
    bool is_end(int32_t t) const { return tokenizer.is_end_of_generation(t); }

    Output plain(std::span<const int32_t> prompt, const GenerationOptions & options) {
        Output out;
        KvCache cache(backend, target->config(), 512);
        const auto processing = logits_processing(options, prompt, &tokenizer);
        generate_plain(
            runner, cache, prompt, options_with_logprobs(options, out), [&](int32_t t) { return is_end(t); },
            [&](int32_t t) {
                out.tokens.push_back(t);
                return true;
            },
            processing.get());
        return out;
    }

    Output speculative(Drafter & drafter, std::span<const int32_t> prompt, const GenerationOptions & options, TreeBudget tree = {},
                       VerifyFn verify = nullptr, std::function<void(const RoundInfo &)> on_round = nullptr) {
        Output out;
        KvCache cache(backend, target->config(), 512);
        auto policy = make_draft_policy(DraftPolicyKind::Fixed, 4, {});
        SequenceParts parts{cache, &drafter, policy.get(), tree, std::move(on_round), std::move(verify)};
        parts.tokenizer = &tokenizer;
        generate_speculative(
            runner, parts, prompt, options_with_logprobs(options, out), [&](int32_t t) { return is_end(t); },
            [&](int32_t t) {
                out.tokens.push_back(t);
                return true;
            });
        return out;
    }
};

// The token whose piece is exactly `piece` (the tokenizer would add a word space to "no").
int32_t token_of(const Tokenizer & tok, const std::string & piece) {
    for (int32_t t = 0; t < tok.n_vocab(); ++t) {
        if (tok.piece(t) == piece) return t;
    }
    ADD_FAILURE() << "no token spells \"" << piece << "\"";
    return 0;
}

// The pieces of the tokens a state allows, on a row of zeros.
std::vector<std::string> allowed_pieces(const LogitsState & state, const Tokenizer & tok) {
    std::vector<float> row(tok.n_vocab(), 0.0f);
    state.apply(row);
    std::vector<std::string> pieces;
    for (int32_t t = 0; t < tok.n_vocab(); ++t) {
        EXPECT_EQ(row[t] != -INFINITY, state.allows(t)) << "allows() disagrees with apply() on token " << t;
        if (row[t] != -INFINITY) pieces.push_back(tok.is_end_of_generation(t) ? "<end>" : tok.piece(t));
    }
    return pieces;
}

TEST(Grammar, BansEveryTokenThatCannotContinueTheGrammarAndAllowsTheEndOnlyAtItsEnd) {
    const Tokenizer tok(test::shipped_model("specula-target.gguf"));
    const auto state = make_grammar_state(tok, R"(root ::= "yes" | "no")");
    const auto first = allowed_pieces(*state, tok);
    ASSERT_FALSE(first.empty());
    for (const std::string & p : first) EXPECT_TRUE(std::string("yes").starts_with(p) || std::string("no").starts_with(p)) << p;

    // Spell "no" one token at a time through a clone; the original still allows "yes".
    auto path = state->clone();
    path->accept(token_of(tok, "n"));
    path->accept(token_of(tok, "o"));
    EXPECT_EQ(allowed_pieces(*path, tok), std::vector<std::string>{"<end>"});
    bool y_allowed = false;
    for (const std::string & p : allowed_pieces(*state, tok)) y_allowed = y_allowed || p == "y";
    EXPECT_TRUE(y_allowed);
    EXPECT_NE(test::error_message([&] { path->accept(token_of(tok, "y")); }).find("does not follow the grammar"),
              std::string::npos);
}

// The argmax without banning over the whole row equals the whole processed row's, whether the
// likeliest tokens are allowed, a few are banned, or more than it tries.
TEST(Grammar, ProcessedArgmaxIsTheArgmaxOfTheWholeProcessedRow) {
    const Tokenizer tok(test::shipped_model("specula-target.gguf"));
    SamplingParams p;
    p.repeat_penalty = 1.7f, p.frequency_penalty = 0.3f;
    const std::vector<int32_t> history = {token_of(tok, "y"), token_of(tok, "n")};
    const auto state = make_logits_state(p, R"(root ::= [a-z]+)", history, &tok);
    Rng rng(7);
    int banned_first = 0, past_the_tries = 0;
    for (int r = 0; r < 60; ++r) {
        std::vector<float> raw(tok.n_vocab());
        for (float & x : raw) x = static_cast<float>(4.0 * rng.uniform());
        // Rows whose likeliest tokens are banned (pieces with a space), a few or very many.
        const int boosted = r % 3 == 0 ? 0 : r % 3 == 1 ? 3
                                                        : 3 * kArgmaxTries;
        int n = 0;
        for (int32_t t = 0; t < tok.n_vocab() && n < boosted; ++t) {
            if (tok.piece(t).starts_with(" ")) raw[t] = 10.0f + n++;
        }
        std::vector<float> whole = raw, partial = raw;
        state->apply(whole);
        const int32_t want = argmax(whole);
        EXPECT_EQ(processed_argmax(*state, partial), want) << "row " << r;
        banned_first += boosted > 0;
        past_the_tries += boosted > kArgmaxTries;
    }
    EXPECT_GT(banned_first, 0);
    EXPECT_GT(past_the_tries, 0);
}

TEST(Grammar, AGrammarThatDoesNotParseIsAnErrorNamingTheProblem) {
    const Tokenizer tok(test::shipped_model("specula-target.gguf"));
    const std::string undefined = test::error_message([&] { make_grammar_state(tok, R"(root ::= missing)"); });
    EXPECT_NE(undefined.find("does not parse as GBNF"), std::string::npos) << undefined;
    EXPECT_NE(undefined.find("missing"), std::string::npos) << undefined;
    const std::string unterminated = test::error_message([&] { make_grammar_state(tok, R"(root ::= "abc)"); });
    EXPECT_NE(unterminated.find("does not parse as GBNF"), std::string::npos) << unterminated;
    EXPECT_NE(unterminated.find("unexpected end of input"), std::string::npos) << unterminated;
    const std::string no_assign = test::error_message([&] { make_grammar_state(tok, "root = \"a\"\nother ::= \"b\""); });
    EXPECT_EQ(no_assign, "the grammar does not parse as GBNF: expecting ::= at = \"a\"") << no_assign;
    const std::string no_root = test::error_message([&] { make_grammar_state(tok, R"(other ::= "a")"); });
    EXPECT_NE(no_root.find("does not parse as GBNF"), std::string::npos) << no_root;
    EXPECT_NE(no_root.find("'root'"), std::string::npos) << no_root;
    EXPECT_NO_THROW(make_grammar_state(tok, "# a comment first\n\nroot ::= item+  # and after a rule\nitem ::= [a-z]\n"));
}

// A server parses grammars on many threads while others log: the parse must leave stderr alone,
// neither swallowing other threads' lines nor mixing them into a client's error message.
TEST(Grammar, ParsingABadGrammarLeavesOtherThreadsStderrAlone) {
    const Tokenizer tok(test::shipped_model("specula-target.gguf"));
    std::string gbnf;  // long, so that each parse spans several of the other thread's lines
    for (int i = 0; i < 4000; ++i) gbnf += "rule" + std::to_string(i) + " ::= \"word\" [a-z]+ (\"x\" | \"y\")*\n";
    gbnf += R"(root ::= "abc)";
    std::atomic<bool> parsing{true};
    std::vector<std::string> reasons;
    testing::internal::CaptureStderr();
    std::thread parser([&] {
        for (int i = 0; i < 20; ++i) reasons.push_back(test::error_message([&] { make_grammar_state(tok, gbnf); }));
        parsing = false;
    });
    int written = 0;
    while (parsing) {
        std::fprintf(stderr, "line %d from another thread\n", written++);
        std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    parser.join();
    const std::string captured = testing::internal::GetCapturedStderr();
    int seen = 0;
    for (size_t at = 0; (at = captured.find("from another thread\n", at)) != std::string::npos; ++at) ++seen;
    EXPECT_EQ(seen, written);
    for (const std::string & reason : reasons) {
        EXPECT_EQ(reason, "the grammar does not parse as GBNF: unexpected end of input");
    }
}

TEST(Grammar, JsonSchemasCompileToGbnfAndUncompilableOnesAreErrors) {
    const auto schema = nlohmann::json::parse(R"({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]})");
    const std::string gbnf = json_schema_to_gbnf(schema);
    EXPECT_NE(gbnf.find("root ::="), std::string::npos) << gbnf;
    const Tokenizer tok(test::shipped_model("specula-target.gguf"));
    const auto state = make_grammar_state(tok, gbnf);
    for (const std::string & p : allowed_pieces(*state, tok)) EXPECT_EQ(p[p.find_first_not_of(" \t\n")], '{') << p;
    const std::string bad = test::error_message([] { json_schema_to_gbnf(nlohmann::json::parse(R"({"$ref": "#/nowhere"})")); });
    EXPECT_NE(bad.find("cannot be compiled to a grammar"), std::string::npos) << bad;
    EXPECT_NE(test::error_message([] { json_schema_to_gbnf(std::string("{not json")); }).find("cannot be compiled"), std::string::npos);
}

// `text` accepted one character's token at a time.
void accept_characters(LogitsState & state, const Tokenizer & tok, const std::string & text) {
    for (const char c : text) {
        const int32_t t = tok.token_spelling(std::string(1, c));
        ASSERT_GE(t, 0) << "no token spells '" << c << "'";
        state.accept(t);
    }
}

// The pieces of `tokens`, joined.
std::string spelled(const Tokenizer & tok, const std::vector<int32_t> & tokens) {
    std::string text;
    for (const int32_t t : tokens) text += tok.piece(t);
    return text;
}

// Catches: a forced text that does not stop where the ways on part (a character class, two
// alternatives, an end the grammar may take), tokens the grammar would not take in turn (the
// tokenizer's word-space spelling of a fragment), a last run of letters kept although the free
// text after it may continue it, or a forced end not kept.
TEST(Grammar, ForcedTokensSpellWhatEveryWayOnBeginsWith) {
    const Tokenizer tok(test::shipped_model("specula-target.gguf"));
    const auto record = make_grammar_state(tok, R"(root ::= "{\"name\": \"" [a-z]+ "\", \"kind\": \"" ("cat" | "cow") "\"}")");
    const std::vector<int32_t> opening = record->forced_tokens(16);
    EXPECT_EQ(spelled(tok, opening), "{\"name\": \"");
    auto walk = record->clone();
    for (const int32_t t : opening) walk->accept(t);
    EXPECT_TRUE(walk->forced_tokens(16).empty()) << "the name is free";
    EXPECT_EQ(record->forced_tokens(2), std::vector<int32_t>(opening.begin(), opening.begin() + 2)) << "at most max_tokens";
    accept_characters(*walk, tok, "x\", \"kind\": \"c");
    EXPECT_TRUE(walk->forced_tokens(16).empty()) << "\"cat\" and \"cow\" part after their \"c\"";
    accept_characters(*walk, tok, "ow");
    EXPECT_EQ(spelled(tok, walk->forced_tokens(16)), "\"}") << "the end is forced, and kept";

    // Letters before a free continuation: "ab" of "abc..." | "abd..." is left to the drafter.
    EXPECT_TRUE(make_grammar_state(tok, R"(root ::= "ab" [c-d] [a-z]*)")->forced_tokens(16).empty());
    // A grammar that may end here, or go on, forces nothing.
    EXPECT_TRUE(make_grammar_state(tok, R"(root ::= "" | "[]")")->forced_tokens(16).empty());
    // A penalty state in front forces nothing itself; the grammar's forced tokens come through it
    // as far as the bias allows them.
    SamplingParams bias;
    bias.logit_bias = {{opening[1], -INFINITY}};
    const auto both = make_logits_state(bias, R"(root ::= "{\"name\": \"" [a-z]+ "\"}")", {}, &tok);
    EXPECT_EQ(both->forced_tokens(16), std::vector<int32_t>{opening[0]});
}

// A state's masks are cached per grammar position and shared by its clones: along a JSON text
// whose string and number positions recur (and whose "é" leaves a partial character between
// byte tokens), every row and allows() answer equals a fresh state's, which has cached nothing.
TEST(Grammar, CachedMasksEqualAFreshStatesAlongARepetitiveJsonText) {
    const std::string gbnf = json_schema_to_gbnf(std::string(
        R"({"type": "object", "properties": {"name": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}}, "n": {"type": "integer"}}, "required": ["name", "tags", "n"]})"));
    const Tokenizer tok(test::shipped_model("specula-target.gguf"));
    auto walked = make_grammar_state(tok, gbnf);
    // The text as the grammar takes it (the tokenizer would add a word space): at each point the
    // longest allowed piece that spells on, but "é" byte by byte (a partial character between).
    std::vector<int32_t> text;
    bool partial = false;
    for (std::string rest = R"({"name": "aaa aaa aaa café", "tags": ["aa", "aa", "aaa"], "n": 11111})"; !rest.empty();) {
        auto state = walked->clone();
        for (int32_t t : text) state->accept(t);
        int32_t best = -1;
        for (int32_t t = 0; t < tok.n_vocab(); ++t) {
            const std::string p = tok.piece(t);
            if (p.empty() || !rest.starts_with(p) || !state->allows(t)) continue;
            const bool byte_wise = static_cast<unsigned char>(rest[0]) >= 0x80;
            if (best < 0 || (byte_wise ? p.size() < tok.piece(best).size() : p.size() > tok.piece(best).size())) best = t;
        }
        ASSERT_GE(best, 0) << "no allowed token spells on at " << rest;
        partial = partial || (static_cast<unsigned char>(rest[0]) >= 0x80 && tok.piece(best).size() == 1);
        text.push_back(best);
        rest = rest.substr(tok.piece(best).size());
    }
    ASSERT_TRUE(partial) << "the vocabulary spells \"é\" with no byte token";
    for (size_t i = 0; i <= text.size(); ++i) {
        auto fresh = make_grammar_state(tok, gbnf);
        for (size_t j = 0; j < i; ++j) fresh->accept(text[j]);
        auto clone = walked->clone();  // shares the walked state's cache
        std::vector<float> cached(tok.n_vocab(), 0.0f), uncached(tok.n_vocab(), 0.0f);
        clone->apply(cached);
        fresh->apply(uncached);
        ASSERT_EQ(cached, uncached) << "after " << i << " tokens";
        for (int32_t t = 0; t < tok.n_vocab(); t += 7) ASSERT_EQ(walked->allows(t), uncached[t] != -INFINITY) << "token " << t << " after " << i;
        if (i < text.size()) walked->accept(text[i]);
    }
}

// A lazy grammar allows every token until its trigger ("<call>", found anywhere in the text),
// then only what follows the grammar from the trigger on; a clone keeps whichever state it is in.
TEST(LazyGrammar, IsFreeBeforeItsTriggerConstrainedAfterAndClonesKeepTheTriggerState) {
    const Tokenizer tok(test::shipped_model("specula-target.gguf"));
    const auto state = make_lazy_grammar_state(tok, R"(root ::= "<call>" [0-9]+ "</call>")", {"<call>"}, {});
    std::vector<int32_t> text = tok.tokenize("hello <call>", false);
    ASSERT_GE(text.size(), 2u);
    for (size_t i = 0; i + 1 < text.size(); ++i) {
        EXPECT_EQ(allowed_pieces(*state, tok).size(), static_cast<size_t>(tok.n_vocab())) << "free before the trigger, after " << i << " tokens";
        state->accept(text[i]);
    }
    const auto awaiting = state->clone();
    state->accept(text.back());
    const std::vector<std::string> after = allowed_pieces(*state, tok);
    ASSERT_FALSE(after.empty());
    for (const std::string & p : after) EXPECT_TRUE(p.find_first_not_of("0123456789") == std::string::npos) << "\"" << p << "\" after the trigger";
    EXPECT_EQ(allowed_pieces(*state->clone(), tok), after) << "a clone of the triggered state is constrained";
    EXPECT_EQ(allowed_pieces(*awaiting, tok).size(), static_cast<size_t>(tok.n_vocab())) << "a clone before the trigger stays free";
    awaiting->accept(text.back());
    EXPECT_EQ(allowed_pieces(*awaiting, tok), after);
    // A token the triggered grammar refuses fails when that path's row is asked for.
    state->accept(token_of(tok, "a"));
    EXPECT_FALSE(state->allows(token_of(tok, "1")));
    std::vector<float> row(tok.n_vocab(), 0.0f);
    EXPECT_NE(test::error_message([&] { state->apply(row); }).find("does not follow the grammar"), std::string::npos);
    EXPECT_NE(test::error_message([&] { make_lazy_grammar_state(tok, R"(root ::= "a")", {}, {}); }).find("needs a trigger"), std::string::npos);
    EXPECT_NE(test::error_message([&] { make_lazy_grammar_state(tok, R"(root ::= "a")", {"(unclosed"}, {}); }).find("does not parse as a regex"), std::string::npos);
}

// Whether libllama's own lazy sampler allows `token` now.
bool reference_allows(llama_sampler * sampler, int32_t token) {
    llama_token_data one{token, 0.0f, 0.0f};
    llama_token_data_array array{&one, 1, -1, false};
    llama_sampler_apply(sampler, &array);
    return one.logit != -INFINITY;
}

// The awaiting state searches only the new text and a window before it, yet triggers where
// libllama's sampler (which searches all the text on every token) does, at the same token and
// with the same grammar state after: a word, a pattern whose group starts the grammar, a pattern
// anchored at the text's start, a trigger token, each behind text longer than the search window
// and at its start. Catches a trigger missed across a token boundary or the window's edge, a
// match replayed from the wrong token, or an anchored pattern matched mid-text.
TEST(LazyGrammar, TheIncrementalTriggerSearchTriggersWhereLibllamasDoes) {
    const Tokenizer tok(test::shipped_model("specula-target.gguf"));
    std::string filler;
    for (int i = 0; filler.size() < 3000; ++i) filler += "word" + std::to_string(i % 7) + (i % 5 ? " " : ",\n");
    struct Case {
        const char * gbnf;
        std::vector<std::string> patterns;
        std::string after;  // the text after the filler (or alone)
    };
    const std::vector<Case> cases = {
        {R"(root ::= "<call>" [0-9]+ "</call>")", {"<call>"}, "see <call>12</call>"},
        {R"(root ::= " to" [0-9]+)", {"<start>assistant(\\s+to)"}, "<start>assistant to42"},
        {R"(root ::= [ ]* "<call>" [0-9]+)", {"^\\s*<call>"}, "  <call>7"},
        {R"(root ::= "<call>" [0-9]+)", {"<never>", "<call>"}, "<cal <call>12"},
    };
    const std::vector<int32_t> probes = {token_of(tok, "a"), token_of(tok, "1"), token_of(tok, " "), token_of(tok, "<")};
    for (const Case & c : cases) {
        for (const bool behind_filler : {false, true}) {
            SCOPED_TRACE(c.patterns.back() + (behind_filler ? " behind the filler" : " at the start"));
            const std::vector<int32_t> text = tok.tokenize((behind_filler ? filler : "") + c.after, false);
            const auto state = make_lazy_grammar_state(tok, c.gbnf, c.patterns, {});
            std::vector<const char *> patterns;
            for (const std::string & p : c.patterns) patterns.push_back(p.c_str());
            llama_sampler * reference = llama_sampler_init_grammar_lazy_patterns(tok.vocabulary(), c.gbnf, "root", patterns.data(), patterns.size(), nullptr, 0);
            ASSERT_NE(reference, nullptr);
            bool constrained = false;
            for (size_t i = 0; i < text.size(); ++i) {
                state->accept(text[i]);
                try {
                    llama_sampler_accept(reference, text[i]);
                } catch (const std::exception &) {
                    break;  // the text strays from the grammar: both fail alike from here
                }
                for (int32_t p : probes) {
                    const bool expected = reference_allows(reference, p);
                    ASSERT_EQ(state->allows(p), expected) << "token " << p << " after " << i + 1 << " of " << text.size();
                    constrained = constrained || !expected;
                }
            }
            llama_sampler_free(reference);
            EXPECT_TRUE(constrained || (c.patterns[0][0] == '^' && behind_filler)) << "the trigger was never reached";
        }
    }
    const auto by_token = make_lazy_grammar_state(tok, R"(root ::= "a" [0-9]+)", {}, {token_of(tok, "a")});
    for (int32_t t : tok.tokenize(filler, false)) by_token->accept(t);
    EXPECT_TRUE(by_token->allows(token_of(tok, "a")));
    by_token->accept(token_of(tok, "a"));
    EXPECT_FALSE(by_token->allows(token_of(tok, "a")));
    EXPECT_TRUE(by_token->allows(token_of(tok, "1")));
}

// A reply of a quarter MiB before its trigger: each token's search reads a bounded window, where
// libllama's would read the whole reply (the square of its length in all: this test would then
// run for many minutes; and libstdc++'s recursive std::regex can overflow the stack on a long text).
TEST(LazyGrammar, ALongReplyIsSearchedForItsTriggerInBoundedWindows) {
    const Tokenizer tok(test::shipped_model("specula-target.gguf"));
    std::string reply;
    for (int i = 0; reply.size() < (256u << 10); ++i) reply += "line " + std::to_string(i) + " of the reply\n";
    std::vector<int32_t> text = tok.tokenize(reply + "<start>assistant to", false);
    const auto state = make_lazy_grammar_state(tok, R"(root ::= " to" [0-9]+)", {"<call>", "^\\s*<tool>[\\s\\S]*$", "<start>assistant(\\s+to)"}, {});
    for (size_t i = 0; i + 1 < text.size(); ++i) state->accept(text[i]);
    EXPECT_TRUE(state->allows(token_of(tok, "a"))) << "free before the trigger";
    state->accept(text.back());
    EXPECT_FALSE(state->allows(token_of(tok, "a")));
    EXPECT_TRUE(state->allows(token_of(tok, "1")));
}

// A tree over the bundled vocabulary: the grammar bans node 3 ("a" after "a") at its parent;
// reading a skipped node's row is an error, never another node's row.
TEST(PathLogits, NodesBannedAtTheirParentAreSkippedWithTheirSubtreesAndEachRowSeesItsPath) {
    const Tokenizer tok(test::shipped_model("specula-target.gguf"));
    const auto state = make_grammar_state(tok, R"(root ::= "ab" | "b")");
    const int32_t a = token_of(tok, "a"), b = token_of(tok, "b");
    TokenTree tree;
    const int n0 = tree.add(TokenTree::kRoot, a, 0.0f);  // "a": allowed
    tree.add(TokenTree::kRoot, b, 0.0f);                 // "b": allowed at the root too
    tree.add(n0, b, 0.0f);                               // "ab": allowed
    tree.add(n0, a, 0.0f);                               // "aa": banned
    PathLogits path;
    path.begin(tree, state.get());
    EXPECT_EQ(std::vector<char>(path.skipped().begin(), path.skipped().end()), (std::vector<char>{0, 0, 0, 1}));
    const int n = tok.n_vocab();
    std::vector<float> raw(static_cast<size_t>(4) * n, 0.0f);  // rows of the root and nodes 0..2
    const std::vector<int> block_row = {0, 1, 2, 3, -1};
    path.set_rows(raw, n, block_row);
    const TargetLogits view = path.view();
    EXPECT_NE(view.row_of(TokenTree::kRoot)[a], -INFINITY);
    EXPECT_EQ(view.row_of(0)[a], -INFINITY) << "after \"a\" only \"b\" may follow";
    EXPECT_NE(view.row_of(0)[b], -INFINITY);
    EXPECT_NE(test::error_message([&] { view.row_of(3); }).find("skipped"), std::string::npos);
}

// ---- Speculative decoding equals plain decoding at T = 0 ------------------------------------

struct Case {
    const char * name;
    GenerationOptions options;
};

std::vector<Case> processing_cases(const Tokenizer & tok) {
    GenerationOptions base;
    base.n_predict = 32;
    base.top_logprobs = 3;
    std::vector<Case> cases;
    GenerationOptions penalties = base;
    penalties.sampling.repeat_penalty = 1.6f, penalties.sampling.presence_penalty = 0.7f, penalties.sampling.frequency_penalty = 0.4f;
    cases.push_back({"penalties", penalties});
    GenerationOptions whole = penalties;
    whole.sampling.penalty_last_n = -1;
    cases.push_back({"penalties over the whole context", whole});
    GenerationOptions bias = base;
    for (const char * word : {" the", ",", ".", " and"}) bias.sampling.logit_bias.emplace_back(tok.tokenize(word, false).back(), -INFINITY);
    bias.sampling.logit_bias.emplace_back(tok.tokenize(" cat", false).back(), 3.0f);
    cases.push_back({"logit bias", bias});
    GenerationOptions grammar = base;
    // No "e" nor "t": most of the drafter's favourite tokens are banned; the sentence ends in a period.
    grammar.grammar = R"(root ::= [a-df-su-z ]{3,30} ".")";
    cases.push_back({"grammar", grammar});
    GenerationOptions schema = base;
    schema.n_predict = 40;
    schema.grammar = json_schema_to_gbnf(nlohmann::json::parse(
        R"({"type": "object", "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}}, "required": ["name", "age"]})"));
    cases.push_back({"JSON schema", schema});
    // Free for the first 10 characters, then the rest of the token that crossed them and a
    // sentence without "e" nor "t": rows change from free to constrained inside drafted paths.
    GenerationOptions lazy = base;
    lazy.grammar = R"(root ::= [^.]{0,8} [a-df-su-z ]{3,30} ".")";
    lazy.grammar_lazy = true;
    lazy.grammar_trigger_patterns = {R"([\s\S]{10}([\s\S]+))"};
    cases.push_back({"lazy grammar", lazy});
    return cases;
}

TEST(LogitsProcessing, GreedySpeculativeChainsAndTreesEqualPlainDecodingTokensAndLogprobs) {
    Bundled m;
    DraftModelDrafter small(*m.draft, 512);
    DraftModelDrafter self(*m.target, 512);  // proposes the unprocessed target's tokens: penalties and grammars reject them
    NgramDrafter ngram(1, 3);
    const auto eagle1 = EagleHead::load(test::shipped_model("specula-eagle1.gguf"), *m.target, m.backend);
    const auto eagle3 = EagleHead::load(test::shipped_model("specula-eagle3.gguf"), *m.target, m.backend);
    EagleDrafter head1(*eagle1, 512), head3(*eagle3, 512);
    const std::vector<int32_t> prompt = m.tokenizer.tokenize("Once upon a time, the little cat");
    for (const Case & c : processing_cases(m.tokenizer)) {
        const Bundled::Output want = m.plain(prompt, c.options);
        ASSERT_EQ(want.logprobs.size(), want.tokens.size()) << c.name;
        int accepted = 0;
        for (Drafter * d : std::vector<Drafter *>{&small, &self, &ngram, &head1, &head3}) {
            for (TreeBudget tree : {TreeBudget{}, TreeBudget{TreeShape::Dynamic, 4, 3, 12}, TreeBudget{TreeShape::Static, 4, 4, 16}}) {
                if (tree.shape != TreeShape::Chain && d == &ngram) continue;
                if (tree.shape == TreeShape::Static && d != &head1) continue;  // EAGLE-1's shape
                const Bundled::Output got =
                    m.speculative(*d, prompt, c.options, tree, nullptr, [&](const RoundInfo & r) { accepted += int(r.result->accepted.size()); });
                const std::string where = std::string(c.name) + ", " + d->name() + ", " + tree_shape_name(tree.shape);
                ASSERT_EQ(got.tokens, want.tokens) << where;
                ASSERT_EQ(got.logprobs.size(), want.logprobs.size()) << where;
                for (size_t i = 0; i < want.logprobs.size(); ++i) {
                    EXPECT_EQ(got.logprobs[i].token, want.logprobs[i].token) << where << ", token " << i;
                    EXPECT_EQ(got.logprobs[i].logprob, want.logprobs[i].logprob) << where << ", token " << i;
                    EXPECT_EQ(got.logprobs[i].top, want.logprobs[i].top) << where << ", token " << i;
                }
            }
        }
        EXPECT_GT(accepted, 20) << c.name << ": the accept path was exercised";
    }
}

// SpecEE's lossless mode (tokens exited at layer 1, by a predictor that always exits, as chain
// drafts) on a fixture target with a vocabulary: plain decoding's tokens, and its logprobs up to
// the rounding of an f32 model's multi-row forward.
TEST(LogitsProcessing, GreedyEarlyExitDraftsEqualPlainDecodingUnderPenaltiesAndAGrammar) {
    const std::string path = test::model_path("llama_gqa_f32");
    Backend backend{BackendOptions{"cpu", 1}};
    const auto target = Model::load(path, backend);
    ModelRunner runner(*target);
    const Tokenizer tok(path);
    const auto head = EagleHead::load(test::eagle_head_path("eagle3", "llama_gqa_f32"), *target, backend);
    test::PredictorSpec always;
    always.layers = {1};
    always.output_bias = 100.0f;
    const auto predictor = ExitPredictor::load(test::write_predictor(always, *target, "always_exits_at_1"), *target);
    EarlyExitDrafter exits(*target, *predictor, 0.5f, std::make_unique<EagleDrafter>(*head, 256), 256);
    GenerationOptions o;
    o.n_predict = 24;
    o.top_logprobs = 2;
    o.sampling.repeat_penalty = 1.8f, o.sampling.presence_penalty = 0.5f;
    o.grammar = R"(root ::= [a-z ]+)";
    const std::vector<int32_t> prompt = tok.tokenize("Once upon a time");
    auto run = [&](Drafter * d) {
        Bundled::Output out;
        KvCache cache(backend, target->config(), 256);
        GenerationOptions with = o;
        with.on_logprob = [&](const TokenLogprob & lp) { out.logprobs.push_back(lp); };
        auto sink = [&](int32_t t) {
            out.tokens.push_back(t);
            return true;
        };
        auto is_end = [&](int32_t t) { return tok.is_end_of_generation(t); };
        if (!d) {
            const auto processing = logits_processing(with, prompt, &tok);
            generate_plain(runner, cache, prompt, with, is_end, sink, processing.get());
            return out;
        }
        auto policy = make_draft_policy(DraftPolicyKind::Fixed, 4, {});
        SequenceParts parts{cache, d, policy.get(), TreeBudget{}};
        parts.tokenizer = &tok;
        generate_speculative(runner, parts, prompt, with, is_end, sink);
        return out;
    };
    const Bundled::Output want = run(nullptr), got = run(&exits);
    EXPECT_EQ(got.tokens, want.tokens);
    ASSERT_EQ(got.logprobs.size(), want.logprobs.size());
    for (size_t i = 0; i < want.logprobs.size(); ++i) {
        EXPECT_NEAR(got.logprobs[i].logprob, want.logprobs[i].logprob, 1e-4) << "token " << i;
        ASSERT_EQ(got.logprobs[i].top.size(), want.logprobs[i].top.size()) << "token " << i;
        for (size_t k = 0; k < want.logprobs[i].top.size(); ++k) {
            EXPECT_EQ(got.logprobs[i].top[k].first, want.logprobs[i].top[k].first) << "token " << i;
            EXPECT_NEAR(got.logprobs[i].top[k].second, want.logprobs[i].top[k].second, 1e-4) << "token " << i;
        }
    }
    EXPECT_GT(exits.exit_stats().exited(), 0);
}

// Model drafters propose only what the grammar allows along each drafted path: no node of theirs
// is left out of the forward as banned, at T = 0 and T > 0, in chains and trees.
TEST(LogitsProcessing, ModelDraftersProposeOnlyTokensTheGrammarAllowsAlongEachPath) {
    Bundled m;
    DraftModelDrafter small(*m.draft, 512);
    const auto eagle3 = EagleHead::load(test::shipped_model("specula-eagle3.gguf"), *m.target, m.backend);
    EagleDrafter head3(*eagle3, 512);
    const std::vector<int32_t> prompt = m.tokenizer.tokenize("Once upon a time, the little cat");
    GenerationOptions o = processing_cases(m.tokenizer)[3].options;  // the grammar without "e" and "t"
    ASSERT_FALSE(o.grammar.empty());
    for (const float temperature : {0.0f, 0.8f}) {
        o.sampling.temperature = temperature;
        for (Drafter * d : std::vector<Drafter *>{&small, &head3}) {
            for (TreeBudget tree : {TreeBudget{}, TreeBudget{TreeShape::Dynamic, 4, 3, 12}}) {
                int drafted = 0, banned = 0;
                std::vector<int32_t> generated;
                auto count = [&](const RoundInfo & r) {
                    // The state the round drafted from: the prompt's, advanced over the tokens before it.
                    const auto state = logits_processing(o, prompt, &m.tokenizer);
                    const size_t before = r.history.size() - prompt.size() - r.result->accepted.size() - 1;
                    for (size_t i = 0; i < before; ++i) state->accept(r.history[prompt.size() + i]);
                    PathLogits path;
                    path.begin(r.draft->tree, state.get());
                    drafted += r.draft->tree.size();
                    for (char skipped : path.skipped()) banned += skipped;
                };
                m.speculative(*d, prompt, o, tree, nullptr, count);
                const std::string where = std::string(d->name()) + ", " + tree_shape_name(tree.shape) + ", T=" + std::to_string(temperature);
                EXPECT_GT(drafted, 0) << where;
                EXPECT_EQ(banned, 0) << where;
            }
        }
    }
}

// Jump-forward as speculation: with a grammar that forces text (a record's keys, quotes and
// braces), the forced tokens are drafted (here by a model drafter that proposes nothing, so that
// every accepted draft is a forced one) and accepted, and the output is plain decoding's token
// for token; with the EAGLE-3 head's trees beside them too. Catches: forced drafts never grafted
// or never accepted, or a graft that changes what greedy decoding gives.
TEST(LogitsProcessing, GrammarForcedTextIsDraftedAndGreedyOutputStaysPlainDecodings) {
    Bundled m;
    const auto eagle3 = EagleHead::load(test::shipped_model("specula-eagle3.gguf"), *m.target, m.backend);
    LookupGraftDrafter forced_only(std::make_unique<test::FixedTreeDrafter>(TokenTree{}), 64, 64);  // lookup never matches 64 tokens
    LookupGraftDrafter head3(std::make_unique<EagleDrafter>(*eagle3, 512), 1, 3);
    const std::vector<int32_t> prompt = m.tokenizer.tokenize("Once upon a time, the little cat");
    GenerationOptions o;
    o.n_predict = 48;
    o.grammar = R"(root ::= "{\"name\": \"" [a-z ]{1,10} "\", \"kind\": \"" ("cat" | "dog") "\", \"age\": " [0-9]{1,2} "}")";
    const Bundled::Output want = m.plain(prompt, o);
    ASSERT_GT(want.tokens.size(), 10u);
    for (TreeBudget tree : {TreeBudget{}, TreeBudget{TreeShape::Dynamic, 4, 3, 12}}) {
        int forced_accepted = 0;
        auto count = [&](const RoundInfo & r) { forced_accepted += static_cast<int>(r.result->accepted.size()); };
        EXPECT_EQ(m.speculative(forced_only, prompt, o, tree, nullptr, count).tokens, want.tokens) << tree_shape_name(tree.shape);
        EXPECT_GT(forced_accepted, 8) << tree_shape_name(tree.shape) << ": the forced keys were drafted and accepted";
        EXPECT_EQ(m.speculative(head3, prompt, o, tree).tokens, want.tokens) << tree_shape_name(tree.shape) << ", with the head";
    }
}

TEST(LogitsProcessing, ConstrainedOutputFollowsTheGrammarAndTheSchema) {
    Bundled m;
    DraftModelDrafter small(*m.draft, 512);
    const std::vector<int32_t> prompt = m.tokenizer.tokenize("Once upon a time, the little cat");
    for (const Case & c : processing_cases(m.tokenizer)) {
        if (c.options.grammar.empty()) continue;
        const Bundled::Output out = m.speculative(small, prompt, c.options, TreeBudget{TreeShape::Dynamic, 4, 3, 12});
        std::vector<int32_t> body = out.tokens;
        const bool ended = !body.empty() && m.tokenizer.is_end_of_generation(body.back());
        if (ended) body.pop_back();
        const std::string text = m.tokenizer.detokenize(body);
        SCOPED_TRACE(std::string(c.name) + ": " + text);
        if (std::string(c.name) == "grammar") {
            EXPECT_EQ(text.find_first_of("etET"), std::string::npos);
            EXPECT_TRUE(ended) << "the grammar's sentence ends within 31 characters";
            EXPECT_TRUE(text.ends_with("."));
        } else if (c.options.grammar_lazy) {  // free at first, then at least 3 characters without "e" nor "t" and a period
            ASSERT_TRUE(ended && text.size() > 13 && text.ends_with(".")) << "the triggered grammar's sentence ends";
            EXPECT_EQ(text.substr(text.size() - 4, 3).find_first_of("etET"), std::string::npos);
        } else if (ended) {
            const auto json = nlohmann::json::parse(text);
            EXPECT_TRUE(json.at("age").is_number_integer());
            EXPECT_TRUE(json.at("name").is_string());
        } else {
            EXPECT_EQ(text.rfind("{", 0), 0u);
        }
    }
}

TEST(LogitsProcessing, OptionsOutOfRangeAreErrorsBeforeAnyToken) {
    Bundled m;
    const std::vector<int32_t> prompt = m.tokenizer.tokenize("Once");
    GenerationOptions o;
    o.top_logprobs = 21;
    EXPECT_NE(test::error_message([&] { m.plain(prompt, o); }).find("top_logprobs must be -1 (none) or 0..20"), std::string::npos);
    o.top_logprobs = -1;
    o.grammar = "root ::= [";
    DraftModelDrafter small(*m.draft, 512);
    EXPECT_NE(test::error_message([&] { m.speculative(small, prompt, o); }).find("does not parse as GBNF"), std::string::npos);
    o.grammar.clear();
    o.sampling.logit_bias = {{m.tokenizer.n_vocab(), 1.0f}};
    EXPECT_NE(test::error_message([&] { m.speculative(small, prompt, o); }).find("outside the"), std::string::npos);
}

// Through Engine::generate: plain decoding and an EAGLE-3 head's policy-sized trees (lookup
// grafted) give the same tokens and logprobs, also the second time, when the engine's prefix
// cache holds the prompt and plain decoding prefills only the rest (the penalties still count the
// whole prompt).
TEST(LogitsProcessing, TheEngineGivesPlainAndSpeculativeGenerationTheSameProcessingAlsoOnACachedPrefix) {
    auto open = [](DrafterSpec drafter) {
        EngineOptions o;
        o.model_path = test::shipped_model("specula-target.gguf");
        o.drafter = std::move(drafter);
        o.n_ctx = 256;
        o.n_threads = 1;
        return Engine::open(o);
    };
    const auto plain = open({});
    const auto spec = open(DrafterSpec{DrafterKind::Eagle3, test::shipped_model("specula-eagle3.gguf")});
    GenerationOptions o;
    o.n_predict = 24;
    o.sampling.repeat_penalty = 1.5f, o.sampling.penalty_last_n = -1;
    o.grammar = R"(root ::= [a-z ,]+ ".")";
    o.top_logprobs = 2;
    std::vector<std::vector<TokenLogprob>> runs;
    std::vector<std::vector<int32_t>> tokens;
    const std::vector<int32_t> prompt = plain->tokenize("Once upon a time, the little cat");
    for (Engine * e : {plain.get(), plain.get(), spec.get(), spec.get()}) {
        GenerationOptions with = o;
        runs.emplace_back();
        with.on_logprob = [&](const TokenLogprob & lp) { runs.back().push_back(lp); };
        tokens.emplace_back();
        e->generate(prompt, with, [&](int32_t t) {
            EXPECT_EQ(runs.back().size(), tokens.back().size() + 1) << "a token's logprob comes before it";
            tokens.back().push_back(t);
            return true;
        });
    }
    for (size_t r = 1; r < runs.size(); ++r) {
        EXPECT_EQ(tokens[r], tokens[0]) << "run " << r;
        ASSERT_EQ(runs[r].size(), runs[0].size()) << "run " << r;
        for (size_t i = 0; i < runs[0].size(); ++i) {
            EXPECT_EQ(runs[r][i].logprob, runs[0][i].logprob) << "run " << r << ", token " << i;
            EXPECT_EQ(runs[r][i].top, runs[0][i].top) << "run " << r << ", token " << i;
        }
    }
}

TEST(LogitsProcessing, SpecEEsLossyModeRefusesWhatItCannotHonour) {
    GenerationOptions o;
    EXPECT_NO_THROW(check_lossy_early_exit_options(o));
    auto refused = [](GenerationOptions x) { return test::error_message([&] { check_lossy_early_exit_options(x); }); };
    o.grammar = "root ::= \"a\"";
    EXPECT_NE(refused(o).find("does not support a grammar"), std::string::npos) << refused(o);
    o = {};
    o.sampling.logit_bias = {{1, 1.0f}};
    EXPECT_NE(refused(o).find("logit bias"), std::string::npos);
    o = {};
    o.sampling.frequency_penalty = 0.5f;
    EXPECT_NE(refused(o).find("penalties"), std::string::npos);
    o = {};
    o.top_logprobs = 0;
    EXPECT_NE(refused(o).find("logprobs"), std::string::npos);
}

// `specula generate` with a grammar file and a JSON-schema file: constrained text, and one error
// line naming the problem for a grammar that does not parse or a schema that is not JSON.
TEST(LogitsProcessing, GenerateTakesGrammarAndJsonSchemaFiles) {
    const std::string cli = std::string(SPECULA_CLI) + " generate --quiet --threads 1 -m " + test::shipped_model("specula-target.gguf") + " -p 'Once upon a time' -n 40 ";
    const std::string grammar = test::scratch_file("color.gbnf"), schema = test::scratch_file("animal.json");
    std::ofstream(grammar) << R"(root ::= " The " [a-z]+ " is " ("red" | "blue") ".")";
    std::ofstream(schema) << R"({"type": "object", "properties": {"legs": {"type": "integer"}}, "required": ["legs"]})";
    const test::CommandRun colored = test::run_command(cli + "--grammar-file " + grammar + " --repeat-penalty 1.3");
    ASSERT_EQ(colored.exit_code, 0) << colored.err;
    const std::string text = colored.out.substr(std::string("Once upon a time").size());
    EXPECT_TRUE(text.starts_with(" The ")) << text;
    EXPECT_TRUE(text.ends_with(" is red.") || text.ends_with(" is blue.")) << text;
    const test::CommandRun json = test::run_command(cli + "--json-schema " + schema);
    ASSERT_EQ(json.exit_code, 0) << json.err;
    EXPECT_TRUE(json.out.substr(std::string("Once upon a time").size()).starts_with("{")) << json.out;

    const std::string bad = test::scratch_file("bad.gbnf");
    std::ofstream(bad) << "root ::= undefined-rule\n";
    test::expect_cli_error(cli, "--grammar-file " + bad, "the grammar does not parse as GBNF: Undefined rule identifier 'undefined-rule'");
    test::expect_cli_error(cli, "--json-schema " + grammar, "is not JSON");
    test::expect_cli_error(cli, "--grammar-file " + bad + ".missing", "cannot read the grammar file");
}

// ---- The processed target's law at T > 0 ----------------------------------------------------

// Exact law of the first two tokens after `prompt` under the processed target: each row
// processed with the state after the tokens before it. Keys t1 * n_vocab + t2.
std::map<int64_t, double> exact_processed_joint(const Model & target, ModelRunner & runner, std::span<const int32_t> prompt,
                                                const SamplingParams & sp, const LogitsState & state) {
    std::map<int64_t, double> joint;
    const int n_vocab = target.config().n_vocab;
    KvCache cache(target.backend(), target.config(), 64);
    ForwardOutput out = runner.forward(ForwardBatch::causal(prompt, 0, {int32_t(prompt.size() - 1)}), cache);
    std::vector<float> row(out.logits_row(0).begin(), out.logits_row(0).end()), p1, p2;
    state.apply(row);
    processed_probs(row, sp, p1);
    const int base = cache.size();
    for (int32_t t1 = 0; t1 < n_vocab; ++t1) {
        if (p1[t1] == 0.0f) continue;
        const auto after = state.clone();
        after->accept(t1);
        const int32_t one[1] = {t1};
        ForwardOutput o = runner.forward(ForwardBatch::causal(one, base, {0}), cache);
        std::vector<float> next(o.logits_row(0).begin(), o.logits_row(0).end());
        after->apply(next);
        processed_probs(next, sp, p2);
        for (int32_t t2 = 0; t2 < n_vocab; ++t2) {
            if (p2[t2] > 0.0f) joint[int64_t(t1) * n_vocab + t2] = double(p1[t1]) * p2[t2];
        }
        cache.rollback(base);
    }
    return joint;
}

// Chi-square of `runs` speculative two-token generations against `joint`. A run that ends in an
// Error (a broken verifier letting a token the grammar bans through) counts as an outcome of
// probability 0.
std::pair<double, int> processed_chi2(const Model & target, ModelRunner & runner, Drafter & drafter, const Tokenizer * tokenizer,
                                      std::span<const int32_t> prompt, const GenerationOptions & options, const std::map<int64_t, double> & joint,
                                      int runs, TreeBudget tree, VerifyFn verify) {
    const int n_vocab = target.config().n_vocab;
    std::map<int64_t, double> counts;
    int impossible = 0;
    auto policy = make_draft_policy(DraftPolicyKind::Fixed, 3, {});
    KvCache cache(target.backend(), target.config(), 64);
    for (int r = 0; r < runs; ++r) {
        cache.rollback(0);
        SequenceParts parts{cache, &drafter, policy.get(), tree, nullptr, verify};
        parts.tokenizer = tokenizer;
        GenerationOptions o = options;
        o.n_predict = 2;
        o.sampling.seed = 5000 + r;
        o.stop_at_end_of_generation = false;
        int64_t cell = 0;
        try {
            generate_speculative(
                runner, parts, prompt, o, [](int32_t) { return false; },
                [&](int32_t t) {
                    cell = cell * n_vocab + t;
                    return true;
                });
        } catch (const Error &) {
            ++impossible;
            continue;
        }
        counts[cell] += 1.0;
    }
    std::vector<test::Cell> cells;
    double seen_elsewhere = impossible;
    for (const auto & [cell, count] : counts) {
        if (!joint.contains(cell)) seen_elsewhere += count;
    }
    for (const auto & [cell, prob] : joint) cells.push_back({prob, counts.contains(cell) ? counts.at(cell) : 0.0});
    auto [stat, dof] = test::chi_square(cells, runs);
    if (seen_elsewhere > 0) stat = INFINITY;  // an outcome the processed target never produces
    return {stat, dof};
}

// The verifier reading raw rows: processing forgotten in verification (a draft with no banned
// node, so that the raw rows are those of the nodes).
VerifyResult verify_unprocessed(const TokenTree & tree, const TargetLogits & logits, const SamplingParams & sp, Rng & rng,
                                int64_t root_position) {
    return verify_sampled(tree, TargetLogits{logits.data, logits.n_vocab}, sp, rng, root_position);
}

TEST(LogitsProcessing, PenalisedSampledChainsAndTreesFollowTheProcessedTargetAndBrokenVerifiersFail) {
    Backend backend{BackendOptions{"cpu", 1}};
    const int V = 10;
    const auto target = Model::load(test::tiny_vocab_model("tiny_target_v10", V, 101), backend);
    const auto draft = Model::load(test::tiny_vocab_model("tiny_draft_v10", V, 202), backend);
    ModelRunner runner(*target);
    DraftModelDrafter drafter(*draft, 64);
    NgramDrafter ngram(1, 2);
    const std::vector<int32_t> prompt = {1, 2, 3, 1, 2};
    GenerationOptions o;
    o.sampling.temperature = 1.0f;
    o.sampling.repeat_penalty = 3.0f, o.sampling.presence_penalty = 1.0f, o.sampling.frequency_penalty = 0.5f, o.sampling.penalty_last_n = 4;
    o.sampling.logit_bias = {{7, 1.5f}};
    GenerationOptions banned = o;
    banned.sampling.logit_bias.emplace_back(4, -INFINITY);
    const int runs = 3000;
    for (const GenerationOptions & opts : {o, banned}) {
        const auto state = make_logits_state(opts.sampling, "", prompt, nullptr);
        const auto joint = exact_processed_joint(*target, runner, prompt, opts.sampling, *state);
        for (TreeBudget tree : {TreeBudget{}, TreeBudget{TreeShape::Dynamic, 2, 3, 9}}) {
            auto [stat, dof] = processed_chi2(*target, runner, drafter, nullptr, prompt, opts, joint, runs, tree, nullptr);
            std::printf("[distribution] penalised %s, %s: chi2 = %.1f, dof = %d, critical = %.1f\n", tree_shape_name(tree.shape),
                        opts.sampling.logit_bias.size() > 1 ? "one token banned" : "biased", stat, dof, test::chi2_critical(dof));
            EXPECT_LT(stat, test::chi2_critical(dof)) << tree_shape_name(tree.shape);
        }
        auto [nstat, ndof] = processed_chi2(*target, runner, ngram, nullptr, prompt, opts, joint, runs, {}, nullptr);
        EXPECT_LT(nstat, test::chi2_critical(ndof)) << "n-gram chains";
    }
    const auto state = make_logits_state(o.sampling, "", prompt, nullptr);
    const auto joint = exact_processed_joint(*target, runner, prompt, o.sampling, *state);
    const SamplingParams sp = o.sampling;
    auto unprocessed = [&sp](const TokenTree & t, const TargetLogits & l, Rng & r, int64_t root_position) { return verify_unprocessed(t, l, sp, r, root_position); };
    auto [bstat, bdof] = processed_chi2(*target, runner, drafter, nullptr, prompt, o, joint, runs, {}, unprocessed);
    std::printf("[distribution] penalised chain, verifier on unprocessed rows: chi2 = %.1f (critical %.1f)\n", bstat, test::chi2_critical(bdof));
    EXPECT_GT(bstat, test::chi2_critical(bdof));
    auto accept_all = [&sp](const TokenTree & t, const TargetLogits & l, Rng & r, int64_t) { return test::accept_everything(t, l, sp, r); };
    auto [astat, adof] = processed_chi2(*target, runner, drafter, nullptr, prompt, o, joint, runs, {}, accept_all);
    EXPECT_GT(astat, test::chi2_critical(adof));
}

TEST(LogitsProcessing, GrammarConstrainedSamplingFollowsTheProcessedTargetAndABrokenVerifierFails) {
    Bundled m;
    DraftModelDrafter self(*m.draft, 64);  // unmasked: proposes banned tokens, which are skipped
    const std::vector<int32_t> prompt = m.tokenizer.tokenize("Once upon a time");
    GenerationOptions o;
    o.sampling.temperature = 1.0f;
    o.sampling.repeat_penalty = 1.3f;
    o.grammar = R"(root ::= [a-d] [a-d] | " " [a-z])";
    const auto state = logits_processing(o, prompt, &m.tokenizer);
    const auto joint = exact_processed_joint(*m.target, m.runner, prompt, o.sampling, *state);
    ASSERT_GT(joint.size(), 8u);
    const int runs = 200;
    for (TreeBudget tree : {TreeBudget{}, TreeBudget{TreeShape::Dynamic, 2, 3, 9}}) {
        auto [stat, dof] = processed_chi2(*m.target, m.runner, self, &m.tokenizer, prompt, o, joint, runs, tree, nullptr);
        std::printf("[distribution] grammar, %s: chi2 = %.1f, dof = %d, critical = %.1f\n", tree_shape_name(tree.shape), stat, dof,
                    test::chi2_critical(dof));
        EXPECT_LT(stat, test::chi2_critical(dof)) << tree_shape_name(tree.shape);
    }
    // Forced text (" the ", which the grammar lets the target spell in several ways) grafted as a
    // one-hot draft beside the model's sampled ones.
    GenerationOptions forced = o;
    forced.grammar = R"(root ::= " the " [a-d])";
    const auto forced_state = logits_processing(forced, prompt, &m.tokenizer);
    ASSERT_FALSE(forced_state->forced_tokens(4).empty());
    const auto forced_joint = exact_processed_joint(*m.target, m.runner, prompt, forced.sampling, *forced_state);
    ASSERT_GT(forced_joint.size(), 4u);
    LookupGraftDrafter grafting(std::make_unique<DraftModelDrafter>(*m.draft, 64), 1, 3);
    for (TreeBudget tree : {TreeBudget{TreeShape::Dynamic, 2, 3, 9}}) {
        auto [stat, dof] = processed_chi2(*m.target, m.runner, grafting, &m.tokenizer, prompt, forced, forced_joint, runs, tree, nullptr);
        std::printf("[distribution] forced text grafted, %s: chi2 = %.1f, dof = %d, critical = %.1f\n", tree_shape_name(tree.shape), stat,
                    dof, test::chi2_critical(dof));
        EXPECT_LT(stat, test::chi2_critical(dof)) << tree_shape_name(tree.shape);
    }
    const SamplingParams sp = o.sampling;
    auto accept_all = [&sp](const TokenTree & t, const TargetLogits & l, Rng & r, int64_t) { return test::accept_everything(t, l, sp, r); };
    auto [bstat, bdof] = processed_chi2(*m.target, m.runner, self, &m.tokenizer, prompt, o, joint, runs, {}, accept_all);
    std::printf("[distribution] grammar, verifier accepting every draft: chi2 = %.1f (critical %.1f)\n", bstat, test::chi2_critical(bdof));
    EXPECT_GT(bstat, test::chi2_critical(bdof));
}

}  // namespace
}  // namespace specula
