// `specula serve`'s scheduler and request checking, without HTTP (tests/server/ drives the HTTP
// side with the real openai client). The bundled 15.7M family, greedy and seeded sampling.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "specula/error.h"
#include "engine/target.h"
#include "server/openai.h"
#include "server/scheduler.h"
#include "test_models.h"
#include "tokenizer/tokenizer.h"

namespace specula {
namespace {


const std::vector<std::string> kPrompts = {
    "def fibonacci(n):", "The Python standard library", "import os\nimport sys\n", "class Parser:", "Return the number of",
    "    for i in range(", "The following example shows", "# Copyright", "It is possible to",
};

std::unique_ptr<Target> open_target(bool speculative) {
    EngineOptions o;
    o.model_path = test::shipped_model("specula-target.gguf");
    if (speculative) {
        o.drafter = {DrafterKind::DraftModel, test::shipped_model("specula-draft.gguf")};
        o.draft_policy = DraftPolicyKind::Fixed;  // no timing in the draft length: sampled output depends on the seed only
        o.draft_max = 4;
    }
    o.n_ctx = 192;
    o.n_threads = 1;
    return Target::open(o);
}

GenerationOptions options(int n, float temperature = 0.0f, uint64_t seed = 1) {
    GenerationOptions g;
    g.n_predict = n;
    g.sampling.temperature = temperature;
    g.sampling.seed = seed;
    g.stop_at_end_of_generation = false;
    return g;
}

std::string drain(Job & job) {
    std::string text;
    while (job.next(text) != Job::Wait::Ended) {
    }
    EXPECT_EQ(job.result().error, "");
    return text;
}

// Runs prompt 0 (with `options`) together with `neighbours` other requests; returns prompt 0's text.
std::string with_neighbours(Target & target, int parallel, int neighbours, const GenerationOptions & mine) {
    Scheduler scheduler(target, SchedulerOptions{parallel, 16, 7});
    std::vector<std::shared_ptr<Job>> jobs;
    for (int i = 1; i <= neighbours; ++i) {
        // Neighbours of every length, sampling or not, so that they join and leave mid-run.
        jobs.push_back(scheduler.submit(target.tokenizer->tokenize(kPrompts[i % kPrompts.size()]), options(5 + 7 * i, i % 2 ? 0.9f : 0.0f, 100 + i)));
    }
    auto job = scheduler.submit(target.tokenizer->tokenize(kPrompts[0]), mine);
    for (auto & j : jobs) drain(*j);
    return drain(*job);
}

// Catches: cross-talk between sequences in the shared forward (mask, slots, rows), one slot's
// drafter or KV state leaking into another's, and scheduling that changes a sequence's rounds.
TEST(Scheduler, GreedyTextIsTheSameAloneAndWithOneTwoFourEightConcurrentSequences) {
    for (bool speculative : {false, true}) {
        SCOPED_TRACE(speculative ? "draft model" : "no drafter");
        auto target = open_target(speculative);
        const std::string alone = with_neighbours(*target, 1, 0, options(40));
        EXPECT_FALSE(alone.empty());
        for (int n : {1, 2, 4, 8}) EXPECT_EQ(with_neighbours(*target, n, n - 1 + (n == 8 ? 3 : 0), options(40)), alone) << n << " slots";
    }
}

// Catches: a Rng shared between sequences or seeded from the slot, sampling params taken from a
// neighbour, draws that depend on what else is in the step.
TEST(Scheduler, SampledTextWithAFixedSeedDoesNotDependOnTheOtherSequences) {
    auto target = open_target(true);
    const GenerationOptions mine = options(40, 0.8f, 1234);
    const std::string alone = with_neighbours(*target, 1, 0, mine);
    EXPECT_EQ(with_neighbours(*target, 4, 5, mine), alone);
    EXPECT_NE(with_neighbours(*target, 1, 0, options(40, 0.8f, 1235)), alone);  // the seed matters
}

// Catches: requests beyond the slots and the queue accepted, a cancelled request keeping its slot.
TEST(Scheduler, FullQueueRefusesAndACancelledRequestFreesItsSlot) {
    auto target = open_target(false);
    Scheduler scheduler(*target, SchedulerOptions{1, 1, 256});
    const auto prompt = target->tokenizer->tokenize(kPrompts[1]);
    auto first = scheduler.submit(prompt, options(150));
    auto second = scheduler.submit(prompt, options(3));
    ASSERT_TRUE(first && second);
    EXPECT_EQ(scheduler.submit(prompt, options(3)), nullptr);

    std::string text;
    while (text.empty()) ASSERT_NE(first->next(text), Job::Wait::Ended);
    first->cancel();
    while (first->next(text) != Job::Wait::Ended) {
    }
    EXPECT_EQ(first->result().error, "cancelled");
    EXPECT_LT(first->result().n_generated, 150);
    EXPECT_FALSE(drain(*second).empty());  // got the freed slot
    const SchedulerMetrics m = scheduler.metrics();
    EXPECT_EQ(m.requests_cancelled, 1u);
    EXPECT_EQ(m.requests_finished, 1u);
    EXPECT_EQ(m.processing, 0);
    EXPECT_EQ(m.slot_states.at(0).n_cached, 0);
    EXPECT_NE(test::error_message([&] { scheduler.submit(prompt, options(190)); }).find("exceed the 192-token context"), std::string::npos);
}

// Catches: text split inside a UTF-8 character between stream chunks.
TEST(Scheduler, StreamedTextNeverSplitsAUtf8Character) {
    auto target = open_target(false);
    Scheduler scheduler(*target, SchedulerOptions{1, 1, 256});
    auto job = scheduler.submit(target->tokenizer->tokenize("\xc3\xa9t\xc3\xa9 \xe2\x82\xac"), options(60, 1.5f, 7));
    std::string chunk;
    std::vector<TokenOrigin> origins;
    while (job->next(chunk, &origins) != Job::Wait::Ended) {
        // The chunk's token origins spell it (a split character goes with the token completing it).
        std::string spelled;
        for (const TokenOrigin & o : origins) spelled += o.text;
        EXPECT_EQ(spelled, chunk);
        origins.clear();
        // Every chunk ends on a character boundary: its last lead byte has all its continuation bytes.
        size_t i = chunk.size();
        while (i > 0 && (static_cast<uint8_t>(chunk[i - 1]) & 0xC0) == 0x80) --i;
        if (i > 0) {
            const uint8_t lead = static_cast<uint8_t>(chunk[i - 1]);
            const size_t need = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 1;
            EXPECT_EQ(chunk.size() - (i - 1), need) << chunk;
        }
        chunk.clear();
    }
}

// Catches stream token origins (the live page's colours) that lose or reorder text, or call a
// draft the target's token: with a draft model every accepted draft is classed "accepted" at its
// depth, every round ends in the target's "bonus" or "correction", and the texts spell the output.
TEST(Scheduler, TokenOriginsSpellTheTextAndTellDraftsFromTargetTokens) {
    auto target = open_target(true);
    Scheduler scheduler(*target, SchedulerOptions{1, 1, 256});
    auto job = scheduler.submit(target->tokenizer->tokenize(kPrompts[0]), options(48));
    std::string text, spelled;
    std::vector<TokenOrigin> origins;
    while (job->next(text, &origins) != Job::Wait::Ended) {
    }
    int accepted = 0, target_tokens = 0, expected_depth = 1;
    for (const TokenOrigin & o : origins) {
        spelled += o.text;
        const std::string kind = o.kind;
        if (kind == "accepted") {
            EXPECT_EQ(o.depth, expected_depth++);
            ++accepted;
        } else {
            EXPECT_TRUE(kind == "bonus" || kind == "correction") << kind;
            EXPECT_EQ(o.depth, expected_depth);
            expected_depth = 1;
            ++target_tokens;
        }
    }
    EXPECT_EQ(spelled, text);
    EXPECT_EQ(origins.size(), 48u);
    EXPECT_GT(accepted, 0);
    EXPECT_GT(target_tokens, 0);
    EXPECT_LE(accepted, job->result().stats.speculation.accepted);
}

openai::ApiError refusal(openai::Endpoint e, const std::string & body) {
    try {
        openai::parse_request(e, body, "specula-target");
    } catch (const openai::ApiError & error) {
        return error;
    }
    return openai::ApiError{0, "accepted", "", "", ""};
}

// Catches: a malformed or unsupported request accepted (or refused without naming the field).
TEST(OpenAi, BadRequestsAreRefusedWith400NamingTheField) {
    using openai::Endpoint;
    EXPECT_EQ(refusal(Endpoint::Chat, "{\"messages\": [").status, 400);
    EXPECT_EQ(refusal(Endpoint::Chat, "[1]").status, 400);
    EXPECT_EQ(refusal(Endpoint::Completions, "1E999").status, 400);  // out of double's range: found by fuzz_openai_request
    EXPECT_EQ(refusal(Endpoint::Chat, R"({"messages": []})").param, "messages");
    EXPECT_EQ(refusal(Endpoint::Chat, R"({"messages": [{"role": "wizard", "content": "x"}]})").param, "messages[0].role");
    const std::string hi = R"("messages": [{"role": "user", "content": "hi"}])";
    EXPECT_EQ(refusal(Endpoint::Chat, "{" + hi + R"(, "model": "gpt-4"})").code, "model_not_found");
    EXPECT_EQ(refusal(Endpoint::Chat, "{" + hi + R"(, "max_tokens": -1})").param, "max_tokens");
    EXPECT_EQ(refusal(Endpoint::Chat, "{" + hi + R"(, "n": 2})").param, "n");
    EXPECT_EQ(refusal(Endpoint::Chat, "{" + hi + R"(, "temperature": 3})").param, "temperature");
    EXPECT_EQ(refusal(Endpoint::Chat, "{" + hi + R"(, "temperature": "hot"})").param, "temperature");
    EXPECT_EQ(refusal(Endpoint::Chat, "{" + hi + R"(, "stop": ["\n"]})").param, "stop");
    EXPECT_EQ(refusal(Endpoint::Chat, "{" + hi + R"(, "stream_options": {"include_usage": true}})").param, "stream_options");
    EXPECT_EQ(refusal(Endpoint::Completions, R"({"prompt": 5})").param, "prompt");
    EXPECT_EQ(refusal(Endpoint::Completions, R"({"prompt": "x", "max_tokens": 0})").param, "max_tokens");
    EXPECT_EQ(refusal(Endpoint::Completions, R"({"prompt": "x", "max_tokens": 4, "model": "specula-target", "seed": 3})").status, 0);
    const openai::Request r = openai::parse_request(Endpoint::Chat, "{" + hi + R"(, "stream": true, "stream_options": {"include_usage": true}, "temperature": 0})", "m");
    EXPECT_TRUE(r.stream && r.include_usage);
    EXPECT_EQ(r.sampling.temperature, 0.0f);
    EXPECT_EQ(r.messages.at(0).second, "hi");
}

// Catches: a chat prompt with a doubled BOS (template text + added BOS).
TEST(OpenAi, ChatPromptsStartWithOneBos) {
    const Tokenizer tok(test::shipped_model("specula-target.gguf"));
    const std::vector<int32_t> t = tok.tokenize_chat({{"user", "hello"}});
    const std::vector<int32_t> bos = tok.tokenize("", true);
    ASSERT_FALSE(t.empty());
    if (!bos.empty()) {
        EXPECT_EQ(t[0], bos[0]);
        EXPECT_NE(t.size() > 1 ? t[1] : -1, bos[0]);
    }
}

// Catches: a response body serialized so that a model's stray byte (a byte-fallback token that is
// not a whole UTF-8 character) throws: it killed the server (the long non-streamed path once
// did). Every body goes out through openai::wire, which replaces such bytes.
TEST(OpenAi, BytesThatAreNotUtf8AreReplacedNotFatal) {
    openai::Completion c;
    c.model = "m";
    const nlohmann::json body = openai::response(c, "caf\xA9 ok", "stop", GenerationStats{});
    EXPECT_THROW((void)body.dump(), nlohmann::json::type_error);  // what a plain dump does
    std::string text;
    ASSERT_NO_THROW(text = openai::wire(body));
    EXPECT_NE(text.find("caf\xEF\xBF\xBD ok"), std::string::npos) << text;
    EXPECT_NE(openai::sse(body).find("\xEF\xBF\xBD"), std::string::npos);
}

}  // namespace
}  // namespace specula
