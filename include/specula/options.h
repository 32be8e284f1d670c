#pragma once
// The engine's choices as enums. Strings become enums only at the edges (the CLI's flags, HTTP
// fields) through parse_*, which throw Error naming the bad value and the accepted names.
#include <optional>
#include <string>
#include <string_view>

namespace specula {

// How long each chain draft is (docs/policies.md).
enum class DraftPolicyKind {
    Fixed,
    Heuristic,
    Cost
};
// The shape of each round's draft: a chain, a fixed tree (EAGLE-1) or a dynamic one (EAGLE-2).
enum class TreeShape {
    Chain,
    Static,
    Dynamic
};
// Weight matmuls: specula's batch-invariant kernels on the CPU (Auto there), or ggml's.
enum class Kernels {
    Auto,
    Specula,
    Ggml
};
// Attention: Auto = specula's with specula's kernels, else matmul on the CPU and flash on GPUs.
enum class Attention {
    Auto,
    Flash,
    Matmul,
    Specula
};

DraftPolicyKind parse_draft_policy(std::string_view name);  // cost | heuristic | fixed
TreeShape parse_tree_shape(std::string_view name);          // chain | static | dynamic
Kernels parse_kernels(std::string_view name);               // auto | specula | ggml
Attention parse_attention(std::string_view name);           // auto | flash | matmul | specula
const char * tree_shape_name(TreeShape shape);
const char * kernels_name(Kernels kernels);
const char * attention_name(Attention attention);

// At most one drafter per engine.
enum class DrafterKind {
    None,        // plain decoding
    DraftModel,  // a small LM sharing the target's vocabulary (path: its GGUF)
    Eagle,       // EAGLE-1/2 head for the target (path: a specula-eagle1 GGUF)
    Eagle3,      // EAGLE-3 head for the target (path: a llama.cpp eagle3 GGUF)
    Ngram,       // prompt lookup: n-grams of the sequence so far (no file)
};
const char * drafter_kind_name(DrafterKind kind);  // none | draft | eagle | eagle3 | ngram

struct DrafterSpec {
    DrafterKind kind = DrafterKind::None;
    std::string path = {};             // DraftModel, Eagle, Eagle3: the GGUF; empty otherwise
    int ngram_min = 1, ngram_max = 3;  // Ngram (and lookup): the n-gram lengths matched
    // DraftModel, Eagle, Eagle3: also graft the prompt-lookup continuation into each draft
    // (draft/lookup_graft.h). Unset: on for trees sized by the tree policy (the
    // default for EAGLE heads), whose pricing keeps lookup's nodes only where they pay; off for
    // chains and fixed-size trees.
    std::optional<bool> lookup = std::nullopt;
    // DraftModel, a trimmed draft vocabulary: the draft's logits cover only some token ids plus
    // the vocabulary's control and end-of-generation tokens, and its LM head reads only those
    // rows (draft/draft_vocabulary.h). vocab_file: the ids of a `specula draft-vocab` file (its
    // corpus's most frequent tokens); vocab > 0: ids [0, vocab) (BPE numbers tokens by merge
    // rank, a rougher frequency order). Neither: the whole vocabulary.
    int vocab = 0;
    std::string vocab_file = {};
    // DraftModel chains: cascade drafting, prompt lookup's continuation checked by the draft
    // model's first forward of each round (draft/draft_model_drafter.h). Unset: on.
    std::optional<bool> cascade = std::nullopt;
};

}  // namespace specula
