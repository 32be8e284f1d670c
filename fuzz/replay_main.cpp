// The fuzz targets without libFuzzer: a main that runs one target's LLVMFuzzerTestOneInput once on
// every file it is given (a directory gives each file in it, in name order). The test suite builds
// each target this way with the compiler and sanitizers of its tree and replays the seed corpus and
// fuzz/regressions/ through it, so every input that once crashed a target stays checked by the
// ASan + UBSan run without building the clang tree scripts/fuzz.sh mutates inputs in.
//
// With --mutate SECONDS it then mutates those inputs for that long, without coverage feedback:
// stacked byte edits, repeats of a range (deep nesting, long alternations), splices of two inputs
// and tokens of a dictionary, from a PRNG seeded by --seed so that a run can be repeated. An input
// that crashes the target, trips a sanitizer or runs past --timeout (10 s; replays: only when
// given) is written to --findings before the process dies, and its path printed.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t * data, size_t size);
// Defined by the targets that load something once (a model, a server); weak so the others link.
extern "C" __attribute__((weak)) int LLVMFuzzerInitialize(int * argc, char *** argv);
// Present when a sanitizer runtime is linked (sanitizer/common_interface_defs.h), null otherwise.
extern "C" __attribute__((weak)) void __sanitizer_set_death_callback(void (*callback)());
extern "C" __attribute__((weak)) void __sanitizer_print_stack_trace();

namespace fs = std::filesystem;
using Bytes = std::vector<uint8_t>;

namespace {

const char * g_program = "fuzz";

// The mutant being run, for the handlers below (null otherwise), and where to save it.
const Bytes * g_current = nullptr;
std::string g_findings;
char g_saved_path[4096];
volatile sig_atomic_t g_saved = 0;

// Writes the current input to <findings>/<kind>-<fnv1a64> and prints the path, once; only
// async-signal-safe calls, as a signal or a sanitizer's death may come from anywhere.
void save_current(const char * kind) {
    if (g_saved || !g_current) return;
    g_saved = 1;
    uint64_t hash = 1469598103934665603ULL;
    for (uint8_t byte : *g_current) hash = (hash ^ byte) * 1099511628211ULL;
    char * p = g_saved_path;
    auto append = [&](const char * s) {
        while (*s && p < g_saved_path + sizeof g_saved_path - 18) *p++ = *s++;
    };
    append(g_findings.c_str());
    append("/");
    append(kind);
    append("-");
    for (int shift = 60; shift >= 0; shift -= 4) *p++ = "0123456789abcdef"[(hash >> shift) & 15];
    *p = '\0';
    const int fd = ::open(g_saved_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
        for (size_t done = 0; done < g_current->size();) {
            const ssize_t n = ::write(fd, g_current->data() + done, g_current->size() - done);
            if (n <= 0) break;
            done += static_cast<size_t>(n);
        }
        ::close(fd);
    }
    const char * parts[] = {"\n", g_program, ": the input that failed is saved as ", g_saved_path, "\n"};
    for (const char * part : parts) (void)!::write(STDERR_FILENO, part, std::strlen(part));
}

// The handlers that were installed before ours (a sanitizer's, or the default): each fatal
// signal saves the input, then goes on to them, so that a sanitizer still reports it.
struct sigaction g_previous[NSIG];

void on_fatal_signal(int sig) {
    save_current("crash");
    ::sigaction(sig, &g_previous[sig], nullptr);
    ::raise(sig);  // delivered when this handler returns; a fault re-executes and faults again
}

void on_timeout(int) {
    const char * message = ": an input ran past the time limit; its stack:\n";
    (void)!::write(STDERR_FILENO, g_program, std::strlen(g_program));
    (void)!::write(STDERR_FILENO, message, std::strlen(message));
    if (__sanitizer_print_stack_trace) __sanitizer_print_stack_trace();
    save_current("timeout");
    std::abort();
}

void install_handlers(unsigned timeout_seconds) {
    // A stack overflow (deep recursion is what breaks parsers) leaves no stack to handle it on:
    // an alternate one, unless a sanitizer has set one up already.
    stack_t current{};
    if (::sigaltstack(nullptr, &current) == 0 && (current.ss_flags & SS_DISABLE)) {
        static std::vector<char> alternate(1 << 16);
        stack_t stack{};
        stack.ss_sp = alternate.data();
        stack.ss_size = alternate.size();
        ::sigaltstack(&stack, nullptr);
    }
    for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT}) {
        struct sigaction action {};
        action.sa_handler = on_fatal_signal;
        action.sa_flags = SA_ONSTACK;
        ::sigaction(sig, &action, &g_previous[sig]);
    }
    if (timeout_seconds > 0) {
        struct sigaction action {};
        action.sa_handler = on_timeout;
        ::sigaction(SIGALRM, &action, nullptr);
    }
    // ASan's reports; gcc's UBSan has a runtime of its own, whose reports reach us as SIGABRT with
    // UBSAN_OPTIONS=abort_on_error=1 (fuzz/CMakeLists.txt).
    if (__sanitizer_set_death_callback) __sanitizer_set_death_callback([] { save_current("crash"); });
}

// A libFuzzer dictionary (fuzz/dictionaries/): one token a line, `name="value"` or `"value"`, with
// \\, \" and \xNN escapes; '#' starts a comment line.
std::vector<Bytes> read_dictionary(const char * path) {
    std::ifstream in(path);
    if (!in) {
        std::fprintf(stderr, "%s: error: cannot read the dictionary '%s'\n", g_program, path);
        std::exit(2);
    }
    std::vector<Bytes> tokens;
    for (std::string line; std::getline(in, line);) {
        const size_t open = line.find('"');
        const size_t close = line.rfind('"');
        if (line.empty() || line[0] == '#' || open == std::string::npos || close <= open) continue;
        Bytes token;
        for (size_t i = open + 1; i < close; ++i) {
            if (line[i] == '\\' && i + 1 < close && line[i + 1] == 'x' && i + 3 < close) {
                token.push_back(static_cast<uint8_t>(std::stoi(line.substr(i + 2, 2), nullptr, 16)));
                i += 3;
            } else {
                if (line[i] == '\\' && i + 1 < close) ++i;
                token.push_back(static_cast<uint8_t>(line[i]));
            }
        }
        tokens.push_back(std::move(token));
    }
    return tokens;
}

// One input's mutations: 1 to 8 edits stacked, each at a position drawn from the PRNG.
class Mutator {
public:
    Mutator(uint64_t seed, const std::vector<Bytes> & corpus, std::vector<Bytes> dictionary, size_t max_len)
        : rng_(seed), corpus_(corpus), dictionary_(std::move(dictionary)), max_len_(max_len) {}

    Bytes mutate(Bytes data) {
        for (size_t edits = 1 + below(8); edits > 0; --edits) edit(data);
        if (data.size() > max_len_) data.resize(max_len_);
        return data;
    }

private:
    size_t below(size_t n) { return n == 0 ? 0 : static_cast<size_t>(rng_() % n); }

    // A range [begin, begin + length) of `data`, at most 64 bytes long (possibly empty).
    std::pair<size_t, size_t> range(const Bytes & data) {
        const size_t begin = below(data.size() + 1);
        return {begin, below(std::min<size_t>(64, data.size() - begin) + 1)};
    }

    void insert(Bytes & data, size_t at, const Bytes & bytes) { data.insert(data.begin() + at, bytes.begin(), bytes.end()); }

    void edit(Bytes & data) {
        switch (below(9)) {
            case 0:  // flip a bit
                if (!data.empty()) data[below(data.size())] ^= static_cast<uint8_t>(1u << below(8));
                break;
            case 1:  // set a byte
                if (!data.empty()) data[below(data.size())] = static_cast<uint8_t>(rng_());
                break;
            case 2:  // insert a random byte, 1 to 4 times
                insert(data, below(data.size() + 1), Bytes(1 + below(4), static_cast<uint8_t>(rng_())));
                break;
            case 3: {  // delete a range
                const auto [begin, length] = range(data);
                data.erase(data.begin() + begin, data.begin() + begin + length);
                break;
            }
            case 4: {  // copy a range elsewhere
                const auto [begin, length] = range(data);
                insert(data, below(data.size() + 1), Bytes(data.begin() + begin, data.begin() + begin + length));
                break;
            }
            case 5: {  // repeat a range in place, up to 256 times: deep nesting, long alternations
                const auto [begin, length] = range(data);
                const Bytes piece(data.begin() + begin, data.begin() + begin + length);
                for (size_t times = below(256); times > 0 && data.size() < max_len_; --times) insert(data, begin, piece);
                break;
            }
            case 6: {  // splice: this input's head and another's tail
                const Bytes & other = corpus_[below(corpus_.size())];
                data.resize(below(data.size() + 1));
                data.insert(data.end(), other.begin() + below(other.size() + 1), other.end());
                break;
            }
            default:  // a dictionary token, inserted (or, without a dictionary, a random byte)
                if (dictionary_.empty()) {
                    insert(data, below(data.size() + 1), Bytes(1, static_cast<uint8_t>(rng_())));
                } else {
                    insert(data, below(data.size() + 1), dictionary_[below(dictionary_.size())]);
                }
                break;
        }
    }

    std::mt19937_64 rng_;
    const std::vector<Bytes> & corpus_;
    const std::vector<Bytes> dictionary_;
    const size_t max_len_;
};

// A mutant is kept for the handlers; a replayed input that fails is its file already.
void run(const Bytes & bytes, bool mutant, unsigned timeout_seconds) {
    static const uint8_t kNoBytes = 0;  // libFuzzer never passes a null pointer, even for an empty input
    g_current = mutant ? &bytes : nullptr;
    ::alarm(timeout_seconds);
    LLVMFuzzerTestOneInput(bytes.empty() ? &kNoBytes : bytes.data(), bytes.size());
    ::alarm(0);
    g_current = nullptr;
}

[[noreturn]] void usage() {
    std::fprintf(stderr,
                 "usage: %s [--timeout SECONDS] [--mutate SECONDS --findings DIR [--seed N] [--dict FILE] [--max-len BYTES]] "
                 "FILE_OR_DIR...\n"
                 "  runs the fuzz target once on each input; with --mutate, then on mutations of them for SECONDS\n",
                 g_program);
    std::exit(2);
}

}  // namespace

int main(int argc, char ** argv) {
    g_program = argv[0];
    double mutate_seconds = 0;
    uint64_t seed = 1;
    const char * dictionary_path = nullptr;
    size_t max_len = 16384;
    int timeout_seconds = -1;  // none for a replay, 10 s a mutant, unless given
    std::vector<fs::path> inputs;
    bool any_path = false;
    for (int i = 1; i < argc; ++i) {
        const std::string arg = argv[i];
        if (arg.rfind("--", 0) == 0) {
            if (i + 1 >= argc) usage();
            const char * value = argv[++i];
            if (arg == "--mutate") mutate_seconds = std::atof(value);
            else if (arg == "--seed") seed = std::strtoull(value, nullptr, 10);
            else if (arg == "--findings") g_findings = value;
            else if (arg == "--dict") dictionary_path = value;
            else if (arg == "--max-len") max_len = std::strtoull(value, nullptr, 10);
            else if (arg == "--timeout") timeout_seconds = std::max(0, std::atoi(value));
            else usage();
            continue;
        }
        any_path = true;
        std::error_code ec;
        if (fs::is_directory(arg, ec)) {
            std::vector<fs::path> files;
            for (const auto & entry : fs::directory_iterator(arg)) {
                if (entry.is_regular_file() && entry.path().extension() != ".md") files.push_back(entry.path());
            }
            std::sort(files.begin(), files.end());
            inputs.insert(inputs.end(), files.begin(), files.end());
        } else if (fs::is_regular_file(arg, ec)) {
            inputs.push_back(arg);
        } else {
            std::fprintf(stderr, "%s: error: '%s' is neither a file nor a directory\n", g_program, argv[i]);
            return 2;
        }
    }
    if (!any_path || (mutate_seconds > 0 && g_findings.empty())) usage();
    if (mutate_seconds > 0 && inputs.empty()) {
        std::fprintf(stderr, "%s: error: no input to mutate\n", g_program);
        return 2;
    }
    std::vector<Bytes> corpus;
    for (const auto & path : inputs) {
        std::ifstream in(path, std::ios::binary);
        corpus.emplace_back((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        if (!in.good() && !in.eof()) {
            std::fprintf(stderr, "%s: error: cannot read '%s'\n", g_program, path.c_str());
            return 2;
        }
    }
    const std::vector<Bytes> dictionary = dictionary_path ? read_dictionary(dictionary_path) : std::vector<Bytes>{};
    if (timeout_seconds < 0) timeout_seconds = mutate_seconds > 0 ? 10 : 0;
    if (mutate_seconds > 0) fs::create_directories(g_findings);
    install_handlers(timeout_seconds);
    if (LLVMFuzzerInitialize) LLVMFuzzerInitialize(&argc, &argv);
    for (size_t i = 0; i < inputs.size(); ++i) {
        std::fprintf(stderr, "%s: %s (%zu bytes)\n", g_program, inputs[i].c_str(), corpus[i].size());
        run(corpus[i], false, timeout_seconds);
    }
    size_t mutations = 0;
    if (mutate_seconds > 0) {
        std::fprintf(stderr, "%s: mutating for %g s from seed %llu\n", g_program, mutate_seconds, static_cast<unsigned long long>(seed));
        Mutator mutator(seed, corpus, dictionary, max_len);
        const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(mutate_seconds);
        // Half the time the last mutant is mutated further, so that edits compound (a nesting
        // repeated twice); otherwise an input of the corpus is the start.
        Bytes last;
        for (; std::chrono::steady_clock::now() < end; ++mutations) {
            const bool again = !last.empty() && mutations % 2 == 1;
            last = mutator.mutate(again ? last : corpus[mutations / 2 % corpus.size()]);
            run(last, true, timeout_seconds);
        }
    }
    std::printf("%s: %zu inputs and %zu mutations of them, no finding\n", g_program, inputs.size(), mutations);
    return 0;
}
