#include "draft/ngram.h"

#include <algorithm>
#include <string>

#include "specula/error.h"

namespace specula {

NgramDrafter::NgramDrafter(int n_min, int n_max) : n_min_(n_min), n_max_(n_max) {
    if (n_min < 1 || n_max < n_min) throw Error("n-gram sizes must satisfy 1 <= min <= max (got " + std::to_string(n_min) + ", " + std::to_string(n_max) + ")");
}

void NgramDrafter::start(const DraftRequest & req) {
    draft_ = Draft{};
    Draft & d = draft_;
    const auto & h = req.history;
    const int L = static_cast<int>(h.size());
    for (int n = std::min(n_max_, L - 1); n >= n_min_; --n) {
        const auto suffix = h.subspan(L - n, n);
        // Latest match that ends before the suffix itself.
        for (int start = L - n - 1; start >= 0; --start) {
            if (!std::equal(suffix.begin(), suffix.end(), h.begin() + start)) continue;
            int prev = TokenTree::kRoot;
            for (int i = start + n; i < L && d.tree.size() < req.budget.depth; ++i) prev = d.tree.add(prev, h[i], 0.0f);
            return;
        }
    }
}

}  // namespace specula
