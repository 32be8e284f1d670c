// The JSON-lines trace: one line per decision with the documented fields, and each round's tree
// and policy decision rebuilt from it.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "draft/draft_model_drafter.h"
#include "trace/trace.h"
#include "speculative_run.h"

namespace specula {
namespace {

using test::kPrompts;
using test::Spec;

TEST(Speculative, TraceHasOneLinePerDecisionWithTheDocumentedFields) {
    Spec s;
    DraftModelDrafter drafter(*s.draft_small, 256);
    const std::string path = test::scratch_file("trace.jsonl");
    SamplingParams sp;
    sp.temperature = 1.0f;
    sp.seed = 3;
    {
        TraceWriter w(path, [](int32_t t) { return std::string("t").append(std::to_string(t)); });
        s.run(drafter, DraftPolicyKind::Fixed, 3, kPrompts[1], 20, sp,
              [&](const RoundInfo & r) { w.round(round_report(r)); });
    }
    std::ifstream in(path);
    std::string line;
    int lines = 0, emitted = 0;
    while (std::getline(in, line)) {
        auto j = nlohmann::json::parse(line);
        if (j["kind"] == "round") continue;  // checked by TraceRecordsEachRoundsTreeAndPolicyDecision
        ASSERT_EQ(j["kind"], "token");
        for (const char * k : {"round", "position", "token", "text", "q", "p", "accept_prob", "draw", "outcome", "draft_len", "draft_ms", "verify_ms"}) {
            ASSERT_TRUE(j.contains(k)) << k;
        }
        const std::string o = j["outcome"];
        emitted += o == "accepted" || o == "correction" || o == "bonus";
        ++lines;
    }
    EXPECT_GT(lines, 0);
    EXPECT_GE(emitted, 20);
}

// Catches a trace that loses or garbles a round's tree (tokens, parents, depths, draft
// probabilities), the accepted path or the policy's decision: the tree rebuilt from the trace's
// round lines must equal what the drafter handed to the verifier, round by round.
TEST(Speculative, TraceRecordsEachRoundsTreeAndPolicyDecision) {
    Spec s;
    DraftModelDrafter drafter(*s.target, 256);  // drafts what the target accepts: the policy keeps drafting trees
    const std::string path = test::scratch_file("trace_tree.jsonl");
    SamplingParams sp;
    sp.temperature = 1.0f;
    sp.seed = 5;
    std::vector<TokenTree> drafted;
    std::vector<std::vector<int>> accepted;
    std::vector<RoundDecision> decisions;
    {
        TraceWriter w(path, [](int32_t t) { return std::string("t").append(std::to_string(t)); });
        // A flat verify cost far above the drafter's real time (microseconds per level, a
        // millisecond under sanitizers or load): every node is free to verify, so the policy keeps
        // whole trees whatever the machine does (with a rising cost it often kept one node).
        TreeSizePolicy tree_size(std::vector<double>(10, 100.0));
        s.run(
            drafter, DraftPolicyKind::Fixed, 3, kPrompts[1], 24, sp,
            [&](const RoundInfo & r) {
                drafted.push_back(r.draft->tree);
                accepted.push_back(r.result->accepted);
                decisions.push_back(r.decision);
                w.round(round_report(r));
            },
            nullptr, nullptr, TreeBudget{TreeShape::Dynamic, 3, 3, 0}, &tree_size);
    }
    ASSERT_FALSE(drafted.empty());
    std::ifstream in(path);
    std::string line;
    size_t round = 0;
    int branching_rounds = 0;
    while (std::getline(in, line)) {
        const auto j = nlohmann::json::parse(line);
        if (j["kind"] != "round") {
            if (j["outcome"] == "accepted") {  // an accepted token names its node in the round's tree
                const TokenTree & t = drafted.at(round - 1);
                EXPECT_EQ(j["token"].get<int32_t>(), t.token.at(j["node"].get<int>()));
            }
            continue;
        }
        ASSERT_LT(round, drafted.size());
        EXPECT_EQ(j["round"].get<size_t>(), round);
        const auto & n = j["tree"];
        TokenTree rebuilt;
        for (size_t i = 0; i < n["token"].size(); ++i) {
            rebuilt.add(n["parent"][i].get<int>(), n["token"][i].get<int32_t>(), std::log(n["path_prob"][i].get<float>()));
        }
        const TokenTree & want = drafted[round];
        EXPECT_EQ(rebuilt.token, want.token) << "round " << round;
        EXPECT_EQ(rebuilt.parent, want.parent) << "round " << round;
        EXPECT_EQ(rebuilt.depth, want.depth) << "round " << round;
        EXPECT_EQ(n["depth"].get<std::vector<int>>(), want.depth);
        for (int i = 0; i < want.size(); ++i) {
            EXPECT_NEAR(n["q"][i].get<float>(), node_draft_prob(want, i), 1e-6f);
            EXPECT_NEAR(n["path_prob"][i].get<float>(), std::exp(want.logp[i]), 1e-6f);
            EXPECT_LT(node_draft_prob(want, i), 1.0f);  // a sampled draft model's q, not the deterministic 1
        }
        for (int i = 0; i < want.size(); ++i) branching_rounds += want.children(i).size() > 1 || want.children(TokenTree::kRoot).size() > 1;
        EXPECT_EQ(j["accepted"].get<std::vector<int>>(), accepted[round]);
        // The forward is part of the verify time; the commit follows the forward.
        EXPECT_GE(j["forward_ms"].get<double>(), 0.0);
        EXPECT_LE(j["forward_ms"].get<double>(), j["verify_ms"].get<double>());
        EXPECT_GE(j["commit_ms"].get<double>(), 0.0);
        EXPECT_EQ(j["policy"], "tree-size");
        EXPECT_EQ(j["verified_nodes"].get<int>(), want.size());
        EXPECT_EQ(j["drafted_nodes"].get<int>(), decisions[round].drafted_nodes);
        EXPECT_GE(j["drafted_nodes"].get<int>(), want.size());
        // A round the policy chose not to draft says so; one that drafted, how it sized the tree.
        EXPECT_NE(j["why"].get<std::string>().find(want.size() == 0 ? "no draft" : "calibration"), std::string::npos) << j["why"];
        ++round;
    }
    EXPECT_EQ(round, drafted.size());
    EXPECT_GT(branching_rounds, 0) << "no round drafted a real tree: the test would not see parents garbled";
}

}  // namespace
}  // namespace specula
