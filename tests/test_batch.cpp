// Several sequences in one forward: KV streams of one pool, ragged blocks, a row sees only its own
// sequence. With specula's batch-invariant kernels every sequence must get, bit for bit, what it
// gets alone; a mask that leaked another stream's slots, a wrong slot offset in the cache writes,
// or outputs split at the wrong rows would change some logits.
#include <gtest/gtest.h>

#include <cstring>

#include "specula/error.h"
#include "draft/draft_model_drafter.h"
#include "draft/ngram.h"
#include "engine/sequence.h"
#include "engine/model_bundle.h"
#include "tokenizer/tokenizer.h"
#include "runtime/kv_cache.h"
#include "runtime/backend.h"
#include "runtime/forward.h"
#include "runtime/model.h"
#include "test_models.h"

namespace specula {
namespace {

const std::vector<std::vector<int32_t>> kPrompts = {
    {1, 450, 4996, 17354, 1701, 29916},
    {1, 822, 5713, 29898, 29876, 1125, 13, 1678, 310, 526},
    {1, 29871, 29896, 29892},
    {1, 3186},
};

bool same_bits(const std::vector<float> & a, const std::vector<float> & b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// A tree block: root, two children of the root, a grandchild under the second child.
ForwardBatch tree_block(int base) {
    ForwardBatch b;
    b.tokens = {310, 526, 2253, 825};
    b.positions = {base, base + 1, base + 1, base + 2};
    b.mask = BlockMask::from_parents(std::vector<int>{-1, 0, 0, 2});
    b.logit_rows = {0, 1, 2, 3};
    return b;
}

struct Fixture {
    explicit Fixture(const char * attention = "auto") : backend(BackendOptions{"cpu", 1, parse_attention(attention)}) {}
    Backend backend;
    std::unique_ptr<Model> model = Model::load(test::model_path("llama_q8_0"), backend);
    ModelRunner runner{*model};
};

// Catches: rows of one sequence seeing another's cache or block, cache writes at the wrong stream
// offset, logits/taps handed to the wrong part.
TEST(Batch, RaggedBlocksOfSeveralSequencesGiveEachItsLogitsAloneBitForBit) {
    Fixture f;
    const int n_seq = static_cast<int>(kPrompts.size());
    auto pool = KvCache::pool(f.backend, f.model->config(), 64, n_seq);
    // Prefill all prompts in one forward (ragged chunks), then one step of mixed blocks: a tree,
    // a chain of three, a single root, and a causal chunk of two with logits for its last row only.
    std::vector<ForwardBatch> prefill(n_seq), step(n_seq);
    std::vector<ForwardOutput> out_prefill(n_seq), out_step(n_seq);
    std::vector<BatchPart> parts;
    for (int s = 0; s < n_seq; ++s) {
        prefill[s] = ForwardBatch::causal(kPrompts[s], 0, {static_cast<int32_t>(kPrompts[s].size()) - 1});
        prefill[s].tap_layers = {1};
        parts.push_back({&prefill[s], pool[s].get(), &out_prefill[s]});
    }
    f.runner.forward_parts(parts);
    step[0] = tree_block(static_cast<int>(kPrompts[0].size()));
    step[1] = ForwardBatch::causal(std::vector<int32_t>{13, 1678, 29889}, static_cast<int>(kPrompts[1].size()), {0, 1, 2});
    step[2] = ForwardBatch::causal(std::vector<int32_t>{29906}, static_cast<int>(kPrompts[2].size()), {0});
    step[3] = ForwardBatch::causal(std::vector<int32_t>{450, 4996}, static_cast<int>(kPrompts[3].size()), {1});
    parts.clear();
    for (int s = 0; s < n_seq; ++s) {
        step[s].tap_layers = {1};
        parts.push_back({&step[s], pool[s].get(), &out_step[s]});
    }
    f.runner.forward_parts(parts);

    for (int s = 0; s < n_seq; ++s) {
        SCOPED_TRACE("sequence " + std::to_string(s));
        KvCache alone(f.backend, f.model->config(), 64);
        const ForwardOutput a = f.runner.forward(prefill[s], alone);
        const ForwardOutput b = f.runner.forward(step[s], alone);
        EXPECT_TRUE(same_bits(a.logits, out_prefill[s].logits));
        EXPECT_TRUE(same_bits(a.taps.at(0), out_prefill[s].taps.at(0)));
        EXPECT_TRUE(same_bits(b.logits, out_step[s].logits));
        EXPECT_TRUE(same_bits(b.taps.at(0), out_step[s].taps.at(0)));
        EXPECT_EQ(pool[s]->size(), alone.size());
    }
}

// Catches: compaction or rollback of one stream touching another stream's slots, and reads at
// the wrong offset. Layer 0's K/V rows depend only on the token and position, so they are exact
// whatever the attention kernel; both V layouts.
class PoolLayout : public ::testing::TestWithParam<const char *> {};

TEST_P(PoolLayout, CompactingOneStreamLeavesTheOthersAndMatchesAPlainCache) {
    Fixture f(GetParam());
    auto pool = KvCache::pool(f.backend, f.model->config(), 32, 3);
    KvCache alone(f.backend, f.model->config(), 32);
    const ForwardBatch prompt = ForwardBatch::causal(kPrompts[0], 0, {});
    for (auto & s : pool) f.runner.forward(prompt, *s);
    f.runner.forward(prompt, alone);
    const int base = static_cast<int>(kPrompts[0].size());
    const std::vector<float> neighbour_before = pool[2]->read_row(0, true, base - 1);
    f.runner.forward(tree_block(base), *pool[1]);
    f.runner.forward(tree_block(base), alone);
    const std::vector<int> kept = {0, 2, 3};
    pool[1]->compact(base, kept);
    alone.compact(base, kept);
    ASSERT_EQ(pool[1]->size(), alone.size());
    for (int slot = 0; slot < alone.size(); ++slot) {
        for (bool value : {false, true}) EXPECT_EQ(pool[1]->read_row(0, value, slot), alone.read_row(0, value, slot)) << slot;
    }
    EXPECT_EQ(pool[2]->read_row(0, true, base - 1), neighbour_before);
    EXPECT_EQ(pool[0]->size(), base);
    EXPECT_EQ(pool[2]->size(), base);
}

INSTANTIATE_TEST_SUITE_P(VLayouts, PoolLayout, ::testing::Values("flash", "matmul"));

TEST(Batch, MalformedPartsAreErrors) {
    Fixture f;
    auto pool = KvCache::pool(f.backend, f.model->config(), 16, 2);
    KvCache other(f.backend, f.model->config(), 16);
    const ForwardBatch b = ForwardBatch::causal(kPrompts[2], 0, {0});
    ForwardOutput o1, o2;
    const BatchPart same_stream[2] = {{&b, pool[0].get(), &o1}, {&b, pool[0].get(), &o2}};
    EXPECT_NE(test::error_message([&] { f.runner.forward_parts(same_stream); }).find("same KV stream"), std::string::npos);
    const BatchPart two_pools[2] = {{&b, pool[0].get(), &o1}, {&b, &other, &o2}};
    EXPECT_NE(test::error_message([&] { f.runner.forward_parts(two_pools); }).find("one KV pool"), std::string::npos);
    EXPECT_EQ(pool[0]->size(), 0);  // nothing was appended
    EXPECT_NE(test::error_message([&] { KvCache::pool(f.backend, f.model->config(), 16, 0); }).find("must be positive"), std::string::npos);
}

// The step driver: speculative sequences with different drafters and prompts, stepped together in
// one forward per step, each emit exactly what they emit alone (greedy). Catches any cross-talk
// through the shared forward, the verify rows, or a drafter state shared between sequences.
TEST(Batch, SequencesSteppedTogetherEmitWhatTheyEmitAlone) {
    Fixture f;
    const int n_seq = static_cast<int>(kPrompts.size()), n_predict = 24;
    auto make_drafter = [&](int s) -> std::unique_ptr<Drafter> {
        if (s % 2 == 0) return std::make_unique<DraftModelDrafter>(*f.model, 64);
        return std::make_unique<NgramDrafter>(1, 3);
    };
    GenerationOptions o;
    o.n_predict = n_predict;
    o.stop_at_end_of_generation = false;
    auto never_end = [](int32_t) { return false; };

    std::vector<std::vector<int32_t>> alone(n_seq);
    for (int s = 0; s < n_seq; ++s) {
        KvCache cache(f.backend, f.model->config(), 64);
        auto drafter = make_drafter(s);
        auto policy = make_draft_policy(DraftPolicyKind::Fixed, 1 + s, {});
        SequenceParts parts{cache, drafter.get(), policy.get(), TreeBudget{}, nullptr, nullptr};
        generate_speculative(f.runner, parts, kPrompts[s], o, never_end, [&](int32_t t) {
            alone[s].push_back(t);
            return true;
        });
    }

    auto pool = KvCache::pool(f.backend, f.model->config(), 64, n_seq);
    std::vector<std::unique_ptr<Drafter>> drafters;
    std::vector<std::unique_ptr<DraftLengthPolicy>> policies;
    std::vector<std::unique_ptr<Sequence>> seqs;
    for (int s = 0; s < n_seq; ++s) {
        drafters.push_back(make_drafter(s));
        policies.push_back(make_draft_policy(DraftPolicyKind::Fixed, 1 + s, {}));
        // A prefill chunk of 3 so that prompt chunks and drafts share steps.
        seqs.push_back(std::make_unique<Sequence>(SequenceParts{*pool[s], drafters[s].get(), policies[s].get(), TreeBudget{}, nullptr, nullptr},
                                                  kPrompts[s], o, never_end, 3));
    }
    std::vector<std::vector<int32_t>> together(n_seq);
    for (;;) {
        std::vector<Sequence *> active;
        std::vector<int> index;
        for (int s = 0; s < n_seq; ++s) {
            if (!seqs[s]->done()) {
                active.push_back(seqs[s].get());
                index.push_back(s);
            }
        }
        if (active.empty()) break;
        std::vector<char> prefilling;
        for (Sequence * a : active) prefilling.push_back(a->prefilling());
        const StepResult step = step_sequences(f.runner, active, [&](size_t i, int32_t t) {
            together[index[i]].push_back(t);
            return true;
        });
        // The policies price drafts by the verify rows alone: a prompt chunk is not one.
        int verify_rows = 0;
        bool chunks = false;
        for (size_t k = 0; k < active.size(); ++k) {
            if (prefilling[k]) EXPECT_EQ(active[k]->last_rows(), 0);
            else verify_rows += active[k]->last_rows();
            chunks = chunks || prefilling[k];
        }
        EXPECT_EQ(step.verify_rows, verify_rows);
        if (chunks) EXPECT_GT(step.rows, step.verify_rows);
        else EXPECT_EQ(step.rows, step.verify_rows);
    }
    for (int s = 0; s < n_seq; ++s) {
        EXPECT_EQ(together[s], alone[s]) << "sequence " << s;
        EXPECT_EQ(static_cast<int>(alone[s].size()), n_predict);
    }
}

// Batched drafting: the drafters of one group (a server's slots) share a runner and a KV pool,
// and a step runs their forwards together, one per tree level. Catches: a group member drafting
// from another's cache stream or features (its drafts would differ from the sequence's drafts
// alone: the kernels are batch-invariant and the tree size is fixed), and drafts that stopped
// being batched (a forward per sequence per level).
TEST(Batch, ADrafterGroupDraftsInOneForwardPerLevelAndEachSequenceEmitsWhatItEmitsAlone) {
    for (const DrafterSpec & spec : {DrafterSpec{DrafterKind::DraftModel, test::shipped_model("specula-draft.gguf"), 1, 3},
                                     DrafterSpec{DrafterKind::Eagle3, test::shipped_model("specula-eagle3.gguf"), 1, 3}}) {
        SCOPED_TRACE(drafter_kind_name(spec.kind));
        EngineOptions o;
        o.model_path = test::shipped_model("specula-target.gguf");
        o.drafter = spec;
        o.draft_policy = DraftPolicyKind::Fixed;
        o.draft_max = 4;
        o.tree = TreeShape::Dynamic;  // a tree for both: levels of several nodes
        o.tree_depth = 4;
        o.tree_nodes = 8;
        o.n_ctx = 128;
        o.n_threads = 1;
        auto target = ModelBundle::open(o);
        const std::vector<std::string> prompts = {"def main():\n    parser = argparse.", "import os\nimport sys\n",
                                                  "class Stack:\n    def push(self, item):", "The list of"};
        const int n = static_cast<int>(prompts.size());
        GenerationOptions g;
        g.n_predict = 24;
        g.stop_at_end_of_generation = false;
        auto never_end = [](int32_t) { return false; };
        std::vector<std::vector<int32_t>> tokens(n), alone(n), together(n);
        std::vector<std::vector<std::vector<int32_t>>> drafts_alone(n), drafts_together(n);  // per round, the tree's tokens
        for (int i = 0; i < n; ++i) tokens[i] = target->tokenizer->tokenize(prompts[i]);

        int alone_forwards = 0;
        for (int i = 0; i < n; ++i) {
            auto cache = KvCache::pool(*target->backend, target->model->config(), o.n_ctx, 1);
            auto drafter = target->make_drafter(o.n_ctx);
            auto record = [&, i](const RoundInfo & r) { drafts_alone[i].push_back(r.draft->tree.token); };
            Sequence seq(SequenceParts{*cache[0], drafter.get(), nullptr, target->tree, record, nullptr}, tokens[i], g, never_end);
            Sequence * const one[1] = {&seq};
            while (!seq.done()) {
                alone_forwards += step_sequences(*target->runner, one, [&](size_t, int32_t t) {
                                      alone[i].push_back(t);
                                      return true;
                                  }).draft_forwards;
            }
        }

        auto caches = KvCache::pool(*target->backend, target->model->config(), o.n_ctx, n);
        auto drafters = target->make_drafters(o.n_ctx, n);
        std::vector<std::unique_ptr<Sequence>> seqs;
        for (int i = 0; i < n; ++i) {
            auto record = [&, i](const RoundInfo & r) { drafts_together[i].push_back(r.draft->tree.token); };
            seqs.push_back(std::make_unique<Sequence>(SequenceParts{*caches[i], drafters[i].get(), nullptr, target->tree, record, nullptr},
                                                      tokens[i], g, never_end));
        }
        int together_forwards = 0, shared_steps = 0;
        for (;;) {
            std::vector<Sequence *> active;
            std::vector<int> index;
            for (int i = 0; i < n; ++i) {
                if (!seqs[i]->done()) active.push_back(seqs[i].get()), index.push_back(i);
            }
            if (active.empty()) break;
            const StepResult step = step_sequences(*target->runner, active, [&](size_t k, int32_t t) {
                together[index[k]].push_back(t);
                return true;
            });
            together_forwards += step.draft_forwards;
            shared_steps += step.drafting >= 2;
            EXPECT_LE(step.draft_forwards, o.tree_depth) << "a forward per tree level, whatever the number of sequences";
        }
        for (int i = 0; i < n; ++i) {
            EXPECT_EQ(together[i], alone[i]) << "sequence " << i;
            EXPECT_EQ(drafts_together[i], drafts_alone[i]) << "sequence " << i;
        }
        EXPECT_GT(shared_steps, 0);
        EXPECT_LT(together_forwards * 2, alone_forwards);
    }
}

// The server's speculation gate (policy/speculation_gate.h) turns drafting off for whole windows of
// steps. Catches: a gated step that still drafts, and a drafter that loses its place over the
// rounds it did not draft (an EAGLE head must catch up on every token verified meanwhile, from the
// target's features, or its later drafts are garbage and, worse, its cache holds stale rows).
TEST(Batch, StepsThatMayNotDraftDraftNothingAndLaterDraftsStillHold) {
    EngineOptions o;
    o.model_path = test::shipped_model("specula-target.gguf");
    o.drafter = DrafterSpec{DrafterKind::Eagle3, test::shipped_model("specula-eagle3.gguf"), 1, 3};
    o.draft_policy = DraftPolicyKind::Fixed;
    o.draft_max = 3;
    o.tree = TreeShape::Chain;
    o.n_ctx = 128;
    o.n_threads = 1;
    auto target = ModelBundle::open(o);
    const std::vector<std::string> prompts = {"def main():\n    parser = argparse.", "import os\nimport sys\n", "The list of"};
    const int n = static_cast<int>(prompts.size());
    GenerationOptions g;
    g.n_predict = 40;
    g.stop_at_end_of_generation = false;
    auto never_end = [](int32_t) { return false; };
    auto policy = [&] { return make_draft_policy(DraftPolicyKind::Fixed, o.draft_max, {}); };

    std::vector<std::vector<int32_t>> plain(n), gated(n);
    for (int i = 0; i < n; ++i) {
        const std::vector<int32_t> tokens = target->tokenizer->tokenize(prompts[i]);
        auto cache = KvCache::pool(*target->backend, target->model->config(), o.n_ctx, 1);
        Sequence seq(SequenceParts{*cache[0], nullptr, nullptr, target->tree, nullptr, nullptr}, tokens, g, never_end);
        Sequence * const one[1] = {&seq};
        while (!seq.done()) step_sequences(*target->runner, one, [&](size_t, int32_t t) { return plain[i].push_back(t), true; });
    }

    auto caches = KvCache::pool(*target->backend, target->model->config(), o.n_ctx, n);
    auto drafters = target->make_drafters(o.n_ctx, n);
    std::vector<std::unique_ptr<DraftLengthPolicy>> policies;
    std::vector<std::unique_ptr<Sequence>> seqs;
    for (int i = 0; i < n; ++i) {
        policies.push_back(policy());
        seqs.push_back(std::make_unique<Sequence>(SequenceParts{*caches[i], drafters[i].get(), policies[i].get(), target->tree, nullptr, nullptr},
                                                  target->tokenizer->tokenize(prompts[i]), g, never_end));
    }
    int step_no = 0, drafting_steps = 0, accepted_after_gap = 0;
    for (;; ++step_no) {
        std::vector<Sequence *> active;
        std::vector<int> index;
        for (int i = 0; i < n; ++i) {
            if (!seqs[i]->done()) active.push_back(seqs[i].get()), index.push_back(i);
        }
        if (active.empty()) break;
        const bool may_draft = (step_no / 4) % 2 == 1;  // windows of 4 steps: plain, drafting, plain, ...
        std::vector<int> accepted_before(active.size());
        std::vector<char> decoding(active.size());
        for (size_t k = 0; k < active.size(); ++k) {
            accepted_before[k] = active[k]->stats().speculation.accepted;
            decoding[k] = !active[k]->prefilling();
        }
        const StepResult step = step_sequences(
            *target->runner, active, [&](size_t k, int32_t t) {
                gated[index[k]].push_back(t);
                return true;
            },
            {}, may_draft);
        if (!may_draft) {
            EXPECT_EQ(step.drafting, 0) << "step " << step_no;
            for (size_t k = 0; k < active.size(); ++k) {
                if (decoding[k]) {
                    EXPECT_EQ(active[k]->last_rows(), 1) << "step " << step_no << ": a gated sequence verifies its root alone";
                }
            }
        } else {
            drafting_steps += step.drafting > 0;
            for (size_t k = 0; k < active.size(); ++k) accepted_after_gap += active[k]->stats().speculation.accepted - accepted_before[k];
        }
    }
    for (int i = 0; i < n; ++i) EXPECT_EQ(gated[i], plain[i]) << "sequence " << i;
    EXPECT_GT(drafting_steps, 3);
    // The trained head drafts these prompts well; after catching up it still does.
    EXPECT_GT(accepted_after_gap, drafting_steps);
}

}  // namespace
}  // namespace specula
