#include "engine/drafter_factory.h"

#include <algorithm>
#include <numeric>

#include "specula/error.h"
#include "draft/draft_model_drafter.h"
#include "draft/eagle_drafter.h"
#include "draft/lookup_graft.h"
#include "draft/ngram.h"
#include "runtime/kv_cache.h"
#include "runtime/eagle_head.h"
#include "runtime/model.h"
#include "tokenizer/draft_vocabulary.h"
#include "tokenizer/tokenizer.h"

namespace specula {

void check_drafter_spec(const DrafterSpec & spec) {
    const bool takes_file = spec.kind == DrafterKind::DraftModel || spec.kind == DrafterKind::Eagle || spec.kind == DrafterKind::Eagle3;
    const std::string kind = drafter_kind_name(spec.kind);
    if (takes_file && spec.path.empty()) throw Error("the " + kind + " drafter needs a GGUF path");
    if (!takes_file && !spec.path.empty()) throw Error("the " + kind + " drafter takes no file, but was given " + spec.path);
    if (spec.vocab < 0) throw Error("the draft vocabulary (--draft-vocab) must be 0 (all) or a token count, not " + std::to_string(spec.vocab));
    if (spec.vocab > 0 && !spec.vocab_file.empty()) {
        throw Error("a trimmed draft vocabulary (--draft-vocab) is a token count or a file, not both (" + std::to_string(spec.vocab) + " and " +
                    spec.vocab_file + ")");
    }
    if ((spec.vocab > 0 || !spec.vocab_file.empty()) && spec.kind != DrafterKind::DraftModel) {
        throw Error("a trimmed draft vocabulary (--draft-vocab) is for a draft model (--draft), not the " + kind + " drafter");
    }
    if (spec.cascade.has_value() && spec.kind != DrafterKind::DraftModel) {
        throw Error("cascade drafting (--cascade, --no-cascade) is for a draft model's chains (--draft), not the " + kind + " drafter");
    }
    if (spec.lookup.value_or(false) && !takes_file) {
        throw Error("prompt lookup (--lookup) grafts into a model drafter's trees: add --draft, --eagle or --eagle3" +
                    std::string(spec.kind == DrafterKind::Ngram ? " (--ngram drafts by lookup alone)" : ""));
    }
}

DraftingRules drafting_rules(const EngineOptions & options, DrafterKind kind) {
    const bool eagle = kind == DrafterKind::Eagle || kind == DrafterKind::Eagle3;
    DraftingRules r;
    r.policy = options.draft_policy;
    const TreeShape shape = options.tree.value_or(eagle ? TreeShape::Dynamic : TreeShape::Chain);
    r.tree = TreeBudget{shape, options.tree_depth, options.tree_branching, options.tree_nodes};
    if (r.tree.shape != TreeShape::Chain && (options.tree_depth < 1 || options.tree_branching < 1 || options.tree_nodes < 0)) {
        throw Error("tree depth and branching must be at least 1, tree nodes at least 0");
    }
    if (r.tree.shape != TreeShape::Chain && kind == DrafterKind::Ngram) throw Error("the n-gram drafter drafts chains only (--tree chain)");
    if (kind == DrafterKind::DraftModel && r.tree.shape != TreeShape::Chain && options.drafter.cascade.value_or(false)) {
        throw Error(std::string("cascade drafting (--cascade) drafts chains, not ") + tree_shape_name(r.tree.shape) + " trees (--tree chain)");
    }
    const bool model_drafter = kind == DrafterKind::DraftModel || eagle;
    // Grafted by default into the trees the tree policy sizes. A chain's free chain, which only the
    // cost policy weighs, is asked for: on the Qwen2.5-Coder pair it measured no faster than the
    // draft model's cascade chains alone (docs/benchmarks.md).
    r.lookup = options.drafter.lookup.value_or(model_drafter && r.tree.shape != TreeShape::Chain && r.tree.max_nodes == 0);
    if (options.drafter.lookup.value_or(false) && model_drafter && r.tree.shape == TreeShape::Chain && r.policy != DraftPolicyKind::Cost) {
        throw Error("prompt lookup (--lookup) with chains is a free chain the cost policy weighs each round: use --draft-policy cost");
    }
    if (options.draft_max < 1) throw Error("--draft-max must be at least 1");
    if (options.draft_max + 2 > options.n_ctx) {
        throw Error("draft length " + std::to_string(options.draft_max) + " does not fit the " + std::to_string(options.n_ctx) +
                    "-token context");
    }
    return r;
}

DrafterFactory::DrafterFactory() = default;
DrafterFactory::DrafterFactory(DrafterFactory &&) noexcept = default;
DrafterFactory & DrafterFactory::operator=(DrafterFactory &&) noexcept = default;
DrafterFactory::~DrafterFactory() = default;

DrafterFactory DrafterFactory::open(const DrafterSpec & spec, Backend & backend, const Model & target, const Tokenizer & target_vocab) {
    check_drafter_spec(spec);
    DrafterFactory s;
    s.spec = spec;
    s.markup_tokens = std::make_shared<const std::vector<int32_t>>(target_vocab.markup_tokens());
    switch (spec.kind) {
        case DrafterKind::None:
        case DrafterKind::Ngram: break;
        case DrafterKind::DraftModel: {
            s.draft_model = Model::load(spec.path, backend);
            const Tokenizer draft_vocab(spec.path);
            if (draft_vocab.fingerprint() != target_vocab.fingerprint() || s.draft_model->config().n_vocab != target.config().n_vocab) {
                throw Error("draft model " + spec.path + " has a different vocabulary (" + std::to_string(draft_vocab.n_vocab()) +
                            " tokens) than the target (" + std::to_string(target_vocab.n_vocab()) + " tokens)");
            }
            const int n_vocab = s.draft_model->config().n_vocab;
            if (!spec.vocab_file.empty()) {
                s.draft_logit_ids = with_control_tokens(read_draft_vocabulary(spec.vocab_file, target_vocab), target_vocab);
            } else if (spec.vocab > 0) {
                s.draft_logit_ids.resize(std::min(spec.vocab, n_vocab));
                std::iota(s.draft_logit_ids.begin(), s.draft_logit_ids.end(), 0);
                s.draft_logit_ids = with_control_tokens(std::move(s.draft_logit_ids), target_vocab);
            }
            if (static_cast<int>(s.draft_logit_ids.size()) >= n_vocab) s.draft_logit_ids.clear();  // the whole vocabulary
            break;
        }
        case DrafterKind::Eagle:
        case DrafterKind::Eagle3: {
            s.head = EagleHead::load(spec.path, target, backend);
            const EagleKind want = spec.kind == DrafterKind::Eagle3 ? EagleKind::Eagle3 : EagleKind::Eagle1;
            if (s.head->config().kind != want) {
                throw Error(spec.path + (want == EagleKind::Eagle3 ? " is an EAGLE-1 head: use --eagle" : " is an EAGLE-3 head: use --eagle3"));
            }
            break;
        }
    }
    return s;
}

std::unique_ptr<Drafter> DrafterFactory::make(int n_ctx) const { return std::move(make_group(n_ctx, 1).front()); }

std::vector<std::unique_ptr<Drafter>> DrafterFactory::make_group(int n_ctx, int n) const {
    if (n < 1) throw Error("a drafter group needs at least one drafter");
    std::vector<std::unique_ptr<Drafter>> group;
    switch (spec.kind) {
        case DrafterKind::DraftModel: {
            auto runner = draft_logit_ids.empty() ? std::make_shared<ModelRunner>(*draft_model)
                                                  : std::make_shared<ModelRunner>(*draft_model, draft_logit_ids);
            auto streams = KvCache::pool(draft_model->backend(), draft_model->config(), n_ctx, n);
            for (auto & s : streams) {
                auto drafter = std::make_unique<DraftModelDrafter>(*draft_model, runner, std::move(s));
                if (spec.cascade.value_or(true)) drafter->cascade(spec.ngram_min, spec.ngram_max, markup_tokens);
                group.push_back(std::move(drafter));
            }
            break;
        }
        case DrafterKind::Eagle:
        case DrafterKind::Eagle3: {
            auto runner = std::make_shared<ModelRunner>(*head);
            auto streams = KvCache::pool(head->backend(), head->config().layer, n_ctx, n);
            for (auto & s : streams) group.push_back(std::make_unique<EagleDrafter>(*head, runner, std::move(s)));
            break;
        }
        case DrafterKind::None: group.resize(n); break;
        case DrafterKind::Ngram:
            for (int i = 0; i < n; ++i) group.push_back(std::make_unique<NgramDrafter>(spec.ngram_min, spec.ngram_max, markup_tokens));
            break;
    }
    if (spec.lookup.value_or(false)) {
        for (auto & d : group) d = std::make_unique<LookupGraftDrafter>(std::move(d), spec.ngram_min, spec.ngram_max, markup_tokens);
    }
    return group;
}

}  // namespace specula
