// libFuzzer target: the input is a SpecEE exit-predictor sidecar (GGUF), loaded by
// ExitPredictor::load for a fixed small target ($SPECULA_FUZZ_TARGET, written by fuzz_seeds), then
// asked for every layer's exit probability and the online schedule. A specula::Error is how a
// hostile input must end; a signal, a sanitizer report, any other exception or a leak is a finding.
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz_input.h"
#include "specula/error.h"
#include "runtime/exit_predictor.h"

namespace {
const specula::Model * g_target = nullptr;
std::string g_input_path;
}  // namespace

extern "C" int LLVMFuzzerInitialize(int *, char ***) {
    g_target = &specula::fuzz::target_model("fuzz_exit_predictor");
    g_input_path = specula::fuzz::input_path("exit-predictor", "input.gguf");
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t * data, size_t size) {
    specula::fuzz::write_input(g_input_path, data, size);
    try {
        const auto predictor = specula::ExitPredictor::load(g_input_path, *g_target);
        const std::vector<float> features(specula::kExitFeatures, 0.5f);
        for (size_t i = 0; i < predictor->layers().size(); ++i) {
            predictor->exit_probability(i, features);
            predictor->index_of(predictor->layers()[i]);
        }
        const std::vector<int> recent_stops(specula::kOnlineWindow, predictor->layers().back());
        specula::online_probe_layers(predictor->layers(), predictor->offline_layers(), recent_stops);
    } catch (const specula::Error &) {
    }
    return 0;
}
