// libFuzzer target: the input is an HTTP request body as `specula serve` receives it, parsed for
// both endpoints (chat completions, completions). An ApiError (a 400 naming the field) is how a
// hostile body must end; a signal, a sanitizer report, any other exception or a leak is a finding.
#include <cstdint>
#include <string>

#include "server/openai.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t * data, size_t size) {
    const std::string body(reinterpret_cast<const char *>(data), size);
    for (auto endpoint : {specula::openai::Endpoint::Chat, specula::openai::Endpoint::Completions}) {
        try {
            specula::openai::parse_request(endpoint, body, "model");
        } catch (const specula::openai::ApiError &) {
        }
    }
    return 0;
}
