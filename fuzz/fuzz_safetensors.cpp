// libFuzzer target: the input is a safetensors file, read by convert-eagle's reader
// (SafetensorsCheckpoint: the header, then every tensor it lists). A specula::Error is how a
// hostile input must end; a signal, a sanitizer report, any other exception or a leak is a finding.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "specula/error.h"
#include "eagle_convert.h"

namespace {
std::string g_checkpoint_dir;  // the reader takes a checkpoint directory: each input is its one file
}

extern "C" int LLVMFuzzerInitialize(int *, char ***) {
    const char * tmp = std::getenv("TMPDIR");
    g_checkpoint_dir = std::string(tmp ? tmp : "/tmp") + "/specula-fuzz-safetensors-" + std::to_string(::getpid());
    std::filesystem::create_directories(g_checkpoint_dir);
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t * data, size_t size) {
    const std::string path = g_checkpoint_dir + "/model.safetensors";
    FILE * f = std::fopen(path.c_str(), "wb");
    if (!f || std::fwrite(data, 1, size, f) != size || std::fclose(f) != 0) {
        std::fprintf(stderr, "fuzz_safetensors: cannot write %s\n", path.c_str());
        std::abort();
    }
    try {
        const specula::SafetensorsCheckpoint checkpoint(g_checkpoint_dir);
        for (const std::string & name : checkpoint.names()) checkpoint.read(name);
    } catch (const specula::Error &) {
    }
    return 0;
}
