#pragma once
// Progress of long work on stderr: on a terminal one bar redrawn in place (\r) with the rate and
// the ETA; otherwise one line per step, so logs stay readable. Never writes to stdout (generated
// text and JSON stay byte-identical). `specula --quiet` silences it process-wide.
#include <chrono>
#include <cstdint>
#include <string>

namespace specula {

class Progress {
public:
    // `total` steps of `what` (e.g. "bench spec", "writing model.gguf").
    Progress(std::string what, int64_t total);
    ~Progress();  // ends the bar's line on a terminal
    Progress(const Progress &) = delete;
    Progress & operator=(const Progress &) = delete;

    // One more step done; `detail` names it (e.g. "prompt 2/6 code, mode spec-chain").
    void step(const std::string & detail = "");

    static void set_quiet(bool quiet);

private:
    std::string what_;
    int64_t total_, done_ = 0;
    std::chrono::steady_clock::time_point start_;
    bool terminal_;
};

}  // namespace specula
