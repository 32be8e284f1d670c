// libFuzzer target: the input is an HTTP request body as `specula serve` receives it, parsed for
// both endpoints (chat completions, completions) and, when refused, answered as the server answers
// (the error object through openai::wire). An ApiError of status 400 or 404 (an unknown model) is
// how a hostile body must end; a signal, a sanitizer report, any other exception or status, or a
// leak is a finding.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "server/openai.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t * data, size_t size) {
    const std::string body(reinterpret_cast<const char *>(data), size);
    for (auto endpoint : {specula::openai::Endpoint::Chat, specula::openai::Endpoint::Completions}) {
        try {
            specula::openai::parse_request(endpoint, body, {{"model"}});
        } catch (const specula::openai::ApiError & e) {
            if (e.status != 400 && e.status != 404) std::abort();
            (void)specula::openai::wire(e.body());
        }
    }
    return 0;
}
