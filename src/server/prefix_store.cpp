#include "server/prefix_store.h"

#include <algorithm>

#include "draft/drafter.h"
#include "server/slot_prefix.h"

namespace specula {

void PrefixStore::erase(std::list<Entry>::iterator it) {
    stats_.bytes -= bytes_of(*it);
    --stats_.entries;
    entries_.erase(it);
}

void PrefixStore::put(std::span<const int32_t> tokens, KvCache::HostRows rows, const std::string & scope) {
    if (tokens.empty() || !fits(tokens.size(), rows.f16.size() * sizeof(uint16_t))) return;
    std::lock_guard lock(mutex_);
    for (auto it = entries_.begin(); it != entries_.end();) {
        if (it->scope != scope) {
            ++it;
            continue;
        }
        const size_t common = common_prefix(it->tokens, tokens);
        if (common == tokens.size()) return;  // a kept entry holds these rows and more
        it = common == it->tokens.size() ? (erase(it), entries_.begin()) : std::next(it);
    }
    entries_.push_front({std::vector<int32_t>(tokens.begin(), tokens.end()), std::move(rows), scope});
    stats_.bytes += bytes_of(entries_.front());
    ++stats_.entries;
    while (stats_.bytes > max_bytes_) {
        erase(std::prev(entries_.end()));
        ++stats_.evictions;
    }
}

std::optional<PrefixStore::Match> PrefixStore::find(std::span<const int32_t> prompt, size_t than, const std::string & scope) {
    std::lock_guard lock(mutex_);
    auto best = entries_.end();
    size_t best_n = than;
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
        const size_t n = it->scope == scope ? matched_prefix(it->tokens, prompt) : 0;
        if (n > best_n) best = it, best_n = n;
    }
    if (best == entries_.end()) return std::nullopt;
    entries_.splice(entries_.begin(), entries_, best);
    ++stats_.hits;
    return Match{best_n, &entries_.front().rows};
}

void stash_prefix(PrefixStore & store, const SlotPrefix & prefix, const KvCache & cache, std::span<const int32_t> prompt) {
    const int n = std::min(static_cast<int>(prefix.tokens.size()), cache.size());
    if (n == 0 || common_prefix(prefix.tokens, prompt) >= prefix.tokens.size()) return;
    if (!store.fits(n, cache.row_bytes(n))) return;  // not worth the copy
    store.put(std::span(prefix.tokens).first(n), cache.save_rows(n), prefix.scope);
}

void restore_prefix(PrefixStore & store, SlotPrefix & prefix, KvCache & cache, Drafter * drafter, std::span<const int32_t> prompt) {
    if (prompt.empty()) return;
    const std::span<const int32_t> before_last = prompt.first(prompt.size() - 1);
    const size_t held = std::min({common_prefix(prefix.tokens, before_last), static_cast<size_t>(cache.size())});
    const std::optional<PrefixStore::Match> match = store.find(before_last, held, prefix.scope);
    if (!match) return;
    cache.load_rows(*match->rows);
    cache.rollback(static_cast<int>(match->n));
    prefix.tokens.assign(prompt.begin(), prompt.begin() + match->n);
    if (drafter) drafter->reset();
    prefix.drafter = drafter;
}

}  // namespace specula
