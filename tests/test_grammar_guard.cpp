// The limits on client grammars and JSON schemas (constrain/grammar_guard.h): each refused with
// an error naming it, and the known ways to crash or hang libllama's GBNF engine refused before
// they reach it, or stopped at the stacks budget while decoding.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "constrain/grammar.h"
#include "constrain/grammar_guard.h"
#include "constrain/lazy_grammar.h"
#include "engine/generate.h"
#include "tokenizer/chat_template.h"
#include "sample/logits_state.h"
#include "specula/error.h"
#include "tokenizer/tokenizer.h"
#include "test_models.h"

namespace specula {
namespace {

const Tokenizer & tokenizer() {
    static const Tokenizer tok(test::shipped_model("specula-target.gguf"));
    return tok;
}

std::string refusal(const std::string & gbnf) {
    return test::error_message([&] { make_grammar_state(tokenizer(), gbnf); });
}

int32_t token_of(const std::string & piece) {
    const int32_t t = tokenizer().token_spelling(piece);
    EXPECT_GE(t, 0) << "no token spells " << piece;
    return t;
}

// Catches: the parser reached with nesting that overflows its recursion (SIGSEGV at ~100k levels).
TEST(GrammarGuard, DeepNestingIsRefusedBeforeTheParser) {
    const std::string deep = "root ::= " + std::string(200000, '(') + "\"a\"" + std::string(200000, ')');
    EXPECT_EQ(refusal(deep), "the grammar exceeds a limit: larger than 256 KiB");
    const std::string nested = "root ::= " + std::string(65, '(') + "\"a\"" + std::string(65, ')');
    EXPECT_EQ(refusal(nested), "the grammar exceeds a limit: nesting deeper than 64");
    EXPECT_NO_THROW(make_grammar_state(tokenizer(), "root ::= " + std::string(64, '(') + "\"a\"" + std::string(64, ')')));
}

// Catches: libllama's left-recursion check walking all 2^60 leftmost paths of 60 rules that each
// name the next twice, from a grammar or from a schema's "$defs".
TEST(GrammarGuard, ExponentialLeftRecursionCheckIsRefused) {
    std::string chain;
    for (int i = 0; i < 60; ++i) chain += "a" + std::to_string(i) + " ::= a" + std::to_string(i + 1) + " | a" + std::to_string(i + 1) + "\n";
    chain += "a60 ::= \"x\"\nroot ::= a0\n";
    EXPECT_NE(refusal(chain).find("the grammar exceeds a limit: rules that branch into more than"), std::string::npos) << refusal(chain);

    nlohmann::json schema = {{"$ref", "#/$defs/d0"}, {"$defs", nlohmann::json::object()}};
    for (int i = 0; i < 60; ++i) {
        const std::string next = "#/$defs/d" + std::to_string(i + 1);
        schema["$defs"]["d" + std::to_string(i)] = {{"anyOf", {{{"$ref", next}}, {{"$ref", next}}}}};
    }
    schema["$defs"]["d60"] = {{"type", "string"}};
    const std::string message = test::error_message([&] { make_grammar_state(tokenizer(), json_schema_to_gbnf(schema)); });
    EXPECT_NE(message.find("the grammar exceeds a limit"), std::string::npos) << message;
}

// Catches: left recursion through a rule that matches the empty text only by way of another rule,
// which libllama's check misses and whose stacks then grow without end at the start.
TEST(GrammarGuard, LeftRecursionIsRefusedThroughRulesThatMayBeEmpty) {
    EXPECT_EQ(refusal("root ::= root \"a\" | \"b\""), "the grammar is left-recursive: rule 'root' can begin with itself");
    EXPECT_EQ(refusal("root ::= x root \"a\" | \"b\"\nx ::= y\ny ::= \"\" | \"c\""), "the grammar is left-recursive: rule 'root' can begin with itself");
    EXPECT_NO_THROW(make_grammar_state(tokenizer(), "root ::= x \"a\" root | \"b\"\nx ::= y\ny ::= \"\" | \"c\""));
    // A rule that begins with itself as its alternative's last element repeats a stack, which
    // libllama drops (llama.cpp's tool-call grammars repeat optional blanks so).
    const auto blanks = make_grammar_state(tokenizer(), "root ::= \"a\" ws \"b\"\nws ::= sp ws | \"\"\nsp ::= \" \"?");
    for (const char * piece : {"a", " ", " ", "b"}) blanks->accept(token_of(piece));
}

// Catches: {m,n} with m > n (libllama loops ~2^64 times), and repetitions that expand without bound.
TEST(GrammarGuard, RepetitionsAreBounded) {
    EXPECT_EQ(refusal("root ::= \"a\"{5,3}"), "the grammar exceeds a limit: repetition {5,3} has its minimum above its maximum");
    // libllama's parser reads \xf4 as the first byte of 4, taking the quote after it into the
    // character: the literal ends at the third quote and {5,2} repeats it (2^64 copies).
    EXPECT_EQ(refusal("root ::= \"\xf4\"xx\" {5,2} \"a\""), "the grammar exceeds a limit: repetition {5,2} has its minimum above its maximum");
    EXPECT_EQ(refusal("root ::= (\"ab\"{100}){100}"), "the grammar exceeds a limit: a repetition expands to more than 4096 symbols");
    EXPECT_EQ(refusal("root ::= \"abcdefgh\"{1000}"), "the grammar exceeds a limit: a repetition expands to more than 4096 symbols");
    EXPECT_NO_THROW(make_grammar_state(tokenizer(), "root ::= [a-z]{1,2000} \"a\"{0,100000}"));
}

// Catches: the counts unbounded, one limit at a time.
TEST(GrammarGuard, RuleAlternativeAndSymbolCountsAreBounded) {
    std::string rules = "root ::= \"a\"\n";
    for (int i = 0; i < 8192; ++i) rules += "r" + std::to_string(i) + " ::= \"a\"\n";
    EXPECT_EQ(refusal(rules), "the grammar exceeds a limit: more than 8192 rules");
    std::string alternatives = "root ::= \"a\"";
    for (int i = 0; i < 32768; ++i) alternatives += "|\"b\"";
    EXPECT_EQ(refusal(alternatives), "the grammar exceeds a limit: more than 32768 alternatives");
    const std::string symbols = "root ::= \"" + std::string(70000, 'a') + "\"";
    EXPECT_EQ(refusal(symbols), "the grammar exceeds a limit: more than 65536 symbols");
    // What libllama would start with: one stack per alternative of root.
    std::string wide = "root ::= \"x0\"";
    for (int i = 1; i <= 1024; ++i) wide += " | \"x" + std::to_string(i) + "\"";
    EXPECT_EQ(refusal(wide), "the grammar exceeds a limit: more than 1024 parse stacks at its start");
}

// Catches: stacks doubling with every "a" (libllama drops only equal stacks) until the process
// runs out of memory, whether accepted token by token or walked as forced text; and libllama's
// abort on an end of generation the grammar does not allow.
TEST(GrammarGuard, StacksBeyondTheBudgetEndDecodingWithAnError) {
    const std::string doubling = "root ::= \"a\" root \"b\" | \"a\" root \"c\"";
    const auto forced = make_grammar_state(tokenizer(), doubling);
    EXPECT_LE(forced->forced_tokens(64).size(), 64u);  // returns, the walk stopped at the budget
    const auto state = make_grammar_state(tokenizer(), doubling);
    const int32_t a = token_of("a");
    std::string message = "<no error>";
    for (int i = 0; i < 64 && message == "<no error>"; ++i) message = test::error_message([&] { state->accept(a); });
    EXPECT_TRUE(message.starts_with("the grammar exceeds a limit: more than 1024 parse stacks at once (")) << message;

    const auto open = make_grammar_state(tokenizer(), "root ::= \"ab\"");
    open->accept(a);
    int32_t eog = -1;
    for (int32_t t = 0; t < tokenizer().n_vocab() && eog < 0; ++t) {
        if (tokenizer().is_end_of_generation(t)) eog = t;
    }
    ASSERT_GE(eog, 0);
    EXPECT_NE(test::error_message([&] { open->accept(eog); }).find("does not follow the grammar"), std::string::npos);
}

// Catches: a lazy grammar run by libllama's sampler once triggered, whose stacks doubled with each
// "a" after the trigger without a limit (to the process's memory).
TEST(GrammarGuard, ALazyGrammarKeepsTheLimitsAfterItsTrigger) {
    const auto state = make_lazy_grammar_state(tokenizer(), "root ::= \"<\" body\nbody ::= \"a\" body \"b\" | \"a\" body \"c\" | \"d\"", {"<"}, {});
    std::vector<float> row(tokenizer().n_vocab());
    EXPECT_EQ(test::error_message([&] { state->apply_bans(row); }), "<no error>");  // free before the trigger
    state->accept(token_of("<"));
    EXPECT_FALSE(state->allows(token_of("b")));
    std::string message = "<no error>";
    for (int i = 0; i < 12 && message == "<no error>"; ++i) {
        state->accept(token_of("a"));
        message = test::error_message([&] { state->apply_bans(row); });
    }
    EXPECT_TRUE(message.starts_with("the grammar exceeds a limit: more than 1024 parse stacks at once (")) << message;
}

// Catches: schemas whose size or "$ref"s are unbounded, and schema grammars past the text limit.
TEST(GrammarGuard, JsonSchemasAreBounded) {
    nlohmann::json wide = {{"enum", nlohmann::json::array()}};
    for (int i = 0; i < 20000; ++i) wide["enum"].push_back(i);
    EXPECT_EQ(test::error_message([&] { json_schema_to_gbnf(wide); }), "the JSON schema exceeds a limit: more than 20000 values");
    nlohmann::json refs = {{"anyOf", nlohmann::json::array()}, {"$defs", {{"s", {{"type", "string"}}}}}};
    for (int i = 0; i < 513; ++i) refs["anyOf"].push_back({{"$ref", "#/$defs/s"}});
    EXPECT_EQ(test::error_message([&] { json_schema_to_gbnf(refs); }), "the JSON schema exceeds a limit: more than 512 \"$ref\"s");
    nlohmann::json optional = {{"type", "object"}, {"properties", nlohmann::json::object()}, {"required", {"p0"}}};
    for (int i = 0; i < 258; ++i) optional["properties"]["p" + std::to_string(i)] = {{"type", "integer"}};
    EXPECT_EQ(test::error_message([&] { json_schema_to_gbnf(optional); }), "the JSON schema exceeds a limit: an object with more than 256 optional properties");
    nlohmann::json long_names = {{"type", "object"}, {"properties", nlohmann::json::object()}};
    for (int i = 0; i < 300; ++i) {
        const std::string name = std::string(1000, 'k') + std::to_string(i);
        long_names["properties"][name] = {{"type", "integer"}};
        long_names["required"].push_back(name);
    }
    EXPECT_EQ(test::error_message([&] { json_schema_to_gbnf(long_names); }), "the grammar exceeds a limit: larger than 256 KiB");
    EXPECT_NE(test::error_message([] { json_schema_to_gbnf(std::string(100, '[') + std::string(100, ']')); }).find("nested more than 64"), std::string::npos);
}

// Catches: the grammar compiled again for each choice and sequence (on the scheduler's thread)
// instead of cloned from the request's compiled one: the text here does not even parse.
TEST(GrammarGuard, AGenerationStartsFromTheCompiledGrammar) {
    GenerationOptions options;
    options.grammar = "root ::= (";
    GenerationOptions yes;
    yes.grammar = R"(root ::= "yes")";
    options.compiled_grammar = compile_grammar(yes, &tokenizer());
    const auto state = logits_processing(options, {}, &tokenizer());
    ASSERT_NE(state, nullptr);
    EXPECT_TRUE(state->allows(token_of("y")));
    EXPECT_FALSE(state->allows(token_of("n")));
    options.compiled_grammar.reset();
    EXPECT_NE(test::error_message([&] { logits_processing(options, {}, &tokenizer()); }).find("does not parse as GBNF"), std::string::npos);
}

// The tools of llama.cpp's server tests (tools/server/tests/unit/test_tool_call.py) under the
// templates they give (the pinned sources' models/templates; "" the bundled target's own, which
// gets the generic tool format), for tool_choice required and auto: the chat layer's grammar of
// the calls compiles under the limits, and a walk of tokens its mask allows (seeded, triggered
// first when lazy, by its trigger word) is accepted token for token. Catches a legitimate tool grammar refused (a
// client's 400, or the 500 of an error the server did not expect) or a token the mask allows
// that the grammar's accept then rejects.
TEST(GrammarGuard, LlamaCppToolCallGrammarsAreServed) {
    const char * templates[] = {"",
                                "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use",
                                "NousResearch-Hermes-3-Llama-3.1-8B-tool_use",
                                "meetkai-functionary-medium-v3.1",
                                "meetkai-functionary-medium-v3.2",
                                "meta-llama-Llama-3.1-8B-Instruct",
                                "meta-llama-Llama-3.2-3B-Instruct",
                                "meta-llama-Llama-3.3-70B-Instruct",
                                "CohereForAI-c4ai-command-r7b-12-2024-tool_use",
                                "llama-cpp-deepseek-r1"};
    const ChatTool tools[] = {
        {"test", "", R"({"type": "object", "properties": {"success": {"type": "boolean", "const": true}}, "required": ["success"]})"},
        {"python", "Runs code in an ipython interpreter and returns the result of the execution after 60 seconds.",
         R"({"type": "object", "properties": {"code": {"type": "string", "description": "The code to run in the ipython interpreter."}}, "required": ["code"]})"},
        {"get_current_weather", "Get the current weather in a given location",
         R"({"type": "object", "properties": {"location": {"type": "string", "description": "The city and country/state, e.g. 'San Francisco, CA', or 'Paris, France'"}}, "required": ["location"]})"},
    };
    int walked = 0;
    for (const char * name : templates) {
        Tokenizer tok(test::shipped_model("specula-target.gguf"));
        if (*name) {
            std::ifstream in(std::string(SPECULA_VOCAB_DIR) + "/templates/" + name + ".jinja", std::ios::binary);
            ASSERT_TRUE(in) << name;
            std::ostringstream source;
            source << in.rdbuf();
            tok.set_chat_template(source.str());
        }
        for (const ChatTool & tool : tools) {
            for (ToolChoice choice : {ToolChoice::Required, ToolChoice::Auto}) {
                ChatInput input;
                input.messages = {{"system", "You are a coding assistant."}, {"user", "Write an example"}};
                input.tools = {tool};
                input.tool_choice = choice;
                const ChatPrompt prompt = tok.chat_template().render(input);
                const std::string where = std::string(*name ? name : "the bundled target's") + ", " + tool.name + ", " +
                                          (choice == ToolChoice::Required ? "required" : "auto") + ":\n" + prompt.grammar;
                if (prompt.grammar.empty()) continue;
                GenerationOptions options;
                options.grammar = prompt.grammar;
                options.grammar_lazy = prompt.grammar_lazy;
                options.grammar_trigger_patterns = prompt.grammar_trigger_patterns;
                options.grammar_trigger_tokens = prompt.grammar_trigger_tokens;
                std::shared_ptr<const LogitsState> compiled;
                ASSERT_EQ(test::error_message([&] { compiled = compile_grammar(options, &tok); }), "<no error>") << where;
                const auto state = compiled->clone();
                if (prompt.grammar_lazy) {  // triggered by its first pattern when that is a word (escaped by the chat layer)
                    ASSERT_FALSE(prompt.grammar_trigger_patterns.empty()) << where;
                    const std::string & pattern = prompt.grammar_trigger_patterns[0];
                    if (std::regex_search(std::regex_replace(pattern, std::regex(R"(\\.)"), ""), std::regex(R"([.^$|()*+?\[\]{}])"))) continue;
                    for (int32_t t : tok.tokenize(std::regex_replace(pattern, std::regex(R"(\\(.))"), "$1"), false, SpecialTokens::Text)) state->accept(t);
                }
                std::mt19937 random(7);
                std::vector<float> row(tok.n_vocab());
                for (int step = 0; step < 48; ++step) {
                    std::fill(row.begin(), row.end(), 0.0f);
                    ASSERT_EQ(test::error_message([&] { state->apply_bans(row); }), "<no error>") << "step " << step << ", " << where;
                    std::vector<int32_t> allowed;
                    for (int32_t t = 0; t < tok.n_vocab(); ++t) {
                        if (row[t] == 0.0f && !tok.is_end_of_generation(t)) allowed.push_back(t);
                    }
                    if (allowed.empty()) break;  // only the end of generation
                    const int32_t t = allowed[random() % allowed.size()];
                    ASSERT_EQ(test::error_message([&] { state->accept(t); }), "<no error>") << "step " << step << ", token '" << tok.piece(t, true) << "', " << where;
                }
                ++walked;
            }
        }
    }
    // Most of the 60: a template that makes no grammar for a choice, or whose trigger is a pattern
    // rather than a word, is only compiled.
    EXPECT_GE(walked, 36);
}

}  // namespace
}  // namespace specula
