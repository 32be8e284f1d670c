#include "engine/drafter_source.h"

#include "common/error.h"
#include "draft/draft_model.h"
#include "draft/eagle.h"
#include "draft/ngram.h"
#include "runtime/eagle_head.h"
#include "runtime/model.h"
#include "tokenizer/tokenizer.h"

namespace specula {

DrafterSpec drafter_spec_of(const EngineOptions & options) {
    const int n_drafters = !options.draft_model_path.empty() + !options.eagle_path.empty() + !options.eagle3_path.empty() + options.ngram;
    if (n_drafters > 1) throw Error("choose one drafter: --draft, --eagle, --eagle3 or --ngram");
    DrafterSpec spec;
    spec.ngram_min = options.ngram_min;
    spec.ngram_max = options.ngram_max;
    if (!options.draft_model_path.empty()) spec.kind = DrafterKind::DraftModel, spec.path = options.draft_model_path;
    if (!options.eagle_path.empty()) spec.kind = DrafterKind::Eagle, spec.path = options.eagle_path;
    if (!options.eagle3_path.empty()) spec.kind = DrafterKind::Eagle3, spec.path = options.eagle3_path;
    if (options.ngram) spec.kind = DrafterKind::Ngram;
    return spec;
}

DraftingRules drafting_rules(const EngineOptions & options, DrafterKind kind) {
    const bool eagle = kind == DrafterKind::Eagle || kind == DrafterKind::Eagle3;
    DraftingRules r;
    r.policy = parse_draft_policy(options.draft_policy);
    const std::string shape = options.tree.empty() ? (eagle ? "dynamic" : "chain") : options.tree;
    r.tree = TreeBudget{parse_tree_shape(shape), options.tree_depth, options.tree_branching, options.tree_nodes};
    if (r.tree.shape != TreeShape::Chain && (options.tree_depth < 1 || options.tree_branching < 1 || options.tree_nodes < 0)) {
        throw Error("tree depth and branching must be at least 1, tree nodes at least 0");
    }
    if (r.tree.shape != TreeShape::Chain && kind == DrafterKind::Ngram) throw Error("the n-gram drafter drafts chains only (--tree chain)");
    if (options.draft_max < 1) throw Error("--draft-max must be at least 1");
    if (options.draft_max + 2 > options.n_ctx) {
        throw Error("draft length " + std::to_string(options.draft_max) + " does not fit the " + std::to_string(options.n_ctx) +
                    "-token context");
    }
    return r;
}

DrafterSource::DrafterSource() = default;
DrafterSource::DrafterSource(DrafterSource &&) noexcept = default;
DrafterSource & DrafterSource::operator=(DrafterSource &&) noexcept = default;
DrafterSource::~DrafterSource() = default;

DrafterSource DrafterSource::open(const DrafterSpec & spec, Backend & backend, const Model & target, const Tokenizer & target_vocab) {
    DrafterSource s;
    s.spec = spec;
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

std::unique_ptr<Drafter> DrafterSource::make(int n_ctx) const {
    switch (spec.kind) {
        case DrafterKind::None: return nullptr;
        case DrafterKind::DraftModel: return std::make_unique<DraftModelDrafter>(*draft_model, n_ctx);
        case DrafterKind::Eagle:
        case DrafterKind::Eagle3: return std::make_unique<EagleDrafter>(*head, n_ctx);
        case DrafterKind::Ngram: return std::make_unique<NgramDrafter>(spec.ngram_min, spec.ngram_max);
    }
    return nullptr;
}

}  // namespace specula
