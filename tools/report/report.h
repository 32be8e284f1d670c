#pragma once
// `specula report`: one self-contained HTML page (data inline, no network) showing speculative
// runs from their traces, or a `bench spec` result. docs/report.md describes the page.
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace specula::report {

// One trace (src/trace/) as the page reads it: {"name", "rounds": [round lines], "tokens": [token
// lines]}. Traces written before round lines existed give rounds rebuilt from their token lines
// (no trees). Throws specula::Error naming the file and line of anything that is not a trace.
nlohmann::json read_trace(const std::string & path);

// The page for {"kind": "traces", "runs": [read_trace(...), ...]} or {"kind": "bench", "bench": <bench spec JSON>}.
std::string render_page(const nlohmann::json & data);
void write_page(const std::string & path, const nlohmann::json & data);

// The page `specula serve` shows at "/": a chat streaming through the server's own
// /v1/chat/completions with the report's token colours, and the live figures of /metrics.json.
std::string live_page();

}  // namespace specula::report
