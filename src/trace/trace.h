#pragma once
// Trace of speculative rounds (JSON lines) and the summary every run prints.
//
// The trace file is one observer of RoundReports (specula/report.h). Per round, one line {"kind":"round", ...} with the verified tree (token, parent, depth, draft
// probability q of each node, path probability), the accepted nodes, the policy's decision and
// the round's timings; then one line {"kind":"token", ...} per verification event (accepted and
// rejected drafts, the correction or bonus token). SpecEE's lossless drafts add each node's exit
// layer to both; its lossy mode writes {"kind":"exit", ...} per token instead of rounds.
// docs/report.md lists every field.
#include <cstdint>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "specula/report.h"
#include "verify/verify.h"

namespace specula {

class TraceWriter {
public:
    // token_text renders a token for the trace; the file is truncated.
    TraceWriter(const std::string & path, std::function<std::string(int32_t)> token_text);
    void round(const RoundReport & round);
    // SpecEE's lossy mode: one line {"kind":"exit", ...} per token.
    void exit(const ExitReport & token);

private:
    std::ofstream out_;
    std::function<std::string(int32_t)> token_text_;
};

std::string format_summary(const SpeculationStats & s);
// Where a run's generation time went per round: the target's forwards, drafting, the commits, and
// the rest (the caller's work between rounds); empty for a run without rounds.
std::string format_time_split(const GenerationStats & g);

}  // namespace specula
