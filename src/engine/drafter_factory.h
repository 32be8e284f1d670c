#pragma once
// The one assembly path for drafters: the options' DrafterSpec checked, what it loads and checks
// (the draft model's vocabulary, the EAGLE head's kind), the drafting defaults (tree shape and
// budget, policy, limits), and per-sequence drafter instances. ModelBundle (so Engine, `specula
// generate`, `specula serve` and the server) and the benchmarks assemble drafters only here, so
// their rules cannot drift apart.
#include <memory>
#include <string>
#include <vector>

#include "draft/drafter.h"
#include "policy/draft_length.h"
#include "specula/specula.h"
#include "tree/tree_builder.h"

namespace specula {

class Backend;
class EagleHead;
class Model;
class Tokenizer;

// Throws Error naming what is wrong with `spec`: a kind that loads a file without a path, a path
// for a kind that takes none (the n-gram range is checked by the n-gram drafter).
void check_drafter_spec(const DrafterSpec & spec);

// The drafting rules of `options` for `kind` (not None): the tree budget (its shape defaulting
// to dynamic for EAGLE heads, else chain) and the draft-length policy, checked against the
// context and the drafter. Throws Error naming the bad option.
struct DraftingRules {
    DraftPolicyKind policy = DraftPolicyKind::Cost;
    TreeBudget tree;
    bool lookup = false;  // graft prompt lookup into the model's drafts (DrafterSpec::lookup, resolved)
};
DraftingRules drafting_rules(const EngineOptions & options, DrafterKind kind);

// What a drafter shares across sequences: its model or head, loaded and checked against the
// target (the spec checked first). make() gives one sequence's drafter (nullptr for None);
// make_group() drafters for n sequences that share one runner and KV pool, so that run_drafts
// batches their forwards (a server's slots).
struct DrafterFactory {
    static DrafterFactory open(const DrafterSpec & spec, Backend & backend, const Model & target, const Tokenizer & target_vocab);
    DrafterFactory();
    DrafterFactory(DrafterFactory &&) noexcept;
    DrafterFactory & operator=(DrafterFactory &&) noexcept;
    ~DrafterFactory();

    std::unique_ptr<Drafter> make(int n_ctx) const;
    std::vector<std::unique_ptr<Drafter>> make_group(int n_ctx, int n) const;

    DrafterSpec spec;
    std::unique_ptr<Model> draft_model;  // DrafterKind::DraftModel
    std::unique_ptr<EagleHead> head;     // DrafterKind::Eagle / Eagle3
    // The target vocabulary's markup tokens, which prompt lookup never proposes.
    std::shared_ptr<const std::vector<int32_t>> markup_tokens;
    // The token ids a trimmed draft vocabulary (DrafterSpec::vocab, vocab_file) keeps, ascending; empty: all.
    std::vector<int32_t> draft_logit_ids;
};

}  // namespace specula
