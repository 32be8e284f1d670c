// libFuzzer target: the input is a safetensors file, read by convert-eagle's reader
// (SafetensorsCheckpoint: the header, then every tensor it lists). A specula::Error is how a
// hostile input must end; a signal, a sanitizer report, any other exception or a leak is a finding.
#include <cstdint>
#include <filesystem>
#include <string>

#include "fuzz_input.h"
#include "specula/error.h"
#include "eagle_convert.h"

namespace {
std::string g_checkpoint_dir;  // the reader takes a checkpoint directory: each input is its one file
}

extern "C" int LLVMFuzzerInitialize(int *, char ***) {
    g_checkpoint_dir = specula::fuzz::input_path("safetensors", "checkpoint");
    std::filesystem::create_directories(g_checkpoint_dir);
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t * data, size_t size) {
    specula::fuzz::write_input(g_checkpoint_dir + "/model.safetensors", data, size);
    try {
        const specula::SafetensorsCheckpoint checkpoint(g_checkpoint_dir);
        for (const std::string & name : checkpoint.names()) checkpoint.read(name);
    } catch (const specula::Error &) {
    }
    return 0;
}
