#include "server/slot_prefix.h"

#include <algorithm>

#include "draft/drafter.h"
#include "runtime/kv_cache.h"

namespace specula {

size_t common_prefix(std::span<const int32_t> a, std::span<const int32_t> b) {
    const size_t n = std::min(a.size(), b.size());
    return static_cast<size_t>(std::mismatch(a.begin(), a.begin() + n, b.begin()).first - a.begin());
}

size_t matched_prefix(std::span<const int32_t> kept, std::span<const int32_t> prompt) {
    const size_t common = common_prefix(kept, prompt);
    return 2 * common >= prompt.size() || 2 * common >= kept.size() ? common : 0;
}

int choose_slot(std::span<const SlotPrefix * const> prefixes, std::span<const char> free, std::span<const int32_t> prompt,
                const std::string & scope) {
    int best = -1;
    size_t best_common = 0;
    for (size_t i = 0; i < prefixes.size(); ++i) {
        if (!free[i]) continue;
        const size_t common = prefixes[i]->scope == scope ? matched_prefix(prefixes[i]->tokens, prompt) : 0;
        const bool longer = best < 0 || common > best_common;
        if (longer || (common == best_common && prefixes[i]->last_used < prefixes[best]->last_used)) {
            best = static_cast<int>(i);
            best_common = common;
        }
    }
    return best;
}

void reuse_prefix(SlotPrefix & prefix, KvCache & cache, Drafter * drafter, std::span<const int32_t> prompt) {
    const size_t limit = std::min({prefix.tokens.size(), static_cast<size_t>(cache.size()), prompt.empty() ? 0 : prompt.size() - 1});
    const size_t n = common_prefix(std::span(prefix.tokens).first(limit), prompt);
    cache.rollback(static_cast<int>(n));
    prefix.tokens.resize(n);
    if (drafter && drafter != prefix.drafter) drafter->reset();
    prefix.drafter = drafter;
}

void keep_prefix(SlotPrefix & prefix, KvCache & cache, std::span<const int32_t> history, int n_exact, const Drafter * drafter) {
    const int n = std::clamp(n_exact, 0, std::min(cache.size(), static_cast<int>(history.size())));
    cache.rollback(n);
    prefix.tokens.assign(history.begin(), history.begin() + n);
    prefix.drafter = drafter;
}

void share_prompt(SlotPrefix & prefix, KvCache & cache, Drafter * drafter, const KvCache & first_cache, const Drafter * first_drafter,
                  std::span<const int32_t> prompt) {
    cache.copy_from(first_cache, std::min(first_cache.size(), static_cast<int>(prompt.size())));
    prefix.tokens.assign(prompt.begin(), prompt.begin() + cache.size());
    prefix.drafter = nullptr;
    if (drafter && first_drafter) {
        drafter->copy_state(*first_drafter);
        prefix.drafter = drafter;
    }
}

void forget_prefix(SlotPrefix & prefix, KvCache & cache) {
    cache.rollback(0);
    prefix.tokens.clear();
    prefix.drafter = nullptr;
}

}  // namespace specula
