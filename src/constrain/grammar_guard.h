#pragma once
// Limits on the grammars and JSON schemas a client sends, checked before libllama sees them.
// libllama's GBNF engine has none: its parser recurses once per parenthesis, its left-recursion
// check walks every leftmost derivation (2^60 steps for 60 rules that each name the next twice),
// a {m,n} with m > n loops ~2^64 times, and its stacks multiply with every character of a
// grammar that keeps several parses open. Every check here is iterative and linear in the text.
#include <cstddef>
#include <string_view>

#include <nlohmann/json.hpp>

#include "specula/error.h"

struct llama_grammar_parser;

namespace specula {

// A client's grammar that cannot go on at a point of its output: past one of the limits below or
// grammar_mask.h's, or allowing no token there (nor the end of generation). The request's fault,
// not the server's: serve answers it 400 (streamed: an error event) and its other requests go on.
struct GrammarError : Error {
    using Error::Error;
};

inline constexpr size_t kMaxGrammarBytes = 256 * 1024;
inline constexpr int kMaxGrammarNesting = 64;     // groups "(...)" inside one another
inline constexpr size_t kMaxGrammarRules = 8192;  // rule definitions ("name ::= ...")
inline constexpr size_t kMaxGrammarAlternatives = 32768;
inline constexpr size_t kMaxGrammarSymbols = 65536;                // characters, classes and references, repetitions expanded
inline constexpr size_t kMaxRepetitionSymbols = 4096;              // one repetition "x{m,n}" expanded
inline constexpr size_t kMaxGrammarStacks = 1024;                  // parse stacks the grammar may hold at once
inline constexpr size_t kMaxLeftRecursionCheck = size_t{1} << 22;  // steps of libllama's left-recursion check
inline constexpr size_t kMaxSchemaNodes = 20000;                   // JSON values in a schema
inline constexpr size_t kMaxSchemaRefs = 512;                      // "$ref"s in a schema
inline constexpr size_t kMaxSchemaOptionalProperties = 256;        // properties of one object not "required"

// The GBNF text's size, nesting, rule, alternative and symbol counts and its repetitions, by one
// scan that does not parse it: syntax errors are left to the parser. Throws Error naming the
// limit ("the grammar exceeds a limit: nesting deeper than 64").
void check_gbnf_limits(std::string_view gbnf);

// The rules libllama parsed from a text that passed check_gbnf_limits: throws Error for a
// left-recursive grammar, for one whose start or any position after a character opens more than
// kMaxGrammarStacks parse stacks, and for one that libllama's left-recursion check would take
// more than kMaxLeftRecursionCheck steps over. `root` is the start rule's id.
void check_gbnf_rules(const llama_grammar_parser & parser, size_t root);

// Throws the GrammarError of a grammar holding more than kMaxGrammarStacks parse stacks while it
// runs (accepting a token, or a mask's walk). libllama keeps one stack per way the text so far
// parses and merges only equal ones; alternatives that begin alike around a recursive rule
// (x ::= "a" x "b" | "a" x "c") leave stacks whose tails differ, 2^n of them after n levels, so
// neither merging nor expanding later helps: the message names the construct and its rewrite.
[[noreturn]] void too_many_stacks();

// A JSON schema's size: at most kMaxSchemaNodes values, kMaxSchemaRefs "$ref"s and
// kMaxSchemaOptionalProperties optional properties an object. Throws Error
// ("the JSON schema exceeds a limit: more than 20000 values").
void check_json_schema_limits(const nlohmann::json & schema);

}  // namespace specula
