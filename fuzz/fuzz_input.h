#pragma once
// What the fuzz targets that read files share: each input is written to a file first (the loaders
// take paths), and the targets that load heads or sidecars load them for one small model.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

#include "runtime/backend.h"
#include "runtime/model.h"

namespace specula::fuzz {

// A file under $TMPDIR (scripts/fuzz.sh points it at /dev/shm: in memory a run is ~10x faster),
// one per target and process, removed when the process exits (every test run replays the corpora;
// an input that crashes the process is one libFuzzer has already saved as crash-<sha1>).
inline std::string input_path(const std::string & target, const std::string & file_name) {
    static std::vector<std::string> made;
    if (made.empty()) {
        std::atexit([] {
            std::error_code ignored;  // a path the target never created, or already gone
            for (const std::string & path : made) std::filesystem::remove_all(path, ignored);
        });
    }
    const char * tmp = std::getenv("TMPDIR");
    made.push_back(std::string(tmp ? tmp : "/tmp") + "/specula-fuzz-" + target + "-" + std::to_string(::getpid()) + "-" + file_name);
    return made.back();
}

// Writes one input to `path`; a failure is the harness's, not the input's: abort.
inline void write_input(const std::string & path, const uint8_t * data, size_t size) {
    FILE * f = std::fopen(path.c_str(), "wb");
    if (!f || std::fwrite(data, 1, size, f) != size || std::fclose(f) != 0) {
        std::fprintf(stderr, "fuzz: cannot write %s\n", path.c_str());
        std::abort();
    }
}

// $SPECULA_FUZZ_TARGET (written by fuzz_seeds) on a CPU backend, loaded once and kept for the whole
// run (reachable, so not a leak): a backend and model per input would dominate the time.
inline const Model & target_model(const char * fuzzer) {
    static const Model * model = [&] {
        const char * path = std::getenv("SPECULA_FUZZ_TARGET");
        if (!path) {
            std::fprintf(stderr, "%s: set SPECULA_FUZZ_TARGET to the model its inputs are loaded for (scripts/fuzz.sh does)\n", fuzzer);
            std::exit(1);
        }
        auto * backend = new Backend(BackendOptions{"cpu", 1});
        return Model::load(path, *backend).release();
    }();
    return *model;
}

}  // namespace specula::fuzz
