#include "corpus_counts.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/progress.h"
#include "specula/error.h"
#include "tokenizer/tokenizer.h"

namespace specula::cli {
namespace {

bool listed(const std::vector<std::string> & names, const std::string & name) { return std::find(names.begin(), names.end(), name) != names.end(); }

std::vector<std::filesystem::path> corpus_files(const CorpusSelection & s) {
    namespace fs = std::filesystem;
    std::vector<fs::path> files;
    for (const std::string & p : s.paths) {
        if (!fs::exists(p)) throw Error(p + ": no such file or directory");
        if (!fs::is_directory(p)) {
            files.emplace_back(p);
            continue;
        }
        fs::recursive_directory_iterator it(p, fs::directory_options::skip_permission_denied);
        for (; it != fs::recursive_directory_iterator(); ++it) {
            if (it->is_directory() && listed(s.excluded, it->path().filename().string())) {
                it.disable_recursion_pending();
                continue;
            }
            if (!it->is_regular_file()) continue;
            const std::string ext = it->path().extension().string();
            if (!s.extensions.empty() && (ext.empty() || !listed(s.extensions, ext.substr(1)))) continue;
            files.push_back(it->path());
        }
    }
    std::sort(files.begin(), files.end());
    return files;
}

}  // namespace

CorpusCounts count_corpus_tokens(const Tokenizer & vocab, const CorpusSelection & selection) {
    const std::vector<std::filesystem::path> files = corpus_files(selection);
    CorpusCounts c;
    c.counts.assign(static_cast<size_t>(vocab.n_vocab()), 0);
    // A progress step per hundredth of the files: a line each where stderr is a log.
    const size_t per_step = std::max<size_t>(1, files.size() / 100);
    Progress progress("counting tokens", static_cast<int64_t>((files.size() + per_step - 1) / per_step));
    for (size_t i = 0; i < files.size(); ++i) {
        const std::filesystem::path & f = files[i];
        if (i % per_step == 0) progress.step(f.string());
        if (c.bytes >= selection.max_bytes) continue;
        std::ifstream in(f, std::ios::binary);
        if (!in) continue;
        std::ostringstream text;
        text << in.rdbuf();
        const std::string content = text.str();
        if (content.empty() || content.find('\0') != std::string::npos) continue;  // binary (compiled bytecode, images): not text
        for (const int32_t t : vocab.tokenize(content, false, SpecialTokens::Text)) ++c.counts[static_cast<size_t>(t)];
        c.bytes += static_cast<int64_t>(content.size());
        ++c.files;
    }
    for (const int64_t n : c.counts) c.tokens += n;
    if (c.tokens == 0) throw Error("the corpus holds no text");
    return c;
}

}  // namespace specula::cli
