// libFuzzer target: the input is a GGUF file, loaded as a target or draft model (Model::load) and
// as an EAGLE head (EagleHead::load: EAGLE-1 or EAGLE-3 by its architecture) for a fixed small
// target ($SPECULA_FUZZ_TARGET, written by fuzz_seeds). A specula::Error is how a hostile input
// must end; a signal, a sanitizer report, any other exception or a leak is a finding.
#include <cstdint>
#include <string>

#include "fuzz_input.h"
#include "specula/error.h"
#include "runtime/eagle_head.h"

namespace {
const specula::Model * g_target = nullptr;
std::string g_input_path;
}  // namespace

extern "C" int LLVMFuzzerInitialize(int *, char ***) {
    g_target = &specula::fuzz::target_model("fuzz_model_loading");
    g_input_path = specula::fuzz::input_path("model", "input.gguf");
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t * data, size_t size) {
    specula::fuzz::write_input(g_input_path, data, size);
    try {
        specula::Model::load(g_input_path, g_target->backend());
    } catch (const specula::Error &) {
    }
    try {
        specula::EagleHead::load(g_input_path, *g_target, g_target->backend());
    } catch (const specula::Error &) {
    }
    return 0;
}
