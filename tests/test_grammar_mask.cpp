// The grammar's token mask (constrain/grammar_mask.h) against libllama's own step
// (llama_grammar_apply_impl): equal on every token at many grammar positions (JSON schemas, GBNF
// with classes, negations, UTF-8 ranges, token ids, the fuzz corpus), reached by random walks of
// allowed tokens, on real vocabularies; and bounded where libllama's step is exponential.
#include <gtest/gtest.h>

#include <llama.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "common/model_cache.h"
#include "constrain/grammar.h"
#include "constrain/grammar_guard.h"
#include "constrain/grammar_mask.h"
#include "llama-grammar.h"
#include "llama-vocab.h"
#include "specula/error.h"
#include "tokenizer/tokenizer.h"
#include "test_models.h"

namespace specula {
namespace {

struct GrammarFree {
    void operator()(llama_grammar * g) const { llama_grammar_free_impl(g); }
};
using GrammarPtr = std::unique_ptr<llama_grammar, GrammarFree>;

// The vocabularies: SmolLM2's (byte-level BPE, 49k tokens, runs of spaces) from the model cache,
// and Qwen2's (151k tokens) from llama.cpp's vocabulary files.
const Tokenizer * smollm2() {
    static const std::unique_ptr<Tokenizer> tok = [] {
        const std::string path = model_cache_dir() + "/SmolLM2-135M-Instruct.Q4_1.gguf";
        return std::filesystem::exists(path) ? std::make_unique<Tokenizer>(path) : nullptr;
    }();
    return tok.get();
}
const Tokenizer & qwen2() {
    static const Tokenizer tok(test::vocab_dir() + "/ggml-vocab-qwen2.gguf");
    return tok;
}

std::vector<uint64_t> libllama_mask(const llama_grammar & grammar, int n_tokens) {
    std::vector<llama_token_data> candidates(n_tokens);
    for (int i = 0; i < n_tokens; ++i) candidates[i] = llama_token_data{i, 0.0f, 0.0f};
    llama_token_data_array array{candidates.data(), candidates.size(), -1, false};
    llama_grammar_apply_impl(grammar, &array);
    std::vector<uint64_t> mask((n_tokens + 63) / 64, 0);
    for (int i = 0; i < n_tokens; ++i) {
        if (candidates[i].logit != -INFINITY) mask[i >> 6] |= uint64_t{1} << (i & 63);
    }
    return mask;
}

bool bit(const std::vector<uint64_t> & mask, int32_t t) { return (mask[t >> 6] >> (t & 63)) & 1; }

std::string shown(const Tokenizer & tok, int32_t t) {
    std::string out;
    for (const unsigned char c : tok.vocabulary()->token_to_piece(t)) {
        char hex[8];
        std::snprintf(hex, sizeof hex, c >= 0x20 && c < 0x7f ? "%c" : "\\x%02x", c);
        out += hex;
    }
    return std::to_string(t) + " '" + out + "'";
}

// Compares the masks at the grammar's position, and grammar_allows on a sample of tokens; false
// (with failures reported) when they differ or the mask stops at a limit (`limited`: the stacks
// limit, which a token libllama allows exceeds). `allowed` gets libllama's allowed tokens.
bool same_masks(const Tokenizer & tok, llama_grammar & grammar, const std::string & where, std::vector<int32_t> & allowed, std::mt19937 & rng,
                bool & limited) {
    const int n = tok.n_vocab();
    const auto trie = vocabulary_trie(tok);
    const std::vector<uint64_t> expected = libllama_mask(grammar, n);
    std::vector<uint64_t> got;
    try {
        got = grammar_mask(grammar, *trie, n);
    } catch (const Error & e) {
        // Only where a token libllama allows takes the stacks past the limit, checked a byte at
        // a time as the grammar state accepts it.
        const std::string what = e.what();
        limited = what.starts_with("the grammar exceeds a limit: more than " + std::to_string(kMaxGrammarStacks) + " parse stacks at once") &&
                  std::any_of(expected.begin(), expected.end(), [](uint64_t w) { return w != 0; });
        bool explained = false;
        for (int32_t t = 0; t < n && limited && !explained; ++t) {
            if (!bit(expected, t) || tok.is_end_of_generation(t)) continue;
            GrammarPtr g(llama_grammar_clone_impl(grammar));
            for (const char c : tok.vocabulary()->token_to_piece(t)) {
                llama_grammar_accept_str(*g, std::string(1, c));
                if (llama_grammar_get_stacks(g.get()).size() > kMaxGrammarStacks) explained = true;
                if (explained || llama_grammar_get_stacks(g.get()).empty()) break;
            }
        }
        if (!explained) ADD_FAILURE() << where << ": " << what;
        return false;
    }
    int differences = 0;
    allowed.clear();
    for (int32_t t = 0; t < n; ++t) {
        if (bit(expected, t)) allowed.push_back(t);
        if (bit(expected, t) != bit(got, t) && ++differences <= 5) {
            ADD_FAILURE() << where << ": token " << shown(tok, t) << (bit(expected, t) ? " allowed by libllama, not by the mask" : " allowed by the mask, not by libllama");
        }
    }
    std::uniform_int_distribution<int32_t> any(0, n - 1);
    for (int i = 0; i < 64 && differences == 0; ++i) {
        const int32_t t = i % 2 == 0 && !allowed.empty() ? allowed[any(rng) % allowed.size()] : any(rng);
        if (grammar_allows(grammar, *trie, t) != bit(expected, t)) {
            ++differences;
            ADD_FAILURE() << where << ": grammar_allows(" << shown(tok, t) << ") differs from libllama";
        }
    }
    return differences == 0;
}

bool non_ascii(const Tokenizer & tok, int32_t t) {
    for (const unsigned char c : tok.vocabulary()->token_to_piece(t)) {
        if (c >= 0x80) return true;
    }
    return false;
}

// Random walks from the grammar's start: at each position the masks compared, then a random
// allowed token accepted by libllama (often one with non-ASCII bytes, which may leave a character
// unfinished, or a long one).
void check_walks(const Tokenizer & tok, const std::string & gbnf, const std::string & name, int walks, int steps) {
    GrammarPtr start(llama_grammar_init_impl(tok.vocabulary(), gbnf.c_str(), "root", false, nullptr, 0, nullptr, 0));
    ASSERT_NE(start, nullptr) << name;
    std::mt19937 rng(42);
    std::vector<int32_t> allowed;
    for (int w = 0; w < walks; ++w) {
        GrammarPtr g(llama_grammar_clone_impl(*start));
        for (int s = 0; s < steps; ++s) {
            const std::string where = name + " (walk " + std::to_string(w) + ", step " + std::to_string(s) + ")";
            bool limited = false;
            if (!same_masks(tok, *g, where, allowed, rng, limited)) {
                if (limited) break;
                return;
            }
            std::vector<int32_t> choices;
            for (int32_t t : allowed) {
                if (!tok.is_end_of_generation(t)) choices.push_back(t);
            }
            if (choices.empty()) break;
            std::vector<int32_t> preferred;
            const int kind = static_cast<int>(rng() % 3);
            for (int32_t t : choices) {
                if ((kind == 1 && non_ascii(tok, t)) || (kind == 2 && tok.vocabulary()->token_to_piece(t).size() >= 4)) preferred.push_back(t);
            }
            const std::vector<int32_t> & from = preferred.empty() || kind == 0 ? choices : preferred;
            llama_grammar_accept_impl(*g, from[rng() % from.size()]);
        }
    }
}

std::string read(const std::string & path) {
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

// The grammars compared: JSON schemas compiled as the server compiles them, and GBNF with every
// kind of element. `token` spells token ids of the vocabulary into the token-id rules.
std::vector<std::pair<std::string, std::string>> grammars(const Tokenizer & tok) {
    const auto id = [&](const char * piece) { return std::to_string(tok.token_spelling(piece)); };
    const auto schema = [](const char * json) { return json_schema_to_gbnf(std::string(json)); };
    std::vector<std::pair<std::string, std::string>> out = {
        {"object schema", schema(R"({"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
            "tags": {"type": "array", "items": {"type": "string"}}, "kind": {"enum": ["cat", "dög", "猫", 3, null]},
            "score": {"type": "number"}, "ok": {"type": "boolean"}}, "required": ["name", "age"]})")},
        {"array schema", schema(R"({"type": "array", "items": {"type": "object", "properties": {"x": {"type": "number"}, "s": {"type": "string", "maxLength": 5}}}, "minItems": 1})")},
        {"string pattern schema", schema(R"({"type": "string", "pattern": "^[a-z]+-[0-9]{2,3}$"})")},
        {"any JSON", schema("{}")},
        {"classes", R"(root ::= [a-zA-Z_] [a-zA-Z0-9_]* ("=" [0-9]+)? ("," [^,\n]*)* "\n"?)"},
        {"negations", R"(root ::= "<" [^<>]* ">" ([^a-z\x80-\U0010FFFF] | "x")* "</" [a-z]+ ">")"},
        {"UTF-8 ranges", R"(root ::= [\u0430-\u044f]+ " " [\u4e00-\u9fff]+ "é"* [\U0001F600-\U0001F64F]? [^\u0000-\u007f]*)"},
        {"any character", R"(root ::= .{0,6} "!" .*)"},
        {"token ids", "root ::= (<[" + id(" the") + "]> | [a-z] | !<[" + id("a") + "]> [0-9])+ " + "<[" + id(".") + "]>"},
        {"token id after characters", "root ::= \"ab\" <[" + id("c") + "]> \" \"* (!<[" + id("x") + "]> | \"x\")*"},
        {"mild ambiguity", R"(root ::= ws "{" ws ws "}" ws
ws ::= [ ]* [ \t]*)"},
        {"optional end", R"(root ::= "yes" | "no" | "")"},
    };
    for (const auto & entry : std::filesystem::directory_iterator(std::string(SPECULA_SOURCE_DIR) + "/fuzz/regressions/grammar")) {
        const std::string path = entry.path().string();
        const std::string text = read(path);
        std::string gbnf;
        try {
            gbnf = path.ends_with(".json") ? json_schema_to_gbnf(text) : text;
            make_grammar_state(tok, gbnf);  // the attacks the limits refuse never reach a mask
        } catch (const Error &) {
            continue;
        }
        out.emplace_back(entry.path().filename().string(), gbnf);
    }
    return out;
}

// The walks of the two tests below. Under the sanitizers (SPECULA_SHORT_WALKS, tests/CMakeLists.txt),
// where a step over a whole vocabulary costs seconds, each grammar's first walk for half its steps:
// the start of the full count's walk, the same random choices. The uninstrumented build walks the
// full count (scripts/test.sh runs these tests there too).
void check_all_walks(const Tokenizer & tok, int walks, int steps) {
#ifdef SPECULA_SHORT_WALKS
    walks = 1;
    steps = (steps + 1) / 2;
#endif
    for (const auto & [name, gbnf] : grammars(tok)) check_walks(tok, gbnf, name, walks, steps);
}

// Catches: any token the mask allows or bans otherwise than libllama (a partial character at a
// piece's end or left by the grammar, token-id elements, end of generation, NUL, ranges).
TEST(GrammarMask, EqualsLibllamaOnSmolLM2) {
    const Tokenizer * tok = smollm2();
    if (!tok) GTEST_SKIP() << "SmolLM2 is absent from " << model_cache_dir() << ": run scripts/fetch_models.sh";
    check_all_walks(*tok, 3, 12);
}

TEST(GrammarMask, EqualsLibllamaOnQwen2) { check_all_walks(qwen2(), 2, 6); }

// Catches: the mask walking each parse of an ambiguous grammar apart (libllama's step, 2^L for a
// token of L spaces). Here the mask is the tokens of spaces, with or without a final "x".
TEST(GrammarMask, AmbiguousGrammarsAreWalkedOnce) {
    for (const Tokenizer * tok : {smollm2(), &qwen2()}) {
        if (!tok) continue;
        GrammarPtr g(llama_grammar_init_impl(tok->vocabulary(), R"(root ::= (" " | "  ")* "x")", "root", false, nullptr, 0, nullptr, 0));
        ASSERT_NE(g, nullptr);
        const std::vector<uint64_t> mask = grammar_mask(*g, *vocabulary_trie(*tok), tok->n_vocab());
        const std::regex spaces(" *x?");
        size_t longest = 0;
        for (int32_t t = 0; t < tok->n_vocab(); ++t) {
            const std::string & piece = tok->vocabulary()->token_to_piece(t);
            const bool expected = !piece.empty() && !tok->is_end_of_generation(t) && std::regex_match(piece, spaces);
            EXPECT_EQ(bit(mask, t), expected) << shown(*tok, t);
            if (expected) longest = std::max(longest, piece.size());
        }
        EXPECT_GE(longest, 16u);  // a token libllama's step takes 2^16 steps over
    }
}

// Catches: a mask without a budget (the stacks that double with each "a" walked over every token
// of "a"s), and the budget's error not naming the limit.
TEST(GrammarMask, LimitsEndTheMaskWithAnError) {
    const Tokenizer & tok = qwen2();
    GrammarPtr g(llama_grammar_init_impl(tok.vocabulary(), R"(root ::= "a" root "b" | "a" root "c" | "d")", "root", false, nullptr, 0, nullptr, 0));
    ASSERT_NE(g, nullptr);
    for (int i = 0; i < 8; ++i) llama_grammar_accept_impl(*g, tok.token_spelling("a"));  // 2^8 stacks; "aaa" would make 2^11
    const size_t stacks = llama_grammar_get_stacks(g.get()).size();
    const std::string message = test::error_message([&] { grammar_mask(*g, *vocabulary_trie(tok), tok.n_vocab()); });
    EXPECT_TRUE(message.starts_with("the grammar exceeds a limit: more than 1024 parse stacks at once (") ||
                message.starts_with("the grammar exceeds a limit: more than " + std::to_string(kMaxMaskSteps) + " parse-stack steps"))
        << message;
    EXPECT_EQ(llama_grammar_get_stacks(g.get()).size(), stacks);  // the grammar's own stacks put back
}

// Catches: a mask without its step budget, and the budget's end being anything but the client's
// GrammarError naming it. 300 alternatives that each take any text keep 301 stacks (under the
// stacks limit) through every character, and the walk steps them on each distinct character of
// Qwen2's vocabulary: ~600 steps a character, past the budget well before the walk's end.
TEST(GrammarMask, TheStepBudgetEndsAMaskWithAGrammarError) {
    std::string gbnf = "root ::= .*";
    for (int i = 1; i < 300; ++i) gbnf += " | .*";
    const auto state = make_grammar_state(qwen2(), gbnf);  // within every limit checked when it compiles
    std::vector<float> row(qwen2().n_vocab());
    std::string message = "<no error>";
    try {
        state->apply_bans(row);
    } catch (const GrammarError & e) {
        message = e.what();
    }
    EXPECT_EQ(message, "the grammar exceeds a limit: more than 4194304 parse-stack steps to find the tokens it allows");
}

// Catches: the stacks limit's message not naming the construct that reaches it. Alternatives that
// begin alike around a recursive rule keep a stack per parse, 2^n after n levels, whose tails all
// differ ("b" or "c" each level), so merging equal stacks cannot help. The first mask is found;
// the walk of a later one over tokens of several "a"s reaches the limit, which ends it.
TEST(GrammarMask, AmbiguousNestingEndsAtTheStacksLimitNamingTheConstruct) {
    const Tokenizer & tok = qwen2();
    const auto state = make_grammar_state(tok, "root ::= x\nx ::= \"a\" x \"b\" | \"a\" x \"c\" | \"d\"");
    std::vector<float> row(tok.n_vocab());
    const int32_t a = tok.token_spelling("a");
    int depth = 0;
    std::string message = "<no error>";
    for (; depth < 16 && message == "<no error>"; ++depth) {
        message = test::error_message([&] {
            state->apply_bans(row);
            state->accept(a);
        });
    }
    EXPECT_GE(depth, 2) << message;  // the first mask is found
    EXPECT_LE(depth, 11) << message;
    EXPECT_EQ(message,
              "the grammar exceeds a limit: more than 1024 parse stacks at once (one per way the text so far parses: an ambiguous rule such as "
              "x ::= \"a\" x \"b\" | \"a\" x \"c\" doubles them at each level of nesting; factor the alternatives' common beginning out: "
              "x ::= \"a\" x (\"b\" | \"c\"))");
    // The rewrite the message suggests keeps one stack per level: 16 levels, every mask found.
    const auto factored = make_grammar_state(tok, "root ::= x\nx ::= \"a\" x (\"b\" | \"c\") | \"d\"");
    for (int i = 0; i < 16; ++i) {
        EXPECT_EQ(test::error_message([&] {
                      factored->apply_bans(row);
                      factored->accept(a);
                  }),
                  "<no error>")
            << "level " << i;
    }
}

// Catches: the bounded step giving other stacks than libllama's accept (or another order), and not
// stopping past the stacks limit. Stacks that double with each "a" are stepped both ways.
TEST(GrammarMask, TheBoundedCharacterStepIsLibllamasUntilTheLimit) {
    const Tokenizer & tok = qwen2();
    GrammarPtr ours(llama_grammar_init_impl(tok.vocabulary(), R"(root ::= "a" root "b" | "a" root "c" | "d")", "root", false, nullptr, 0, nullptr, 0));
    GrammarPtr theirs(llama_grammar_clone_impl(*ours));
    // Each grammar's stacks as (rule, offset) pairs: a clone has its own copy of the rules.
    const auto positions = [](const llama_grammar & g) {
        std::vector<std::vector<std::pair<size_t, ptrdiff_t>>> out;
        for (const llama_grammar_stack & stack : g.stacks) {
            out.emplace_back();
            for (const llama_grammar_element * e : stack) {
                for (size_t r = 0; r < g.rules.size(); ++r) {
                    if (e >= g.rules[r].data() && e < g.rules[r].data() + g.rules[r].size()) out.back().emplace_back(r, e - g.rules[r].data());
                }
            }
        }
        return out;
    };
    int steps = 0;
    for (; steps < 16 && accept_char_within_limit(*ours, 'a'); ++steps) {
        llama_grammar_accept(theirs.get(), 'a');
        ASSERT_EQ(positions(*ours), positions(*theirs)) << "after " << steps + 1 << " characters";
    }
    EXPECT_EQ(steps, 8);  // 3 * 2^n stacks after n, past 1024 at the ninth
    EXPECT_GT(ours->stacks.size(), kMaxGrammarStacks);
    EXPECT_LE(ours->stacks.size(), 2 * kMaxGrammarStacks);  // stopped at the first stack past the limit
}

}  // namespace
}  // namespace specula
