// Prompt lookup and grammar-forced text grafted into a model drafter's trees: what is grafted and when, how often lookup's
// chains hold, its chain verified in rounds without a model draft, and the defaults.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>
#include <thread>
#include <vector>

#include "draft/lookup_graft.h"
#include "draft/ngram.h"
#include "draft/suffix_cache.h"
#include "engine/drafter_factory.h"
#include "sample/logits_state.h"
#include "speculative_run.h"

namespace specula {
namespace {

using test::FixedTreeDrafter;
using test::plain_decoding;

// Catches: the lookup continuation not grafted (or grafted as a duplicate of a child the model
// already proposed), grafted nodes without a path probability below their parent's, or, at T > 0,
// a chain merged into the model's draws or not flagged one-hot (the verifier would judge it
// against the model's q).
TEST(Speculative, LookupGraftAddsThePromptContinuationToTheModelsTree) {
    TokenTree model_tree;
    const int a = model_tree.add(TokenTree::kRoot, 7, std::log(0.6f));
    model_tree.add(TokenTree::kRoot, 9, std::log(0.3f));
    model_tree.add(a, 8, std::log(0.4f));
    // "5 6 7 8 4 3 ... 5 6": lookup continues the trailing "5 6" with "7 8 4 3".
    const std::vector<int32_t> history = {5, 6, 7, 8, 4, 3, 1, 5, 6};
    auto drafter = LookupGraftDrafter(std::make_unique<FixedTreeDrafter>(model_tree), 1, 3);
    EXPECT_STREQ(drafter.name(), "fixed+lookup");
    SamplingParams greedy;
    drafter.start(DraftRequest{history, TreeBudget{TreeShape::Dynamic, 4, 2, 4}, &greedy, nullptr});
    Draft grafted = drafter.take();
    const TokenTree t = grafted.tree;
    ASSERT_EQ(t.size(), 5);  // a chain of 4 (the round's nodes): 7 and 8 were the model's; 4 and 3 are new, below 8
    EXPECT_EQ(grafted.grafted_from, 3);
    EXPECT_EQ(t.token[3], 4);
    EXPECT_EQ(t.parent[3], 2);
    EXPECT_EQ(t.token[4], 3);
    EXPECT_EQ(t.parent[4], 3);
    EXPECT_EQ(t.depth[4], 4);
    // Before any chain was checked against the text, each step is priced at the prior.
    EXPECT_FLOAT_EQ(t.logp[3], t.logp[2] + std::log(float(LookupGraftDrafter::kPriorStepProb)));
    EXPECT_FLOAT_EQ(t.logp[4], t.logp[3] + std::log(float(LookupGraftDrafter::kPriorStepProb)));
    // Pruned, the grafted nodes stay a suffix and grafted_from follows them.
    prune_draft(grafted, 4);  // path probabilities 7: 0.6, 8: 0.4, 9: 0.3, 4: 0.2, 3: 0.1
    EXPECT_EQ(grafted.tree.token, (std::vector<int32_t>{7, 9, 8, 4}));
    EXPECT_EQ(grafted.grafted_from, 3);
    prune_draft(grafted, 2);
    EXPECT_EQ(grafted.tree.token, (std::vector<int32_t>{7, 8}));
    EXPECT_EQ(grafted.grafted_from, -1);
    // A continuation the model did not propose at all becomes a new child of the root.
    TokenTree other;
    other.add(TokenTree::kRoot, 9, std::log(0.9f));
    EXPECT_EQ(graft_chain(other, std::vector<int32_t>{7, 8}, std::vector<float>{std::log(0.5f), std::log(0.5f)}), 2);
    EXPECT_EQ(other.children(TokenTree::kRoot), (std::vector<int>{0, 1}));
    EXPECT_FLOAT_EQ(other.logp[1], std::log(0.5f));
    // A path both propose is priced by the likelier estimate, and the continuation below it too.
    TokenTree doubted;
    doubted.add(TokenTree::kRoot, 7, std::log(0.1f));
    EXPECT_EQ(graft_chain(doubted, std::vector<int32_t>{7, 8}, std::vector<float>{std::log(0.8f), std::log(0.5f)}), 1);
    EXPECT_FLOAT_EQ(doubted.logp[0], std::log(0.8f));
    EXPECT_FLOAT_EQ(doubted.logp[1], std::log(0.8f) + std::log(0.5f));

    // At T > 0 the chain goes beside the model's draws (children drawn from its q), never into
    // them: a token no draw proposes becomes a one-hot node of its own, which the verifier tries
    // after the draws. A draw of the chain's token, accepted, takes the text where the chain goes:
    // the chain goes on below that draw (through its child 8, which has no q: merged), and gets no
    // one-hot copy beside it, which the verifier would refuse after the draw's rejection.
    TokenTree drawn = model_tree;
    drawn.q = {std::vector<float>(10, 0.1f)};
    SamplingParams sampled;
    sampled.temperature = 1.0f;
    auto sampling_drafter = LookupGraftDrafter(std::make_unique<FixedTreeDrafter>(drawn), 1, 3);
    sampling_drafter.start(DraftRequest{history, TreeBudget{TreeShape::Dynamic, 4, 2, 8}, &sampled, nullptr});
    Draft below_draw = sampling_drafter.take();
    ASSERT_EQ(below_draw.grafted_from, 3);
    ASSERT_EQ(below_draw.tree.size(), 8);
    // lookup's chain: 7 8 4 3 1 5 6. Below the drawn 7 (node 0) and its 8 (node 2): 4 3 1 5 6.
    EXPECT_EQ(std::vector<int32_t>(below_draw.tree.token.begin() + 3, below_draw.tree.token.end()), (std::vector<int32_t>{4, 3, 1, 5, 6}));
    EXPECT_EQ(below_draw.tree.parent[3], 2);
    EXPECT_FLOAT_EQ(below_draw.tree.logp[2], std::log(0.4f));  // the likelier estimate: the model's 0.4 over the chain's 0.6 x 0.5
    EXPECT_EQ(std::count(below_draw.tree.one_hot.begin(), below_draw.tree.one_hot.end(), 1), 0) << "a one-hot copy of the drawn 7";
    // "5 6 4 3 1 5 6": lookup continues with 4, which no draw proposes: the one-hot 4 beside the
    // draws at the root, the rest of the chain below it.
    const std::vector<int32_t> history_4 = {5, 6, 4, 3, 1, 5, 6};
    auto beside_drafter = LookupGraftDrafter(std::make_unique<FixedTreeDrafter>(drawn), 1, 3);
    beside_drafter.start(DraftRequest{history_4, TreeBudget{TreeShape::Dynamic, 4, 2, 8}, &sampled, nullptr});
    Draft beside = beside_drafter.take();
    ASSERT_EQ(beside.grafted_from, 3);
    ASSERT_EQ(beside.tree.size(), 8);  // 4 3 1 5 6 after the model's 3
    const int one_hot = 3;
    EXPECT_EQ(beside.tree.token[one_hot], 4);
    EXPECT_EQ(beside.tree.parent[one_hot], TokenTree::kRoot);
    EXPECT_TRUE(beside.tree.proposed_one_hot(one_hot));
    EXPECT_FALSE(beside.tree.proposed_one_hot(0));
    EXPECT_EQ(beside.tree.token[one_hot + 1], 3);
    EXPECT_EQ(beside.tree.parent[one_hot + 1], one_hot);
    // Pruned (path probabilities 7: 0.6, the grafted 4: 0.5, 8: 0.4, 9: 0.3, the rest lower), the
    // grafted node keeps its flag and needs none of the model's draws beside it.
    prune_draft(beside, 2);
    EXPECT_EQ(beside.tree.token, (std::vector<int32_t>{7, 4}));
    EXPECT_EQ(beside.tree.parent, (std::vector<int>{TokenTree::kRoot, TokenTree::kRoot}));
    EXPECT_TRUE(beside.tree.proposed_one_hot(1));
    EXPECT_EQ(beside.grafted_from, 1);
}

// Logit processing that forces a fixed continuation (a grammar's, without a vocabulary).
class ForcingState : public LogitsState {
public:
    explicit ForcingState(std::vector<int32_t> forced) : forced_(std::move(forced)) {}
    std::unique_ptr<LogitsState> clone() const override { return std::make_unique<ForcingState>(forced_); }
    void apply_values(std::span<float>) const override {}
    void apply_bans(std::span<float>) const override {}
    bool allows(int32_t) const override { return true; }
    void accept(int32_t) override {}
    std::vector<int32_t> forced_tokens(int max_tokens) const override {
        return {forced_.begin(), forced_.begin() + std::min<size_t>(forced_.size(), static_cast<size_t>(max_tokens))};
    }

private:
    std::vector<int32_t> forced_;
};

// Catches: the text a grammar forces not grafted (or lookup's chain grafted in its place), its
// tokens priced like lookup's instead of at kForcedStepProb, deeper than the round's nodes, or
// missing from the free draft of rounds without a model draft.
TEST(Speculative, GrammarForcedTokensAreGraftedBeforeLookupsContinuation) {
    TokenTree model_tree;
    model_tree.add(TokenTree::kRoot, 7, std::log(0.6f));
    const std::vector<int32_t> history = {5, 6, 7, 8, 4, 3, 1, 5, 6};  // lookup would continue "7 8 4 3"
    SamplingParams greedy;
    const ForcingState forcing({2, 9, 11});
    DraftRequest request{history, TreeBudget{TreeShape::Dynamic, 4, 2, 3}, &greedy, nullptr, &forcing};
    auto drafter = LookupGraftDrafter(std::make_unique<FixedTreeDrafter>(model_tree), 1, 3);
    drafter.start(request);
    const Draft grafted = drafter.take();
    ASSERT_EQ(grafted.grafted_from, 1);
    EXPECT_EQ(grafted.tree.token, (std::vector<int32_t>{7, 2, 9, 11}));
    EXPECT_EQ(grafted.tree.parent, (std::vector<int>{TokenTree::kRoot, TokenTree::kRoot, 1, 2}));
    const float step = std::log(float(LookupGraftDrafter::kForcedStepProb));
    EXPECT_FLOAT_EQ(grafted.tree.logp[2] - grafted.tree.logp[1], step);
    EXPECT_FLOAT_EQ(grafted.tree.logp[3] - grafted.tree.logp[2], step);

    request.budget = TreeBudget{TreeShape::Dynamic, 4, 2, 2};  // two nodes a round: two forced tokens
    const Draft alone = drafter.free_draft(request);
    EXPECT_EQ(alone.tree.token, (std::vector<int32_t>{2, 9}));
    EXPECT_EQ(alone.grafted_from, 0);

    const ForcingState nothing({});
    request.processing = &nothing;  // nothing forced: lookup's continuation
    EXPECT_EQ(drafter.free_draft(request).tree.token, (std::vector<int32_t>{7, 8}));
}

// Catches: lookup's step probabilities not learned from the text that followed its chains (a
// chain that keeps holding priced like one that never does), learned past a chain's first
// mismatch, or a free draft (the lookup chain alone, for rounds without a model draft) that
// differs from lookup's continuation or is not offered at T > 0.
TEST(Speculative, LookupGraftLearnsHowOftenItsChainsHoldAndDraftsThemAlone) {
    SamplingParams greedy;
    const TreeBudget depth3{TreeShape::Dynamic, 3, 2, 3};  // lookup's chain: as many tokens as the round's nodes
    // A text of period 5: lookup's continuation always holds.
    std::vector<int32_t> periodic = {5, 6, 7, 8, 9, 5, 6};
    LookupGraftDrafter holds(std::make_unique<FixedTreeDrafter>(TokenTree{}), 1, 3);
    for (int round = 0; round < 20; ++round) {
        const TokenTree chain = holds.free_draft(DraftRequest{periodic, depth3, &greedy, nullptr}).tree;
        ASSERT_EQ(chain.size(), 3);
        for (int i = 0; i < 3; ++i) {
            EXPECT_EQ(chain.token[i], periodic[periodic.size() - 5 + i]);
            EXPECT_EQ(chain.parent[i], i - 1);
            EXPECT_FLOAT_EQ(chain.logp[i], (i > 0 ? chain.logp[i - 1] : 0.0f) + std::log(float(holds.step_prob(i + 1))));
        }
        periodic.insert(periodic.end(), chain.token.begin(), chain.token.end());
    }
    for (int depth = 1; depth <= 3; ++depth) EXPECT_GT(holds.step_prob(depth), 0.9) << depth;
    // The tree policy will scale path probabilities by its calibration: lookup's own leave the root divided by it.
    TreeBudget calibrated = depth3;
    calibrated.calibration = 0.5f;
    const TokenTree halved = holds.free_draft(DraftRequest{periodic, calibrated, &greedy, nullptr}).tree;
    ASSERT_EQ(halved.size(), 3);
    EXPECT_FLOAT_EQ(halved.logp[0], std::log(float(holds.step_prob(1)) / 0.5f));
    EXPECT_FLOAT_EQ(halved.logp[1], halved.logp[0] + std::log(float(holds.step_prob(2))));
    // Each root is searched once, kMaxDepth deep, and the whole chain is checked against the text:
    // steps deeper than a round's nodes are learned too.
    EXPECT_GT(holds.step_prob(4), 0.9);

    // A text that never goes on as lookup proposes: the first step falls, deeper ones are never reached.
    LookupGraftDrafter fails(std::make_unique<FixedTreeDrafter>(TokenTree{}), 1, 3);
    const std::vector<int32_t> base = {5, 6, 7, 8, 9, 5, 6};
    for (int round = 0; round < 20; ++round) {
        ASSERT_EQ(fails.free_draft(DraftRequest{base, depth3, &greedy, nullptr}).tree.size(), 3);
        std::vector<int32_t> went_on = base;
        went_on.push_back(42);
        EXPECT_TRUE(fails.free_draft(DraftRequest{went_on, depth3, &greedy, nullptr}).tree.empty());  // no earlier "42"
    }
    EXPECT_LT(fails.step_prob(1), 0.1);
    EXPECT_DOUBLE_EQ(fails.step_prob(2), LookupGraftDrafter::kPriorStepProb);
    fails.reset();
    EXPECT_DOUBLE_EQ(fails.step_prob(1), LookupGraftDrafter::kPriorStepProb);

    // At T > 0 too: the chain alone is a one-hot proposal at every node.
    SamplingParams sampled;
    sampled.temperature = 1.0f;
    const TokenTree sampled_chain = holds.free_draft(DraftRequest{base, depth3, &sampled, nullptr}).tree;
    ASSERT_EQ(sampled_chain.size(), 3);
    EXPECT_TRUE(sampled_chain.proposed_one_hot(0));
}

// Catches: lookup proposing a markup token (or the text after one), from the history or from the
// suffix cache, alone or grafted; or cutting the chain before a token that is not markup.
TEST(Speculative, PromptLookupStopsItsChainBeforeAMarkupToken) {
    const auto markup = std::make_shared<const std::vector<int32_t>>(std::vector<int32_t>{1, 2});
    const TreeBudget depth4{TreeShape::Chain, 4, 1, 4};
    auto chain_of = [&](Drafter & d, const std::vector<int32_t> & history) {
        d.start(DraftRequest{history, depth4, nullptr, nullptr});
        return d.take().tree.token;
    };
    NgramDrafter lookup(1, 3, markup), unfiltered(1, 3);
    const std::vector<int32_t> turn = {5, 6, 1, 7, 5, 6};  // "5 6" was followed by markup
    EXPECT_EQ(chain_of(unfiltered, turn), (std::vector<int32_t>{1, 7, 5, 6}));
    EXPECT_TRUE(chain_of(lookup, turn).empty());
    EXPECT_EQ(chain_of(lookup, {5, 6, 8, 9, 2, 7, 5, 6}), (std::vector<int32_t>{8, 9}));

    auto cache = std::make_shared<SuffixCache>(64, 1, 3);
    cache->add(std::vector<int32_t>{3, 4, 8, 1, 9}, "");
    ASSERT_TRUE(lookup.use_suffix_cache(cache, ""));
    EXPECT_EQ(chain_of(lookup, {0, 3, 4}), (std::vector<int32_t>{8}));
    EXPECT_EQ(cache->stats().draft_tokens, 1u);

    SamplingParams greedy;
    LookupGraftDrafter grafted(std::make_unique<FixedTreeDrafter>(TokenTree{}), 1, 3, markup);
    EXPECT_TRUE(grafted.free_draft(DraftRequest{turn, depth4, &greedy, nullptr}).tree.empty());
}

// 48 greedy tokens of speculative decoding, and its rounds without a model draft (the decision's
// reason says so) and with one.
struct FreeRounds {
    std::vector<int32_t> tokens;
    int free_rounds = 0, free_accepted = 0, model_rounds = 0;
};
FreeRounds run_counting_free_rounds(ModelRunner & runner, KvCache & cache, Drafter & drafter, DraftLengthPolicy & policy,
                                    const TreeBudget & shape, TreeSizePolicy * tree_size, std::span<const int32_t> prompt) {
    FreeRounds run;
    SequenceParts parts{cache, &drafter, &policy, shape,
                        [&](const RoundInfo & r) {
                            const bool free = r.decision.why.rfind("no model draft", 0) == 0;
                            run.free_rounds += free;
                            run.model_rounds += !free && r.draft->tree.size() > 0;
                            if (free) run.free_accepted += static_cast<int>(r.result->accepted.size());
                        },
                        nullptr, tree_size};
    GenerationOptions o;
    o.n_predict = 48;
    o.stop_at_end_of_generation = false;
    generate_speculative(
        runner, parts, prompt, o, [](int32_t) { return false; }, [&](int32_t t) {
        run.tokens.push_back(t);
        return true; });
    return run;
}

// A model drafter too slow to ever pay: the tree policy stops drafting with it after its first round.
class SlowTreeDrafter : public FixedTreeDrafter {
public:
    using FixedTreeDrafter::FixedTreeDrafter;
    void start(const DraftRequest &) override { std::this_thread::sleep_for(std::chrono::milliseconds(50)); }
};

// Catches: rounds where the tree policy drafts no model tree (its drafter is far too slow to pay)
// not offering the drafter's free draft, so that a text repeating itself gets no lookup chain
// verified; or a free draft changing the greedy text. The bundled trained target continues a
// repeated token pattern, which lookup proposes.
TEST(Speculative, RoundsWithoutAModelDraftStillVerifyTheLookupChain) {
    Backend backend{BackendOptions{"cpu", 1}};
    const auto target = Model::load(test::shipped_model("specula-target.gguf"), backend);
    ModelRunner runner(*target);
    std::vector<int32_t> prompt = {1};
    for (int i = 0; i < 6; ++i) prompt.insert(prompt.end(), {450, 4996, 17354, 1701, 822, 5713, 13});
    for (auto & t : prompt) t %= target->config().n_vocab;
    const auto want = plain_decoding(*target, runner, prompt, 48);
    TokenTree guess;
    guess.add(TokenTree::kRoot, want[0], 0.0f);
    LookupGraftDrafter drafter(std::make_unique<SlowTreeDrafter>(guess), 1, 3);
    std::vector<double> curve;
    for (int b = 1; b <= 17; ++b) curve.push_back(1.0 + 0.1 * (b - 1));
    TreeSizePolicy tree_size(curve);
    auto policy = make_draft_policy(DraftPolicyKind::Fixed, 4, std::vector<double>(5, 1.0));
    KvCache cache(backend, target->config(), 256);
    const FreeRounds run = run_counting_free_rounds(runner, cache, drafter, *policy, TreeBudget{TreeShape::Dynamic, 6, 2, 16}, &tree_size, prompt);
    const auto & [got, free_rounds, free_accepted, model_rounds] = run;
    EXPECT_EQ(got, want);
    EXPECT_EQ(model_rounds, 1);
    EXPECT_GT(free_accepted, 16) << free_rounds << " rounds without a model draft";
}

// Catches: prompt lookup not grafted by default into the trees the tree policy sizes, or on by
// default for chains and fixed-size trees; an explicit --lookup / --no-lookup not obeyed, or an
// explicit --lookup on chains that no policy would weigh (fixed, heuristic) silently ignored.
TEST(Speculative, PromptLookupIsOnByDefaultForPolicySizedTreesAndAskedForChains) {
    EngineOptions o;
    EXPECT_TRUE(drafting_rules(o, DrafterKind::Eagle3).lookup);
    EXPECT_TRUE(drafting_rules(o, DrafterKind::Eagle).lookup);
    EXPECT_FALSE(drafting_rules(o, DrafterKind::DraftModel).lookup);  // a chain by default
    EXPECT_FALSE(drafting_rules(o, DrafterKind::Ngram).lookup);
    o.tree = TreeShape::Dynamic;
    EXPECT_TRUE(drafting_rules(o, DrafterKind::DraftModel).lookup);
    o.tree_nodes = 8;
    EXPECT_FALSE(drafting_rules(o, DrafterKind::Eagle3).lookup);
    o.drafter.lookup = true;
    EXPECT_TRUE(drafting_rules(o, DrafterKind::Eagle3).lookup);
    o.tree_nodes = 0;
    o.drafter.lookup.reset();
    o.tree = TreeShape::Chain;
    EXPECT_FALSE(drafting_rules(o, DrafterKind::Eagle3).lookup);
    o.drafter.lookup = true;
    EXPECT_TRUE(drafting_rules(o, DrafterKind::DraftModel).lookup);  // under the cost policy
    o.drafter.lookup.reset();
    o.draft_policy = DraftPolicyKind::Heuristic;
    EXPECT_FALSE(drafting_rules(o, DrafterKind::Eagle3).lookup);
    EXPECT_FALSE(drafting_rules(o, DrafterKind::DraftModel).lookup);
    o.drafter.lookup = true;
    try {
        drafting_rules(o, DrafterKind::DraftModel);
        ADD_FAILURE() << "--lookup on chains under the heuristic policy was accepted";
    } catch (const Error & e) {
        EXPECT_NE(std::string(e.what()).find("--draft-policy cost"), std::string::npos) << e.what();
    }
    o.draft_policy = DraftPolicyKind::Cost;
    o.drafter.lookup = false;
    EXPECT_FALSE(drafting_rules(o, DrafterKind::Eagle3).lookup);
}

// A chain drafter too slow to pay once timed: it proposes the text's next token after 30 ms.
class SlowChainDrafter : public Drafter {
public:
    // text: what follows a prompt of prompt_size tokens.
    SlowChainDrafter(std::vector<int32_t> text, size_t prompt_size) : text_(std::move(text)), prompt_size_(prompt_size) {}
    const char * name() const override { return "slow-chain"; }
    void start(const DraftRequest & request) override {
        std::this_thread::sleep_for(std::chrono::milliseconds(30));
        draft_ = Draft{};
        const size_t at = request.history.size() - prompt_size_;
        if (at < text_.size()) draft_.tree.add(TokenTree::kRoot, text_[at], 0.0f);
    }
    Draft take() override { return std::move(draft_); }
    void accept(const Acceptance &) override {}
    void reset() override {}

private:
    std::vector<int32_t> text_;
    size_t prompt_size_;
    Draft draft_;
};

// Catches: chain rounds under the cost policy never verifying lookup's free chain where the model's
// chain costs more than it gives, so that a text repeating itself is drafted by the slow model (or
// decoded plainly); or a free chain changing the greedy text.
TEST(Speculative, ChainRoundsVerifyTheLookupChainWhereTheModelsChainCostsMore) {
    Backend backend{BackendOptions{"cpu", 1}};
    const auto target = Model::load(test::shipped_model("specula-target.gguf"), backend);
    ModelRunner runner(*target);
    std::vector<int32_t> prompt = {1};
    for (int i = 0; i < 6; ++i) prompt.insert(prompt.end(), {450, 4996, 17354, 1701, 822, 5713, 13});
    for (auto & t : prompt) t %= target->config().n_vocab;
    const auto want = plain_decoding(*target, runner, prompt, 48);
    LookupGraftDrafter drafter(std::make_unique<SlowChainDrafter>(want, prompt.size()), 1, 3);
    auto policy = make_draft_policy(DraftPolicyKind::Cost, 4, std::vector<double>{1.0, 1.1, 1.2, 1.3, 1.4});
    KvCache cache(backend, target->config(), 256);
    const FreeRounds run = run_counting_free_rounds(runner, cache, drafter, *policy, TreeBudget{}, nullptr, prompt);
    const auto & [got, free_rounds, free_accepted, model_rounds] = run;
    EXPECT_EQ(got, want);
    EXPECT_LE(model_rounds, 3) << "the slow model kept drafting";
    EXPECT_GT(free_accepted, 16) << free_rounds << " rounds verified lookup's chain";
}

// Catches: a suffix cache that grows past its bound (or keeps the index entries of evicted
// sequences, so that a lookup reads a freed sequence), a continuation taken from an older
// sequence than the latest holding the n-gram, or one running past its sequence's end.
TEST(SuffixCache, KeepsAtMostItsTokensEvictingTheOldestSequencesAndContinuesTheLatest) {
    SuffixCache cache(10, 1, 3);
    cache.add(std::vector<int32_t>{1, 2, 3, 4, 5}, "");
    cache.add(std::vector<int32_t>{7, 2, 3, 9}, "");
    EXPECT_EQ(cache.continuation(std::vector<int32_t>{2, 3}, 8, ""), (std::vector<int32_t>{9}));  // the latest, to its end
    EXPECT_EQ(cache.continuation(std::vector<int32_t>{1, 2, 3}, 2, ""), (std::vector<int32_t>{4, 5}));
    EXPECT_TRUE(cache.continuation(std::vector<int32_t>{5}, 4, "").empty());           // nothing after it
    EXPECT_TRUE(cache.continuation(std::vector<int32_t>{9, 2, 3, 4}, 4, "").empty());  // longer than n_max
    EXPECT_EQ(cache.stats().tokens, 9u);
    cache.add(std::vector<int32_t>{8, 1, 2, 6}, "");  // 13 tokens: the first sequence goes
    const SuffixCache::Stats s = cache.stats();
    EXPECT_EQ(s.tokens, 8u);
    EXPECT_EQ(s.sequences, 2u);
    EXPECT_EQ(s.evicted, 1u);
    EXPECT_TRUE(cache.continuation(std::vector<int32_t>{4}, 4, "").empty());
    EXPECT_TRUE(cache.continuation(std::vector<int32_t>{1, 2, 3}, 4, "").empty());
    EXPECT_EQ(cache.continuation(std::vector<int32_t>{1, 2}, 4, ""), (std::vector<int32_t>{6}));
    EXPECT_EQ(cache.continuation(std::vector<int32_t>{3}, 4, ""), (std::vector<int32_t>{9}));
    // A sequence longer than the cache is kept by its last tokens, alone.
    std::vector<int32_t> long_text(25);
    for (int i = 0; i < 25; ++i) long_text[i] = 100 + i;
    cache.add(long_text, "");
    EXPECT_EQ(cache.stats().tokens, 10u);
    EXPECT_EQ(cache.stats().sequences, 1u);
    EXPECT_EQ(cache.continuation(std::vector<int32_t>{115}, 2, ""), (std::vector<int32_t>{116, 117}));
    EXPECT_TRUE(cache.continuation(std::vector<int32_t>{114}, 2, "").empty());
    EXPECT_THROW(SuffixCache(0, 1, 3), Error);
    EXPECT_THROW(SuffixCache(10, 2, 1), Error);
}

// Catches: a lookup that finds another scope's sequence (a server's other tenant or cache salt),
// or a scope's latest place of an n-gram lost to another scope's later one.
TEST(SuffixCache, ALookupFindsOnlyTheSequencesOfItsScope) {
    SuffixCache cache(64, 1, 3);
    cache.add(std::vector<int32_t>{1, 2, 3, 4}, "a");
    cache.add(std::vector<int32_t>{1, 2, 3, 5}, "b");
    EXPECT_EQ(cache.continuation(std::vector<int32_t>{2, 3}, 4, "a"), (std::vector<int32_t>{4}));
    EXPECT_EQ(cache.continuation(std::vector<int32_t>{2, 3}, 4, "b"), (std::vector<int32_t>{5}));
    EXPECT_TRUE(cache.continuation(std::vector<int32_t>{2, 3}, 4, "").empty());
    EXPECT_TRUE(cache.continuation(std::vector<int32_t>{2, 3}, 4, "a\n").empty());
    NgramDrafter drafter(1, 3);
    auto shared = std::make_shared<SuffixCache>(64, 1, 3);
    shared->add(std::vector<int32_t>{7, 8, 9}, "a");
    ASSERT_TRUE(drafter.use_suffix_cache(shared, "b"));
    const TreeBudget depth4{TreeShape::Chain, 4, 1, 4};
    drafter.start(DraftRequest{std::vector<int32_t>{0, 7, 8}, depth4, nullptr, nullptr});
    EXPECT_TRUE(drafter.take().tree.empty());
    drafter.use_suffix_cache(shared, "a");
    drafter.start(DraftRequest{std::vector<int32_t>{0, 7, 8}, depth4, nullptr, nullptr});
    EXPECT_EQ(drafter.take().tree.token, (std::vector<int32_t>{9}));
}

// Catches: the n-gram drafter not consulting the cache where the history holds no match (or
// consulting it before a longer match of the history), and its counts of cache drafts and of
// their tokens the next round accepted; the graft consulting it at T > 0.
TEST(SuffixCache, TheNgramDrafterDraftsFromEarlierSequencesWhereTheHistoryHasNoMatch) {
    auto cache = std::make_shared<SuffixCache>(64, 1, 3);
    cache->add(std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7}, "");
    NgramDrafter drafter(1, 3);
    ASSERT_TRUE(drafter.use_suffix_cache(cache, ""));
    const TreeBudget depth4{TreeShape::Chain, 4, 1, 4};
    std::vector<int32_t> history = {9, 1, 2, 3};
    drafter.start(DraftRequest{history, depth4, nullptr, nullptr});
    EXPECT_EQ(drafter.take().tree.token, (std::vector<int32_t>{4, 5, 6, 7}));
    EXPECT_EQ(cache->stats().drafts, 1u);
    EXPECT_EQ(cache->stats().draft_tokens, 4u);
    // The round accepted 4 and 5, then the target said 8: two accepted tokens.
    history.insert(history.end(), {4, 5, 8});
    drafter.start(DraftRequest{history, depth4, nullptr, nullptr});
    EXPECT_TRUE(drafter.take().tree.empty());  // "5 8", "8": nowhere
    EXPECT_EQ(cache->stats().accepted_tokens, 2u);
    // The history's own trigram match comes first.
    const std::vector<int32_t> repeats = {2, 3, 4, 0, 2, 3, 4};
    drafter.start(DraftRequest{repeats, depth4, nullptr, nullptr});
    EXPECT_EQ(drafter.take().tree.token, (std::vector<int32_t>{0, 2, 3, 4}));
    EXPECT_EQ(cache->stats().drafts, 1u);
    // Through the graft at T = 0; sampled, the graft reads the history alone: which rounds the
    // model drafter draws in follows lookup's chains, and a seeded request's text must not depend
    // on other requests.
    LookupGraftDrafter grafted(std::make_unique<FixedTreeDrafter>(TokenTree{}), 1, 3);
    ASSERT_TRUE(grafted.use_suffix_cache(cache, ""));
    SamplingParams greedy, sampled;
    sampled.temperature = 1.0f;
    const std::vector<int32_t> asks = {9, 5, 6};
    EXPECT_TRUE(grafted.free_draft(DraftRequest{asks, depth4, &sampled, nullptr}).tree.empty());
    const std::vector<int32_t> asks_again = {9, 5, 6, 0, 5, 6};  // a new root: searched again
    EXPECT_EQ(grafted.free_draft(DraftRequest{asks_again, depth4, &greedy, nullptr}).tree.token, (std::vector<int32_t>{0, 5, 6}));
    const std::vector<int32_t> other = {8, 5, 6};
    EXPECT_EQ(grafted.free_draft(DraftRequest{other, depth4, &greedy, nullptr}).tree.token, (std::vector<int32_t>{7}));
}

}  // namespace
}  // namespace specula
