#pragma once
// A compact draft vocabulary for an EAGLE-3 head, as EAGLE-3's own checkpoints have: keep the
// lm_head rows of the `keep` target tokens that are most frequent in a corpus and map draft ids
// back to target ids with d2t (llama.cpp's eagle3 layout). Logits of kept tokens are unchanged;
// the lm_head, most of a small head's cost, shrinks by n_vocab / keep. The head can then only
// propose kept tokens, so `keep` trades acceptance on rare tokens for drafting speed.
#include <cstdint>
#include <span>
#include <string>

namespace specula {

struct CompactVocabResult {
    int kept = 0;
    double coverage = 0.0;  // share of the corpus's tokens that are in the draft vocabulary
};

// token_counts[id]: occurrences of target token id in the corpus. Throws Error.
CompactVocabResult write_compact_eagle3(const std::string & head_path, std::span<const int64_t> token_counts, int keep,
                                        const std::string & out_path);

}  // namespace specula
