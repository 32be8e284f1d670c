#pragma once
// A draft model's trimmed vocabulary (--draft-vocab): the token ids whose logits its LM head
// computes, as EAGLE-3's d2t ranks a head's draft vocabulary. Drafts are drawn from those ids
// alone and the target verifies every token, so the output is unchanged; the ids chosen decide
// how often drafts are accepted.
//
// The file `specula draft-vocab` writes (text, lines ending in '\n'):
//   specula-draft-vocab 1
//   tokenizer <fingerprint: 16 lower-case hex digits> <token count>   (Tokenizer::fingerprint())
//   ids <how many ids the file lists>
//   then one line per id or run of ids, ascending and not overlapping: "<id>" or "<first>-<last>"
// Lines starting with '#' after the first are comments (the corpus the ids were counted on).
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace specula {

class Tokenizer;

// `ids` with the vocabulary's markup and end-of-generation tokens (chat templates and FIM prompts
// use them, and byte-pair vocabularies number them last), sorted and distinct.
std::vector<int32_t> with_control_tokens(std::vector<int32_t> ids, const Tokenizer & vocab);

// The `n` ids counted most often in `counts` (counts[id]; ties go to the lower id), ascending.
std::vector<int32_t> most_frequent_ids(std::span<const int64_t> counts, int n);

// Writes `ids` (ascending, distinct, within `vocab`) as a draft vocabulary file for `vocab`, the
// `comment` lines (no '\n' inside) after the header as "# " lines. Throws Error if it cannot.
void write_draft_vocabulary(const std::string & path, std::span<const int32_t> ids, const Tokenizer & vocab,
                            const std::vector<std::string> & comment = {});

// The ids of a draft vocabulary file, ascending. Throws Error naming the file and what is wrong:
// not such a file, another format version, made for another vocabulary than `vocab`, a malformed
// or out-of-order line, a count other than the header's.
std::vector<int32_t> read_draft_vocabulary(const std::string & path, const Tokenizer & vocab);

}  // namespace specula
