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
// Whether replies are parsed at all: for tool calls, or for the reasoning of a template that thinks.
bool parses_reply(const ChatInput & input, const ChatPrompt & prompt);

// The stream's deltas from what the client holds (`sent`: content and calls as sent so far) to a
// parse of the reply (`parsed`, its calls' ids set), as llama-server frames them; `sent` becomes
// what the client then holds. Reasoning goes as {"reasoning_content"}, content as {"content"}; a call's first delta carries its index,
// id, type, name and the arguments so far, later ones its index and the next piece of the
// arguments. Sent text cannot be taken back: only what extends it is sent. A call of a partial
// parse is announced once its arguments have begun (its name is then whole) or a call follows it;
// `final` (the whole reply's parse) announces the rest.
std::vector<nlohmann::json> reply_deltas(ChatReply & sent, const ChatReply & parsed, bool final);

// A reply parsed for tool calls as it streams: add() gives the deltas the partial parse of the
// text so far adds, finish() the whole reply (its calls' ids: the model's, else "call_N" made once
// per call and kept for all its deltas) and the deltas it adds to what was sent. add() parses once
// the reply grew by 1/kReparseFraction since its last parse (else it gives no delta yet): a long
// reply's partial parses then read about kReparseFraction + 1 times its length in all, not once
// per chunk.
class ReplyStream {
public:
    static constexpr size_t kReparseFraction = 32;

    explicit ReplyStream(ChatPrompt prompt) : prompt_(std::move(prompt)) {}
    std::vector<nlohmann::json> add(const std::string & text);
    // `rest`: text not given to add().
    ChatReply finish(const std::string & rest = "", std::vector<nlohmann::json> * deltas = nullptr);
    size_t parses() const { return parses_; }  // of the reply so far, partial and whole

private:
    ChatReply parse(bool partial);

    ChatPrompt prompt_;
    std::string text_;         // the reply so far
    size_t parsed_bytes_ = 0;  // of text_, at add()'s last parse
    size_t parses_ = 0;
    ChatReply sent_;                // what the stream's deltas have sent
    std::vector<std::string> ids_;  // the ids made for calls the model wrote none for
};

// The reply into a chat response: message.reasoning_content (when there is reasoning),
// message.content (null when only calls) and message.tool_calls; a
// chunk of one of reply_deltas' deltas; finish_reason "tool_calls" when the model called a tool
// and stopped.
void set_reply(nlohmann::json & response, const ChatReply & reply);
nlohmann::json chunk_delta(const Completion & c, nlohmann::json delta);
std::string finish_reason(const ChatReply & reply, const std::string & generation_finish);

}  // namespace specula::openai
