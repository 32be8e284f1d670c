#pragma once
// Earlier sequences of a server (each finished request's prompt and output, one text), searched
// like prompt lookup: a request that repeats what an earlier one wrote (an edit of the same code,
// a summary asked again, an agent's loop) gets the earlier continuation as a free draft.
// Memory is bounded: at most max_tokens tokens are kept, and the index holds at most one entry
// per kept token and n-gram length (n_min..n_max); the oldest sequences are evicted first.
// Each sequence is kept under a scope (a server's tenant and cache salt), and a lookup finds only
// the sequences of its own scope; one bound holds them all.
// Thread-safe: every member takes the cache's mutex.
#include <cstdint>
#include <deque>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

namespace specula {

class SuffixCache {
public:
    static constexpr size_t kDefaultMaxTokens = 1 << 18;  // with the index, about 45 MB at n-grams of 1-3

    SuffixCache(size_t max_tokens, int n_min, int n_max);

    // A finished sequence of `scope`; one longer than max_tokens is kept by its last max_tokens tokens.
    void add(std::span<const int32_t> tokens, const std::string & scope);
    // What followed `ngram` in the latest kept sequence of `scope` holding it with a token after
    // it, up to `depth` tokens; empty if none does (or its length is outside n_min..n_max).
    std::vector<int32_t> continuation(std::span<const int32_t> ngram, int depth, const std::string & scope) const;

    // Drafts taken from the cache, and how many of their tokens verification accepted.
    void count_draft(size_t tokens);
    void count_accepted(size_t tokens);
    struct Stats {
        uint64_t drafts = 0, draft_tokens = 0, accepted_tokens = 0;
        uint64_t sequences = 0, tokens = 0, evicted = 0;  // kept now; evicted so far
    };
    Stats stats() const;
    int n_min() const { return n_min_; }
    int n_max() const { return n_max_; }

private:
    struct Place {
        uint64_t sequence = 0;  // id
        uint32_t end = 0;       // the n-gram ends before this index
    };
    struct Kept {
        uint64_t id = 0;
        std::vector<int32_t> tokens;
        std::string scope;
    };
    // The index's key of an n-gram in a scope: scopes that share a key only overwrite each other's
    // places (a lookup checks the kept sequence's scope and tokens).
    static uint64_t key(std::span<const int32_t> ngram, uint64_t scope_hash);
    void evict_oldest();  // under mutex_

    const size_t max_tokens_;
    const int n_min_, n_max_;
    mutable std::mutex mutex_;
    std::deque<Kept> kept_;  // oldest first; ids consecutive
    uint64_t next_id_ = 0;
    size_t n_tokens_ = 0;
    std::unordered_map<uint64_t, Place> index_;  // (scope, n-gram) -> its latest place
    Stats stats_;
};

}  // namespace specula
