#include "trace/trace.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "specula/error.h"

namespace specula {

namespace {
std::string dump(const nlohmann::json & j) { return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace); }
}  // namespace

TraceWriter::TraceWriter(const std::string & path, std::function<std::string(int32_t)> token_text)
    : out_(path, std::ios::trunc), token_text_(std::move(token_text)) {
    if (!out_) throw Error(path + ": cannot open the trace file for writing");
}

void TraceWriter::round(const RoundReport & report) {
    const RoundDecision & decision = report.decision;
    const int round = report.round, base_position = report.position;
    const double draft_ms = report.draft_ms, verify_ms = report.verify_ms;
    nlohmann::json nodes = nlohmann::json::object();
    std::vector<int32_t> token;
    std::vector<int> parent, depth;
    std::vector<float> q, path_prob;
    std::vector<std::string> text;
    for (const DraftNode & n : report.tree) {
        token.push_back(n.token);
        parent.push_back(n.parent);
        depth.push_back(n.depth);
        q.push_back(n.q);
        path_prob.push_back(n.path_prob);
        text.push_back(token_text_(n.token));
    }
    nodes["token"] = token;
    nodes["parent"] = parent;
    nodes["depth"] = depth;
    nodes["q"] = q;
    nodes["path_prob"] = path_prob;
    nodes["text"] = text;
    auto layer = [](int l) { return l < 0 ? nlohmann::json(nullptr) : nlohmann::json(l); };
    if (!report.exit_layer.empty()) {
        nlohmann::json exits = nlohmann::json::array();
        for (int l : report.exit_layer) exits.push_back(layer(l));
        nodes["exit_layer"] = exits;
    }
    out_ << dump({
                {"kind", "round"},
                {"round", round},
                {"position", base_position},
                {"policy", decision.policy},
                {"asked", decision.asked},
                {"drafted_nodes", decision.drafted_nodes},
                {"verified_nodes", decision.verified_nodes},
                {"why", decision.why},
                {"draft_ms", draft_ms},
                {"draft_level_ms", report.draft_level_ms},
                {"verify_ms", verify_ms},
                {"forward_ms", report.forward_ms},
                {"commit_ms", report.commit_ms},
                {"tree", nodes},
                {"accepted", report.accepted},
                {"next_token", report.next_token},
                {"bonus", report.bonus},
            })
         << '\n';
    for (const VerifyEvent & e : report.events) {
        nlohmann::json j = {
            {"kind", "token"},
            {"round", round},
            {"position", base_position + e.depth},
            {"depth", e.depth},
            {"node", e.node},
            {"token", e.token},
            {"text", token_text_(e.token)},
            {"q", e.q},
            {"p", e.p},
            {"accept_prob", e.accept_prob},
            {"draw", e.draw < 0 ? nlohmann::json(nullptr) : nlohmann::json(e.draw)},
            {"outcome", outcome_name(e.outcome)},
            {"draft_len", decision.asked},
            {"draft_ms", draft_ms},
            {"verify_ms", verify_ms},
        };
        if (e.node >= 0 && e.node < static_cast<int>(report.exit_layer.size())) j["exit_layer"] = layer(report.exit_layer[e.node]);
        out_ << dump(j) << '\n';
    }
}

void TraceWriter::exit(const ExitReport & t) {
    out_ << dump({
                {"kind", "exit"},
                {"position", t.position},
                {"token", t.token},
                {"text", token_text_(t.token)},
                {"exit_layer", t.exit_layer < 0 ? nlohmann::json(nullptr) : nlohmann::json(t.exit_layer)},
                {"n_layer", t.n_layer},
            })
         << '\n';
}

std::string format_summary(const SpeculationStats & s) {
    char buf[256];
    std::snprintf(buf, sizeof(buf), "drafted %d, accepted %d (%.1f%%), mean accepted length %.2f tokens/forward over %d rounds",
                  s.drafted, s.accepted, 100.0 * s.acceptance_rate(), s.mean_accepted_length(), s.rounds);
    std::string out = buf;
    if (!s.drafted_at.empty()) {
        out += "; per-position acceptance:";
        for (size_t d = 0; d < s.drafted_at.size(); ++d) {
            if (s.drafted_at[d] == 0) {
                std::snprintf(buf, sizeof(buf), " %zu:-", d + 1);
            } else {
                std::snprintf(buf, sizeof(buf), " %zu:%.2f", d + 1, s.acceptance_at(d));
            }
            out += buf;
        }
    }
    return out;
}

std::string format_time_split(const GenerationStats & g) {
    const SpeculationStats & s = g.speculation;
    const double total = g.generation_seconds * 1000.0;
    if (s.rounds == 0 || total <= 0.0) return {};
    const double other = std::max(0.0, total - s.forward_ms - s.draft_ms - s.commit_ms);
    char levels[96] = "";
    if (s.draft_forwards > 0) {
        std::snprintf(levels, sizeof(levels), "; %.2f drafter levels of %.3f ms", double(s.draft_forwards) / s.rounds,
                      s.draft_level_ms / s.draft_forwards);
    }
    char buf[320];
    std::snprintf(buf, sizeof(buf),
                  "time per round %.2f ms: target forward %.2f ms (%.0f%%), drafting %.2f ms (%.0f%%%s), commit %.2f ms (%.0f%%), "
                  "other %.2f ms (%.0f%%)",
                  total / s.rounds, s.forward_ms / s.rounds, 100.0 * s.forward_ms / total, s.draft_ms / s.rounds,
                  100.0 * s.draft_ms / total, levels, s.commit_ms / s.rounds, 100.0 * s.commit_ms / total, other / s.rounds,
                  100.0 * other / total);
    return buf;
}

}  // namespace specula
