#pragma once
// Prompt-lookup drafting: find the latest earlier occurrence of the sequence's last n tokens
// (n from n_max down to n_min) and propose what followed it, as a chain of up to budget.depth
// tokens whatever shape is asked. No model, no distribution. With a suffix cache (earlier
// sequences of a server), an n-gram the history does not hold is looked up there too. A chain
// stops before a markup token (Tokenizer::markup_tokens): at a reply's start the history's last
// "\n" was followed by the next turn's "<|im_start|>", which the reply does not hold.
#include <memory>
#include <string>
#include <vector>

#include "draft/drafter.h"
#include "draft/suffix_cache.h"

namespace specula {

class NgramDrafter : public Drafter {
public:
    // markup: sorted tokens never proposed (none when null).
    NgramDrafter(int n_min, int n_max, std::shared_ptr<const std::vector<int32_t>> markup = nullptr);
    const char * name() const override { return "ngram"; }
    void start(const DraftRequest & request) override { draft(request, cache_ != nullptr); }
    // start(), with the history alone looked up (not the suffix cache).
    void start_from_history(const DraftRequest & request) { draft(request, false); }
    Draft take() override { return std::move(draft_); }
    void accept(const Acceptance &) override {}
    void reset() override { from_cache_ = {}; }
    int keep_prefix(int n_common, int) override {  // no state but the cache draft's count: it reads the history
        reset();
        return n_common;
    }
    bool use_suffix_cache(std::shared_ptr<SuffixCache> cache, const std::string & scope) override;

private:
    void draft(const DraftRequest & request, bool with_cache);
    // Counts how many of the last cache draft's tokens the round after it accepted: its first
    // `history - root - 1` tokens (the round's emitted tokens but the target's own) that held.
    void count_cache_draft(std::span<const int32_t> history);
    // The tokens up to the first markup token.
    std::span<const int32_t> proposable(std::span<const int32_t> tokens) const;

    int n_min_, n_max_;
    std::shared_ptr<const std::vector<int32_t>> markup_;
    Draft draft_;
    std::shared_ptr<SuffixCache> cache_;
    std::string scope_;  // the part of cache_ looked up
    struct CacheDraft {
        size_t root = 0;  // history size when drafted
        std::vector<int32_t> tokens;
    } from_cache_;
};

}  // namespace specula
