#pragma once
// The chat side of OpenAI's wire format: messages (system, developer, user, assistant with
// tool_calls, tool results), tools, tool_choice and parallel_tool_calls in; the assistant's reply
// parsed by the chat layer (tokenizer/chat_template.h) into content and tool_calls out.
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/openai.h"
#include "tokenizer/chat_template.h"

namespace specula::openai {

// The body's chat fields (`text`: the body as sent, `body` parsed from it); throws ApiError naming
// the field. A named function as tool_choice cuts the tools to that one and requires a call.
ChatInput parse_chat(const nlohmann::json & body, const std::string & text);

// Whether replies to `input` are parsed for tool calls: tools offered and tool_choice not "none".
bool parses_tool_calls(const ChatInput & input);

// A reply parsed for tool calls as it streams: add() gives the content to send now (what the
// partial parse holds beyond what was sent), finish() the whole reply's tool calls, each with an
// id ("call_N" where the model wrote none), and the content not sent yet.
class ReplyStream {
public:
    explicit ReplyStream(ChatPrompt prompt) : prompt_(std::move(prompt)) {}
    std::string add(const std::string & text);
    ChatReply finish(const std::string & rest = "");  // `rest`: text not given to add()

private:
    std::string take_unsent(const std::string & content);

    ChatPrompt prompt_;
    std::string text_;  // the reply so far
    std::string sent_;  // its content as sent
};

// The reply into a chat response or chunk: message.content (null when only calls) and
// message.tool_calls; finish_reason "tool_calls" when the model called a tool and stopped.
void set_reply(nlohmann::json & response, const ChatReply & reply);
nlohmann::json chunk_tool_calls(const Completion & c, const std::vector<ToolCall> & calls);
std::string finish_reason(const ChatReply & reply, const std::string & generation_finish);

}  // namespace specula::openai
