// libFuzzer target: the input is a GGUF file, loaded as a target or draft model (Model::load) and
// as an EAGLE head (EagleHead::load: EAGLE-1 or EAGLE-3 by its architecture) for a fixed small
// target ($SPECULA_FUZZ_TARGET, written by fuzz_seeds). A specula::Error is how a hostile input
// must end; a signal, a sanitizer report, any other exception or a leak is a finding.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "specula/error.h"
#include "runtime/backend.h"
#include "runtime/eagle_head.h"
#include "runtime/model.h"

namespace {

// Kept for the whole run (reachable, so not leaks): a backend per input would dominate the time.
specula::Backend * g_backend = nullptr;
specula::Model * g_target = nullptr;
std::string g_input_path;  // the loaders read files: each input is written here first

}  // namespace

extern "C" int LLVMFuzzerInitialize(int *, char ***) {
    const char * target = std::getenv("SPECULA_FUZZ_TARGET");
    if (!target) {
        std::fprintf(stderr, "fuzz_model_loading: set SPECULA_FUZZ_TARGET to the model EAGLE heads are loaded for (scripts/fuzz.sh does)\n");
        std::exit(1);
    }
    g_backend = new specula::Backend(specula::BackendOptions{"cpu", 1});
    g_target = specula::Model::load(target, *g_backend).release();
    const char * tmp = std::getenv("TMPDIR");
    g_input_path = std::string(tmp ? tmp : "/tmp") + "/specula-fuzz-model-" + std::to_string(::getpid()) + ".gguf";
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t * data, size_t size) {
    FILE * f = std::fopen(g_input_path.c_str(), "wb");
    if (!f || std::fwrite(data, 1, size, f) != size || std::fclose(f) != 0) {
        std::fprintf(stderr, "fuzz_model_loading: cannot write %s\n", g_input_path.c_str());
        std::abort();
    }
    try {
        specula::Model::load(g_input_path, *g_backend);
    } catch (const specula::Error &) {
    }
    try {
        specula::EagleHead::load(g_input_path, *g_target, *g_backend);
    } catch (const specula::Error &) {
    }
    return 0;
}
