#include "draft/suffix_cache.h"

#include <algorithm>
#include <functional>
#include <string>

#include "specula/error.h"

namespace specula {

SuffixCache::SuffixCache(size_t max_tokens, int n_min, int n_max) : max_tokens_(max_tokens), n_min_(n_min), n_max_(n_max) {
    if (max_tokens < 1) throw Error("the suffix cache must hold at least one token");
    if (n_min < 1 || n_max < n_min) throw Error("n-gram sizes must satisfy 1 <= min <= max (got " + std::to_string(n_min) + ", " + std::to_string(n_max) + ")");
}

// The n-gram's tokens, its length and its scope's hash, mixed (FNV-1a over 32-bit words). A
// collision is caught by comparing the kept tokens and scope.
uint64_t SuffixCache::key(std::span<const int32_t> ngram, uint64_t scope_hash) {
    uint64_t h = (1469598103934665603ull ^ scope_hash ^ ngram.size()) * 1099511628211ull;
    for (int32_t t : ngram) h = (h ^ static_cast<uint32_t>(t)) * 1099511628211ull;
    return h;
}

void SuffixCache::add(std::span<const int32_t> tokens, const std::string & scope) {
    if (tokens.size() > max_tokens_) tokens = tokens.last(max_tokens_);
    if (tokens.size() < 2) return;
    const uint64_t scope_hash = std::hash<std::string>{}(scope);
    std::lock_guard lock(mutex_);
    while (n_tokens_ + tokens.size() > max_tokens_) evict_oldest();
    const uint64_t id = next_id_++;
    kept_.push_back(Kept{id, {tokens.begin(), tokens.end()}, scope});
    n_tokens_ += tokens.size();
    // Every n-gram with a token after it; a later place of the same n-gram overwrites an earlier one.
    for (size_t end = 1; end < tokens.size(); ++end) {
        for (int n = n_min_; n <= n_max_ && static_cast<size_t>(n) <= end; ++n) {
            index_[key(tokens.subspan(end - n, n), scope_hash)] = Place{id, static_cast<uint32_t>(end)};
        }
    }
    stats_.sequences = kept_.size();
    stats_.tokens = n_tokens_;
}

void SuffixCache::evict_oldest() {
    const Kept & oldest = kept_.front();
    const std::span<const int32_t> tokens = oldest.tokens;
    const uint64_t scope_hash = std::hash<std::string>{}(oldest.scope);
    for (size_t end = 1; end < tokens.size(); ++end) {
        for (int n = n_min_; n <= n_max_ && static_cast<size_t>(n) <= end; ++n) {
            auto it = index_.find(key(tokens.subspan(end - n, n), scope_hash));
            if (it != index_.end() && it->second.sequence == oldest.id) index_.erase(it);
        }
    }
    n_tokens_ -= tokens.size();
    kept_.pop_front();
    ++stats_.evicted;
}

std::vector<int32_t> SuffixCache::continuation(std::span<const int32_t> ngram, int depth, const std::string & scope) const {
    const int n = static_cast<int>(ngram.size());
    if (n < n_min_ || n > n_max_ || depth < 1) return {};
    const uint64_t scope_hash = std::hash<std::string>{}(scope);
    std::lock_guard lock(mutex_);
    const auto it = index_.find(key(ngram, scope_hash));
    if (it == index_.end() || kept_.empty() || it->second.sequence < kept_.front().id) return {};
    const Kept & kept = kept_[it->second.sequence - kept_.front().id];
    const std::vector<int32_t> & tokens = kept.tokens;
    const size_t end = it->second.end;
    if (kept.scope != scope || !std::equal(ngram.begin(), ngram.end(), tokens.begin() + static_cast<std::ptrdiff_t>(end - n))) return {};  // a hash collision
    const size_t stop = std::min(tokens.size(), end + static_cast<size_t>(depth));
    return {tokens.begin() + static_cast<std::ptrdiff_t>(end), tokens.begin() + static_cast<std::ptrdiff_t>(stop)};
}

void SuffixCache::count_draft(size_t tokens) {
    std::lock_guard lock(mutex_);
    ++stats_.drafts;
    stats_.draft_tokens += tokens;
}

void SuffixCache::count_accepted(size_t tokens) {
    std::lock_guard lock(mutex_);
    stats_.accepted_tokens += tokens;
}

SuffixCache::Stats SuffixCache::stats() const {
    std::lock_guard lock(mutex_);
    return stats_;
}

}  // namespace specula
