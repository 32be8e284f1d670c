#pragma once
// bench spec's modes: what it compares (specula's generation modes and drafters, llama.cpp's tools),
// in the order one prompt runs them, and which of them a run can take.
#include <string>
#include <vector>

#include "bench_util.h"
#include "engine/generation_mode.h"
#include "specula/error.h"
#include "specula/options.h"
#include "spec_bench.h"

namespace specula::bench {

enum class Kind {
    SpeculaPlain,
    SpeculaDraft,
    SpeculaDraftNoCascade,  // the draft model drafting every chain token itself (--no-cascade)
    SpeculaDraftLookup,     // the draft model's chains weighed against lookup's free chain (--lookup)
    SpeculaNgram,
    SpeculaEagle1,
    SpeculaEagle3,
    SpeculaEagle3Lookup,
    SpeculaSpeceeLossy,
    SpeculaSpeceeLossless,
    LlamaSpec,
    LlamaPlain,
    LlamaEagle3
};

struct Mode {
    const char * name;
    Kind kind;
    DraftPolicyKind policy = DraftPolicyKind::Fixed;
    TreeShape tree = TreeShape::Chain;
    bool llama_flash_attn = true;  // llama.cpp modes: -fa on (its CPU default) or -fa off
};

// The generation mode a specula mode runs (llama.cpp's modes run none of them).
inline GenerationMode generation_mode_of(Kind kind) {
    switch (kind) {
        case Kind::SpeculaPlain: return GenerationMode::Plain;
        case Kind::SpeculaSpeceeLossy: return GenerationMode::SpeceeLossy;
        case Kind::SpeculaSpeceeLossless: return GenerationMode::SpeceeLossless;
        default: return GenerationMode::Speculative;
    }
}

// Modes of one prompt run back to back, so that load drift on a shared machine hits all alike.
inline const std::vector<Mode> kModes = {
    {"specula-plain", Kind::SpeculaPlain},
    {"specula-draft-fixed", Kind::SpeculaDraft, DraftPolicyKind::Fixed},
    {"specula-draft-heuristic", Kind::SpeculaDraft, DraftPolicyKind::Heuristic},
    {"specula-draft-cost", Kind::SpeculaDraft, DraftPolicyKind::Cost},
    {"specula-draft-cost-no-cascade", Kind::SpeculaDraftNoCascade, DraftPolicyKind::Cost},
    {"specula-draft-cost-lookup", Kind::SpeculaDraftLookup, DraftPolicyKind::Cost},
    {"specula-ngram", Kind::SpeculaNgram, DraftPolicyKind::Fixed},
    {"specula-ngram-cost", Kind::SpeculaNgram, DraftPolicyKind::Cost},  // generate's and serve's default without a drafter
    {"llamacpp-spec", Kind::LlamaSpec},
    {"llamacpp-spec-fa-off", Kind::LlamaSpec, DraftPolicyKind::Fixed, TreeShape::Chain, false},
    {"llamacpp-plain", Kind::LlamaPlain},
    {"llamacpp-plain-fa-off", Kind::LlamaPlain, DraftPolicyKind::Fixed, TreeShape::Chain, false},
    {"specula-draft-tree", Kind::SpeculaDraft, DraftPolicyKind::Fixed, TreeShape::Dynamic},
    {"specula-eagle1-chain", Kind::SpeculaEagle1, DraftPolicyKind::Fixed, TreeShape::Chain},
    {"specula-eagle1-static", Kind::SpeculaEagle1, DraftPolicyKind::Fixed, TreeShape::Static},
    {"specula-eagle1-dynamic", Kind::SpeculaEagle1, DraftPolicyKind::Fixed, TreeShape::Dynamic},
    {"specula-eagle3-chain", Kind::SpeculaEagle3, DraftPolicyKind::Fixed, TreeShape::Chain},
    {"specula-eagle3-static", Kind::SpeculaEagle3, DraftPolicyKind::Fixed, TreeShape::Static},
    {"specula-eagle3-dynamic", Kind::SpeculaEagle3, DraftPolicyKind::Fixed, TreeShape::Dynamic},       // the head alone (--no-lookup)
    {"specula-eagle3-lookup", Kind::SpeculaEagle3Lookup, DraftPolicyKind::Fixed, TreeShape::Dynamic},  // the default: + prompt lookup
    // SpecEE (docs/specee.md): the lossy early exit (greedy only) and its exits as chains of drafts.
    {"specula-specee-lossy", Kind::SpeculaSpeceeLossy},
    {"specula-specee-lossless", Kind::SpeculaSpeceeLossless, DraftPolicyKind::Fixed, TreeShape::Chain},
    {"llamacpp-eagle3", Kind::LlamaEagle3},
    {"llamacpp-eagle3-fa-off", Kind::LlamaEagle3, DraftPolicyKind::Fixed, TreeShape::Chain, false},
};
// With --eagle3, the headline compares specula's default EAGLE-3 mode with llama.cpp's EAGLE-3.
inline constexpr const char * kEagle3Headline = "specula-eagle3-lookup";
inline constexpr int kPlainMode = 0;
// The headline specula figure: the default policy (cost) with llama.cpp's draft length as its cap;
// the fixed policy drafts exactly as many tokens as llama.cpp every round.
inline constexpr const char * kHeadlineSpecMode = "specula-draft-cost";
inline constexpr const char * kFixedSpecMode = "specula-draft-fixed";
inline constexpr const char * kEagle3FixedMode = "specula-eagle3-chain";
// With no drafter (--no-llamacpp): what `-m` alone runs, prompt lookup's chains under the cost policy.
inline constexpr const char * kLookupHeadline = "specula-ngram-cost";
inline constexpr const char * kLookupFixedMode = "specula-ngram";
inline constexpr const char * kAllCategories = "all";

inline bool is_specula(Kind k) { return k != Kind::LlamaSpec && k != Kind::LlamaPlain && k != Kind::LlamaEagle3; }
inline bool is_speculative(Kind k) { return k != Kind::SpeculaPlain && k != Kind::LlamaPlain && k != Kind::SpeculaSpeceeLossy; }
inline bool is_specee(Kind k) { return k == Kind::SpeculaSpeceeLossy || k == Kind::SpeculaSpeceeLossless; }
// The lossy mode decodes greedily: it has no rows at T > 0.
inline bool runs_at(const Mode & m, float temp) { return m.kind != Kind::SpeculaSpeceeLossy || temp == 0.0f; }
// Modes that need a file the user did not give, or that the pinned llama.cpp cannot run, are skipped.
inline bool available(const Mode & m, const SpecBenchOptions & o) {
    if (!is_specula(m.kind) && !o.llamacpp) return false;
    if (is_specee(m.kind)) return !o.specee.empty();
    if (m.kind == Kind::SpeculaDraft || m.kind == Kind::SpeculaDraftNoCascade || m.kind == Kind::SpeculaDraftLookup ||
        m.kind == Kind::LlamaSpec) {
        return !o.draft.empty();
    }
    if (m.kind == Kind::SpeculaEagle1) return !o.eagle.empty();
    if (m.kind == Kind::SpeculaEagle3 || m.kind == Kind::SpeculaEagle3Lookup) return !o.eagle3.empty();
    if (m.kind == Kind::LlamaEagle3) return !o.eagle3.empty() && llama_cpp_runs_eagle3_on(o.model);
    return true;
}
inline int mode_index(const char * name) {
    for (size_t i = 0; i < kModes.size(); ++i) {
        if (std::string(kModes[i].name) == name) return static_cast<int>(i);
    }
    throw Error(std::string("unknown mode ") + name);
}

}  // namespace specula::bench
