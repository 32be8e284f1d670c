#include "constrain/grammar.h"

#include <llama.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <functional>
#include <limits>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/json_limits.h"
#include "constrain/grammar_guard.h"
#include "constrain/grammar_mask.h"
#include "json-schema-to-grammar.h"
#include "llama-grammar.h"
#include "llama-vocab.h"
#include "runtime/library_log.h"
#include "specula/error.h"
#include "tokenizer/tokenizer.h"

namespace specula {

namespace {

struct GrammarFree {
    void operator()(llama_grammar * g) const { llama_grammar_free_impl(g); }
};
using GrammarPtr = std::unique_ptr<llama_grammar, GrammarFree>;

// Which tokens a grammar allows is a function of its stacks and its partial UTF-8 character
// alone, and a JSON schema's grammar returns to the same few (inside a string, a number, between
// items) token after token. A whole-row pass costs milliseconds over a 49k-token vocabulary, a
// cached one microseconds: the masks are kept per grammar position, shared by every clone of a
// request's state (clones are advanced on one thread at a time).
class MaskCache {
public:
    static constexpr size_t kMaxMasks = 256;  // then the cache starts over (memory: n_tokens / 8 bytes a mask)
    const std::vector<uint64_t> * find(const std::string & key) const {
        const auto it = masks_.find(key);
        return it == masks_.end() ? nullptr : &it->second;
    }
    const std::vector<uint64_t> & insert(const std::string & key, std::vector<uint64_t> mask) {
        if (masks_.size() >= kMaxMasks) masks_.clear();
        return masks_[key] = std::move(mask);
    }

private:
    std::unordered_map<std::string, std::vector<uint64_t>> masks_;
};

bool bit(const std::vector<uint64_t> & mask, int32_t token) { return (mask[token >> 6] >> (token & 63)) & 1; }

// The grammar's position as bytes: its set of stacks (the order and repeats of libllama's stack
// list change nothing it allows), each stack's elements as (rule, offset) pairs (a clone's stacks
// point into its own copy of the rules), then the partial UTF-8 character.
std::string position_key(const llama_grammar & g) {
    std::vector<std::string> stacks;
    for (const llama_grammar_stack & stack : g.stacks) {
        std::string s;
        const auto put = [&s](uint32_t v) { s.append(reinterpret_cast<const char *>(&v), sizeof v); };
        put(static_cast<uint32_t>(stack.size()));
        for (const llama_grammar_element * e : stack) {
            for (size_t r = 0; r < g.rules.size(); ++r) {
                const llama_grammar_rule & rule = g.rules[r];
                if (e >= rule.data() && e < rule.data() + rule.size()) {
                    put(static_cast<uint32_t>(r));
                    put(static_cast<uint32_t>(e - rule.data()));
                    break;
                }
            }
        }
        stacks.push_back(std::move(s));
    }
    std::sort(stacks.begin(), stacks.end());
    stacks.erase(std::unique(stacks.begin(), stacks.end()), stacks.end());
    std::string key;
    for (const std::string & s : stacks) key += s;
    // With no bytes remaining libllama leaves the last code point in `value`, which it reads no more.
    const uint32_t partial[2] = {g.partial_utf8.n_remain > 0 ? g.partial_utf8.value : 0, static_cast<uint32_t>(g.partial_utf8.n_remain)};
    key.append(reinterpret_cast<const char *>(partial), sizeof partial);
    return key;
}

void append_utf8(std::string & out, uint32_t cp) {
    if (cp < 0x80) {
        out.push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
        out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
        out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
        out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
        out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
        out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else {
        out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
        out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
        out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
        out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
}

struct ForcedText {
    std::string text;
    bool at_end = false;  // the grammar is complete after it
};

// The characters every way on from the grammar's position begins with: each stack's next element
// is the same single character (no class, range or negation), until they part, one of them may
// end, or kMaxBytes. Walked on a copy of the stacks, with libllama's own character step.
ForcedText forced_text(const llama_grammar & grammar) {
    constexpr size_t kMaxBytes = 64;
    ForcedText forced;
    if (grammar.partial_utf8.n_remain > 0) return forced;  // inside a character a token left unfinished
    GrammarPtr walk(llama_grammar_clone_impl(grammar));
    while (forced.text.size() < kMaxBytes && !walk->stacks.empty()) {
        uint32_t next = 0;
        bool first = true;
        for (const llama_grammar_stack & stack : walk->stacks) {
            if (stack.empty()) {  // the grammar may end here
                forced.at_end = walk->stacks.size() == 1;
                return forced;
            }
            const llama_grammar_element * e = stack.back();
            const bool single = e->type == LLAMA_GRETYPE_CHAR && e[1].type != LLAMA_GRETYPE_CHAR_ALT && e[1].type != LLAMA_GRETYPE_CHAR_RNG_UPPER;
            if (!single || (!first && e->value != next)) return forced;
            next = e->value;
            first = false;
        }
        if (!accept_char_within_limit(*walk, next)) return forced;  // no further than decoding may go
        append_utf8(forced.text, next);
    }
    return forced;
}

// libllama's accept of `piece` (all or, where a lazy grammar's trigger matched, the end of
// `token`'s), checked a byte at a time: libllama's own checks nothing until the piece's last
// character, by which time a grammar that keeps several parses open (`"a" x "b" | "a" x "c"`) may
// have doubled its stacks with each character.
void accept_piece(llama_grammar & grammar, int32_t token, const std::string & piece) {
    const auto at_token = [](const llama_grammar_stack & stack) {
        return !stack.empty() && (stack.back()->type == LLAMA_GRETYPE_TOKEN || stack.back()->type == LLAMA_GRETYPE_TOKEN_NOT);
    };
    if (piece.empty() || piece[0] == 0 || std::any_of(grammar.stacks.begin(), grammar.stacks.end(), at_token)) {  // no characters, or a token-id rule
        llama_grammar_accept_token(grammar, token, piece);
    } else {
        for (const char byte : piece) {
            if (byte == 0) break;                                     // libllama reads the piece as a C string
            llama_grammar_accept_str(grammar, std::string(1, byte));  // throws when no stack takes it
            if (grammar.stacks.size() > kMaxGrammarStacks) break;
        }
    }
    if (grammar.stacks.size() > kMaxGrammarStacks) too_many_stacks();
}

// accept_piece of the token's piece; libllama's own accept aborts the process on an end of
// generation the grammar does not allow here.
void accept_token(llama_grammar & grammar, int32_t token) {
    const auto complete = [](const llama_grammar_stack & stack) { return stack.empty(); };
    if (llama_vocab_is_eog(grammar.vocab, token)) {
        if (std::none_of(grammar.stacks.begin(), grammar.stacks.end(), complete)) throw std::runtime_error("the grammar is not complete here");
        return;
    }
    accept_piece(grammar, token, grammar.vocab->token_to_piece(token));
}

// libllama's grammar, its stacks advanced by accept_token() and its allowed tokens found by a
// budgeted walk of the vocabulary's trie (grammar_mask.h), with whole-row masks cached per position.
class GrammarState final : public LogitsState {
public:
    GrammarState(GrammarPtr grammar, const Tokenizer & tokenizer, std::shared_ptr<const VocabularyTrie> trie, std::shared_ptr<MaskCache> cache)
        : grammar_(std::move(grammar)), tokenizer_(&tokenizer), n_tokens_(tokenizer.n_vocab()), trie_(std::move(trie)), cache_(std::move(cache)) {}
    std::unique_ptr<LogitsState> clone() const override {
        auto copy = std::make_unique<GrammarState>(GrammarPtr(llama_grammar_clone_impl(*grammar_)), *tokenizer_, trie_, cache_);
        copy->key_ = key_;
        return copy;
    }

    void apply_values(std::span<float>) const override {}  // a grammar only bans

    void apply_bans(std::span<float> logits) const override {
        const std::vector<uint64_t> & allowed = mask();
        const int n = std::min<int>(n_tokens_, static_cast<int>(logits.size()));
        bool any = false;
        for (int i = 0; i < n; ++i) {
            if (!bit(allowed, i)) logits[i] = -INFINITY;
            any = any || logits[i] != -INFINITY;
        }
        for (size_t i = n; i < logits.size(); ++i) logits[i] = -INFINITY;
        if (!any) throw GrammarError("the grammar allows no token of the vocabulary here (nor the end of generation)");
    }

    bool allows(int32_t token) const override {
        if (token < 0 || token >= n_tokens_) return false;
        if (const std::vector<uint64_t> * cached = cache_->find(key())) return bit(*cached, token);
        return grammar_allows(*grammar_, *trie_, token);
    }

    void accept(int32_t token) override {
        advance(token, [&] { accept_token(*grammar_, token); });
    }
    void accept_text(int32_t token, const std::string & piece) {
        advance(token, [&] { accept_piece(*grammar_, token, piece); });
    }

    // The forced text spelled greedily by the longest token the grammar takes at each step: its
    // spelling, not the tokenizer's (whose fragments may start with a word space), and one of
    // several the grammar allows; where the target spells it otherwise the verifier says so.
    std::vector<int32_t> forced_tokens(int max_tokens) const override {
        constexpr size_t kMaxPieceBytes = 32;
        const ForcedText forced = forced_text(*grammar_);
        std::string_view rest = forced.text;
        const auto walk = clone();
        std::vector<int32_t> tokens;
        while (!rest.empty() && static_cast<int>(tokens.size()) < max_tokens) {
            int32_t token = -1;
            size_t length = std::min(rest.size(), kMaxPieceBytes);
            try {
                for (; length > 0; --length) {
                    token = tokenizer_->token_spelling(rest.substr(0, length));
                    if (token >= 0 && walk->allows(token)) break;
                    token = -1;
                }
            } catch (const Error &) {  // a limit: the row's mask reports it, a draft stops short of it
                break;
            }
            // A last token of letters or digits may be the start of a longer one that the free text
            // after it continues ("na" of "name"): it is left to the drafter.
            const bool last = length == rest.size();
            if (token < 0 || (last && !forced.at_end && std::isalnum(static_cast<unsigned char>(rest.back())))) break;
            walk->accept(token);
            tokens.push_back(token);
            rest.remove_prefix(length);
        }
        return tokens;
    }

private:
    void advance(int32_t token, const std::function<void()> & step) {
        try {
            step();
        } catch (const Error &) {
            throw;
        } catch (const std::exception & e) {
            throw GrammarError(std::string("token ") + std::to_string(token) + " does not follow the grammar: " + e.what());
        }
        key_.clear();
    }
    const std::string & key() const {
        if (key_.empty()) key_ = position_key(*grammar_);
        return key_;
    }
    // The tokens the grammar allows here, one bit each: one walk of the vocabulary's trie per
    // position (grammar_mask.h), which lends the grammar's stacks and puts them back.
    const std::vector<uint64_t> & mask() const {
        if (const std::vector<uint64_t> * cached = cache_->find(key())) return *cached;
        return cache_->insert(key(), grammar_mask(*grammar_, *trie_, n_tokens_));
    }

    GrammarPtr grammar_;
    const Tokenizer * tokenizer_;
    int n_tokens_;
    std::shared_ptr<const VocabularyTrie> trie_;
    std::shared_ptr<MaskCache> cache_;
    mutable std::string key_;  // position_key() of the current position; empty: not yet made
};

// libllama's GBNF parser prints why a grammar does not parse on stderr, not to its log, yet the
// reason belongs in the Error, and stderr is shared with the server's other threads. Its
// rule-by-rule entry point throws the reason, so the grammar is parsed here rule by rule (with the
// undefined-rule check parse() adds), and libllama builds the grammar from these rules. Throws
// Error naming the problem.
llama_grammar_parser parse_gbnf(const llama_vocab * vocab, const std::string & gbnf) {
    const auto skip_space = [](const char * pos) {  // the grammar's leading blanks, newlines and comments
        while (*pos == ' ' || *pos == '\t' || *pos == '\r' || *pos == '\n' || *pos == '#') {
            if (*pos == '#') {
                while (*pos && *pos != '\r' && *pos != '\n') ++pos;
            } else {
                ++pos;
            }
        }
        return pos;
    };
    llama_grammar_parser parser(vocab);
    try {
        for (const char * pos = skip_space(gbnf.c_str()); *pos;) pos = parser.parse_rule(pos);
    } catch (const std::exception & e) {
        const std::string what = e.what();  // "expecting ... at <the rest of the grammar>": its first line
        throw Error("the grammar does not parse as GBNF: " + what.substr(0, what.find('\n')));
    }
    for (const auto & [name, id] : parser.symbol_ids) {
        if (id >= parser.rules.size() || parser.rules[id].empty()) throw Error("the grammar does not parse as GBNF: Undefined rule identifier '" + name + "'");
    }
    if (parser.rules.empty()) throw Error("the grammar does not parse as GBNF: it has no rule");
    return parser;
}

}  // namespace

std::unique_ptr<LogitsState> make_grammar_state(const Tokenizer & tokenizer, const std::string & gbnf) {
    check_gbnf_limits(gbnf);  // before libllama's parser, which recurses once per parenthesis
    const llama_grammar_parser parser = parse_gbnf(tokenizer.vocabulary(), gbnf);
    const auto root = parser.symbol_ids.find("root");
    if (root == parser.symbol_ids.end()) throw Error("the grammar does not parse as GBNF: it has no 'root' rule");
    check_gbnf_rules(parser, root->second);  // before libllama's left-recursion check, which is exponential
    capture_library_log();
    take_library_errors();
    std::vector<const llama_grammar_element *> rules = parser.c_rules();
    GrammarPtr grammar(llama_grammar_init_impl(tokenizer.vocabulary(), rules.data(), rules.size(), root->second));
    const std::string logged = take_library_errors();
    if (!grammar) throw Error("the grammar does not parse as GBNF" + (logged.empty() ? std::string() : ": " + logged));
    return std::make_unique<GrammarState>(std::move(grammar), tokenizer, vocabulary_trie(tokenizer), std::make_shared<MaskCache>());
}

void accept_grammar_text(LogitsState & state, int32_t token, const std::string & piece) {
    auto * grammar = dynamic_cast<GrammarState *>(&state);
    if (!grammar) throw std::logic_error("accept_grammar_text: not a grammar state");
    grammar->accept_text(token, piece);
}

std::string json_schema_to_gbnf(const std::string & schema_json) {
    nlohmann::json schema;
    try {
        schema = parse_json(schema_json);
    } catch (const std::exception & e) {
        throw Error(std::string("the JSON schema cannot be compiled to a grammar: ") + e.what());
    }
    check_json_schema_limits(schema);  // llama.cpp's converter recurses per value and expands "$ref"s
    std::string gbnf;
    try {
        gbnf = json_schema_to_grammar(common_json::parse(schema_json), /*force_gbnf=*/true);
    } catch (const std::exception & e) {
        throw Error(std::string("the JSON schema cannot be compiled to a grammar: ") + e.what());
    }
    check_gbnf_limits(gbnf);
    return gbnf;
}

std::unique_ptr<LogitsState> make_logits_state(const SamplingParams & params, const std::string & gbnf, std::span<const int32_t> history,
                                               const Tokenizer * tokenizer) {
    std::vector<std::unique_ptr<LogitsState>> states;
    const int n_vocab = tokenizer ? tokenizer->n_vocab() : std::numeric_limits<int>::max();
    if (auto penalties = make_penalty_state(params, history, n_vocab)) states.push_back(std::move(penalties));
    if (!gbnf.empty()) {
        if (!tokenizer) throw Error("a grammar needs the model's vocabulary: this generation has no tokenizer");
        states.push_back(make_grammar_state(*tokenizer, gbnf));
    }
    if (states.empty()) return nullptr;
    if (states.size() == 1) return std::move(states.front());
    return std::make_unique<LogitsStates>(std::move(states));
}

}  // namespace specula
