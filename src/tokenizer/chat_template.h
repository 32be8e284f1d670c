#pragma once
// Chat templates through llama.cpp's chat layer (common/chat.h): the model's Jinja template (or one
// given with --chat-template FILE) renders system, user, assistant and tool messages and the tools
// offered; the same layer gives the grammar a tool choice asks for and parses a reply back into
// content and tool calls. A file without a template gets llama.cpp's built-in one its vocabulary's
// turn tokens name ("gemma"), rendered by libllama without tools, else llama.cpp's Jinja chatml.
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

struct llama_model;
struct common_chat_templates;

namespace specula {

struct ToolCall {
    std::string id;
    std::string name;
    std::string arguments;  // a JSON object's text
};

struct ChatMessage {
    std::string role;  // system, user, assistant or tool
    std::string content;
    std::vector<ToolCall> tool_calls;  // assistant
    std::string tool_call_id;          // tool: the call it answers
    std::string reasoning_content;     // assistant: a thinking model's reasoning, where the template shows it
};

struct ChatTool {
    std::string name;
    std::string description;
    std::string parameters;  // a JSON schema's text
};

enum class ToolChoice {
    Auto,      // the model decides between text and calls
    None,      // text only, the tools still described
    Required,  // at least one call (a named function: the tools cut to that one)
};

// Where a thinking model's reasoning goes (llama-server's --reasoning-format).
enum class ReasoningFormat {
    None,            // left in the content, unparsed
    Deepseek,        // parsed out of the content into reasoning_content ("auto" is this one)
    DeepseekLegacy,  // reasoning_content, and the thinking section kept in the content too
};

// llama-server's names: none, auto, deepseek, deepseek-legacy; throws Error naming the others.
ReasoningFormat reasoning_format_from_name(const std::string & name);

// How the reply continues the final message, an assistant's (llama-server's assistant prefill,
// vLLM's and transformers' continue_final_message): the messages before it are rendered with the
// generation prompt, and the final message follows it left open, so that the reply goes on from its
// text. Content: its content (a thinking template's thinking section closed before it); Reasoning:
// its reasoning_content, the thinking section left open; Auto: Reasoning for a message with
// reasoning_content and no content, else Content.
enum class Continuation {
    None,
    Auto,
    Content,
    Reasoning
};

struct ChatInput {
    std::vector<ChatMessage> messages;
    Continuation continuation = Continuation::None;
    // Without it (and without a continuation) the rendering ends after the last message, without
    // the template's generation prompt (the request's add_generation_prompt: false).
    bool add_generation_prompt = true;
    std::vector<ChatTool> tools;
    ToolChoice tool_choice = ToolChoice::Auto;
    bool parallel_tool_calls = false;
    ReasoningFormat reasoning = ReasoningFormat::None;
    bool enable_thinking = true;  // the template's `enable_thinking`: false asks a thinking model not to think
    // More variables for the template, each a JSON value's text by name (a request's
    // chat_template_kwargs and reasoning_effort).
    std::map<std::string, std::string> template_kwargs;
};

// How one rendering's replies parse (the chat layer's parser for that template and tools).
struct ReplyFormat;

struct ChatPrompt {
    std::string text;  // the rendering, without the BOS the vocabulary adds
    // GBNF the reply must follow (tool choice required), or empty. A lazy grammar applies only
    // from one of its triggers on (tool choice auto); grammar_lazy says so.
    std::string grammar;
    bool grammar_lazy = false;
    // A lazy grammar's triggers, as GenerationOptions takes them (words escaped into patterns).
    std::vector<std::string> grammar_trigger_patterns;
    std::vector<int32_t> grammar_trigger_tokens;
    std::vector<std::string> additional_stops;  // stop strings the template's format asks for
    // The reply is parsed for reasoning: a template that thinks (the chat layer found its thinking
    // markers) with a reasoning format other than None.
    bool parses_reasoning = false;
    std::shared_ptr<const ReplyFormat> reply_format;
};

struct ChatReply {
    std::string content;
    std::vector<ToolCall> tool_calls;
    std::string reasoning_content;  // a thinking model's, when the reply is parsed for it
};

class ChatTemplate {
public:
    // `source`: Jinja text replacing the model's template, or the name of one of llama.cpp's
    // built-in templates (builtin_template_names(), rendered by libllama, as llama-server's
    // --chat-template NAME); empty: the model's, or the fallback above. Throws Error for a
    // template that does not parse.
    ChatTemplate(const llama_model * vocab_model, bool gemma_turns, const std::string & source);
    // The names of llama.cpp's built-in templates ("chatml", "llama3", "gemma", ...).
    static std::vector<std::string> builtin_template_names();
    ~ChatTemplate();

    // Tools for a template that describes none take llama.cpp's generic format (the tools in the
    // system message, a JSON reply forced by the grammar, parsed back into calls). Throws Error
    // naming what the template cannot render (tool calls in the messages of a template that shows
    // none, without tools; a malformed tool schema or call arguments; a template that fails).
    ChatPrompt render(const ChatInput & input, bool add_assistant = true) const;
    // The reply (`partial`: so far, while it streams) as reasoning, content and tool calls. Text
    // the parser cannot place stays content, as llama.cpp's lenient parse keeps it.
    static ChatReply parse(const ChatPrompt & prompt, const std::string & reply, bool partial);
    bool jinja() const { return jinja_; }
    // "jinja" or the built-in template's name.
    std::string name() const { return jinja_ ? "jinja" : builtin_; }
    // The Jinja source, or the built-in template's name.
    std::string source() const;

private:
    std::unique_ptr<common_chat_templates, void (*)(common_chat_templates *)> templates_;
    bool jinja_ = true;
    std::string builtin_;
    bool describes_tools_ = false;   // the template renders `tools`
    bool shows_tool_calls_ = false;  // and assistant messages' tool_calls
};

}  // namespace specula
