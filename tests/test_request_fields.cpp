// The request surface of `specula serve` without a model: stop strings (tokenizer/stop_strings.h)
// and the fields parse_request reads into a request (server/openai.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "server/openai.h"
#include "server/openai_generation.h"
#include "server/token_routes.h"
#include "specula/error.h"
#include "test_models.h"
#include "tokenizer/stop_strings.h"
#include "tokenizer/tokenizer.h"

namespace specula {
namespace {

// Feeds `pieces` one by one; returns what each push released, then the flush (when not stopped).
std::vector<std::string> feed(StopStrings & stops, const std::vector<std::string> & pieces) {
    std::vector<std::string> out;
    for (const std::string & p : pieces) out.push_back(stops.push(p));
    if (!stops.stopped()) out.push_back(stops.flush());
    return out;
}

std::string joined(const std::vector<std::string> & parts) {
    std::string s;
    for (const std::string & p : parts) s += p;
    return s;
}

// Catches: a stop string found only inside one piece, the stop string itself returned, or text
// after it released.
TEST(StopStrings, TheTextEndsWhereAStopStringSpanningPiecesStarts) {
    StopStrings stops({"END"});
    const auto out = feed(stops, {"Hello E", "N", "D and more", "never"});
    EXPECT_TRUE(stops.stopped());
    EXPECT_EQ(joined(out), "Hello ");
    EXPECT_EQ(out[0], "Hello ");  // "E" held back: it may start the stop string
    EXPECT_EQ(out[3], "");
}

// Catches: held-back text lost or released twice when the match fails, or released before it is
// known not to start a stop string.
TEST(StopStrings, AHeldPrefixIsReleasedOnceItCanNoLongerMatch) {
    StopStrings stops({"</s>", "###"});
    const auto out = feed(stops, {"a </", "b ##", "x", "#"});
    EXPECT_FALSE(stops.stopped());
    EXPECT_EQ(out[0], "a ");
    EXPECT_EQ(out[1], "</b ");
    EXPECT_EQ(out[2], "##x");
    EXPECT_EQ(out[3], "");
    EXPECT_EQ(out[4], "#");  // the end: a prefix that never completed is text
}

// Catches: the first stop string in the list winning over one that starts earlier in the text,
// or a stop string inside a piece that continues past it.
TEST(StopStrings, TheEarliestStopStringInTheTextWins) {
    StopStrings stops({"world", "lo"});
    EXPECT_EQ(joined(feed(stops, {"hello world"})), "hel");
    StopStrings one({"\n"});
    EXPECT_EQ(joined(feed(one, {"line one\nline two"})), "line one");
    StopStrings none;
    EXPECT_EQ(joined(feed(none, {"a", "b"})), "ab");
    EXPECT_THROW(StopStrings({"ok", ""}), Error);
}

// Catches: a stop string that overlaps itself ("aab" in "aaab") missed after a partial match.
TEST(StopStrings, AnOverlappingPartialMatchStillFindsTheStop) {
    StopStrings stops({"aab"});
    EXPECT_EQ(joined(feed(stops, {"x", "a", "a", "a", "b", "y"})), "xa");
    EXPECT_TRUE(stops.stopped());
}

using openai::Endpoint;
const std::string kChat = R"({"messages": [{"role": "user", "content": "hi"}], )";
const std::string kCompletion = R"({"prompt": "x", )";

openai::Request parsed(Endpoint e, const std::string & body) { return openai::parse_request(e, body, {{"specula-target"}}); }

// check_generation of a parsed request (which it completes: the logit_bias texts' tokens).
void check(openai::Request r, const Tokenizer & tokenizer) { openai::check_generation(r, tokenizer); }

// The refusal of a body, or status 0 when it was accepted.
openai::ApiError refusal(Endpoint e, const std::string & body) {
    try {
        parsed(e, body);
    } catch (const openai::ApiError & error) {
        return error;
    }
    return openai::ApiError{0, "accepted", "", "", ""};
}

// Catches: stop strings refused, dropped, or accepted beyond the limit of 16 or empty.
TEST(RequestFields, StopIsAStringOrUpToSixteenNonEmptyStrings) {
    EXPECT_EQ(parsed(Endpoint::Chat, kChat + R"("stop": "\n"})").stop, std::vector<std::string>{"\n"});
    EXPECT_EQ(parsed(Endpoint::Completions, kCompletion + R"("stop": ["a", "bc"]})").stop, (std::vector<std::string>{"a", "bc"}));
    EXPECT_TRUE(parsed(Endpoint::Completions, kCompletion + R"("stop": []})").stop.empty());
    std::string sixteen = R"("stop": ["s0")";
    for (int i = 1; i < 16; ++i) sixteen += ", \"s" + std::to_string(i) + "\"";
    EXPECT_EQ(parsed(Endpoint::Completions, kCompletion + sixteen + "]}").stop.size(), 16u);  // lm-eval's tasks send more than OpenAI's 4
    EXPECT_EQ(refusal(Endpoint::Completions, kCompletion + sixteen + R"(, "s16"]})").param, "stop");
    EXPECT_EQ(refusal(Endpoint::Completions, kCompletion + R"("stop": ["a", ""]})").param, "stop");
    EXPECT_EQ(refusal(Endpoint::Chat, kChat + R"("stop": [1]})").param, "stop");
    EXPECT_EQ(parsed(Endpoint::Chat, kChat + R"("stop": ")" + std::string(1024, 'a') + "\"}").stop.at(0).size(), 1024u);
    EXPECT_EQ(refusal(Endpoint::Chat, kChat + R"("stop": ")" + std::string(1025, 'a') + "\"}").param, "stop");
}

// Catches: penalties refused or dropped on their way to SamplingParams, or accepted out of range.
TEST(RequestFields, PenaltiesReachTheSamplingParameters) {
    const openai::Request r = parsed(Endpoint::Completions, kCompletion + R"("presence_penalty": 0.5, "frequency_penalty": -1, "repeat_penalty": 1.3, "repeat_last_n": -1})");
    EXPECT_FLOAT_EQ(r.sampling.presence_penalty, 0.5f);
    EXPECT_FLOAT_EQ(r.sampling.frequency_penalty, -1.0f);
    EXPECT_FLOAT_EQ(r.sampling.repeat_penalty, 1.3f);
    EXPECT_EQ(r.sampling.penalty_last_n, -1);
    const openai::Request vllm = parsed(Endpoint::Chat, kChat + R"("repetition_penalty": 1.2, "top_k": -1})");  // vLLM's names and values
    EXPECT_FLOAT_EQ(vllm.sampling.repeat_penalty, 1.2f);
    EXPECT_EQ(vllm.sampling.penalty_last_n, -1);
    EXPECT_EQ(vllm.sampling.top_k, 0);
    EXPECT_EQ(refusal(Endpoint::Chat, kChat + R"("repetition_penalty": 1.2, "repeat_penalty": 1.1})").param, "repetition_penalty");
    EXPECT_EQ(refusal(Endpoint::Chat, kChat + R"("top_k": -2})").param, "top_k");
    EXPECT_EQ(refusal(Endpoint::Chat, kChat + R"("presence_penalty": 2.5})").param, "presence_penalty");
    EXPECT_EQ(refusal(Endpoint::Chat, kChat + R"("repeat_penalty": 0})").param, "repeat_penalty");
    EXPECT_EQ(refusal(Endpoint::Chat, kChat + R"("repeat_last_n": -2})").param, "repeat_last_n");
}

// Catches: the server's defaults (serve --temp, --seed, ...) not reaching a request that omits
// the field, overriding one that gives it, or a server without them leaving OpenAI's defaults.
TEST(RequestFields, AnOmittedSamplingFieldTakesTheServersDefault) {
    const openai::Request plain = parsed(Endpoint::Completions, kCompletion + R"("n": 1})");
    EXPECT_FLOAT_EQ(plain.sampling.temperature, 1.0f);  // OpenAI's
    EXPECT_EQ(plain.sampling.top_k, 0);
    EXPECT_FALSE(plain.seeded);
    openai::Accepted server{{"specula-target"}};
    server.defaults.temperature = 0.8f, server.defaults.top_k = 40, server.defaults.top_p = 0.95f, server.defaults.min_p = 0.05f;
    server.defaults.repeat_penalty = 1.1f, server.defaults.presence_penalty = 0.25f, server.defaults.frequency_penalty = -0.5f;
    server.defaults.penalty_last_n = 32, server.defaults.seed = 42;
    for (const Endpoint e : {Endpoint::Chat, Endpoint::Completions, Endpoint::Llama}) {
        const openai::Request r = openai::parse_request(e, (e == Endpoint::Chat ? kChat : kCompletion) + R"("n": 1})", server);
        EXPECT_FLOAT_EQ(r.sampling.temperature, 0.8f);
        EXPECT_EQ(r.sampling.top_k, 40);
        EXPECT_FLOAT_EQ(r.sampling.top_p, 0.95f);
        EXPECT_FLOAT_EQ(r.sampling.min_p, 0.05f);
        EXPECT_FLOAT_EQ(r.sampling.repeat_penalty, 1.1f);
        EXPECT_FLOAT_EQ(r.sampling.presence_penalty, 0.25f);
        EXPECT_FLOAT_EQ(r.sampling.frequency_penalty, -0.5f);
        EXPECT_EQ(r.sampling.penalty_last_n, 32);
        EXPECT_TRUE(r.seeded);
        EXPECT_EQ(r.sampling.seed, 42u);
    }
    EXPECT_EQ(openai::tokens_to_generate(parsed(Endpoint::Completions, kCompletion + R"("n": 1})"), 10, 100), 90);  // until the context is full
    server.defaults.max_tokens = 64;
    const openai::Request capped = openai::parse_request(Endpoint::Completions, kCompletion + R"("n": 1})", server);
    EXPECT_EQ(openai::tokens_to_generate(capped, 10, 100), 64);
    EXPECT_EQ(openai::tokens_to_generate(capped, 60, 100), 40) << "the server's default is cut to the room left, not refused";
    EXPECT_THROW(openai::tokens_to_generate(capped, 100, 100), openai::ApiError);
    const openai::Request asked = openai::parse_request(Endpoint::Completions, kCompletion + R"("max_tokens": 50})", server);
    EXPECT_EQ(openai::tokens_to_generate(asked, 10, 100), 50);
    EXPECT_THROW(openai::tokens_to_generate(asked, 60, 100), openai::ApiError) << "a request's own max_tokens beyond the context is refused";
    const openai::Request own = openai::parse_request(
        Endpoint::Completions, kCompletion + R"("temperature": 0, "top_k": 3, "top_p": 0.5, "min_p": 0.1, "repeat_penalty": 1.0, "seed": 7})", server);
    EXPECT_FLOAT_EQ(own.sampling.temperature, 0.0f);
    EXPECT_EQ(own.sampling.top_k, 3);
    EXPECT_FLOAT_EQ(own.sampling.top_p, 0.5f);
    EXPECT_FLOAT_EQ(own.sampling.min_p, 0.1f);
    EXPECT_FLOAT_EQ(own.sampling.repeat_penalty, 1.0f);
    EXPECT_EQ(own.sampling.seed, 7u);
}

// Catches: logit_bias dropped, keys that are not token ids or biases beyond -100..100 accepted, an
// id outside the vocabulary reaching the engine.
TEST(RequestFields, LogitBiasIsTokenIdsToBiasesWithinTheVocabulary) {
    const openai::Request r = parsed(Endpoint::Chat, kChat + R"("logit_bias": {"42": -100, "7": 2.5}})");
    EXPECT_EQ(r.sampling.logit_bias.size(), 2u);
    EXPECT_EQ(refusal(Endpoint::Chat, kChat + R"("logit_bias": {"": 1}})").param, "logit_bias");
    EXPECT_EQ(refusal(Endpoint::Chat, kChat + R"("logit_bias": {"99999999999": 1}})").param, "logit_bias");
    EXPECT_EQ(refusal(Endpoint::Chat, kChat + R"("logit_bias": {"5": 101}})").param, "logit_bias");
    EXPECT_EQ(refusal(Endpoint::Chat, kChat + R"("logit_bias": {"5": 1, "05": 2}})").param, "logit_bias");
    // llama-server's form: [[id, bias]], false banning the token.
    const openai::Request pairs = parsed(Endpoint::Chat, kChat + R"("logit_bias": [[5, 1.5], [9, false]]})");
    ASSERT_EQ(pairs.sampling.logit_bias.size(), 2u);
    EXPECT_EQ(pairs.sampling.logit_bias[0], (std::pair<int32_t, float>{5, 1.5f}));
    EXPECT_EQ(pairs.sampling.logit_bias[1].second, -std::numeric_limits<float>::infinity());
    EXPECT_EQ(refusal(Endpoint::Chat, kChat + R"("logit_bias": [[5]]})").param, "logit_bias");
    EXPECT_EQ(refusal(Endpoint::Chat, kChat + R"("logit_bias": [[-1, 1]]})").param, "logit_bias");
    EXPECT_EQ(refusal(Endpoint::Chat, kChat + R"("logit_bias": [["x", "1"]]})").param, "logit_bias");
    EXPECT_EQ(refusal(Endpoint::Chat, kChat + R"("logit_bias": [[5, 1], [5, 2]]})").param, "logit_bias");
    EXPECT_EQ(parsed(Endpoint::Chat, kChat + R"("logit_bias": [[5, -100], [9, 1], [5, -100]]})").sampling.logit_bias.size(), 2u);  // /tokenize's ids repeat
    const Tokenizer tok(test::shipped_model("specula-target.gguf"));
    EXPECT_NO_THROW(check(r, tok));
    const std::string unknown = std::to_string(tok.n_vocab());
    try {
        check(parsed(Endpoint::Chat, kChat + R"("logit_bias": {")" + unknown + R"(": 1}})"), tok);
        ADD_FAILURE() << "an id outside the vocabulary was accepted";
    } catch (const openai::ApiError & e) {
        EXPECT_EQ(e.status, 400);
        EXPECT_EQ(e.param, "logit_bias");
        EXPECT_NE(e.message.find(unknown), std::string::npos) << e.message;
    }
}

// Catches: llama-server's logit_bias keyed by text ([["text", bias]] and {"text": bias}) refused,
// or not biasing every token of the text (without BOS, its special-token text as text), or a
// token two texts share getting one text's bias only.
TEST(RequestFields, LogitBiasKeyedByTextBiasesEachOfItsTokens) {
    const Tokenizer tok(test::shipped_model("specula-target.gguf"));
    const std::vector<int32_t> hello = tok.tokenize(" hello world", false, SpecialTokens::Text);
    ASSERT_GE(hello.size(), 2u);
    for (const std::string & form : {std::string(R"([[" hello world", -100], [7, 2]])"), std::string(R"({" hello world": false, "7": 2})")}) {
        openai::Request r = parsed(Endpoint::Completions, kCompletion + R"("logit_bias": )" + form + "}");
        openai::check_generation(r, tok);
        EXPECT_TRUE(r.logit_bias_texts.empty());
        std::vector<std::pair<int32_t, float>> want = {{7, 2.0f}};
        const float ban = form.front() == '[' ? -100.0f : -std::numeric_limits<float>::infinity();
        for (const int32_t id : hello) want.emplace_back(id, ban);
        auto got = r.sampling.logit_bias;
        std::sort(got.begin(), got.end());
        std::sort(want.begin(), want.end());
        EXPECT_EQ(got, want) << form;
    }
    openai::Request shared = parsed(Endpoint::Completions, kCompletion + R"("logit_bias": [[" hello", 1], [" hello world", 2]]})");
    openai::check_generation(shared, tok);
    float first = 0;
    for (const auto & [id, bias] : shared.sampling.logit_bias) first += id == hello.front() ? bias : 0.0f;
    EXPECT_FLOAT_EQ(first, 3.0f) << "both texts hold ' hello'";
    openai::Request special = parsed(Endpoint::Completions, kCompletion + R"("logit_bias": {"<|im_start|>": -5}})");
    openai::check_generation(special, tok);
    const std::vector<int32_t> spelled = tok.tokenize("<|im_start|>", false, SpecialTokens::Text);
    EXPECT_EQ(special.sampling.logit_bias.size(), std::set<int32_t>(spelled.begin(), spelled.end()).size());
}

// Catches: logprobs refused, or their two shapes (chat's flag and count, completions' count) mixed
// up or accepted beyond their ranges.
TEST(RequestFields, LogprobsAreChatsFlagAndCountOrCompletionsCount) {
    EXPECT_EQ(parsed(Endpoint::Chat, kChat + R"("logprobs": true, "top_logprobs": 3})").top_logprobs, 3);
    EXPECT_EQ(parsed(Endpoint::Chat, kChat + R"("logprobs": true})").top_logprobs, 0);
    EXPECT_EQ(parsed(Endpoint::Chat, kChat + R"("logprobs": false})").top_logprobs, -1);
    EXPECT_EQ(refusal(Endpoint::Chat, kChat + R"("top_logprobs": 3})").param, "top_logprobs");
    EXPECT_EQ(refusal(Endpoint::Chat, kChat + R"("logprobs": true, "top_logprobs": 21})").param, "top_logprobs");
    EXPECT_EQ(parsed(Endpoint::Completions, kCompletion + R"("logprobs": 2})").top_logprobs, 2);
    EXPECT_EQ(refusal(Endpoint::Completions, kCompletion + R"("logprobs": 6})").param, "logprobs");
    EXPECT_EQ(parsed(Endpoint::Completions, kCompletion + R"("top_logprobs": 2})").ignored_fields, std::vector<std::string>{"top_logprobs"});
}

// Catches: a field the server does not read refused (other servers accept it), or accepted
// without being named; --strict-fields not refusing it; documented metadata refused.
TEST(RequestFields, AnUnknownFieldIsNamedAndRefusedOnlyWhenStrict) {
    const openai::Request r = parsed(Endpoint::Chat, kChat + R"("audio": 1, "user": "u1", "frobnicate": {"x": 1}, "prediction": null})");
    EXPECT_EQ(r.ignored_fields, (std::vector<std::string>{"audio", "frobnicate"}));
    EXPECT_TRUE(parsed(Endpoint::Chat, kChat + R"("user": "u1", "metadata": {"k": "v"}, "store": false})").ignored_fields.empty());
    EXPECT_EQ(parsed(Endpoint::Completions, kCompletion + R"("messages": []})").ignored_fields, std::vector<std::string>{"messages"});
    const openai::Accepted strict{{"specula-target"}, true};
    for (const char * field : {"audio", "modalities", "frobnicate"}) {
        try {
            openai::parse_request(Endpoint::Chat, kChat + "\"" + field + "\": 1}", strict);
            ADD_FAILURE() << field << " accepted with strict fields";
        } catch (const openai::ApiError & e) {
            EXPECT_EQ(e.status, 400) << field;
            EXPECT_EQ(e.param, field);
            EXPECT_NE(e.message.find(std::string("'") + field + "' is not supported"), std::string::npos) << e.message;
        }
    }
    EXPECT_TRUE(openai::parse_request(Endpoint::Chat, kChat + R"("user": "u1", "audio": null})", strict).ignored_fields.empty());
    EXPECT_EQ(parsed(Endpoint::Completions, kCompletion + R"("echo": true})").ignored_fields, std::vector<std::string>{});
    EXPECT_EQ(parsed(Endpoint::Llama, kCompletion + R"("echo": true})").ignored_fields, std::vector<std::string>{"echo"});  // not llama-server's
}

// Catches: token-id prompts refused or read as text, a batch refused, read as one prompt or out of
// order, ids that are no token accepted, echo dropped, prompt logprobs asked for in a stream.
TEST(RequestFields, APromptIsTextTokenIdsOrABatchAndEchoIsRead) {
    EXPECT_EQ(parsed(Endpoint::Completions, R"({"prompt": [5, 7, 9]})").prompts.at(0).tokens, (std::vector<int32_t>{5, 7, 9}));
    EXPECT_EQ(parsed(Endpoint::Completions, R"({"prompt": [[5, 7]]})").prompts.at(0).tokens, (std::vector<int32_t>{5, 7}));
    EXPECT_EQ(parsed(Endpoint::Llama, R"({"prompt": ["abc"]})").prompts.at(0).text, "abc");
    const openai::Request batch = parsed(Endpoint::Completions, R"({"prompt": ["a", [5, 7], "b"]})");
    ASSERT_EQ(batch.prompts.size(), 3u);
    EXPECT_EQ(batch.prompts[0].text, "a");
    EXPECT_EQ(batch.prompts[1].tokens, (std::vector<int32_t>{5, 7}));
    EXPECT_EQ(batch.prompts[2].text, "b");
    EXPECT_EQ(refusal(Endpoint::Completions, R"({"prompt": [5, -1]})").param, "prompt");
    EXPECT_EQ(refusal(Endpoint::Completions, R"({"prompt": []})").param, "prompt");
    EXPECT_EQ(refusal(Endpoint::Completions, R"({"prompt": ["a", []]})").param, "prompt");
    EXPECT_EQ(refusal(Endpoint::Completions, R"({"prompt": [5, "a", 1.5]})").param, "prompt");
    EXPECT_EQ(refusal(Endpoint::Completions, R"({"prompt": [5, true]})").param, "prompt");
    nlohmann::json many = {{"prompt", std::vector<std::string>(openai::kMaxPrompts + 1, "a")}};
    EXPECT_EQ(refusal(Endpoint::Completions, many.dump()).param, "prompt");
    EXPECT_TRUE(parsed(Endpoint::Completions, kCompletion + R"("echo": true})").echo);
    const openai::Request scored = parsed(Endpoint::Completions, kCompletion + R"("echo": true, "logprobs": 1, "max_tokens": 0})");
    EXPECT_TRUE(scored.echo);
    EXPECT_EQ(scored.top_logprobs, 1);
    EXPECT_EQ(scored.max_tokens, 0);
    EXPECT_EQ(refusal(Endpoint::Completions, kCompletion + R"("echo": true, "logprobs": 1, "stream": true})").param, "echo");
    const Tokenizer tok(test::shipped_model("specula-target.gguf"));
    EXPECT_NO_THROW(check(parsed(Endpoint::Completions, R"({"prompt": [1, 2]})"), tok));
    try {
        check(parsed(Endpoint::Completions, R"({"prompt": [1, )" + std::to_string(tok.n_vocab()) + "]}"), tok);
        ADD_FAILURE() << "a prompt token outside the vocabulary was accepted";
    } catch (const openai::ApiError & e) {
        EXPECT_EQ(e.param, "prompt");
        EXPECT_NE(e.message.find("prompt[1]"), std::string::npos) << e.message;
    }
    try {
        check(parsed(Endpoint::Completions, R"({"prompt": ["a", [1, )" + std::to_string(tok.n_vocab()) + "]]}"), tok);
        ADD_FAILURE() << "a batch's prompt token outside the vocabulary was accepted";
    } catch (const openai::ApiError & e) {
        EXPECT_NE(e.message.find("prompt[1][1]"), std::string::npos) << e.message;
    }
}

// llama-server's prompt shapes (its tokenize_input_prompts): an array with ids at its top is one
// prompt, texts among the ids each tokenized on their own with BOS only when first; an array
// without is a batch of strings, ids, mixed arrays and {"prompt_string"} objects. Catches: a mixed
// prompt refused or read as a batch, BOS before a later text, an object's other members (its
// images) dropped without a word.
TEST(RequestFields, PromptsMixTextAndTokenIdsAsLlamaServerReadsThem) {
    const Tokenizer tok(test::shipped_model("specula-target.gguf"));
    auto tokens_of = [&](const openai::Prompt & p) { return openai::prompt_tokens(p, tok, SpecialTokens::Text); };
    const std::vector<int32_t> text = tok.tokenize(" of life", false, SpecialTokens::Text);
    const std::vector<int32_t> text_bos = tok.tokenize(" of life", true, SpecialTokens::Text);
    auto concat = [](std::vector<std::vector<int32_t>> parts) {
        std::vector<int32_t> all;
        for (const auto & p : parts) all.insert(all.end(), p.begin(), p.end());
        return all;
    };
    const openai::Request mixed = parsed(Endpoint::Llama, R"({"prompt": [5, 7, " of life", 9, " of life"]})");
    ASSERT_EQ(mixed.prompts.size(), 1u);
    EXPECT_EQ(tokens_of(mixed.prompts[0]), concat({{5, 7}, text, {9}, text}));
    const openai::Request text_first = parsed(Endpoint::Completions, R"({"prompt": [" of life", 9]})");
    ASSERT_EQ(text_first.prompts.size(), 1u);
    EXPECT_EQ(tokens_of(text_first.prompts[0]), concat({text_bos, {9}}));
    const openai::Request batch = parsed(Endpoint::Llama, R"({"prompt": [[5, 7], " of life", {"prompt_string": " of life"}, [5, " of life"], {"prompt_string": [" of life", 3]}]})");
    ASSERT_EQ(batch.prompts.size(), 5u);
    EXPECT_EQ(tokens_of(batch.prompts[0]), (std::vector<int32_t>{5, 7}));
    EXPECT_EQ(tokens_of(batch.prompts[1]), text_bos);
    EXPECT_EQ(tokens_of(batch.prompts[2]), text_bos);
    EXPECT_EQ(tokens_of(batch.prompts[3]), concat({{5}, text}));
    EXPECT_EQ(tokens_of(batch.prompts[4]), concat({text_bos, {3}}));
    EXPECT_EQ(tokens_of(parsed(Endpoint::Llama, R"({"prompt": {"prompt_string": " of life"}})").prompts.at(0)), text_bos);
    const openai::ApiError images = refusal(Endpoint::Llama, R"({"prompt": {"prompt_string": "a <__media__>", "multimodal_data": ["iVBO"]}})");
    EXPECT_EQ(images.status, 400);
    EXPECT_EQ(images.param, "prompt");
    EXPECT_NE(images.message.find("multimodal_data"), std::string::npos) << images.message;
    EXPECT_NE(refusal(Endpoint::Llama, R"({"prompt": {"prompt_string": "a", "other": 1}})").message.find("other"), std::string::npos);
    EXPECT_EQ(refusal(Endpoint::Llama, R"({"prompt": {}})").param, "prompt");
    EXPECT_EQ(refusal(Endpoint::Llama, R"({"prompt": [{"prompt_string": {"prompt_string": "a"}}]})").param, "prompt");
    try {  // an id of a mixed prompt is checked against the vocabulary where the others are
        check(parsed(Endpoint::Completions, R"({"prompt": ["a", 1, )" + std::to_string(tok.n_vocab()) + "]}"), tok);
        ADD_FAILURE() << "a mixed prompt's token outside the vocabulary was accepted";
    } catch (const openai::ApiError & e) {
        EXPECT_NE(e.message.find("prompt[2]"), std::string::npos) << e.message;
    }
}

// llama-server's response fields are read (never ignored and named), as booleans.
TEST(RequestFields, LlamaServersResponseFieldsAreRead) {
    const openai::Request r = parsed(Endpoint::Chat, kChat + R"("verbose": true, "return_tokens": true, "timings_per_token": true, "post_sampling_probs": true})");
    EXPECT_TRUE(r.verbose && r.return_tokens && r.timings_per_token && r.post_sampling_probs);
    EXPECT_TRUE(r.ignored_fields.empty());
    const openai::Request none = parsed(Endpoint::Llama, R"({"prompt": "x"})");
    EXPECT_FALSE(none.verbose || none.return_tokens || none.timings_per_token || none.post_sampling_probs);
    for (const char * key : {"verbose", "return_tokens", "timings_per_token", "post_sampling_probs"}) {
        EXPECT_EQ(refusal(Endpoint::Llama, kCompletion + "\"" + key + "\": 1}").param, key);
    }
}

// Catches: llama-server's and vLLM's own fields refused, dropped, or read into the wrong setting.
TEST(RequestFields, OtherServersFieldsAreRead) {
    EXPECT_EQ(parsed(Endpoint::Completions, kCompletion + R"("n_predict": 7})").max_tokens, 7);
    EXPECT_EQ(parsed(Endpoint::Completions, kCompletion + R"("n_predict": -1})").max_tokens, -1);
    EXPECT_EQ(parsed(Endpoint::Completions, kCompletion + R"("n_predict": 7, "max_tokens": 3})").max_tokens, 3);
    EXPECT_EQ(parsed(Endpoint::Completions, kCompletion + R"("n_predict": 0})").max_tokens, 0);  // the prompt alone
    EXPECT_EQ(refusal(Endpoint::Chat, kChat + R"("n_predict": 0})").param, "n_predict");
    EXPECT_EQ(parsed(Endpoint::Completions, kCompletion + R"("n_probs": 3})").top_logprobs, 3);
    EXPECT_EQ(parsed(Endpoint::Chat, kChat + R"("n_probs": 12})").top_logprobs, 12);
    EXPECT_EQ(parsed(Endpoint::Chat, kChat + R"("n_probs": 0})").top_logprobs, -1);
    EXPECT_EQ(refusal(Endpoint::Chat, kChat + R"("n_probs": 21})").param, "n_probs");
    const openai::Request vllm = parsed(Endpoint::Completions, kCompletion + R"("min_tokens": 5, "max_tokens": 9, "stop_token_ids": [2, 7], "skip_special_tokens": true})");
    EXPECT_EQ(vllm.min_tokens, 5);
    EXPECT_EQ(vllm.stop_token_ids, (std::vector<int32_t>{2, 7}));
    EXPECT_TRUE(vllm.ignored_fields.empty());
    EXPECT_EQ(refusal(Endpoint::Completions, kCompletion + R"("min_tokens": 10, "max_tokens": 9})").param, "min_tokens");
    EXPECT_EQ(refusal(Endpoint::Completions, kCompletion + R"("stop_token_ids": [-1]})").param, "stop_token_ids[0]");
    EXPECT_EQ(refusal(Endpoint::Completions, kCompletion + R"("stop_token_ids": 2})").param, "stop_token_ids");
    EXPECT_FALSE(vllm.special_token_text);
    EXPECT_TRUE(parsed(Endpoint::Completions, kCompletion + R"("skip_special_tokens": false})").special_token_text);
    EXPECT_FALSE(parsed(Endpoint::Chat, kChat + R"("max_tokens": 2})").special_token_text);
    EXPECT_EQ(refusal(Endpoint::Completions, kCompletion + R"("skip_special_tokens": 0})").param, "skip_special_tokens");
    const Tokenizer tok(test::shipped_model("specula-target.gguf"));
    try {
        check(parsed(Endpoint::Completions, kCompletion + R"("stop_token_ids": [)" + std::to_string(tok.n_vocab()) + "]}"), tok);
        ADD_FAILURE() << "a stop token outside the vocabulary was accepted";
    } catch (const openai::ApiError & e) {
        EXPECT_EQ(e.param, "stop_token_ids");
    }
    const openai::Request chat = parsed(Endpoint::Chat, kChat + R"("chat_template_kwargs": {"enable_thinking": false, "style": {"terse": true}}, "reasoning_effort": "low"})");
    EXPECT_FALSE(chat.chat.enable_thinking);
    EXPECT_EQ(chat.chat.template_kwargs.at("style"), R"({"terse":true})");
    EXPECT_EQ(chat.chat.template_kwargs.at("reasoning_effort"), R"("low")");
    EXPECT_TRUE(chat.ignored_fields.empty());
    EXPECT_EQ(refusal(Endpoint::Chat, kChat + R"("chat_template_kwargs": [1]})").param, "chat_template_kwargs");
    EXPECT_EQ(refusal(Endpoint::Chat, kChat + R"("chat_template_kwargs": {"enable_thinking": "no"}})").param, "chat_template_kwargs.enable_thinking");
    EXPECT_EQ(refusal(Endpoint::Chat, kChat + R"("reasoning_effort": "max"})").param, "reasoning_effort");
}

// Catches: an alias refused, the response's model not the name asked for, another name served
// (unless --any-model, which answers and echoes it).
TEST(RequestFields, TheModelIsAnyServedNameAndEchoed) {
    const openai::Accepted any{{"first"}, false, true};
    EXPECT_EQ(openai::parse_request(Endpoint::Chat, kChat + R"("model": "gpt-3.5-turbo"})", any).model, "gpt-3.5-turbo");
    EXPECT_EQ(openai::parse_request(Endpoint::Chat, kChat + "\"n\": 1}", any).model, "first");
    EXPECT_EQ(refusal(Endpoint::Chat, kChat + R"("model": 5})").param, "model");
    const openai::Accepted names{{"first", "second"}, false};
    EXPECT_EQ(openai::parse_request(Endpoint::Chat, kChat + R"("model": "second"})", names).model, "second");
    EXPECT_EQ(openai::parse_request(Endpoint::Chat, kChat + "\"n\": 1}", names).model, "first");
    try {
        openai::parse_request(Endpoint::Chat, kChat + R"("model": "third"})", names);
        ADD_FAILURE() << "an unserved model was accepted";
    } catch (const openai::ApiError & e) {
        EXPECT_EQ(e.status, 404);
        EXPECT_EQ(e.code, "model_not_found");
        EXPECT_NE(e.message.find("\"second\""), std::string::npos) << e.message;
    }
}

// Catches: response_format ignored, a schema that does not compile accepted, or a grammar and a
// schema both taken.
TEST(RequestFields, ResponseFormatBecomesAGrammar) {
    const openai::Request schema = parsed(Endpoint::Chat, kChat + R"("response_format": {"type": "json_schema", "json_schema": {"name": "p", "strict": true,
        "schema": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}}}})");
    EXPECT_NE(schema.grammar.find("root"), std::string::npos) << schema.grammar;
    EXPECT_EQ(schema.grammar_field, "response_format");
    EXPECT_FALSE(parsed(Endpoint::Chat, kChat + R"("response_format": {"type": "json_object"}})").grammar.empty());
    EXPECT_TRUE(parsed(Endpoint::Chat, kChat + R"("response_format": {"type": "text"}})").grammar.empty());
    EXPECT_EQ(refusal(Endpoint::Chat, kChat + R"("response_format": {"type": "xml"}})").param, "response_format.type");
    EXPECT_EQ(refusal(Endpoint::Chat, kChat + R"("response_format": {"type": "json_schema", "json_schema": {"schema": {"$ref": "#/nowhere"}}}})").param,
              "response_format");
    EXPECT_EQ(refusal(Endpoint::Chat, kChat + R"("grammar": "root ::= \"a\"", "response_format": {"type": "json_object"}})").param, "response_format");
    const Tokenizer tok(test::shipped_model("specula-target.gguf"));
    EXPECT_NO_THROW(check(schema, tok));
    EXPECT_NO_THROW(check(parsed(Endpoint::Completions, kCompletion + R"("grammar": "root ::= \"yes\" | \"no\""})"), tok));
    try {
        check(parsed(Endpoint::Completions, kCompletion + R"("grammar": "root ::= ("})"), tok);
        ADD_FAILURE() << "a grammar that does not parse was accepted";
    } catch (const openai::ApiError & e) {
        EXPECT_EQ(e.param, "grammar");
    }
}

// Catches: /tokenize answering other ids than the tokenizer's, pieces that are not the tokens'
// texts, /detokenize of an id outside the vocabulary reaching libllama, unknown fields ignored.
TEST(RequestFields, TokenizeAndDetokenizeAreTheTokenizers) {
    const Tokenizer tok(test::shipped_model("specula-target.gguf"));
    const std::string text = "def f(x):\n    return x";
    const nlohmann::json ids = openai::tokenize(tok, nlohmann::json{{"content", text}}.dump());
    EXPECT_EQ(ids.at("tokens").get<std::vector<int32_t>>(), tok.tokenize(text, false));
    const nlohmann::json bos = openai::tokenize(tok, nlohmann::json{{"content", text}, {"add_special", true}}.dump());
    EXPECT_EQ(bos.at("tokens").get<std::vector<int32_t>>(), tok.tokenize(text, true));
    const nlohmann::json pieces = openai::tokenize(tok, nlohmann::json{{"content", text}, {"with_pieces", true}}.dump());
    std::string joined_pieces;
    for (const auto & p : pieces.at("tokens")) joined_pieces += p.at("piece").get<std::string>();
    EXPECT_EQ(joined_pieces, " " + text);  // the vocabulary's word-start space, as in llama-server
    EXPECT_EQ(openai::detokenize(tok, nlohmann::json{{"tokens", ids.at("tokens")}}.dump()).at("content"), joined_pieces);
    auto refused = [&](auto route, const std::string & body) {
        try {
            route(tok, body);
        } catch (const openai::ApiError & e) {
            return e.param;
        }
        return std::string("accepted");
    };
    EXPECT_EQ(refused(openai::detokenize, R"({"tokens": [1, )" + std::to_string(tok.n_vocab()) + "]}"), "tokens[1]");
    EXPECT_EQ(refused(openai::detokenize, R"({"tokens": [-1]})"), "tokens[0]");
    EXPECT_EQ(refused(openai::tokenize, R"({"content": 5})"), "content");
    EXPECT_EQ(refused(openai::tokenize, R"({"content": "x", "special": true})"), "special");
}

}  // namespace
}  // namespace specula
