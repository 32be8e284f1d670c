#include "tokenizer/draft_vocabulary.h"

#include <algorithm>
#include <charconv>
#include <cinttypes>
#include <cstdio>
#include <fstream>
#include <numeric>

#include "specula/error.h"
#include "tokenizer/tokenizer.h"

namespace specula {

namespace {

constexpr const char * kMagic = "specula-draft-vocab";
constexpr int kVersion = 1;

std::string tokenizer_line(uint64_t fingerprint, int n_vocab) {
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016" PRIx64, fingerprint);
    return "tokenizer " + std::string(hex) + " " + std::to_string(n_vocab);
}

// A whole decimal number, or false.
bool parse_number(std::string_view s, int64_t & v) {
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    return ec == std::errc() && end == s.data() + s.size() && !s.empty() && s.front() != '-';
}

}  // namespace

std::vector<int32_t> with_control_tokens(std::vector<int32_t> ids, const Tokenizer & vocab) {
    ids.insert(ids.end(), vocab.markup_tokens().begin(), vocab.markup_tokens().end());
    ids.insert(ids.end(), vocab.end_of_generation_tokens().begin(), vocab.end_of_generation_tokens().end());
    std::sort(ids.begin(), ids.end());
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
    return ids;
}

std::vector<int32_t> most_frequent_ids(std::span<const int64_t> counts, int n) {
    std::vector<int32_t> order(counts.size());
    std::iota(order.begin(), order.end(), 0);
    const size_t keep = std::min(order.size(), static_cast<size_t>(std::max(n, 0)));
    std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(keep), order.end(),
                      [&](int32_t a, int32_t b) { return counts[a] != counts[b] ? counts[a] > counts[b] : a < b; });
    order.resize(keep);
    std::sort(order.begin(), order.end());
    return order;
}

void write_draft_vocabulary(const std::string & path, std::span<const int32_t> ids, const Tokenizer & vocab,
                            const std::vector<std::string> & comment) {
    for (size_t i = 0; i < ids.size(); ++i) {
        if (ids[i] < 0 || ids[i] >= vocab.n_vocab() || (i > 0 && ids[i] <= ids[i - 1])) {
            throw Error("draft vocabulary for " + path + ": ids must be ascending, distinct and within the vocabulary");
        }
    }
    std::ofstream out(path, std::ios::binary);
    if (!out) throw Error(path + ": cannot write the draft vocabulary");
    out << kMagic << " " << kVersion << "\n"
        << tokenizer_line(vocab.fingerprint(), vocab.n_vocab()) << "\n";
    for (const std::string & line : comment) out << "# " << line << "\n";
    out << "ids " << ids.size() << "\n";
    for (size_t i = 0; i < ids.size();) {
        size_t j = i;
        while (j + 1 < ids.size() && ids[j + 1] == ids[j] + 1) ++j;
        out << ids[i];
        if (j > i) out << "-" << ids[j];
        out << "\n";
        i = j + 1;
    }
    if (!out.flush()) throw Error(path + ": cannot write the draft vocabulary");
}

std::vector<int32_t> read_draft_vocabulary(const std::string & path, const Tokenizer & vocab) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw Error(path + ": cannot read the draft vocabulary file");
    std::string line;
    int line_no = 0;
    // The next line that is not a comment (the first line never is one); false at the end.
    auto next = [&] {
        while (std::getline(in, line)) {
            if (++line_no == 1 || line.empty() || line[0] != '#') return true;
        }
        return false;
    };
    auto bad = [&](const std::string & why) { return Error(path + " line " + std::to_string(line_no) + ": " + why); };
    const std::string magic = std::string(kMagic) + " ";
    if (!next() || line.compare(0, magic.size(), magic) != 0) {
        throw Error(path + " is not a draft vocabulary file (its first line is not \"" + magic + std::to_string(kVersion) +
                    "\"; `specula draft-vocab` writes them)");
    }
    if (line != magic + std::to_string(kVersion)) {
        throw Error(path + ": draft vocabulary format \"" + line + "\", this specula reads version " + std::to_string(kVersion));
    }
    const std::string want = tokenizer_line(vocab.fingerprint(), vocab.n_vocab());
    if (!next() || line.rfind("tokenizer ", 0) != 0) throw bad("expected \"tokenizer <fingerprint> <token count>\"");
    if (line != want) {
        throw Error(path + " was made for another vocabulary (" + line + ") than the model's (" + want +
                    "): make one with `specula draft-vocab -m MODEL.gguf`");
    }
    int64_t count = 0;
    if (!next() || line.rfind("ids ", 0) != 0 || !parse_number(std::string_view(line).substr(4), count)) throw bad("expected \"ids <count>\"");
    std::vector<int32_t> ids;
    while (next()) {
        const size_t dash = line.find('-', 1);
        int64_t first = 0, last = 0;
        const std::string_view text(line);
        if (!parse_number(text.substr(0, dash), first) || (dash != std::string::npos && !parse_number(text.substr(dash + 1), last))) {
            throw bad("expected an id or a run \"<first>-<last>\", not \"" + line + "\"");
        }
        if (dash == std::string::npos) last = first;
        if (last < first || last >= vocab.n_vocab()) throw bad("\"" + line + "\" is not a run of ids of the " + std::to_string(vocab.n_vocab()) + "-token vocabulary");
        if (!ids.empty() && first <= ids.back()) throw bad("ids must ascend without repeats (" + line + " after " + std::to_string(ids.back()) + ")");
        if (static_cast<int64_t>(ids.size()) + (last - first + 1) > count) throw bad("more ids than the header's " + std::to_string(count));
        for (int64_t t = first; t <= last; ++t) ids.push_back(static_cast<int32_t>(t));
    }
    if (static_cast<int64_t>(ids.size()) != count) {
        throw Error(path + ": " + std::to_string(ids.size()) + " ids, not the header's " + std::to_string(count) + " (a truncated file?)");
    }
    if (ids.empty()) throw Error(path + ": a draft vocabulary needs at least one id");
    return ids;
}

}  // namespace specula
