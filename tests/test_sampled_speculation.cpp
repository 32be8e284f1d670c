// Lossless sampling: speculative output at T > 0 follows the target's law (chi-square against the
// exact joint distribution of a tiny-vocabulary target) for chains, trees, EAGLE heads and early-exit
// drafts, and a broken verifier fails the same test.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "draft/draft_model_drafter.h"
#include "draft/eagle_drafter.h"
#include "draft/early_exit.h"
#include "draft/lookup_graft.h"
#include "draft/ngram.h"
#include "runtime/eagle_head.h"
#include "runtime/kv_cache.h"
#include "runtime/exit_predictor.h"
#include "verify/verify.h"
#include "specee_predictor.h"
#include "speculative_run.h"

namespace specula {
namespace {

using test::accept_everything;
using test::chi2_critical;
using test::kTinyVocab;
using test::Tiny;

TEST(Speculative, SampledOutputFollowsTheTargetDistributionAndABrokenVerifierFails) {
    Tiny t;
    const std::vector<int32_t> prefix = {1, 2, 3, 1, 2};
    DraftModelDrafter model_drafter(*t.draft, 64);
    NgramDrafter ngram(1, 2);
    SamplingParams plain_t;
    plain_t.temperature = 1.0f;
    SamplingParams shaped;
    shaped.temperature = 0.8f, shaped.top_k = 6, shaped.top_p = 0.95f, shaped.min_p = 0.02f;
    const int runs = 4000;
    for (const SamplingParams & sp : {plain_t, shaped}) {
        const auto joint = t.exact_joint(prefix, sp);
        for (Drafter * d : std::vector<Drafter *>{&model_drafter, &ngram}) {
            auto [stat, dof] = t.chi2(*d, prefix, sp, joint, runs, nullptr);
            std::printf("[distribution] %-11s T=%.1f top_k=%d: chi2 = %.1f, dof = %d, critical = %.1f\n", d->name(),
                        sp.temperature, sp.top_k, stat, dof, chi2_critical(dof));
            EXPECT_LT(stat, chi2_critical(dof)) << d->name();
        }
        // The n-gram drafter's proposals are deterministic (no q): accepting them unchecked must
        // show as well as accepting a sampled draft model's.
        auto broken = [&sp](const TokenTree & tree, const TargetLogits & l, Rng & rng, int64_t) { return accept_everything(tree, l, sp, rng); };
        for (Drafter * d : std::vector<Drafter *>{&model_drafter, &ngram}) {
            auto [stat, dof] = t.chi2(*d, prefix, sp, joint, runs, broken);
            std::printf("[distribution] %-11s broken verifier T=%.1f: chi2 = %.1f (critical %.1f)\n", d->name(), sp.temperature, stat,
                        chi2_critical(dof));
            EXPECT_GT(stat, chi2_critical(dof)) << d->name() << ": the distribution test cannot tell a broken verifier";
        }
    }
}

// A tree verifier that forgets the residual between siblings: tries each child against the
// untouched p. Subtly wrong; the test must notice.
VerifyResult no_residual(const TokenTree & tree, const TargetLogits & logits, const SamplingParams & sp, Rng & rng) {
    VerifyResult r;
    std::vector<float> p;
    int cur = TokenTree::kRoot;
    while (true) {
        processed_probs(logits.row_of(cur), sp, p);
        int next = -1;
        for (int c = tree.first_child_of(cur); c >= 0 && next < 0; c = tree.next_sibling[c]) {
            const std::span<const float> q = tree.q_of(cur);
            if (rng.uniform() < std::min(1.0f, p[tree.token[c]] / q[tree.token[c]])) next = c;
        }
        if (next < 0) {
            r.next_token = sample_from(p, rng);
            return r;
        }
        r.accepted.push_back(cur = next);
    }
}

TEST(Speculative, SampledTreesFollowTheTargetDistributionAndABrokenTreeVerifierFails) {
    Tiny t;
    const std::vector<int32_t> prefix = {4, 2, 3, 1, 2};
    DraftModelDrafter model_drafter(*t.draft, 64);
    SamplingParams sp;
    sp.temperature = 1.0f;
    const auto joint = t.exact_joint(prefix, sp);
    const int runs = 4000;
    for (TreeBudget tree : {TreeBudget{TreeShape::Dynamic, 2, 3, 9}, TreeBudget{TreeShape::Static, 3, 4, 12}}) {
        auto [stat, dof] = t.chi2(model_drafter, prefix, sp, joint, runs, nullptr, tree);
        std::printf("[distribution] %s tree: chi2 = %.1f, dof = %d, critical = %.1f\n", tree_shape_name(tree.shape), stat, dof, chi2_critical(dof));
        EXPECT_LT(stat, chi2_critical(dof));
    }
    auto broken = [&sp](const TokenTree & tree, const TargetLogits & l, Rng & rng, int64_t) { return no_residual(tree, l, sp, rng); };
    for (TreeBudget tree : {TreeBudget{TreeShape::Dynamic, 2, 3, 9}, TreeBudget{TreeShape::Static, 3, 4, 12}}) {
        auto [stat, dof] = t.chi2(model_drafter, prefix, sp, joint, runs, broken, tree);
        std::printf("[distribution] %s tree verifier without residual: chi2 = %.1f (critical %.1f)\n", tree_shape_name(tree.shape), stat,
                    chi2_critical(dof));
        EXPECT_GT(stat, chi2_critical(dof)) << tree_shape_name(tree.shape);
    }
}

// A chain verifier that is right at depth 1 and wrong after: a rejection at depth >= 2 draws the
// correction from p instead of the residual norm(max(p - q, 0)). Only chains verified deeper than
// one token can show it.
VerifyResult residual_at_depth_one_only(const TokenTree & tree, const TargetLogits & logits, const SamplingParams & sp, Rng & rng) {
    VerifyResult r;
    std::vector<float> p;
    int cur = TokenTree::kRoot;
    for (int depth = 1;; ++depth) {
        processed_probs(logits.row_of(cur), sp, p);
        const int c = tree.first_child_of(cur);
        if (c < 0) {
            r.next_token = sample_from(p, rng);
            r.bonus = true;
            return r;
        }
        const std::span<const float> q = tree.q_of(cur);
        const int32_t x = tree.token[c];
        if (rng.uniform() < std::min(1.0f, p[x] / q[x])) {
            r.accepted.push_back(cur = c);
            continue;
        }
        if (depth == 1) {
            for (size_t i = 0; i < p.size(); ++i) p[i] = std::max(0.0f, p[i] - q[i]);
        }
        r.next_token = sample_from(p, rng);
        return r;
    }
}

// Chains drafted three deep at T > 0 by every drafter with a draft distribution (a draft model,
// EAGLE-1 and EAGLE-3 heads): the joint law of the first four tokens (the first round drafts 3, so
// acceptance, correction and bonus are exercised at every depth of a chain), on a 4-token
// vocabulary so that 6000 runs fill enough of the 256 cells. A verifier wrong only beyond depth 1
// must fail, as must one that accepts everything.
TEST(Speculative, SampledChainsThreeDeepFollowTheTargetDistributionAndBrokenVerifiersFail) {
    Tiny t(4);
    DraftModelDrafter model_drafter(*t.draft, 64);
    // Cascade drafting: lookup's "2 1" after the trailing "0 1", each token taken one-hot (the
    // draft model ranks both first there), then a draw.
    DraftModelDrafter cascade_drafter(*t.draft, 64);
    cascade_drafter.cascade(1, 3, nullptr);
    auto eagle1 = EagleHead::load(test::tiny_vocab_eagle_head("eagle1", 4, 303), *t.target, t.backend);
    auto eagle3 = EagleHead::load(test::tiny_vocab_eagle_head("eagle3", 4, 303), *t.target, t.backend);
    EagleDrafter eagle1_drafter(*eagle1, 64), eagle3_drafter(*eagle3, 64);
    SamplingParams sp;
    sp.temperature = 2.0f;  // flatter p and q: more of the 256 cells are populated and more chains reach depth 3
    const int runs = 6000;
    const std::vector<int32_t> prefix = {1, 2, 3, 1, 2}, lookup_prefix = {0, 1, 2, 1, 0, 1};
    struct Case {
        const char * name;
        Drafter * drafter;
        const std::vector<int32_t> & prefix;
    };
    for (auto [name, drafter, prefix] : {Case{"draft model", &model_drafter, prefix}, Case{"draft model, cascade", &cascade_drafter, lookup_prefix},
                                         Case{"eagle1", &eagle1_drafter, prefix}, Case{"eagle3", &eagle3_drafter, prefix}}) {
        SCOPED_TRACE(name);
        const auto joint = t.exact_joint(prefix, sp, 4);
        int three_deep = 0, accepted_three = 0, one_hot = 0;
        auto on_round = [&](const RoundInfo & r) {
            if (r.round != 0) return;
            three_deep += r.draft->tree.max_depth() == 3;
            accepted_three += r.result->accepted.size() == 3;
            for (int n = 0; n < r.draft->tree.size(); ++n) one_hot += r.draft->tree.proposed_one_hot(n);
        };
        auto [stat, dof] = t.chi2(*drafter, prefix, sp, joint, runs, nullptr, {}, on_round);
        std::printf(
            "[distribution] %s chain k=3, 4 tokens: chi2 = %.1f, dof = %d, critical = %.1f; 3 accepted in %d of %d first rounds, "
            "%d one-hot nodes\n",
            name, stat, dof, chi2_critical(dof), accepted_three, runs, one_hot);
        EXPECT_LT(stat, chi2_critical(dof));
        EXPECT_EQ(three_deep, runs) << "the first round must draft 3 tokens";
        EXPECT_GT(accepted_three, runs / 100) << "whole 3-token chains must be accepted sometimes";
        if (drafter == &cascade_drafter) EXPECT_GE(one_hot, runs) << "lookup's tokens must be proposed in the first rounds";
        std::vector<std::pair<const char *, VerifyFn>> broken_verifiers = {
            {"accept everything", [&sp](const TokenTree & tree, const TargetLogits & l, Rng & rng, int64_t) { return accept_everything(tree, l, sp, rng); }}};
        if (drafter == &cascade_drafter) {
            // Lookup's tokens judged as if drawn from a distribution (here uniform): accepted at
            // min(1, p / q) instead of at the target's own draw.
            broken_verifiers.emplace_back("lookahead judged as a draw", [&sp](const TokenTree & tree, const TargetLogits & l, Rng & rng, int64_t root_position) {
                TokenTree judged = tree;
                judged.q.resize(judged.size() + 1);
                for (int n = 0; n < judged.size(); ++n) {
                    if (tree.proposed_one_hot(n)) judged.q[judged.parent[n] + 1].assign(4, 0.25f);
                }
                return verify_sampled(judged, l, sp, rng, root_position);
            });
        } else {
            broken_verifiers.emplace_back("residual at depth 1 only", [&sp](const TokenTree & tree, const TargetLogits & l, Rng & rng, int64_t) {
                return residual_at_depth_one_only(tree, l, sp, rng);
            });
        }
        for (const auto & [broken_name, broken] : broken_verifiers) {
            auto [bstat, bdof] = t.chi2(*drafter, prefix, sp, joint, runs, broken);
            std::printf("[distribution] %s, broken chain verifier (%s), k=3: chi2 = %.1f (critical %.1f)\n", name, broken_name, bstat,
                        chi2_critical(bdof));
            EXPECT_GT(bstat, chi2_critical(bdof)) << broken_name;
        }
    }
}

// A draft model with a trimmed vocabulary (16 of 24 ids, scattered as a frequency-ranked file's
// are) at T > 0, chains and a tree: drafts are drawn from its softmax over those ids, and the q the
// verifier reads is that one, zero on the other ids. A verifier reading q as if the draft had kept
// some probability on the dropped ids (its softmax over the whole vocabulary, modelled by moving
// 40% of q there) must fail.
TEST(Speculative, SampledDraftsOfATrimmedDraftVocabularyFollowTheTargetDistributionAndABrokenQFails) {
    Tiny t(24);
    const std::vector<int32_t> prefix = {1, 2, 3, 1, 2};
    const std::vector<int32_t> ids = {0, 1, 2, 3, 5, 6, 8, 9, 11, 12, 14, 15, 17, 18, 20, 21};
    auto kept = [&](size_t id) { return std::binary_search(ids.begin(), ids.end(), static_cast<int32_t>(id)); };
    auto runner = std::make_shared<ModelRunner>(*t.draft, ids);
    ASSERT_EQ(std::vector<int32_t>(runner->logit_ids().begin(), runner->logit_ids().end()), ids);
    DraftModelDrafter trimmed(*t.draft, runner, std::make_unique<KvCache>(t.backend, t.draft->config(), 64));
    SamplingParams sp;
    sp.temperature = 1.0f;
    const auto joint = t.exact_joint(prefix, sp);
    const int runs = 6000;
    int drafted_outside = 0;
    auto on_round = [&](const RoundInfo & r) {
        for (int32_t tok : r.draft->tree.token) drafted_outside += !kept(static_cast<size_t>(tok));
    };
    for (const TreeBudget & tree : {TreeBudget{}, TreeBudget{TreeShape::Dynamic, 3, 2, 6}}) {
        auto [stat, dof] = t.chi2(trimmed, prefix, sp, joint, runs, nullptr, tree, on_round);
        std::printf("[distribution] trimmed draft vocabulary, %s: chi2 = %.1f, dof = %d, critical = %.1f\n", tree_shape_name(tree.shape), stat, dof,
                    chi2_critical(dof));
        EXPECT_LT(stat, chi2_critical(dof)) << tree_shape_name(tree.shape);
    }
    EXPECT_EQ(drafted_outside, 0);
    auto spread_q = [&](const TokenTree & tree, const TargetLogits & l, Rng & rng, int64_t root_position) {
        TokenTree wrong = tree;
        for (std::vector<float> & q : wrong.q) {
            if (q.empty()) continue;
            const float dropped = static_cast<float>(q.size() - ids.size());
            for (size_t i = 0; i < q.size(); ++i) q[i] = kept(i) ? 0.6f * q[i] : 0.4f / dropped;
        }
        return verify_sampled(wrong, l, sp, rng, root_position);
    };
    auto [bstat, bdof] = t.chi2(trimmed, prefix, sp, joint, runs, spread_q);
    std::printf("[distribution] trimmed draft vocabulary, q spread over the dropped ids: chi2 = %.1f (critical %.1f)\n", bstat,
                chi2_critical(bdof));
    EXPECT_GT(bstat, chi2_critical(bdof)) << "the distribution test cannot tell a q other than the one drafts were drawn from";
}

// EAGLE-1 and EAGLE-3 heads at T > 0, chains, dynamic and static trees: their drafts carry the
// head's processed distribution q, sampled without replacement, and the output must follow the
// target's law. Broken chain and tree verifiers (both tree shapes) fed the same drafts must fail.
TEST(Speculative, SampledEagleChainsAndTreesFollowTheTargetDistributionAndBrokenVerifiersFail) {
    Tiny t;
    const std::vector<int32_t> prefix = {4, 2, 3, 1, 2};
    SamplingParams sp;
    sp.temperature = 1.0f;
    const auto joint = t.exact_joint(prefix, sp);
    const int runs = 4000;
    const TreeBudget dynamic_tree{TreeShape::Dynamic, 2, 3, 9}, static_tree{TreeShape::Static, 3, 4, 12};
    auto broken_chain = [&sp](const TokenTree & tr, const TargetLogits & l, Rng & rng, int64_t) { return accept_everything(tr, l, sp, rng); };
    auto broken_tree = [&sp](const TokenTree & tr, const TargetLogits & l, Rng & rng, int64_t) { return no_residual(tr, l, sp, rng); };
    for (const std::string kind : {"eagle1", "eagle3"}) {
        auto head = EagleHead::load(test::tiny_vocab_eagle_head(kind, kTinyVocab, 303), *t.target, t.backend);
        EagleDrafter drafter(*head, 64);
        int accepted = 0;
        auto count = [&](const RoundInfo & r) { accepted += int(r.result->accepted.size()); };
        for (TreeBudget shape : {TreeBudget{}, dynamic_tree, static_tree}) {
            auto [stat, dof] = t.chi2(drafter, prefix, sp, joint, runs, nullptr, shape, count);
            std::printf("[distribution] %s %s: chi2 = %.1f, dof = %d, critical = %.1f\n", kind.c_str(), tree_shape_name(shape.shape), stat,
                        dof, chi2_critical(dof));
            EXPECT_LT(stat, chi2_critical(dof)) << kind << " " << tree_shape_name(shape.shape);
        }
        EXPECT_GT(accepted, runs / 2) << kind << ": the accept path must be exercised";
        auto [cstat, cdof] = t.chi2(drafter, prefix, sp, joint, runs, broken_chain);
        std::printf("[distribution] %s chain, verifier accepting everything: chi2 = %.1f (critical %.1f)\n", kind.c_str(), cstat,
                    chi2_critical(cdof));
        EXPECT_GT(cstat, chi2_critical(cdof)) << kind;
        for (TreeBudget shape : {dynamic_tree, static_tree}) {
            auto [tstat, tdof] = t.chi2(drafter, prefix, sp, joint, runs, broken_tree, shape);
            std::printf("[distribution] %s %s tree, verifier without residual: chi2 = %.1f (critical %.1f)\n", kind.c_str(),
                        tree_shape_name(shape.shape), tstat, chi2_critical(tdof));
            EXPECT_GT(tstat, chi2_critical(tdof)) << kind << " " << tree_shape_name(shape.shape);
        }
    }
}

// The same drafts at T > 0: the output must follow the target's law, and a verifier that accepts
// every draft must be caught.
TEST(Speculative, SampledEarlyExitDraftsFollowTheTargetDistributionAndABrokenVerifierFails) {
    Tiny t;
    const std::vector<int32_t> prefix = {4, 2, 3, 1, 2};
    SamplingParams sp;
    sp.temperature = 1.0f;
    const auto joint = t.exact_joint(prefix, sp);
    const int runs = 4000;
    auto head = EagleHead::load(test::tiny_vocab_eagle_head("eagle3", kTinyVocab, 303), *t.target, t.backend);
    test::PredictorSpec spec;
    spec.layers = {t.target->config().n_layer};
    spec.output_bias = 100.0f;
    auto predictor = ExitPredictor::load(test::write_predictor(spec, *t.target, "always_tiny"), *t.target);
    EarlyExitDrafter drafter(*t.target, *predictor, 0.5f, std::make_unique<EagleDrafter>(*head, 64), 64);
    int accepted = 0;
    auto [stat, dof] = t.chi2(drafter, prefix, sp, joint, runs, nullptr, {}, [&](const RoundInfo & r) { accepted += int(r.result->accepted.size()); });
    std::printf("[distribution] specee chain: chi2 = %.1f, dof = %d, critical = %.1f\n", stat, dof, chi2_critical(dof));
    EXPECT_LT(stat, chi2_critical(dof));
    // Measured: 137 drafts accepted over the 4000 runs (one-hot drafts, accepted with p(token)).
    EXPECT_GT(accepted, runs / 40) << "the accept path must be exercised";
    auto broken = [&sp](const TokenTree & tr, const TargetLogits & l, Rng & rng, int64_t) { return accept_everything(tr, l, sp, rng); };
    auto [bstat, bdof] = t.chi2(drafter, prefix, sp, joint, runs, broken);
    std::printf("[distribution] specee chain, verifier accepting everything: chi2 = %.1f (critical %.1f)\n", bstat, chi2_critical(bdof));
    EXPECT_GT(bstat, chi2_critical(bdof));
}

// Prompt lookup grafted into an EAGLE-3 head's dynamic trees at T > 0: the chain's first token
// goes beside the head's draws as a one-hot proposal. The output must follow the target's law;
// the same trees verified with the grafted nodes judged as head draws (against q) must fail.
TEST(Speculative, SampledTreesWithAGraftedLookupChainFollowTheTargetDistributionAndAGraftJudgedAsADrawFails) {
    Tiny t;
    const std::vector<int32_t> prefix = {4, 2, 3, 1, 2};  // lookup continues the trailing 2 with "3 1 2"
    SamplingParams sp;
    sp.temperature = 1.0f;
    const auto joint = t.exact_joint(prefix, sp);
    const int runs = 4000;
    const TreeBudget tree{TreeShape::Dynamic, 2, 3, 9};
    auto head = EagleHead::load(test::tiny_vocab_eagle_head("eagle3", kTinyVocab, 303), *t.target, t.backend);
    LookupGraftDrafter drafter(std::make_unique<EagleDrafter>(*head, 64), 1, 3);
    int one_hot_tried = 0;
    auto count = [&](const RoundInfo & r) {
        for (const VerifyEvent & e : r.result->events) one_hot_tried += e.node >= 0 && r.draft->tree.one_hot.size() > size_t(e.node) && r.draft->tree.one_hot[e.node];
    };
    auto [stat, dof] = t.chi2(drafter, prefix, sp, joint, runs, nullptr, tree, count);
    std::printf("[distribution] eagle3 dynamic + lookup: chi2 = %.1f, dof = %d, critical = %.1f; %d grafted nodes tried\n", stat, dof,
                chi2_critical(dof), one_hot_tried);
    EXPECT_LT(stat, chi2_critical(dof));
    EXPECT_GT(one_hot_tried, runs / 4);
    auto as_draws = [&sp](const TokenTree & tr, const TargetLogits & l, Rng & rng, int64_t root_position) {
        TokenTree judged = tr;
        judged.one_hot.clear();
        return verify_sampled(judged, l, sp, rng, root_position);
    };
    auto [bstat, bdof] = t.chi2(drafter, prefix, sp, joint, runs, as_draws, tree);
    std::printf("[distribution] eagle3 dynamic + lookup, grafted nodes judged as draws: chi2 = %.1f (critical %.1f)\n", bstat,
                chi2_critical(bdof));
    EXPECT_GT(bstat, chi2_critical(bdof));
}

// Proposes, after a prompt of n_prompt tokens, the next tokens of `reference` (what plain decoding
// wrote), every third round with its first token changed: drafts both accepted and refused.
class ReferenceDrafter : public Drafter {
public:
    ReferenceDrafter(std::vector<int32_t> reference, size_t n_prompt, int vocab)
        : reference_(std::move(reference)), n_prompt_(n_prompt), vocab_(vocab) {}
    const char * name() const override { return "reference"; }
    void start(const DraftRequest & request) override {
        std::vector<int32_t> chain;
        for (size_t i = request.history.size() - n_prompt_; i < reference_.size() && static_cast<int>(chain.size()) < request.budget.depth; ++i) {
            chain.push_back(reference_[i]);
        }
        if (++rounds_ % 3 == 0 && !chain.empty()) chain[0] = (chain[0] + 1) % vocab_;
        tree_ = TokenTree::chain(chain);
    }
    Draft take() override { return Draft{tree_, 0.0f, {}}; }
    void accept(const Acceptance &) override {}
    void reset() override { rounds_ = 0; }

private:
    std::vector<int32_t> reference_;
    size_t n_prompt_;
    int vocab_;
    int rounds_ = 0;
    TokenTree tree_;
};

// The token at each position is drawn at that position's keyed uniform: with a seed, drafts
// proposed one-hot (lookup, the suffix cache, a reference) change how many tokens a forward
// emits, never which. Drawn from one stream, the refused drafts' draws would shift every later one.
TEST(Speculative, ASeededSampledRunWritesPlainDecodingsTextWhateverItsOneHotDraftsWere) {
    test::Spec s;
    SamplingParams sp;
    sp.temperature = 1.0f;
    const int n = 40;
    for (uint64_t seed : {7u, 8u}) {
        sp.seed = seed;
        for (const std::vector<int32_t> & prompt : test::kPrompts) {
            const std::vector<int32_t> plain = test::plain_decoding(*s.target, s.runner, prompt, n, sp);
            ReferenceDrafter reference(plain, prompt.size(), s.target->config().n_vocab);
            NgramDrafter ngram(1, 2);
            int accepted = 0, refused = 0;
            auto count = [&](const RoundInfo & r) {
                for (const VerifyEvent & e : r.result->events) {
                    accepted += e.outcome == Outcome::Accepted;
                    refused += e.outcome == Outcome::Rejected;
                }
            };
            EXPECT_EQ(s.run(reference, DraftPolicyKind::Fixed, 3, prompt, n, sp, count), plain) << "seed " << seed;
            EXPECT_EQ(s.run(ngram, DraftPolicyKind::Fixed, 3, prompt, n, sp), plain) << "seed " << seed;
            EXPECT_GT(accepted, n / 4);
            EXPECT_GT(refused, 0);
        }
    }
}

}  // namespace
}  // namespace specula
