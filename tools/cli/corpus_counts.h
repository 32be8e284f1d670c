#pragma once
// How often each token of a vocabulary occurs in a corpus of text files: what `draft-vocab` and
// `compact-eagle3` rank a draft vocabulary by.
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace specula {
class Tokenizer;
}

namespace specula::cli {

struct CorpusSelection {
    std::vector<std::string> paths;                           // files, and directories read recursively
    std::vector<std::string> extensions;                      // under directories, read only files with these ("py"); empty: all
    std::vector<std::string> excluded;                        // under directories, names of directories not entered
    int64_t max_bytes = std::numeric_limits<int64_t>::max();  // stop reading files once this much was read
};

struct CorpusCounts {
    std::vector<int64_t> counts;  // counts[id]
    int64_t tokens = 0, bytes = 0;
    int64_t files = 0;  // text files read
};

// Tokenizes each text file of the selection (files in sorted order, so that the same corpus always
// gives the same counts; binary files, those holding a NUL byte, and unreadable ones skipped) as
// plain text: spelled control tokens are text. Throws Error on a path that does not exist and on a
// corpus without text.
CorpusCounts count_corpus_tokens(const Tokenizer & vocab, const CorpusSelection & selection);

}  // namespace specula::cli
