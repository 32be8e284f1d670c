// The fuzz targets without libFuzzer: a main that runs one target's LLVMFuzzerTestOneInput once on
// every file it is given (a directory gives each file in it, in name order). The test suite builds
// each target this way with the compiler and sanitizers of its tree and replays the seed corpus and
// fuzz/regressions/ through it, so every input that once crashed a target stays checked by the
// ASan + UBSan run without building the clang tree scripts/fuzz.sh mutates inputs in.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t * data, size_t size);
// Defined by the targets that load something once (a model, a server); weak so the others link.
extern "C" __attribute__((weak)) int LLVMFuzzerInitialize(int * argc, char *** argv);

namespace fs = std::filesystem;

int main(int argc, char ** argv) {
    if (argc < 2) {
        std::fprintf(stderr, "usage: %s FILE_OR_DIR...  (runs the fuzz target once on each input)\n", argv[0]);
        return 2;
    }
    std::vector<fs::path> inputs;
    for (int i = 1; i < argc; ++i) {
        const fs::path arg = argv[i];
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
            std::fprintf(stderr, "%s: error: '%s' is neither a file nor a directory\n", argv[0], argv[i]);
            return 2;
        }
    }
    if (LLVMFuzzerInitialize) LLVMFuzzerInitialize(&argc, &argv);
    for (const auto & path : inputs) {
        std::ifstream in(path, std::ios::binary);
        const std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        if (!in.good() && !in.eof()) {
            std::fprintf(stderr, "%s: error: cannot read '%s'\n", argv[0], path.c_str());
            return 2;
        }
        std::fprintf(stderr, "%s: %s (%zu bytes)\n", argv[0], path.c_str(), bytes.size());
        static const uint8_t kNoBytes = 0;  // libFuzzer never passes a null pointer, even for an empty input
        LLVMFuzzerTestOneInput(bytes.empty() ? &kNoBytes : bytes.data(), bytes.size());
    }
    std::printf("%s: %zu inputs, no finding\n", argv[0], inputs.size());
    return 0;
}
