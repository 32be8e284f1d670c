// draft-vocab: a trimmed draft vocabulary for --draft-vocab FILE. Tokenizes a corpus (files, and
// the files under directories) with the model's tokenizer, counts each token, and writes the N
// most frequent ids with the control and end-of-generation tokens (tokenizer/draft_vocabulary.h has
// the format) for that tokenizer.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <memory>

#include "commands.h"
#include "corpus_counts.h"
#include "specula/error.h"
#include "tokenizer/draft_vocabulary.h"
#include "tokenizer/tokenizer.h"

namespace specula::cli {
namespace {

struct Args {
    std::string model, out_path;
    CorpusSelection corpus;
    int n = 32768;
};

// "a,b,c"
std::string joined(const std::vector<std::string> & items, const char * separator) {
    std::string out;
    for (const std::string & item : items) out += (out.empty() ? "" : separator) + item;
    return out;
}

int run(const Args & a) {
    if (a.n < 1) throw Error("-n must be at least 1");
    const Tokenizer vocab(a.model);
    const CorpusCounts c = count_corpus_tokens(vocab, a.corpus);
    const std::vector<int32_t> frequent = most_frequent_ids(c.counts, a.n);
    int64_t covered = 0;
    for (const int32_t t : frequent) covered += c.counts[static_cast<size_t>(t)];
    const std::vector<int32_t> ids = with_control_tokens(frequent, vocab);
    char summary[200];
    std::snprintf(summary, sizeof summary, "the %zu most frequent of %lld tokens (%lld files, %lld bytes), covering %.4f of them", frequent.size(),
                  static_cast<long long>(c.tokens), static_cast<long long>(c.files), static_cast<long long>(c.bytes), double(covered) / double(c.tokens));
    const size_t n_control = ids.size() - frequent.size();
    const CorpusSelection & s = a.corpus;
    write_draft_vocabulary(a.out_path, ids, vocab,
                           {"specula draft-vocab -n " + std::to_string(a.n) + (s.extensions.empty() ? "" : " --ext " + joined(s.extensions, ",")) +
                                (s.excluded.empty() ? "" : " --exclude " + joined(s.excluded, ",")) + " " + joined(s.paths, " "),
                            summary, "and " + std::to_string(n_control) + " more control and end-of-generation tokens"});
    std::printf("%s: %zu ids: %s; and %zu more control tokens\n", a.out_path.c_str(), ids.size(), summary, n_control);
    return 0;
}

}  // namespace

void register_draft_vocab(CLI::App & app, Commands & commands) {
    auto a = std::make_shared<Args>();
    CLI::App * sub = app.add_subcommand(command::draft_vocab.name, command::draft_vocab.description);
    sub->add_option("-m,--model", a->model, "a GGUF whose tokenizer to count with (the draft model's or the target's: they share it)")->required();
    sub->add_option("-n,--n-tokens", a->n, "how many of the most frequent tokens to keep (the control tokens come on top)")->capture_default_str();
    sub->add_option("-o,--output", a->out_path, "the draft vocabulary file to write")->required();
    sub->add_option("--ext", a->corpus.extensions, "under directories, read only files with these extensions, e.g. py,h (default: every text file)")
        ->delimiter(',');
    sub->add_option("--exclude", a->corpus.excluded, "under directories, skip directories of these names, e.g. site-packages")->delimiter(',');
    sub->add_option("corpus", a->corpus.paths, "files and directories of text like what the model will write (e.g. source code)")->required();
    sub->callback([a, &commands] { commands.run = [a] { return run(*a); }; });
}

}  // namespace specula::cli
