#include "constrain/grammar_mask.h"

#include <llama.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <utility>

#include "constrain/grammar_guard.h"
#include "llama-grammar.h"
#include "llama-vocab.h"
#include "specula/error.h"
#include "tokenizer/tokenizer.h"

namespace specula {

namespace {

// libllama's UTF-8 lengths by a byte's high nibble; 0: a continuation byte, which cannot begin a
// character (libllama then rejects the whole piece).
constexpr int kUtf8Length[16] = {1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 2, 2, 3, 4};

struct TrieBuilder {
    VocabularyTrie & trie;
    const std::vector<std::string_view> & pieces;  // by index in trie.tokens

    void build(uint32_t lo, uint32_t hi, uint32_t depth, uint8_t byte) {
        const uint32_t index = static_cast<uint32_t>(trie.nodes.size());
        trie.nodes.push_back({0, lo, lo, hi, depth, byte});
        uint32_t i = lo;
        while (i < hi && pieces[i].size() == depth) ++i;  // sorted: the pieces that end here come first
        trie.nodes[index].tokens_here = i;
        while (i < hi) {
            const char b = pieces[i][depth];
            uint32_t j = i;
            while (j < hi && pieces[j][depth] == b) ++j;
            build(i, j, depth + 1, static_cast<uint8_t>(b));
            i = j;
        }
        trie.nodes[index].end = static_cast<uint32_t>(trie.nodes.size());
    }
};

std::shared_ptr<const VocabularyTrie> build_trie(const llama_vocab & vocab, int n_tokens) {
    auto trie = std::make_shared<VocabularyTrie>();
    std::vector<std::pair<std::string_view, int32_t>> sorted;
    for (int32_t t = 0; t < n_tokens; ++t) {
        if (vocab.is_eog(t)) {
            trie->end_tokens.push_back(t);
            continue;
        }
        const std::string & piece = vocab.token_to_piece(t);
        const size_t length = std::strlen(piece.c_str());  // libllama reads a piece as a C string
        if (length > 0) sorted.emplace_back(std::string_view(piece.data(), length), t);
    }
    std::sort(sorted.begin(), sorted.end());
    std::vector<std::string_view> pieces;
    trie->rank.assign(n_tokens, VocabularyTrie::kAbsent);
    for (const auto & [piece, t] : sorted) {
        trie->rank[t] = static_cast<uint32_t>(trie->tokens.size());
        trie->tokens.push_back(t);
        pieces.push_back(piece);
    }
    TrieBuilder{*trie, pieces}.build(0, static_cast<uint32_t>(pieces.size()), 0, 0);
    return trie;
}

[[noreturn]] void exceeds(const std::string & what) { throw GrammarError("the grammar exceeds a limit: " + what); }

// A UTF-8 decoder's state between bytes, as libllama's decode_utf8 keeps it: the character so far
// and the bytes it still needs. While a token continues the character the grammar's last token
// left unfinished (`continuing`), a byte that is no continuation byte makes the piece invalid;
// after that libllama takes a character's bytes unchecked.
struct Utf8 {
    uint32_t value = 0;
    int n_remain = 0;
    bool continuing = false;
};

// The walk of one mask (or one token's path): the trie depth first, carrying the interned set of
// stacks after the characters decoded so far. Each (set, character) is stepped once, by libllama's
// llama_grammar_accept on the grammar itself, whose stacks are lent for the walk.
class Walk {
public:
    static constexpr uint32_t kNone = UINT32_MAX;

    Walk(llama_grammar & grammar, const VocabularyTrie & trie, int n_tokens, int32_t only)
        : grammar_(grammar), trie_(trie), n_tokens_(n_tokens), only_(only), saved_(std::move(grammar.stacks)) {
        if (only_ < 0) allowed_.assign((n_tokens_ + 63) / 64, 0);
    }
    ~Walk() { grammar_.stacks = std::move(saved_); }
    Walk(const Walk &) = delete;
    Walk & operator=(const Walk &) = delete;

    void run() {
        const uint32_t root = intern(llama_grammar_stacks(saved_));
        if (sets_[root].has_empty) {  // an end of generation ends the grammar here
            for (int32_t t : trie_.end_tokens) allow(t);
        }
        const uint32_t only_rank = only_ >= 0 && only_ < static_cast<int32_t>(trie_.rank.size()) ? trie_.rank[only_] : VocabularyTrie::kAbsent;
        if (only_ >= 0 && only_rank == VocabularyTrie::kAbsent) return;
        only_rank_ = only_rank;
        Utf8 start;
        if (grammar_.partial_utf8.n_remain > 0) start = {grammar_.partial_utf8.value, grammar_.partial_utf8.n_remain, true};
        visit(0, root, start);
    }

    std::vector<uint64_t> & allowed() { return allowed_; }
    bool found() const { return found_; }

private:
    struct Set {
        llama_grammar_stacks stacks;
        bool has_empty = false;
        std::vector<uint32_t> tokens;      // the values of the stacks at a token element <[id]>
        std::vector<uint32_t> not_tokens;  // ...at !<[id]>, distinct; two are enough to allow every token
    };

    void count(size_t steps) {
        steps_ += steps;
        if (steps_ > kMaxMaskSteps) exceeds("more than " + std::to_string(kMaxMaskSteps) + " parse-stack steps to find the tokens it allows");
    }

    void allow(int32_t t) {
        if (only_ >= 0) found_ = found_ || t == only_;
        else if (t < n_tokens_) allowed_[t >> 6] |= uint64_t{1} << (t & 63);
    }
    // The tokens of trie_.tokens[begin, end), except `except`.
    void allow_range(uint32_t begin, uint32_t end, int64_t except = -1) {
        if (only_ >= 0) {
            found_ = found_ || (only_rank_ >= begin && only_rank_ < end && only_ != except);
            return;
        }
        for (uint32_t k = begin; k < end; ++k) {
            if (trie_.tokens[k] != except) allow(trie_.tokens[k]);
        }
    }

    uint32_t intern(llama_grammar_stacks stacks) {
        const auto less = [](const llama_grammar_stack & a, const llama_grammar_stack & b) {
            return std::lexicographical_compare(a.begin(), a.end(), b.begin(), b.end(), std::less<const llama_grammar_element *>());
        };
        std::sort(stacks.begin(), stacks.end(), less);
        stacks.erase(std::unique(stacks.begin(), stacks.end()), stacks.end());
        std::string key;
        for (const llama_grammar_stack & stack : stacks) {
            const size_t n = stack.size();
            key.append(reinterpret_cast<const char *>(&n), sizeof n);
            key.append(reinterpret_cast<const char *>(stack.data()), n * sizeof(stack[0]));
        }
        const auto [it, inserted] = set_ids_.try_emplace(std::move(key), static_cast<uint32_t>(sets_.size()));
        if (!inserted) return it->second;
        Set set;
        for (const llama_grammar_stack & stack : stacks) {
            if (stack.empty()) {
                set.has_empty = true;
            } else if (stack.back()->type == LLAMA_GRETYPE_TOKEN) {
                set.tokens.push_back(stack.back()->value);
            } else if (stack.back()->type == LLAMA_GRETYPE_TOKEN_NOT && set.not_tokens.size() < 2 &&
                       std::find(set.not_tokens.begin(), set.not_tokens.end(), stack.back()->value) == set.not_tokens.end()) {
                set.not_tokens.push_back(stack.back()->value);
            }
        }
        set.stacks = std::move(stacks);
        sets_.push_back(std::move(set));
        return it->second;
    }

    // The set after `set` takes the character `chr` (kNone: no stack takes it).
    uint32_t step(uint32_t set, uint32_t chr) {
        const uint64_t key = (uint64_t{set} << 32) | chr;
        if (const auto it = next_.find(key); it != next_.end()) return it->second;
        count(sets_[set].stacks.size());
        grammar_.stacks = sets_[set].stacks;
        if (!accept_char_within_limit(grammar_, chr)) too_many_stacks();
        count(grammar_.stacks.size());
        const uint32_t next = grammar_.stacks.empty() ? kNone : intern(std::move(grammar_.stacks));
        next_.emplace(key, next);
        return next;
    }

    // Whether a piece may end here, its characters taken by `set` and `u` left unfinished: libllama
    // allows a finished piece wherever a stack is left, an unfinished one where a stack's next
    // character class may begin with it (asked of libllama with an empty candidate).
    bool may_end(uint32_t set, const Utf8 & u) {
        if (u.n_remain == 0) return true;
        const auto key = std::make_tuple(set, u.value, u.n_remain);
        if (const auto it = partial_ends_.find(key); it != partial_ends_.end()) return it->second;
        count(sets_[set].stacks.size());
        static const uint32_t kEnd = 0;
        const llama_grammar_candidates candidate{{0, &kEnd, llama_partial_utf8{u.value, u.n_remain}, 0}};
        bool ends = false;
        for (const llama_grammar_stack & stack : sets_[set].stacks) {
            if (llama_grammar_reject_candidates_for_stack(grammar_.rules, stack, candidate).empty()) {
                ends = true;
                break;
            }
        }
        partial_ends_.emplace(key, ends);
        return ends;
    }

    // A stack at a token element takes the rest of a piece whole, by the token's id, once the
    // piece has a character for it: the tokens of `node`'s subtree.
    void token_elements(uint32_t set, const VocabularyTrie::Node & node) {
        const Set & s = sets_[set];
        if (s.tokens.empty() && s.not_tokens.empty()) return;
        count(s.tokens.size() + s.not_tokens.size());
        for (uint32_t v : s.tokens) {
            if (v < trie_.rank.size() && trie_.rank[v] >= node.tokens_begin && trie_.rank[v] < node.tokens_end) allow(static_cast<int32_t>(v));
        }
        if (s.not_tokens.size() == 1) allow_range(node.tokens_begin, node.tokens_end, s.not_tokens[0]);
        if (s.not_tokens.size() > 1) allow_range(node.tokens_begin, node.tokens_end);
    }

    // A character that decodes to 0 ends the piece for libllama, whose code points end with a 0:
    // the rest of each piece below `node` only sets the unfinished character it ends with.
    void after_nul(uint32_t set, const VocabularyTrie::Node & node) {
        const llama_vocab & vocab = *grammar_.vocab;
        for (uint32_t k = node.tokens_begin; k < node.tokens_end; ++k) {
            const int32_t t = trie_.tokens[k];
            if (only_ >= 0 && t != only_) continue;
            Utf8 u;
            bool invalid = false;
            for (const char * p = vocab.token_to_piece(t).c_str() + node.depth; *p && !invalid; ++p) {
                const uint8_t b = static_cast<uint8_t>(*p);
                if (u.n_remain > 0) {
                    u.value = (u.value << 6) + (b & 0x3F);
                    --u.n_remain;
                } else {
                    const int length = kUtf8Length[b >> 4];
                    invalid = length == 0;
                    u.n_remain = length - 1;
                    u.value = b & ((1u << (8 - length)) - 1);
                }
            }
            if (!invalid && may_end(set, u)) allow(t);
        }
    }

    void visit(uint32_t index, uint32_t set, const Utf8 & u) {
        const VocabularyTrie::Node & node = trie_.nodes[index];
        if (node.tokens_here > node.tokens_begin && may_end(set, u)) allow_range(node.tokens_begin, node.tokens_here);
        for (uint32_t c = index + 1; c < node.end; c = trie_.nodes[c].end) {
            const VocabularyTrie::Node & child = trie_.nodes[c];
            if (only_ >= 0 && (only_rank_ < child.tokens_begin || only_rank_ >= child.tokens_end)) continue;
            Utf8 v = u;
            const uint8_t b = child.byte;
            if (v.n_remain > 0) {
                if (v.continuing && (b >> 6) != 2) continue;  // libllama rejects the whole piece
                v.value = (v.value << 6) + (b & 0x3F);
                --v.n_remain;
                v.continuing = v.continuing && v.n_remain > 0;
            } else {
                const int length = kUtf8Length[b >> 4];
                if (length == 0) continue;  // likewise
                v.n_remain = length - 1;
                v.value = b & ((1u << (8 - length)) - 1);
            }
            if (v.n_remain > 0) {
                visit(c, set, v);
            } else if (v.value == 0) {
                after_nul(set, child);
            } else {
                token_elements(set, child);
                const uint32_t next = step(set, v.value);
                if (next != kNone) visit(c, next, v);
            }
        }
    }

    llama_grammar & grammar_;
    const VocabularyTrie & trie_;
    const int n_tokens_;
    const int32_t only_;  // >= 0: the walk of this token's path alone
    uint32_t only_rank_ = VocabularyTrie::kAbsent;
    llama_grammar_stacks saved_;  // the grammar's own stacks, put back at the end
    std::vector<uint64_t> allowed_;
    bool found_ = false;
    size_t steps_ = 0;
    std::vector<Set> sets_;
    std::unordered_map<std::string, uint32_t> set_ids_;
    std::unordered_map<uint64_t, uint32_t> next_;
    std::map<std::tuple<uint32_t, uint32_t, int>, bool> partial_ends_;
};

}  // namespace

std::shared_ptr<const VocabularyTrie> vocabulary_trie(const Tokenizer & tokenizer) {
    // Keyed by the vocabulary's texts and type (a vocabulary loaded again, or by another model of
    // the family, finds its trie); kept for the process: one per vocabulary it serves.
    static std::mutex mutex;
    static std::map<std::pair<uint64_t, int>, std::shared_ptr<const VocabularyTrie>> tries;
    const std::pair<uint64_t, int> key{tokenizer.fingerprint(), static_cast<int>(llama_vocab_type(tokenizer.vocabulary()))};
    std::lock_guard lock(mutex);
    std::shared_ptr<const VocabularyTrie> & trie = tries[key];
    if (!trie) trie = build_trie(*tokenizer.vocabulary(), tokenizer.n_vocab());
    return trie;
}

std::vector<uint64_t> grammar_mask(llama_grammar & grammar, const VocabularyTrie & trie, int n_tokens) {
    Walk walk(grammar, trie, n_tokens, -1);
    walk.run();
    return std::move(walk.allowed());
}

bool accept_char_within_limit(llama_grammar & grammar, uint32_t chr) {
    if (grammar.stacks.size() <= 1) {  // nothing to merge across stacks
        llama_grammar_accept(&grammar, chr);
        return grammar.stacks.size() <= kMaxGrammarStacks;
    }
    const llama_grammar_stacks stacks = std::move(grammar.stacks);
    llama_grammar_stacks out;
    std::set<llama_grammar_stack> seen;  // libllama keeps the first of equal stacks, in this order
    for (const llama_grammar_stack & stack : stacks) {
        grammar.stacks.assign(1, stack);
        llama_grammar_accept(&grammar, chr);
        for (llama_grammar_stack & next : grammar.stacks) {
            if (seen.insert(next).second) out.push_back(std::move(next));
        }
        if (out.size() > kMaxGrammarStacks) break;
    }
    grammar.stacks = std::move(out);
    return grammar.stacks.size() <= kMaxGrammarStacks;
}

bool grammar_allows(llama_grammar & grammar, const VocabularyTrie & trie, int32_t token) {
    Walk walk(grammar, trie, static_cast<int>(trie.rank.size()), token);
    walk.run();
    return walk.found();
}

}  // namespace specula
