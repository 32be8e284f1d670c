#include "server/openai_chat.h"

#include <algorithm>
#include <random>

#include "common/json_limits.h"
#include "constrain/grammar_guard.h"
#include "server/openai_fields.h"
#include "specula/error.h"

namespace specula::openai {

using nlohmann::json;

namespace {

std::string string_field(const json & object, const char * key, const std::string & param) {
    if (!object.contains(key)) bad(param, "'" + param + "' is required");
    const json & v = object.at(key);
    if (!v.is_string()) must_be(param, "a string", v);
    return v.get<std::string>();
}

// A content as text: a string, text parts joined by `delimiter`, or null (an assistant's calls alone).
std::string message_content(const json & content, const std::string & param, bool may_be_null, const std::string & delimiter = "") {
    if (content.is_string()) return content.get<std::string>();
    if (content.is_null() && may_be_null) return "";
    if (!content.is_array()) must_be(param, "a string or an array of text parts", content);
    std::string text;
    for (size_t j = 0; j < content.size(); ++j) {
        const json & part = content[j];
        const std::string part_param = param + "[" + std::to_string(j) + "]";
        if (!part.is_object()) must_be(part_param, "a text part ({\"type\": \"text\", \"text\": ...})", part);
        if (!part.contains("type") || !part.at("type").is_string() || part.at("type") != "text") {
            must_be(part_param + ".type", "\"text\" (only text parts are supported)", part.value("type", json()));
        }
        if (j > 0) text += delimiter;
        text += string_field(part, "text", part_param + ".text");
    }
    return text;
}

// A JSON object's text (the arguments of a call): templates re-serialize them, so they must parse.
void check_json_object(const std::string & text, const std::string & param) {
    json parsed;
    try {
        parsed = parse_json(text);
    } catch (const std::exception &) {
        bad(param, "'" + param + "' must be a JSON object's text, and it does not parse as JSON");
    }
    if (!parsed.is_object()) bad(param, "'" + param + "' must be a JSON object's text, got " + json_kind(parsed));
}

std::vector<ToolCall> tool_calls(const json & calls, const std::string & param) {
    if (!calls.is_array()) must_be(param, "an array of tool calls", calls);
    std::vector<ToolCall> out;
    for (size_t j = 0; j < calls.size(); ++j) {
        const json & call = calls[j];
        const std::string p = param + "[" + std::to_string(j) + "]";
        if (!call.is_object()) must_be(p, "a tool call ({\"id\", \"type\": \"function\", \"function\"})", call);
        if (has(call, "type") && call.at("type") != "function") must_be(p + ".type", "\"function\"", call.at("type"));
        if (!call.contains("function") || !call.at("function").is_object()) must_be(p + ".function", "an object with 'name' and 'arguments'", call.value("function", json()));
        const json & function = call.at("function");
        ToolCall c;
        c.id = has(call, "id") ? string_field(call, "id", p + ".id") : "";
        c.name = string_field(function, "name", p + ".function.name");
        c.arguments = string_field(function, "arguments", p + ".function.arguments");
        check_json_object(c.arguments, p + ".function.arguments");
        out.push_back(std::move(c));
    }
    return out;
}

// `continued`: the final message, which the reply continues; its text parts join as llama.cpp's
// chat layer joins a continued message's (a blank line between them).
ChatMessage message(const json & m, size_t i, bool continued = false) {
    const std::string param = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) must_be(param, "an object with 'role' and 'content'", m);
    if (!m.contains("role")) bad(param + ".role", "'" + param + ".role' is required");
    const json & role = m.at("role");
    if (!role.is_string() || (role != "system" && role != "user" && role != "assistant" && role != "developer" && role != "tool")) {
        must_be(param + ".role", "\"system\", \"developer\", \"user\", \"assistant\" or \"tool\"", role);
    }
    ChatMessage out;
    out.role = role == "developer" ? "system" : role.get<std::string>();
    const bool assistant = out.role == "assistant";
    if (assistant && has(m, "tool_calls")) out.tool_calls = tool_calls(m.at("tool_calls"), param + ".tool_calls");
    if (assistant && has(m, "reasoning_content")) out.reasoning_content = string_field(m, "reasoning_content", param + ".reasoning_content");
    // An assistant's message may be its calls or its reasoning alone.
    const bool may_lack_content = assistant && (!out.tool_calls.empty() || !out.reasoning_content.empty());
    if (!m.contains("content") && !may_lack_content) bad(param + ".content", "'" + param + ".content' is required");
    if (m.contains("content")) out.content = message_content(m.at("content"), param + ".content", may_lack_content, continued ? "\n\n" : "");
    if (out.role == "tool") out.tool_call_id = string_field(m, "tool_call_id", param + ".tool_call_id");
    return out;
}

// `ordered`: the same tool as the client wrote it; its schema keeps the client's key order, which
// the template prints (as llama.cpp's server does).
ChatTool tool(const json & t, const nlohmann::ordered_json & ordered, size_t i) {
    const std::string param = "tools[" + std::to_string(i) + "]";
    if (!t.is_object()) must_be(param, "a tool ({\"type\": \"function\", \"function\": {...}})", t);
    if (string_field(t, "type", param + ".type") != "function") must_be(param + ".type", "\"function\"", t.at("type"));
    if (!t.contains("function") || !t.at("function").is_object()) must_be(param + ".function", "an object with 'name'", t.value("function", json()));
    const json & f = t.at("function");
    ChatTool out;
    out.name = string_field(f, "name", param + ".function.name");
    if (out.name.empty()) bad(param + ".function.name", "'" + param + ".function.name' must not be empty");
    if (has(f, "description")) out.description = string_field(f, "description", param + ".function.description");
    out.parameters = R"({"type":"object","properties":{}})";  // none or {}: no arguments, as llama.cpp reads it
    if (has(f, "parameters")) {
        const json & p = f.at("parameters");
        if (!p.is_object()) must_be(param + ".function.parameters", "a JSON schema object", p);
        try {
            check_json_schema_limits(p);  // before llama.cpp's chat layer compiles it to the calls' grammar
        } catch (const Error & e) {
            bad(param + ".function.parameters", "'" + param + ".function.parameters': " + e.what());
        }
        if (!p.empty()) out.parameters = ordered.at("function").at("parameters").dump();
    }
    return out;
}

// "auto" | "none" | "required" | {"type": "function", "function": {"name": NAME}}.
void apply_tool_choice(const json & v, ChatInput & chat) {
    if (v.is_string() && (v == "auto" || v == "none" || v == "required")) {
        chat.tool_choice = v == "auto" ? ToolChoice::Auto : v == "none" ? ToolChoice::None
                                                                        : ToolChoice::Required;
    } else if (v.is_object()) {
        if (v.value("type", json()) != "function" || !v.contains("function") || !v.at("function").is_object()) {
            must_be("tool_choice", "\"auto\", \"none\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}", v);
        }
        const std::string name = string_field(v.at("function"), "name", "tool_choice.function.name");
        std::vector<ChatTool> named;
        for (const ChatTool & t : chat.tools) {
            if (t.name == name) named.push_back(t);
        }
        if (named.empty()) bad("tool_choice", "'tool_choice' names the function " + json_quoted(name) + ", which is not among the 'tools'");
        chat.tools = std::move(named);
        chat.tool_choice = ToolChoice::Required;
    } else {
        must_be("tool_choice", "\"auto\", \"none\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}", v);
    }
    if (chat.tool_choice == ToolChoice::Required && chat.tools.empty()) bad("tool_choice", "'tool_choice' requires a tool call, and no 'tools' are given");
}

// llama-server's assistant prefill and vLLM's continue_final_message (true, false, or transformers'
// "content" or "reasoning_content"), with add_generation_prompt, as llama-server reads them: a
// conversation that ends with the assistant's message continues it whatever the two fields say
// (its prefill is on by default); refused are an explicit continuation with add_generation_prompt
// true (which vLLM's clients turn off with it), two assistant messages at the end, an assistant
// message with tool calls, and (llama-server continues any message) a final message that is not
// the assistant's.
void read_continuation(const json & body, ChatInput & chat) {
    if (has(body, "add_generation_prompt")) chat.add_generation_prompt = boolean(body.at("add_generation_prompt"), "add_generation_prompt");
    const size_t n = chat.messages.size();
    const bool assistant_last = chat.messages.back().role == "assistant";
    if (has(body, "continue_final_message")) {
        const json & v = body.at("continue_final_message");
        if (v.is_boolean()) chat.continuation = v.get<bool>() ? Continuation::Auto : Continuation::None;
        else if (v == "content") chat.continuation = Continuation::Content;
        else if (v == "reasoning_content") chat.continuation = Continuation::Reasoning;
        else must_be("continue_final_message", "a boolean, \"content\" or \"reasoning_content\"", v);
    }
    const std::string last = "messages[" + std::to_string(n - 1) + "]";
    if (chat.continuation == Continuation::None && assistant_last) {
        if (n >= 2 && chat.messages[n - 2].role == "assistant") {
            bad("messages", "'messages' ends with two assistant messages: only the final one can be continued");
        }
        chat.continuation = Continuation::Auto;
        chat.add_generation_prompt = false;
    }
    if (chat.continuation == Continuation::None) return;
    if (chat.add_generation_prompt) {
        bad("continue_final_message", "'continue_final_message' and 'add_generation_prompt' cannot both be true: set 'add_generation_prompt' to false");
    }
    if (!assistant_last) bad("continue_final_message", "'continue_final_message': the final message (" + last + ") is not the assistant's");
    if (!chat.messages.back().tool_calls.empty()) {
        bad(last + ".tool_calls", "'" + last + "' has tool calls: an assistant message with tool calls cannot be continued");
    }
}

}  // namespace

ChatInput parse_chat(const json & body, const std::string & text) {
    if (!body.contains("messages")) bad("messages", "'messages' is required");
    const json & messages = body.at("messages");
    if (!messages.is_array() || messages.empty()) must_be("messages", "a non-empty array", messages);
    ChatInput chat;
    for (size_t i = 0; i < messages.size(); ++i) chat.messages.push_back(message(messages[i], i));
    read_continuation(body, chat);
    if (chat.continuation != Continuation::None) chat.messages.back() = message(messages.back(), messages.size() - 1, true);
    if (has(body, "tools")) {
        const json & tools = body.at("tools");
        if (!tools.is_array()) must_be("tools", "an array of tools", tools);
        const nlohmann::ordered_json ordered = nlohmann::ordered_json::parse(text);  // parsed whole once already: depth and syntax hold
        for (size_t i = 0; i < tools.size(); ++i) chat.tools.push_back(tool(tools[i], ordered.at("tools").at(i), i));
    }
    chat.parallel_tool_calls = has(body, "parallel_tool_calls") ? boolean(body.at("parallel_tool_calls"), "parallel_tool_calls") : true;
    if (has(body, "tool_choice")) apply_tool_choice(body.at("tool_choice"), chat);
    // vLLM's and llama-server's variables for the template; enable_thinking among them is also
    // the chat layer's own switch (a thinking template's empty thinking section).
    if (has(body, "chat_template_kwargs")) {
        const json & kwargs = body.at("chat_template_kwargs");
        if (!kwargs.is_object()) must_be("chat_template_kwargs", "an object of the template's variables", kwargs);
        for (const auto & [name, value] : kwargs.items()) chat.template_kwargs[name] = value.dump();
        if (kwargs.contains("enable_thinking")) chat.enable_thinking = boolean(kwargs.at("enable_thinking"), "chat_template_kwargs.enable_thinking");
    }
    if (has(body, "reasoning_effort")) {  // OpenAI's, which templates such as gpt-oss's read
        const json & effort = body.at("reasoning_effort");
        if (!effort.is_string() || (effort != "none" && effort != "minimal" && effort != "low" && effort != "medium" && effort != "high")) {
            must_be("reasoning_effort", "\"none\", \"minimal\", \"low\", \"medium\" or \"high\"", effort);
        }
        chat.template_kwargs.emplace("reasoning_effort", effort.dump());
    }
    return chat;
}

bool parses_tool_calls(const ChatInput & input) { return !input.tools.empty() && input.tool_choice != ToolChoice::None; }

bool parses_reply(const ChatInput & input, const ChatPrompt & prompt) { return parses_tool_calls(input) || prompt.parses_reasoning; }

namespace {

// What `now` adds to `sent`, where it extends it; else nothing (sent text cannot be taken back).
std::string extension(const std::string & sent, const std::string & now) {
    if (now.size() <= sent.size() || now.compare(0, sent.size(), sent) != 0) return "";
    return now.substr(sent.size());
}

json tool_calls_json(const std::vector<ToolCall> & calls) {
    json out = json::array();
    for (const ToolCall & call : calls) {
        out.push_back({{"id", call.id}, {"type", "function"}, {"function", {{"name", call.name}, {"arguments", call.arguments}}}});
    }
    return out;
}

}  // namespace

std::vector<json> reply_deltas(ChatReply & sent, const ChatReply & parsed, bool final) {
    std::vector<json> deltas;
    const std::string reasoning = extension(sent.reasoning_content, parsed.reasoning_content);
    if (!reasoning.empty()) {
        deltas.push_back({{"reasoning_content", reasoning}});
        sent.reasoning_content = parsed.reasoning_content;
    }
    const std::string content = extension(sent.content, parsed.content);
    if (!content.empty()) {
        deltas.push_back({{"content", content}});
        sent.content = parsed.content;
    }
    for (size_t i = 0; i < parsed.tool_calls.size(); ++i) {
        const ToolCall & call = parsed.tool_calls[i];
        if (i < sent.tool_calls.size()) {
            std::string & arguments = sent.tool_calls[i].arguments;
            const std::string piece = extension(arguments, call.arguments);
            if (piece.empty()) continue;
            deltas.push_back({{"tool_calls", json::array({{{"index", i}, {"function", {{"arguments", piece}}}}})}});
            arguments = call.arguments;
            continue;
        }
        const bool whole_name = !call.name.empty() && (!call.arguments.empty() || i + 1 < parsed.tool_calls.size());
        if (!final && !whole_name) break;
        json first = tool_calls_json({call})[0];
        first["index"] = i;
        deltas.push_back({{"tool_calls", json::array({std::move(first)})}});
        sent.tool_calls.push_back(call);
    }
    return deltas;
}

ChatReply ReplyStream::parse(bool partial) {
    ++parses_;
    ChatReply reply = ChatTemplate::parse(prompt_, text_, partial);
    for (size_t i = 0; i < reply.tool_calls.size(); ++i) {
        if (!reply.tool_calls[i].id.empty()) continue;
        if (ids_.size() <= i) ids_.resize(i + 1);
        if (ids_[i].empty()) {
            std::random_device random;
            ids_[i] = "call_" + std::to_string(random()) + std::to_string(random());
        }
        reply.tool_calls[i].id = ids_[i];
    }
    return reply;
}

std::vector<json> ReplyStream::add(const std::string & text) {
    text_ += text;
    // Each parse reads the whole reply: parsing on every chunk would cost the square of its length.
    // Parsed once it grew by a fraction since the last parse, a long reply costs a bounded multiple
    // of one parse; finish() parses the whole of it whatever came since.
    if (text_.size() - parsed_bytes_ < std::max<size_t>(1, parsed_bytes_ / kReparseFraction)) return {};
    parsed_bytes_ = text_.size();
    return reply_deltas(sent_, parse(/*partial=*/true), /*final=*/false);
}

ChatReply ReplyStream::finish(const std::string & rest, std::vector<json> * deltas) {
    text_ += rest;
    ChatReply reply = parse(/*partial=*/false);
    std::vector<json> last = reply_deltas(sent_, reply, /*final=*/true);
    if (deltas) *deltas = std::move(last);
    return reply;
}

void set_reply(json & response, const ChatReply & reply) {
    json & message = response["choices"][0]["message"];
    message["content"] = reply.content.empty() && !reply.tool_calls.empty() ? json(nullptr) : json(reply.content);
    if (!reply.reasoning_content.empty()) message["reasoning_content"] = reply.reasoning_content;
    if (!reply.tool_calls.empty()) message["tool_calls"] = tool_calls_json(reply.tool_calls);
}

json chunk_delta(const Completion & c, json delta) {
    json j = chunk_text(c, "");
    j["choices"][0]["delta"] = std::move(delta);
    return j;
}

std::string finish_reason(const ChatReply & reply, const std::string & generation_finish) {
    return !reply.tool_calls.empty() && generation_finish == "stop" ? "tool_calls" : generation_finish;
}

}  // namespace specula::openai
