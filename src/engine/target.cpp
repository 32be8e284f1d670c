#include "engine/target.h"

#include <algorithm>

#include "common/error.h"
#include "draft/draft_model.h"
#include "draft/eagle.h"
#include "draft/ngram.h"
#include "engine/generate.h"
#include "engine/speculative.h"
#include "kv/kv_cache.h"
#include "runtime/backend.h"
#include "runtime/eagle_head.h"
#include "runtime/forward.h"
#include "runtime/model.h"
#include "tokenizer/tokenizer.h"

namespace specula {

Target::~Target() = default;

std::unique_ptr<Target> Target::open(const EngineOptions & options) {
    auto t = std::make_unique<Target>();
    t->options = options;
    if (options.n_ctx <= 0) throw Error("context size must be positive");
    t->backend = std::make_unique<Backend>(BackendOptions{options.device, options.n_threads, options.attention, options.kernels});
    t->model = Model::load(options.model_path, *t->backend);
    t->tokenizer = std::make_unique<Tokenizer>(options.model_path);
    if (t->tokenizer->n_vocab() > t->model->config().n_vocab) {
        throw Error(options.model_path + ": tokenizer has more tokens than the embedding matrix");
    }
    t->runner = std::make_unique<ModelRunner>(*t->model);

    const int n_drafters = !options.draft_model_path.empty() + !options.eagle_path.empty() + !options.eagle3_path.empty() + options.ngram;
    if (n_drafters > 1) throw Error("choose one drafter: --draft, --eagle, --eagle3 or --ngram");
    const bool eagle = !options.eagle_path.empty() || !options.eagle3_path.empty();
    t->speculative = n_drafters == 1;
    if (t->speculative) {
        t->policy = parse_draft_policy(options.draft_policy);
        const std::string shape = options.tree.empty() ? (eagle ? "dynamic" : "chain") : options.tree;
        t->tree = TreeBudget{parse_tree_shape(shape), options.tree_depth, options.tree_branching, options.tree_nodes};
        if (t->tree.shape != TreeShape::Chain && (options.tree_depth < 1 || options.tree_branching < 1 || options.tree_nodes < 0)) {
            throw Error("tree depth and branching must be at least 1, tree nodes at least 0");
        }
        if (t->tree.shape != TreeShape::Chain && options.ngram) throw Error("the n-gram drafter drafts chains only (--tree chain)");
        if (options.draft_max < 1) throw Error("--draft-max must be at least 1");
        if (options.draft_max + 2 > options.n_ctx) {
            throw Error("draft length " + std::to_string(options.draft_max) + " does not fit the " +
                        std::to_string(options.n_ctx) + "-token context");
        }
    }
    if (!options.draft_model_path.empty()) {
        t->draft_model = Model::load(options.draft_model_path, *t->backend);
        const Tokenizer draft_vocab(options.draft_model_path);
        if (draft_vocab.fingerprint() != t->tokenizer->fingerprint() || t->draft_model->config().n_vocab != t->model->config().n_vocab) {
            throw Error("draft model " + options.draft_model_path + " has a different vocabulary (" +
                        std::to_string(draft_vocab.n_vocab()) + " tokens) than the target (" +
                        std::to_string(t->tokenizer->n_vocab()) + " tokens)");
        }
    } else if (eagle) {
        const std::string & path = options.eagle_path.empty() ? options.eagle3_path : options.eagle_path;
        t->head = EagleHead::load(path, *t->model, *t->backend);
        const EagleKind want = options.eagle_path.empty() ? EagleKind::Eagle3 : EagleKind::Eagle1;
        if (t->head->config().kind != want) {
            throw Error(path + (want == EagleKind::Eagle3 ? " is an EAGLE-1 head: use --eagle" : " is an EAGLE-3 head: use --eagle3"));
        }
    }
    return t;
}

std::unique_ptr<Drafter> Target::make_drafter(int n_ctx) const {
    if (draft_model) return std::make_unique<DraftModelDrafter>(*draft_model, n_ctx);
    if (head) return std::make_unique<EagleDrafter>(*head, n_ctx);
    if (options.ngram) return std::make_unique<NgramDrafter>(options.ngram_min, options.ngram_max);
    return nullptr;
}

bool Target::needs_verify_cost() const {
    const bool auto_tree = tree.shape != TreeShape::Chain && tree.max_nodes == 0;
    return speculative && (policy == DraftPolicyKind::Cost || auto_tree);
}

void Target::measure_verify_cost_once(KvCache & cache, std::span<const int32_t> tokens, int at_least_rows) {
    if (!needs_verify_cost() || !verify_cost_ms.empty()) return;
    if (tokens.empty()) throw Error("measure_verify_cost_once: no tokens");
    // At a typical depth (attention grows with it), on the given token ids.
    const bool auto_tree = tree.shape != TreeShape::Chain && tree.max_nodes == 0;
    const int max_tokens =
        std::min(std::max({options.draft_max + 1, auto_tree ? kAutoTreeMaxNodes + 1 : 0, at_least_rows}), cache.capacity());
    const int depth = std::min(128, cache.capacity() - max_tokens);
    std::vector<int32_t> probe;
    while (static_cast<int>(probe.size()) < depth + max_tokens) probe.insert(probe.end(), tokens.begin(), tokens.end());
    if (depth > 0) prefill(*runner, cache, std::span(probe).first(depth));
    verify_cost_ms = measure_verify_cost(*runner, cache, std::span(probe).subspan(depth), max_tokens);
    cache.rollback(0);
}

std::unique_ptr<DraftLengthPolicy> Target::make_draft_policy() const {
    return specula::make_draft_policy(policy, options.draft_max, verify_cost_ms);
}

std::unique_ptr<TreeSizePolicy> Target::make_tree_size_policy() const {
    if (tree.shape == TreeShape::Chain || tree.max_nodes != 0) return nullptr;
    // The policy verifies at most one less node than its curve has sizes: the sizes one sequence
    // verifies (the rest of the curve, measured for shared steps, it extrapolates).
    const size_t sizes = std::min(verify_cost_ms.size(), static_cast<size_t>(std::max(options.draft_max + 1, kAutoTreeMaxNodes + 1)));
    return std::make_unique<TreeSizePolicy>(std::vector<double>(verify_cost_ms.begin(), verify_cost_ms.begin() + sizes));
}

}  // namespace specula
