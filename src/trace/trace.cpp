#include "trace/trace.h"

#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "common/error.h"

namespace specula {

namespace {
std::string dump(const nlohmann::json & j) { return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace); }
}  // namespace

TraceWriter::TraceWriter(const std::string & path, std::function<std::string(int32_t)> token_text)
    : out_(path, std::ios::trunc), token_text_(std::move(token_text)) {
    if (!out_) throw Error(path + ": cannot open the trace file for writing");
}

float node_draft_prob(const TokenTree & tree, int node) {
    const auto q = tree.q_of(tree.parent[node]);
    const auto t = static_cast<size_t>(tree.token[node]);
    return t < q.size() ? q[t] : 1.0f;
}

void TraceWriter::round(int round, int base_position, double draft_ms, double verify_ms, const RoundDecision & decision,
                        const TokenTree & tree, const VerifyResult & r) {
    nlohmann::json nodes = {{"token", tree.token}, {"parent", tree.parent}, {"depth", tree.depth}};
    std::vector<float> q, path_prob;
    std::vector<std::string> text;
    for (int i = 0; i < tree.size(); ++i) {
        q.push_back(node_draft_prob(tree, i));
        path_prob.push_back(std::exp(tree.logp[i]));
        text.push_back(token_text_(tree.token[i]));
    }
    nodes["q"] = q;
    nodes["path_prob"] = path_prob;
    nodes["text"] = text;
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
                {"verify_ms", verify_ms},
                {"tree", nodes},
                {"accepted", r.accepted},
                {"next_token", r.next_token},
                {"bonus", r.bonus},
            })
         << '\n';
    for (const VerifyEvent & e : r.events) {
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
        out_ << dump(j) << '\n';
    }
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

}  // namespace specula
