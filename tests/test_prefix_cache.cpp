// The prefix cache: a sequence that starts on a cache (and a drafter) holding a prefix of its
// prompt emits what it emits cold, token for token, with the same drafts round by round; the
// server's slots keep their prefixes and route requests to them; Engine::generate keeps its last
// conversation. Every comparison is against a cold run of the same request.
#include <gtest/gtest.h>

#include <chrono>

#include "draft/eagle_drafter.h"
#include "engine/model_bundle.h"
#include "engine/sequence.h"
#include "policy/catch_up_gate.h"
#include "runtime/eagle_head.h"
#include "runtime/kv_cache.h"
#include "runtime/model.h"
#include "server/prefix_store.h"
#include "server/scheduler.h"
#include "server/slot_prefix.h"
#include "specee_predictor.h"
#include "test_models.h"
#include "tokenizer/tokenizer.h"

namespace specula {
namespace {

constexpr int kCtx = 256;
// The draft model's greedy sequence on the test's prompt, stopped by its client after this many
// tokens, stops inside a block of accepted drafts (checked below).
constexpr int kStopInsideABlock = 16;

EngineOptions bundle_options(DrafterKind kind) {
    EngineOptions o;
    o.model_path = test::shipped_model("specula-target.gguf");
    if (kind == DrafterKind::DraftModel) {
        o.drafter = {DrafterKind::DraftModel, test::shipped_model("specula-draft.gguf")};
        o.tree = TreeShape::Chain;
    } else if (kind == DrafterKind::Eagle3) {
        o.drafter = DrafterSpec{DrafterKind::Eagle3, test::shipped_model("specula-eagle3.gguf"), 1, 3};
        o.tree = TreeShape::Dynamic;
        o.tree_depth = 4;
        o.tree_nodes = 8;  // a fixed tree size: the drafts, and so the sampled text, depend on the seed only
    }
    o.draft_policy = DraftPolicyKind::Fixed;
    o.draft_max = 4;
    o.n_ctx = kCtx;
    o.n_threads = 1;
    return o;
}

using test::fixed_length_options;

struct SequenceRun {
    std::vector<int32_t> tokens;
    std::vector<std::vector<int32_t>> drafts;  // per round, the verified tree's tokens
    std::vector<int32_t> history;
    int n_exact = 0, n_cached = 0, cache_rows = 0;
    int draft_forwards = 0;
};

// One sequence on `cache` and `drafter` as they are; `stop_after` > 0: the client goes away after
// that many tokens (the sink refuses the next one), else it runs to n_predict.
// `gate`: the request's catch-up gate (none: the drafter always catches up).
SequenceRun run(ModelBundle & t, KvCache & cache, Drafter * drafter, std::span<const int32_t> prompt, const GenerationOptions & g, int stop_after = 0,
                CatchUpGate * gate = nullptr) {
    SequenceRun r;
    auto record = [&](const RoundInfo & info) { r.drafts.push_back(info.draft->tree.token); };
    const RoundPolicies policies = t.make_round_policies(GenerationMode::Speculative);
    SequenceParts parts = t.sequence_parts(GenerationMode::Speculative, cache, drafter, policies.length.get(), policies.tree_size.get(), record);
    parts.catch_up = gate;
    Sequence seq(
        parts, prompt, g, [](int32_t) { return false; }, 16);
    Sequence * const one[1] = {&seq};
    while (!seq.done()) {
        step_sequences(*t.runner, one, [&](size_t, int32_t tok) {
            if (stop_after > 0 && static_cast<int>(r.tokens.size()) >= stop_after) return false;
            r.tokens.push_back(tok);
            return true;
        });
    }
    r.history.assign(seq.history().begin(), seq.history().end());
    r.n_exact = seq.n_exact();
    r.n_cached = seq.stats().n_cached;
    r.cache_rows = cache.size();
    r.draft_forwards = seq.stats().speculation.draft_forwards;
    return r;
}

// Cuts `cache` to the common prefix of what it holds (`held`, its first n_exact tokens) and `prompt`.
void keep_common(KvCache & cache, const SequenceRun & held, std::span<const int32_t> prompt) {
    const size_t n = common_prefix(std::span(held.history).first(held.n_exact), prompt.first(prompt.size() - 1));
    cache.rollback(static_cast<int>(n));
}

std::vector<int32_t> next_turn(ModelBundle & t, std::span<const int32_t> history, size_t keep, const std::string & more) {
    std::vector<int32_t> p(history.begin(), history.begin() + std::min(keep, history.size()));
    const std::vector<int32_t> extra = t.tokenizer->tokenize(more, false);
    p.insert(p.end(), extra.begin(), extra.end());
    return p;
}

// Catches: a drafter whose state is not rolled back to the common prefix (the draft model's rows
// of the previous reply, an EAGLE head's entries or pending features past it), a target cache cut
// at the wrong row, a sequence that prefills the cached prefix again or skips a row, and rows of
// a request that stopped inside an accepted block (they are past its last emitted token) or went
// away mid-block taken as the next turn's. Turn 2 on the warm cache must equal turn 2 cold: the
// same tokens and the same drafts in every round, at T = 0 and seeded at T = 0.8.
TEST(PrefixCache, TheNextTurnOnTheCacheEqualsItColdRoundByRound) {
    for (DrafterKind kind : {DrafterKind::DraftModel, DrafterKind::Eagle3}) {
        auto t = ModelBundle::open(bundle_options(kind));
        const std::vector<int32_t> prompt = t->tokenizer->tokenize("def main():\n    parser = argparse.");
        for (float temperature : {0.0f, 0.8f}) {
            for (int stop_after : {0, 3, kStopInsideABlock}) {  // 0: ends by length; else the client goes away after that many tokens
                SCOPED_TRACE(std::string(drafter_kind_name(kind)) + " T=" + std::to_string(temperature) + " stop_after=" + std::to_string(stop_after));
                auto caches = KvCache::pool(*t->backend, t->model->config(), kCtx, 2);
                auto warm_drafter = t->make_drafter(kCtx);
                const SequenceRun turn1 = run(*t, *caches[0], warm_drafter.get(), prompt, fixed_length_options(24, temperature), stop_after);
                const std::vector<int32_t> prompt2 = next_turn(*t, turn1.history, turn1.history.size(), "\n    args = parser");
                keep_common(*caches[0], turn1, prompt2);
                const SequenceRun warm = run(*t, *caches[0], warm_drafter.get(), prompt2, fixed_length_options(24, temperature, 9));
                auto cold_drafter = t->make_drafter(kCtx);
                const SequenceRun cold = run(*t, *caches[1], cold_drafter.get(), prompt2, fixed_length_options(24, temperature, 9));
                EXPECT_EQ(warm.tokens, cold.tokens);
                EXPECT_EQ(warm.drafts, cold.drafts);
                EXPECT_GE(warm.n_cached, static_cast<int>(prompt.size()) - 1);  // an EAGLE head re-reads the last common position
                EXPECT_EQ(cold.n_cached, 0);
            }
        }
    }
}

// The stop inside an accepted block that the test above relies on (a client gone, an end token, a
// stop string: -n never cuts a block, drafts are sized to the tokens left): a sequence that ended
// there holds rows past its last token, which n_exact leaves out.
TEST(PrefixCache, ASequenceStoppedInsideAnAcceptedBlockHoldsRowsPastItsHistory) {
    auto t = ModelBundle::open(bundle_options(DrafterKind::DraftModel));
    const std::vector<int32_t> prompt = t->tokenizer->tokenize("def main():\n    parser = argparse.");
    auto cache = KvCache::pool(*t->backend, t->model->config(), kCtx, 1);
    auto drafter = t->make_drafter(kCtx);
    const SequenceRun r = run(*t, *cache[0], drafter.get(), prompt, fixed_length_options(30, 0.0f), kStopInsideABlock);
    EXPECT_GT(r.cache_rows, static_cast<int>(r.history.size())) << "no longer stopped inside an accepted block: pick another stop";
    EXPECT_EQ(r.n_exact, static_cast<int>(r.history.size()));
}

// Catches: a request the catch-up gate keeps out that still runs its draft model (over the whole
// prompt: the pass the gate exists to save), one that emits other tokens than a drafting request,
// and a gate never told what requests cost (it would let every request draft).
TEST(CatchUpGate, AKeptOutRequestRunsNoDrafterForwardAndEmitsWhatADraftingOneEmits) {
    auto t = ModelBundle::open(bundle_options(DrafterKind::DraftModel));
    std::string source;
    for (int i = 0; i < 12; ++i) source += "def f" + std::to_string(i) + "(x):\n    return x + " + std::to_string(i) + "\n";
    const std::vector<int32_t> prompt = t->tokenizer->tokenize(source);
    ASSERT_GT(static_cast<int>(prompt.size()), CatchUpGate::kMinTimedLag);
    auto caches = KvCache::pool(*t->backend, t->model->config(), kCtx, 2);
    // A plain token priced at almost nothing: once measured, no reply can pay for a catch-up.
    CatchUpGate gate(1e-6);
    auto first_drafter = t->make_drafter(kCtx);
    const SequenceRun first = run(*t, *caches[0], first_drafter.get(), prompt, fixed_length_options(8, 0.0f), 0, &gate);
    EXPECT_GT(first.draft_forwards, 0) << "nothing measured yet: the first request drafts";
    EXPECT_GT(gate.catch_up_ms_per_token(), 0.0);
    EXPECT_GT(gate.ms_per_token(true), 0.0);
    EXPECT_DOUBLE_EQ(gate.mean_reply(), 8.0);
    auto second_drafter = t->make_drafter(kCtx);
    const SequenceRun second = run(*t, *caches[1], second_drafter.get(), prompt, fixed_length_options(8, 0.0f), 0, &gate);
    EXPECT_EQ(second.draft_forwards, 0);
    EXPECT_EQ(second.tokens, first.tokens);
    EXPECT_GT(gate.ms_per_token(false), 0.0);
}

// Catches: an EAGLE head whose prompt window moved between turns (a cold start keeps the last
// prompt_window positions) keeping entries a cold start would not have, or sliding them to the
// wrong slots; and a head whose window starts before its entries (a shorter next prompt) kept
// instead of rebuilt from the target's prefill.
TEST(PrefixCache, AnEagleHeadSlidesItsPromptWindowAsAColdStartWould) {
    auto t = ModelBundle::open(bundle_options(DrafterKind::Eagle3));
    constexpr int kWindow = 12;
    const std::vector<int32_t> prompt = t->tokenizer->tokenize("import os\nimport sys\nimport json\n");
    for (float temperature : {0.0f, 0.8f}) {
        SCOPED_TRACE("T=" + std::to_string(temperature));
        auto caches = KvCache::pool(*t->backend, t->model->config(), kCtx, 2);
        EagleDrafter warm_head(*t->drafter.head, kCtx, kWindow);
        const SequenceRun turn1 = run(*t, *caches[0], &warm_head, prompt, fixed_length_options(10, temperature));
        const std::vector<int32_t> prompt2 = next_turn(*t, turn1.history, turn1.history.size(), "\nimport re\nimport time");
        keep_common(*caches[0], turn1, prompt2);
        const SequenceRun warm = run(*t, *caches[0], &warm_head, prompt2, fixed_length_options(20, temperature, 9));
        EXPECT_GT(warm.n_cached, kWindow);  // the window moved on: its entries slid, not rebuilt
        EagleDrafter cold_head(*t->drafter.head, kCtx, kWindow);
        const SequenceRun cold = run(*t, *caches[1], &cold_head, prompt2, fixed_length_options(20, temperature, 9));
        EXPECT_EQ(warm.tokens, cold.tokens);
        EXPECT_EQ(warm.drafts, cold.drafts);

        // A third prompt that leaves the second early and is shorter: its window starts before
        // the head's entries.
        const std::vector<int32_t> prompt3 = next_turn(*t, prompt2, prompt.size() + 2, " x");
        keep_common(*caches[0], warm, prompt3);
        const SequenceRun warm3 = run(*t, *caches[0], &warm_head, prompt3, fixed_length_options(20, temperature, 4));
        caches[1]->rollback(0);
        const SequenceRun cold3 = run(*t, *caches[1], &cold_head, prompt3, fixed_length_options(20, temperature, 4));
        EXPECT_EQ(warm3.tokens, cold3.tokens);
        EXPECT_EQ(warm3.drafts, cold3.drafts);
    }
}

TEST(PrefixCache, AFreeSlotIsChosenByItsLongestCommonPrefixThenLeastRecentlyUsed) {
    SlotPrefix a{{1, 2, 3, 4}, nullptr, 5}, b{{1, 2, 9}, nullptr, 6}, c{{}, nullptr, 3}, d{{7}, nullptr, 2}, e{{1, 5, 6, 7, 8, 9}, nullptr, 1};
    const std::vector<const SlotPrefix *> slots = {&a, &b, &c, &d, &e};
    const std::vector<int32_t> prompt = {1, 2, 3, 8, 8, 8};
    EXPECT_EQ(choose_slot(slots, std::vector<char>{1, 1, 1, 1, 1}, prompt, ""), 0);
    EXPECT_EQ(choose_slot(slots, std::vector<char>{0, 1, 1, 1, 1}, prompt, ""), 1) << "2 of its 3 tokens";
    EXPECT_EQ(choose_slot(slots, std::vector<char>{0, 0, 1, 1, 1}, prompt, ""), 4) << "no match (1 shared token is none): the least recently used";
    EXPECT_EQ(choose_slot(slots, std::vector<char>{0, 0, 1, 1, 0}, prompt, ""), 3);
    EXPECT_EQ(choose_slot(slots, std::vector<char>{0, 0, 0, 0, 0}, prompt, ""), -1);
    const SlotPrefix tie1{{1, 2, 3}, nullptr, 9}, tie2{{1, 2, 3, 5}, nullptr, 4};
    EXPECT_EQ(choose_slot(std::vector<const SlotPrefix *>{&tie1, &tie2}, std::vector<char>{1, 1}, prompt, ""), 1) << "a tie: the least recently used";
}

std::string drain(Job & job) {
    std::string text;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    for (Job::Wait w; (w = job.next(text)) != Job::Wait::Ended;) {
        if (std::chrono::steady_clock::now() > deadline) {
            ADD_FAILURE() << "the job did not end";
            job.cancel();
            break;
        }
    }
    EXPECT_EQ(job.result().error, "");
    return text;
}

// Catches: a server that prefills every request cold, that routes a conversation's next turn to
// another slot than the one holding its prefix, or whose reused slot changes the text (T = 0 and
// seeded T > 0, a draft model drafting), and cached tokens not reported or not counted.
TEST(PrefixCache, AServerSlotServesTheNextTurnFromItsCacheAsCold) {
    for (float temperature : {0.0f, 0.8f}) {
        SCOPED_TRACE("T=" + std::to_string(temperature));
        auto t = ModelBundle::open(bundle_options(DrafterKind::DraftModel));
        Scheduler warm(*t, SchedulerOptions{3, 8, 16, false});
        const std::string turn1 = "User: name three fruits\nAssistant:";
        auto first = warm.submit(t->tokenizer->tokenize(turn1), fixed_length_options(12, temperature));
        const std::string reply = drain(*first);
        auto other = warm.submit(t->tokenizer->tokenize("The list of"), fixed_length_options(6, temperature));  // another slot's prefix
        drain(*other);
        const std::vector<int32_t> prompt2 = t->tokenizer->tokenize(turn1 + reply + "\nUser: and three more\nAssistant:");
        auto second = warm.submit(prompt2, fixed_length_options(16, temperature, 3));
        const std::string warm_text = drain(*second);
        EXPECT_GT(second->result().stats.n_cached, static_cast<int>(t->tokenizer->tokenize(turn1).size()) / 2);
        EXPECT_EQ(warm.metrics().prompt_tokens_cached, static_cast<uint64_t>(second->result().stats.n_cached));

        Scheduler cold(*t, SchedulerOptions{1, 8, 16, false});
        auto alone = cold.submit(prompt2, fixed_length_options(16, temperature, 3));
        EXPECT_EQ(warm_text, drain(*alone));
        EXPECT_EQ(alone->result().stats.n_cached, 0);
    }
}

// Catches: a lossy SpecEE request's rows (skipped layers' K/V filled from the exit state, not the
// target's) served to a later request, from the slot or the prefix store: the plain request after
// it on the one slot must start cold, and another conversation taking the slot stores nothing.
TEST(PrefixCache, ALossySpecEERequestsRowsAreNeverReused) {
    EngineOptions o;
    o.model_path = test::model_path("gemma3_swa_q8_0");
    o.n_ctx = 192;
    o.n_threads = 1;
    const auto model_only = ModelBundle::open(o);
    o.drafter = {DrafterKind::Eagle3, test::eagle_head_path("eagle3", "gemma3_swa_q8_0")};
    o.draft_policy = DraftPolicyKind::Fixed;
    o.draft_max = 4;
    test::PredictorSpec spec;
    spec.layers = {1, 3};
    o.specee_path = test::write_predictor(spec, *model_only->model, "prefix_cache_" + std::to_string(::getpid()));
    auto t = ModelBundle::open(o);
    Scheduler scheduler(*t, SchedulerOptions{1, 4, 16, false});
    const std::vector<int32_t> prompt = t->tokenizer->tokenize("The following example shows");
    auto lossy = scheduler.submit(prompt, fixed_length_options(8, 0.0f), EarlyExitRequest{EarlyExitMode::Lossy, 0.4f});
    drain(*lossy);
    auto other = scheduler.submit(t->tokenizer->tokenize("Once upon a time"), fixed_length_options(4, 0.0f));  // takes the slot
    drain(*other);
    EXPECT_EQ(scheduler.metrics().prefix_store.entries, 0u) << "the lossy request's rows went to the prefix store";
    auto plain = scheduler.submit(prompt, fixed_length_options(8, 0.0f));
    drain(*plain);
    EXPECT_EQ(plain->result().stats.n_cached, 0);
    auto again = scheduler.submit(prompt, fixed_length_options(8, 0.0f));  // after an exact request, the prefix is reused
    drain(*again);
    EXPECT_GE(again->result().stats.n_cached, static_cast<int>(prompt.size()) - 2);  // the EAGLE-3 head re-reads one position
}

// Catches: rows saved or loaded at the wrong stream offset, layer or channel (a transposed V's
// columns), or converted on the way: a stream loaded from saved rows reads back every K and V
// row bit for bit, and holds exactly the saved slots.
TEST(PrefixStore, KvRowsSavedToHostLoadBackBitExact) {
    auto t = ModelBundle::open(bundle_options(DrafterKind::None));
    auto caches = KvCache::pool(*t->backend, t->model->config(), kCtx, 3);
    const std::vector<int32_t> prompt = t->tokenizer->tokenize("User: name three fruits\nAssistant:");
    run(*t, *caches[1], nullptr, prompt, fixed_length_options(6, 0.0f));
    const int n = caches[1]->size();
    ASSERT_GT(n, 4);
    const KvCache::HostRows rows = caches[1]->save_rows(n);
    EXPECT_EQ(rows.f16.size() * sizeof(uint16_t), caches[1]->row_bytes(n));
    caches[2]->load_rows(rows);
    ASSERT_EQ(caches[2]->size(), n);
    for (int layer = 0; layer < caches[1]->n_layers(); ++layer) {
        for (int slot = 0; slot < n; ++slot) {
            for (bool value : {false, true}) {
                ASSERT_EQ(caches[2]->read_row(layer, value, slot), caches[1]->read_row(layer, value, slot))
                    << "layer " << layer << (value ? " V" : " K") << " slot " << slot;
            }
        }
    }
    EXPECT_THROW(caches[1]->save_rows(n + 1), Error);
    KvCache::HostRows torn = rows;
    torn.f16.pop_back();
    EXPECT_THROW(caches[2]->load_rows(torn), Error);
}

KvCache::HostRows fake_rows(int n, size_t values_per_token) { return {n, std::vector<uint16_t>(n * values_per_token, 7)}; }

// Catches: a store that grows past its bound, evicts the most recently used entry (a found one
// counts as used), keeps an entry larger than the bound, or keeps both a prefix and its extension.
TEST(PrefixStore, StaysWithinItsBoundEvictingTheLeastRecentlyUsed) {
    constexpr size_t kValues = 10;                 // 20 row bytes + 4 token bytes per token
    PrefixStore store(3 * 8 * (kValues * 2 + 4));  // three 8-token entries
    auto tokens = [](int32_t first, int n) {
        std::vector<int32_t> v(n);
        for (int i = 0; i < n; ++i) v[i] = first + i;
        return v;
    };
    for (int32_t first : {100, 200, 300}) {
        store.put(tokens(first, 8), fake_rows(8, kValues), "");
        EXPECT_LE(store.stats().bytes, 3 * 8 * (kValues * 2 + 4));
    }
    EXPECT_EQ(store.stats().entries, 3u);
    const auto hit = store.find(tokens(100, 12), 0, "");  // 100's entry becomes the most recently used
    ASSERT_TRUE(hit);
    EXPECT_EQ(hit->n, 8u);
    EXPECT_FALSE(store.find(tokens(200, 12), 8, "")) << "no longer than what the slot holds";
    store.put(tokens(400, 8), fake_rows(8, kValues), "");
    EXPECT_LE(store.stats().bytes, 3 * 8 * (kValues * 2 + 4));
    EXPECT_EQ(store.stats().evictions, 1u);
    EXPECT_TRUE(store.find(tokens(100, 8), 0, ""));
    EXPECT_FALSE(store.find(tokens(200, 8), 0, "")) << "the least recently used was evicted";
    EXPECT_TRUE(store.find(tokens(300, 8), 0, ""));
    store.put(tokens(0, 100), fake_rows(100, kValues), "");  // larger than the bound: not kept
    EXPECT_EQ(store.stats().entries, 3u);
    store.put(tokens(300, 9), fake_rows(9, kValues), "");  // extends 300's entry: replaces it, and 400's is the least recently used
    EXPECT_LE(store.stats().bytes, 3 * 8 * (kValues * 2 + 4));
    EXPECT_EQ(store.stats().entries, 2u);
    EXPECT_EQ(store.stats().evictions, 2u);
    EXPECT_FALSE(store.find(tokens(400, 8), 0, ""));
    EXPECT_EQ(store.find(tokens(300, 12), 0, "")->n, 9u);
    EXPECT_EQ(store.stats().hits, 4u);
}

// Catches: a request given another tenant's (or cache salt's) slot for its prefix, or served
// another scope's rows from the prefix store, which would make the cache an oracle of other
// clients' prompts.
TEST(PrefixCache, OnlyARequestOfTheSameScopeReusesASlotOrAStoredPrefix) {
    const SlotPrefix mine{{1, 2, 3, 4}, nullptr, 5, "key 1\n"}, theirs{{1, 2, 3, 4, 5}, nullptr, 6, "key 2\n"};
    const std::vector<const SlotPrefix *> slots = {&mine, &theirs};
    const std::vector<int32_t> prompt = {1, 2, 3, 4, 5, 6};
    EXPECT_EQ(choose_slot(slots, std::vector<char>{1, 1}, prompt, "key 1\n"), 0);
    EXPECT_EQ(choose_slot(slots, std::vector<char>{1, 1}, prompt, "key 2\n"), 1);
    EXPECT_EQ(choose_slot(slots, std::vector<char>{0, 1}, prompt, "key 1\n"), 1) << "free, though nothing of it is reused";
    EXPECT_EQ(choose_slot(slots, std::vector<char>{1, 1}, prompt, "key 1\nsalt"), 0) << "no match anywhere: the least recently used";
    PrefixStore store(1 << 20);
    store.put(std::vector<int32_t>{1, 2, 3, 4}, fake_rows(4, 10), "key 2\n");
    EXPECT_FALSE(store.find(prompt, 0, "key 1\n"));
    EXPECT_FALSE(store.find(prompt, 0, "key 2\nsalt"));
    ASSERT_TRUE(store.find(prompt, 0, "key 2\n"));
    EXPECT_EQ(store.find(prompt, 0, "key 2\n")->n, 4u);
    store.put(std::vector<int32_t>{1, 2, 3}, fake_rows(3, 10), "key 1\n");  // a prefix of another scope's entry is kept
    EXPECT_EQ(store.stats().entries, 2u);
    EXPECT_EQ(store.find(prompt, 0, "key 1\n")->n, 3u);
}

// Catches: a slot's history lost when another conversation takes it (the next turn prefilled
// cold), rows restored at the wrong length, a drafter not rebuilt from them as a cold start would
// (the draft model's cache, the EAGLE-3 head's window), and store hits not counted as cached.
// With one slot and two alternating conversations, each one's turn 2 comes from the store and
// equals the same turn served cold.
TEST(PrefixStore, AlternatingConversationsOnOneSlotResumeFromTheStoreAsCold) {
    for (DrafterKind kind : {DrafterKind::DraftModel, DrafterKind::Eagle3}) {
        SCOPED_TRACE(drafter_kind_name(kind));
        EngineOptions o = bundle_options(kind);
        o.n_ctx = 2048;  // EAGLE-3's head rebuilds its 512-token prompt window: the store serves what lies before it
        auto t = ModelBundle::open(o);
        std::string filler_a, filler_b;
        for (int i = 0; kind == DrafterKind::Eagle3 && i < 240; ++i) filler_a += "import os\n", filler_b += "x = 1\n";
        const std::string a1 = filler_a + "User: name three fruits\nAssistant:", b1 = filler_b + "def main():\n    print(";
        if (kind == DrafterKind::Eagle3) {
            ASSERT_GT(t->tokenizer->tokenize(a1).size(), 600u);
        }
        Scheduler warm(*t, SchedulerOptions{1, 8, 64, false});
        auto first_a = warm.submit(t->tokenizer->tokenize(a1), fixed_length_options(8, 0.0f));
        const std::string reply_a = drain(*first_a);
        auto first_b = warm.submit(t->tokenizer->tokenize(b1), fixed_length_options(8, 0.0f));
        const std::string reply_b = drain(*first_b);
        EXPECT_EQ(warm.metrics().prefix_store.entries, 1u) << "A's rows, saved when B took the slot";
        const std::vector<int32_t> a2 = t->tokenizer->tokenize(a1 + reply_a + "\nUser: and three more\nAssistant:");
        const std::vector<int32_t> b2 = t->tokenizer->tokenize(b1 + reply_b + ")\n    return 0");
        auto second_a = warm.submit(a2, fixed_length_options(12, 0.0f));
        const std::string warm_a = drain(*second_a);
        auto second_b = warm.submit(b2, fixed_length_options(12, 0.0f));
        const std::string warm_b = drain(*second_b);
        // Past a shared BOS: the turn before, or for EAGLE-3 what lies before its prompt window.
        auto restored = [&](size_t n_turn1, size_t n_turn2) {
            return static_cast<int>(kind == DrafterKind::Eagle3 ? n_turn2 - 1 - EagleDrafter::kPromptWindow : n_turn1 / 2);
        };
        EXPECT_GE(second_a->result().stats.n_cached, restored(t->tokenizer->tokenize(a1).size(), a2.size()));
        EXPECT_GE(second_b->result().stats.n_cached, restored(t->tokenizer->tokenize(b1).size(), b2.size()));
        const SchedulerMetrics m = warm.metrics();
        EXPECT_EQ(m.prefix_store.hits, 2u);
        int n_cached = 0;
        for (const auto & job : {first_a, first_b, second_a, second_b}) n_cached += job->result().stats.n_cached;
        EXPECT_EQ(m.prompt_tokens_cached, static_cast<uint64_t>(n_cached));

        Scheduler cold(*t, SchedulerOptions{1, 8, 64, false});
        auto alone_a = cold.submit(a2, fixed_length_options(12, 0.0f));
        EXPECT_EQ(warm_a, drain(*alone_a));
        EXPECT_EQ(alone_a->result().stats.n_cached, 0);
        auto alone_b = cold.submit(b2, fixed_length_options(12, 0.0f));
        EXPECT_EQ(warm_b, drain(*alone_b));
    }
}

// Catches: Engine::generate prefilling the conversation again each call, or a second call whose
// reused KV and drafter state change its text.
TEST(PrefixCache, EngineGenerateReusesItsLastConversation) {
    for (DrafterKind kind : {DrafterKind::None, DrafterKind::DraftModel, DrafterKind::Eagle3}) {
        SCOPED_TRACE(drafter_kind_name(kind));
        auto warm = Engine::open(bundle_options(kind));
        std::vector<int32_t> prompt = warm->tokenize("User: hello\nAssistant:");
        std::vector<int32_t> reply;
        warm->generate(prompt, fixed_length_options(10, 0.0f), [&](int32_t tok) { return reply.push_back(tok), true; });
        prompt.insert(prompt.end(), reply.begin(), reply.end());
        const std::vector<int32_t> more = warm->tokenize("\nUser: again\nAssistant:");
        prompt.insert(prompt.end(), more.begin() + 1, more.end());  // without its BOS
        std::vector<int32_t> warm_reply, cold_reply;
        const GenerationStats stats = warm->generate(prompt, fixed_length_options(16, 0.8f), [&](int32_t tok) { return warm_reply.push_back(tok), true; });
        auto cold = Engine::open(bundle_options(kind));
        cold->generate(prompt, fixed_length_options(16, 0.8f), [&](int32_t tok) { return cold_reply.push_back(tok), true; });
        EXPECT_EQ(warm_reply, cold_reply);
        EXPECT_GT(stats.n_cached, 8);
    }
}

// Catches: choices that do not follow seed + i, a further choice that prefills the prompt again
// instead of taking the first one's rows and drafter state (its cached tokens would be 0), or
// whose copied rows or drafter state differ from its own prefill (its text would differ from the
// same request alone), with a draft model and an EAGLE-3 head; an n-choice request waits for n
// free slots (one is busy when it arrives); more choices than the slots and the queue hold are refused.
TEST(PrefixCache, NChoicesPrefillThePromptOnceAndChoiceIEqualsTheRequestWithSeedPlusI) {
    for (DrafterKind kind : {DrafterKind::DraftModel, DrafterKind::Eagle3}) {
        SCOPED_TRACE(drafter_kind_name(kind));
        auto t = ModelBundle::open(bundle_options(kind));
        const std::vector<int32_t> prompt = t->tokenizer->tokenize("def main():\n    parser = argparse.");
        std::vector<std::string> alone(3);
        {
            Scheduler cold(*t, SchedulerOptions{1, 8, 16, false});
            for (int i = 0; i < 3; ++i) alone[i] = drain(*cold.submit(prompt, fixed_length_options(16, 0.8f, 40 + i)));
        }
        Scheduler scheduler(*t, SchedulerOptions{3, 8, 4, false});
        auto busy = scheduler.submit(t->tokenizer->tokenize("The list of"), fixed_length_options(24, 0.0f));
        const std::vector<std::shared_ptr<Job>> choices = scheduler.submit_choices(prompt, fixed_length_options(16, 0.8f, 40), 3);
        ASSERT_EQ(choices.size(), 3u);
        for (int i = 0; i < 3; ++i) {
            EXPECT_EQ(drain(*choices[i]), alone[i]) << "choice " << i;
            EXPECT_EQ(choices[i]->result().stats.n_cached, i == 0 ? 0 : static_cast<int>(prompt.size()) - 1) << "choice " << i;
        }
        EXPECT_NE(alone[0], alone[1]);
        drain(*busy);
        EXPECT_NE(test::error_message([&] { scheduler.submit_choices(prompt, fixed_length_options(4, 0.8f), 12); }), "<no error>");
    }
}

}  // namespace
}  // namespace specula
