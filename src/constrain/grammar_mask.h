#pragma once
// The tokens a grammar allows at its position, found by walking a trie of the vocabulary's pieces
// with the deduplicated set of libllama's parse stacks after each prefix. libllama's own step
// (llama_grammar_apply_impl) follows each stack character by character without merging them:
// under an ambiguous grammar a token of L characters costs it ~2^L steps. Here each (stack set,
// character) is stepped once a mask, with libllama's character step, under a work budget.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

struct llama_grammar;

namespace specula {

class Tokenizer;

// Parse-stack steps one mask may take (stacks stepped plus stacks produced). The masks of ordinary
// JSON-schema and GBNF grammars take up to ~250k over Qwen2's 151k tokens (".*" steps every
// character of the vocabulary once), ~70k over SmolLM2's 49k.
inline constexpr size_t kMaxMaskSteps = size_t{1} << 22;

// The vocabulary's pieces (libllama's, up to a NUL byte) as a byte trie, built once per tokenizer
// and shared by every grammar over it. End-of-generation tokens and empty pieces are not in it.
struct VocabularyTrie {
    struct Node {
        uint32_t end;           // the first node past this one's subtree (nodes are in preorder)
        uint32_t tokens_begin;  // this subtree's tokens: tokens[tokens_begin, tokens_end), those
        uint32_t tokens_here;   // whose piece ends at this node first, up to tokens_here
        uint32_t tokens_end;
        uint32_t depth;  // bytes from the root
        uint8_t byte;    // the byte from the parent
    };
    std::vector<Node> nodes;          // nodes[0]: the root, the empty prefix
    std::vector<int32_t> tokens;      // token ids sorted by piece
    std::vector<uint32_t> rank;       // each token's index in `tokens`; kAbsent when not in the trie
    std::vector<int32_t> end_tokens;  // the end-of-generation tokens, allowed where a stack is empty
    static constexpr uint32_t kAbsent = UINT32_MAX;
};

// The trie of the tokenizer's vocabulary, built on first use, shared while any grammar holds it.
std::shared_ptr<const VocabularyTrie> vocabulary_trie(const Tokenizer & tokenizer);

// The tokens below n_tokens that libllama's step allows at `grammar`'s position, one bit each
// (token t: bit t % 64 of word t / 64). The grammar's stacks are borrowed for the walk and put
// back. Throws Error when the walk takes more than kMaxMaskSteps steps or a prefix leads to more
// than kMaxGrammarStacks stacks.
std::vector<uint64_t> grammar_mask(llama_grammar & grammar, const VocabularyTrie & trie, int n_tokens);

// libllama's llama_grammar_accept of the character `chr` on `grammar`'s stacks, with the same
// result, but stepping one stack at a time and stopping (false, the stacks then partial) once the
// stacks it makes exceed kMaxGrammarStacks. libllama's accept deduplicates its output by a linear
// search of all of it: 1024 stacks that each open 200 alternatives cost it 4*10^10 comparisons
// before the limit could be checked.
bool accept_char_within_limit(llama_grammar & grammar, uint32_t chr);

// Whether libllama's step allows `token`: the walk along its piece alone. Throws as grammar_mask.
bool grammar_allows(llama_grammar & grammar, const VocabularyTrie & trie, int32_t token);

}  // namespace specula
