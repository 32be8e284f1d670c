#include "trace/trace.h"

#include <cstdio>
#include <nlohmann/json.hpp>

#include "common/error.h"

namespace specula {

TraceWriter::TraceWriter(const std::string & path, std::function<std::string(int32_t)> token_text)
    : out_(path, std::ios::trunc), token_text_(std::move(token_text)) {
    if (!out_) throw Error(path + ": cannot open the trace file for writing");
}

void TraceWriter::round(int round, int base_position, int draft_length, double draft_ms, double verify_ms, const VerifyResult & r) {
    for (const VerifyEvent & e : r.events) {
        nlohmann::json j = {
            {"round", round},
            {"position", base_position + e.depth},
            {"depth", e.depth},
            {"token", e.token},
            {"text", token_text_(e.token)},
            {"q", e.q},
            {"p", e.p},
            {"accept_prob", e.accept_prob},
            {"draw", e.draw < 0 ? nlohmann::json(nullptr) : nlohmann::json(e.draw)},
            {"outcome", outcome_name(e.outcome)},
            {"draft_len", draft_length},
            {"draft_ms", draft_ms},
            {"verify_ms", verify_ms},
        };
        out_ << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << '\n';
    }
}

std::string format_summary(const SpeculationStats & s) {
    char buf[256];
    std::snprintf(buf, sizeof(buf), "drafted %d, accepted %d (%.1f%%), mean accepted length %.2f tokens/forward over %d rounds",
                  s.drafted, s.accepted, 100.0 * s.acceptance_rate(), s.mean_accepted_length(), s.rounds);
    std::string out = buf;
    if (!s.reached_at.empty()) {
        out += "; per-position acceptance:";
        for (size_t d = 0; d < s.reached_at.size(); ++d) {
            std::snprintf(buf, sizeof(buf), " %zu:%.2f", d + 1, s.acceptance_at(d));
            out += buf;
        }
    }
    return out;
}

}  // namespace specula
