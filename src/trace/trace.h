#pragma once
// Per-token trace of speculative rounds (JSON lines) and the summary every run prints.
#include <cstdint>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "specula/specula.h"
#include "verify/verify.h"

namespace specula {

class TraceWriter {
public:
    // token_text renders a token for the trace; the file is truncated.
    TraceWriter(const std::string & path, std::function<std::string(int32_t)> token_text);
    void round(int round, int base_position, int draft_length, double draft_ms, double verify_ms, const VerifyResult & result);

private:
    std::ofstream out_;
    std::function<std::string(int32_t)> token_text_;
};

std::string format_summary(const SpeculationStats & s);

}  // namespace specula
