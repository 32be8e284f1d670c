#pragma once
// Speculative generation on the small test models, for the tests of speculation: Spec runs a
// drafter against a target and returns its tokens, Tiny computes the exact law of a tiny-vocabulary
// target's first tokens and a chi-square of speculative runs against it.
#include <cmath>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "draft/drafter.h"
#include "engine/generate.h"
#include "engine/sequence.h"
#include "policy/draft_length.h"
#include "policy/tree_size.h"
#include "runtime/backend.h"
#include "runtime/forward.h"
#include "runtime/kv_cache.h"
#include "runtime/model.h"
#include "sample/sampler.h"
#include "distribution.h"
#include "test_models.h"

namespace specula::test {

inline const std::vector<std::vector<int32_t>> kPrompts = {
    {1, 450, 4996, 17354, 1701, 29916},
    {1, 822, 5713, 29898, 29876, 1125, 13, 1678},
    {1, 29871, 29896, 29892, 29871, 29906, 29892, 29871, 29941, 29892, 29871, 29896, 29892, 29871, 29906},
};

// A drafter that hands out one fixed tree: what a model drafter proposes, without a model.
class FixedTreeDrafter : public Drafter {
public:
    explicit FixedTreeDrafter(TokenTree tree) : tree_(std::move(tree)) {}
    const char * name() const override { return "fixed"; }
    void start(const DraftRequest &) override {}
    Draft take() override { return Draft{tree_, 0.0f, {}}; }
    void accept(const Acceptance &) override {}
    void reset() override {}

private:
    TokenTree tree_;
};

// Plain decoding's n tokens after the prompt: greedy, or sampled by `sp` with its seed.
inline std::vector<int32_t> plain_decoding(const Model & model, ModelRunner & runner, std::span<const int32_t> prompt, int n,
                                           const SamplingParams & sp = {}) {
    KvCache cache(model.backend(), model.config(), 256);
    std::vector<int32_t> out;
    GenerationOptions o;
    o.n_predict = n;
    o.sampling = sp;
    o.stop_at_end_of_generation = false;
    generate_plain(
        runner, cache, prompt, o, [](int32_t) { return false; }, [&](int32_t t) {
        out.push_back(t);
        return true; });
    return out;
}

struct Spec {
    Backend backend{BackendOptions{"cpu", 1}};
    std::unique_ptr<Model> target;
    std::unique_ptr<Model> draft_small = Model::load(test::model_path("llama_draft_small"), backend);
    ModelRunner runner;
    explicit Spec(const std::string & target_name = "llama_gqa_f32")
        : target(Model::load(test::model_path(target_name), backend)), runner(*target) {}

    std::vector<int32_t> run(Drafter & drafter, DraftPolicyKind policy, int k, std::span<const int32_t> prompt, int n,
                             const SamplingParams & sp = {}, std::function<void(const RoundInfo &)> on_round = nullptr,
                             VerifyFn verify = nullptr, KvCache * cache_out = nullptr, TreeBudget tree = {},
                             TreeSizePolicy * tree_size = nullptr) {
        KvCache local(backend, target->config(), 256);
        KvCache & cache = cache_out ? *cache_out : local;
        std::vector<double> cost(k + 1);
        for (int b = 0; b <= k; ++b) cost[b] = 1.0 + 0.1 * b;
        auto pol = make_draft_policy(policy, k, cost);
        SequenceParts parts{cache, &drafter, pol.get(), tree, std::move(on_round), std::move(verify), tree_size};
        GenerationOptions o;
        o.n_predict = n;
        o.sampling = sp;
        o.stop_at_end_of_generation = false;
        std::vector<int32_t> out;
        generate_speculative(
            runner, parts, prompt, o, [](int32_t) { return false; }, [&](int32_t t) {
            out.push_back(t);
            return true; });
        return out;
    }
};

// ---- Lossless sampling on a tiny vocabulary --------------------------------------------------

inline constexpr int kTinyVocab = 10;

struct Tiny {
    const int V;
    Backend backend{BackendOptions{"cpu", 1}};
    std::unique_ptr<Model> target, draft;
    ModelRunner runner;
    explicit Tiny(int n_vocab = kTinyVocab)
        : V(n_vocab),
          target(Model::load(test::tiny_vocab_model("tiny_target_v" + std::to_string(V), V, 101), backend)),
          draft(Model::load(test::tiny_vocab_model("tiny_draft_v" + std::to_string(V), V, 202), backend)),
          runner(*target) {}

    // Exact joint distribution of the first n generated tokens under the processed target,
    // indexed t1 * V^(n-1) + ... + tn.
    std::vector<double> exact_joint(std::span<const int32_t> prefix, const SamplingParams & sp, int n = 2) {
        std::vector<double> joint(static_cast<size_t>(std::pow(V, n)), 0.0);
        KvCache cache(backend, target->config(), 64);
        ForwardOutput out = runner.forward(ForwardBatch::causal(prefix, 0, {int32_t(prefix.size() - 1)}), cache);
        std::vector<float> first;
        processed_probs(out.logits_row(0), sp, first);
        std::function<void(const std::vector<float> &, double, size_t, int)> extend = [&](const std::vector<float> & p, double mass,
                                                                                          size_t index, int depth) {
            for (int32_t t = 0; t < V; ++t) {
                const double m = mass * p[t];
                const size_t i = index * V + t;
                if (depth == n) {
                    joint[i] = m;
                    continue;
                }
                if (m == 0.0) continue;
                const int base = cache.size();
                const int32_t one[1] = {t};
                ForwardOutput o = runner.forward(ForwardBatch::causal(one, base, {0}), cache);
                std::vector<float> next;
                processed_probs(o.logits_row(0), sp, next);
                extend(next, m, i, depth + 1);
                cache.rollback(base);
            }
        };
        extend(first, 1.0, 0, 1);
        return joint;
    }

    // Chi-square statistic and degrees of freedom of `runs` speculative generations of as many
    // tokens as `joint` describes, against `joint`.
    std::pair<double, int> chi2(Drafter & drafter, std::span<const int32_t> prefix, const SamplingParams & base_sp,
                                const std::vector<double> & joint, int runs, VerifyFn verify, TreeBudget tree = {},
                                std::function<void(const RoundInfo &)> on_round = nullptr) {
        int n_tokens = 0;
        for (size_t cells = 1; cells < joint.size(); cells *= V) ++n_tokens;
        std::vector<int> counts(joint.size(), 0);
        auto pol = make_draft_policy(DraftPolicyKind::Fixed, 3, {});
        KvCache cache(backend, target->config(), 64);
        for (int r = 0; r < runs; ++r) {
            cache.rollback(0);
            SequenceParts parts{cache, &drafter, pol.get(), tree, on_round, verify};
            GenerationOptions o;
            o.n_predict = n_tokens;
            o.sampling = base_sp;
            o.sampling.seed = 1000 + r;
            o.stop_at_end_of_generation = false;
            size_t cell = 0;
            generate_speculative(
                runner, parts, prefix, o, [](int32_t) { return false; }, [&](int32_t t) {
                cell = cell * V + t;
                return true; });
            counts[cell]++;
        }
        std::vector<test::Cell> cells;
        for (size_t i = 0; i < joint.size(); ++i) cells.push_back({joint[i], double(counts[i])});
        return test::chi_square(cells, runs);
    }
};

}  // namespace specula::test
