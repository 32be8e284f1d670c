#pragma once
// Trace of speculative rounds (JSON lines) and the summary every run prints.
//
// Per round, one line {"kind":"round", ...} with the verified tree (token, parent, depth, draft
// probability q of each node, path probability), the accepted nodes, the policy's decision and
// the round's timings; then one line {"kind":"token", ...} per verification event (accepted and
// rejected drafts, the correction or bonus token). docs/report.md lists every field.
#include <cstdint>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "specula/specula.h"
#include "tree/token_tree.h"
#include "verify/verify.h"

namespace specula {

// What a round's policy chose, for the trace.
struct RoundDecision {
    const char * policy = "";  // cost | heuristic | fixed (chains), tree-size | fixed-tree (trees)
    int asked = 0;             // draft length (chains) or node budget (trees) the policy asked for
    int drafted_nodes = 0;     // nodes the drafter produced
    int verified_nodes = 0;    // nodes sent to the target after pruning
    std::string why;           // the policy's reasons where it exposes them; may be empty
};

class TraceWriter {
public:
    // token_text renders a token for the trace; the file is truncated.
    TraceWriter(const std::string & path, std::function<std::string(int32_t)> token_text);
    void round(int round, int base_position, double draft_ms, double verify_ms, const RoundDecision & decision,
               const TokenTree & tree, const VerifyResult & result);

private:
    std::ofstream out_;
    std::function<std::string(int32_t)> token_text_;
};

// Draft probability of a node's own token: q of its parent's distribution, 1 when deterministic.
float node_draft_prob(const TokenTree & tree, int node);

std::string format_summary(const SpeculationStats & s);

}  // namespace specula
