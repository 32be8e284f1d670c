#pragma once
// Prompt-lookup drafting: find the latest earlier occurrence of the sequence's last n tokens
// (n from n_max down to n_min) and propose what followed it, as a chain of up to budget.depth
// tokens whatever shape is asked. No model, no distribution.
#include "draft/drafter.h"

namespace specula {

class NgramDrafter : public Drafter {
public:
    NgramDrafter(int n_min, int n_max);
    const char * name() const override { return "ngram"; }
    void start(const DraftRequest & request) override;
    Draft take() override { return std::move(draft_); }
    void accept(const Acceptance &) override {}
    void reset() override {}
    int keep_prefix(int n_common, int) override { return n_common; }  // no state: it reads the history

private:
    int n_min_, n_max_;
    Draft draft_;
};

}  // namespace specula
