#pragma once
// The prefix store behind the server's slots (server/slot_prefix.h): with more conversations than
// slots, a slot taken by another conversation first saves what it held (the target's exact K/V
// rows of its tokens) to host memory, and a request whose prompt begins with a stored prefix
// longer than what its slot holds gets those rows copied back instead of prefilling them.
// Only target rows are stored, never drafter state: the slot's drafter is reset and rebuilds
// exactly what a cold start would (Drafter::keep_prefix: the draft model catches up on the prompt
// with its own forwards; EAGLE's head asks the target to prefill its prompt window again; lookup
// drafters read the history). The rows are exact for every mode that keeps a slot's rows: a lossy
// SpecEE request's slot holds none (forget_prefix), so nothing of it is ever stored.
// Bounded by max_bytes (rows and tokens); the least recently used entries are evicted first.
// Its own lock: the scheduler's worker saves and loads rows outside the scheduler's mutex (a
// remote cache's copy can stall), while metrics() reads the stats from other threads. put() and
// find() come from one thread (a Match stays valid until that thread's next put()).
#include <cstdint>
#include <list>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "runtime/kv_cache.h"

namespace specula {

class Drafter;
struct SlotPrefix;

class PrefixStore {
public:
    static constexpr size_t kDefaultMaxBytes = size_t(256) << 20;

    explicit PrefixStore(size_t max_bytes) : max_bytes_(max_bytes) {}

    // Whether an entry of n_tokens tokens whose rows take row_bytes fits the bound at all.
    bool fits(size_t n_tokens, size_t row_bytes) const { return entry_bytes(n_tokens, row_bytes) <= max_bytes_; }
    // Keeps `tokens` with `rows` (the target's exact K/V of them) as the most recently used entry
    // of `scope` (whose requests may reuse it: Tenancy::scope), replacing entries of the scope it
    // extends, and evicts the least recently used until the bound holds. An entry that does not
    // fit, or whose tokens begin a kept entry's of the scope, is not kept.
    void put(std::span<const int32_t> tokens, KvCache::HostRows rows, const std::string & scope);
    struct Match {
        size_t n = 0;                              // leading prompt tokens the entry's rows hold
        const KvCache::HostRows * rows = nullptr;  // valid until the next put()
    };
    // The entry of `scope` that shares the longest prefix with `prompt`, if that is longer than
    // `than` and counts as a match (matched_prefix: more than a shared header). Counts a hit and
    // makes the entry the most recently used.
    std::optional<Match> find(std::span<const int32_t> prompt, size_t than, const std::string & scope);

    struct Stats {
        uint64_t bytes = 0, entries = 0, hits = 0, evictions = 0;
    };
    Stats stats() const {
        std::lock_guard lock(mutex_);
        return stats_;
    }

private:
    struct Entry {
        std::vector<int32_t> tokens;
        KvCache::HostRows rows;
        std::string scope;
    };
    static size_t entry_bytes(size_t n_tokens, size_t row_bytes) { return n_tokens * sizeof(int32_t) + row_bytes; }
    static size_t bytes_of(const Entry & e) { return entry_bytes(e.tokens.size(), e.rows.f16.size() * sizeof(uint16_t)) + e.scope.size(); }
    void erase(std::list<Entry>::iterator it);

    const size_t max_bytes_;
    mutable std::mutex mutex_;  // entries_ and stats_
    std::list<Entry> entries_;  // most recently used first
    Stats stats_;
};

// Before a request takes the slot: its rows go to the store, under the slot's scope, unless the request keeps them all,
// i.e. unless they are a prefix of `prompt` (pass an empty prompt when the slot's rows are lost
// whatever the prompt: a lossy SpecEE request, a further choice taking the first one's rows).
void stash_prefix(PrefixStore & store, const SlotPrefix & prefix, const KvCache & cache, std::span<const int32_t> prompt);
// Then: when the store holds a longer prefix of `prompt` than the slot, under the slot's scope, the slot takes its rows
// (short of the prompt's last token, as reuse_prefix) and `drafter` (nullptr: none) is reset.
void restore_prefix(PrefixStore & store, SlotPrefix & prefix, KvCache & cache, Drafter * drafter, std::span<const int32_t> prompt);

}  // namespace specula
