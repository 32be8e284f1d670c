#include "draft/ngram.h"

#include <algorithm>
#include <string>

#include "specula/error.h"

namespace specula {

NgramDrafter::NgramDrafter(int n_min, int n_max, std::shared_ptr<const std::vector<int32_t>> markup)
    : n_min_(n_min), n_max_(n_max), markup_(std::move(markup)) {
    if (n_min < 1 || n_max < n_min) throw Error("n-gram sizes must satisfy 1 <= min <= max (got " + std::to_string(n_min) + ", " + std::to_string(n_max) + ")");
}

bool NgramDrafter::use_suffix_cache(std::shared_ptr<SuffixCache> cache, const std::string & scope) {
    cache_ = std::move(cache);
    scope_ = scope;
    from_cache_ = {};
    return true;
}

std::span<const int32_t> NgramDrafter::proposable(std::span<const int32_t> tokens) const {
    if (!markup_) return tokens;
    const auto markup = std::find_if(tokens.begin(), tokens.end(),
                                     [&](int32_t t) { return std::binary_search(markup_->begin(), markup_->end(), t); });
    return tokens.first(static_cast<size_t>(markup - tokens.begin()));
}

void NgramDrafter::count_cache_draft(std::span<const int32_t> history) {
    if (from_cache_.tokens.empty()) return;
    if (history.size() > from_cache_.root) {
        const size_t verified = std::min(from_cache_.tokens.size(), history.size() - from_cache_.root - 1);
        size_t held = 0;
        while (held < verified && history[from_cache_.root + held] == from_cache_.tokens[held]) ++held;
        cache_->count_accepted(held);
    }
    from_cache_ = {};
}

void NgramDrafter::draft(const DraftRequest & req, bool with_cache) {
    draft_ = Draft{};
    Draft & d = draft_;
    const auto & h = req.history;
    if (cache_) count_cache_draft(h);
    const int L = static_cast<int>(h.size());
    auto chain = [&](std::span<const int32_t> tokens) {
        int prev = TokenTree::kRoot;
        for (size_t i = 0; i < tokens.size() && d.tree.size() < req.budget.depth; ++i) prev = d.tree.add(prev, tokens[i], 0.0f);
    };
    // The longest n-gram that matches wins; at one length, the history before earlier sequences.
    for (int n = std::min(n_max_, L); n >= n_min_; --n) {
        const auto suffix = h.subspan(L - n, n);
        // Latest match that ends before the suffix itself.
        for (int start = L - n - 1; start >= 0; --start) {
            if (!std::equal(suffix.begin(), suffix.end(), h.begin() + start)) continue;
            // Only as far as the chain goes: a match early in a long context is followed by the rest of it.
            chain(proposable(h.subspan(start + n, std::min(L - start - n, std::max(0, req.budget.depth)))));
            return;
        }
        if (!with_cache) continue;
        std::vector<int32_t> cached = cache_->continuation(suffix, req.budget.depth, scope_);
        cached.resize(proposable(cached).size());
        if (cached.empty()) continue;
        chain(cached);
        from_cache_ = CacheDraft{h.size(), std::move(cached)};
        cache_->count_draft(from_cache_.tokens.size());
        return;
    }
}

}  // namespace specula
