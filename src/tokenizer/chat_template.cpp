#include "tokenizer/chat_template.h"

#include <algorithm>
#include <map>
#include <regex>

#include <nlohmann/json.hpp>

#include "chat.h"
#include "common.h"
#include "json-schema-to-grammar.h"
#include "llama.h"
#include "specula/error.h"

namespace specula {

struct ReplyFormat {
    common_chat_parser_params params;
    bool generic = false;  // the generic tool format's JSON reply (generic_tools below)
    // A continued message's text (ChatInput::continuation): the chat layer parses it before the
    // reply, and the reply's parse leaves it out (the client holds it already).
    ChatReply prefill;
};

namespace {
common_chat_templates_ptr init_templates(const llama_model * vocab_model, const std::string & source) {
    try {
        return common_chat_templates_init(vocab_model, source);
    } catch (const std::exception & e) {
        throw Error(std::string("the chat template does not parse as Jinja: ") + e.what());
    }
}

common_chat_msg to_common(const ChatMessage & m) {
    common_chat_msg out;
    out.role = m.role;
    out.content = m.content;
    out.reasoning_content = m.reasoning_content;
    for (const ToolCall & c : m.tool_calls) out.tool_calls.push_back({c.name, c.arguments, c.id});
    out.tool_call_id = m.tool_call_id;
    return out;
}

// The chat layer's grammar as the engine applies it, from the reply's first token. llama.cpp's
// tool-call grammars begin with the generation prompt, which its sampler is fed before the reply,
// so the root rule drops that literal; and they let text precede the calls ("until-N?", up to the
// first call's marker), which a required call drops too, so that the reply is the calls (content
// null, as OpenAI answers a required call) rather than text that may run to max_tokens. A grammar
// of another shape stays unused (empty): the reply is then generated unconstrained and parsed.
std::string grammar_of_reply(const std::string & gbnf, const std::string & generation_prompt) {
    if (gbnf.empty()) return gbnf;
    const std::string head = "root ::= " + (generation_prompt.empty() ? "" : gbnf_format_literal(generation_prompt) + " ");
    for (size_t at = gbnf.find(head); at != std::string::npos; at = gbnf.find(head, at + 1)) {
        const size_t body = at + head.size();
        const size_t line_end = gbnf.find('\n', at);
        std::string root = gbnf.substr(body, line_end == std::string::npos ? std::string::npos : line_end - body);
        if ((at != 0 && gbnf[at - 1] != '\n') || root.find('|') != std::string::npos) continue;
        const std::regex preamble(R"(^((?:space )?)until-[0-9]+\? )");
        root = std::regex_replace(root, preamble, "$1", std::regex_constants::format_first_only);
        return gbnf.substr(0, at) + "root ::= " + root + (line_end == std::string::npos ? "" : gbnf.substr(line_end));
    }
    return "";
}

// parallel_tool_calls false: the chat layer makes each call block hold one call, but its formats
// of one block per call still let blocks follow one another ("tool-calls ::= (tool-call space)+");
// one block, then the end of the reply.
std::string with_one_call_block(std::string gbnf) {
    const std::string head = "\ntool-calls ::= (";
    const size_t at = gbnf.find(head);
    if (at == std::string::npos) return gbnf;
    const size_t body = at + head.size();
    const size_t line_end = std::min(gbnf.find('\n', body), gbnf.size());
    if (line_end - body < 2 || gbnf.compare(line_end - 2, 2, ")+") != 0) return gbnf;
    return gbnf.substr(0, body - 1) + gbnf.substr(body, line_end - 2 - body) + gbnf.substr(line_end);
}

// The chat layer's triggers as llama.cpp's sampler takes them (common/sampling.cpp): a word is
// found anywhere, a full pattern must match the whole text so far.
void add_triggers(const std::vector<common_grammar_trigger> & triggers, ChatPrompt & out) {
    for (const common_grammar_trigger & t : triggers) {
        switch (t.type) {
            case COMMON_GRAMMAR_TRIGGER_TYPE_WORD: out.grammar_trigger_patterns.push_back(regex_escape(t.value)); break;
            case COMMON_GRAMMAR_TRIGGER_TYPE_PATTERN: out.grammar_trigger_patterns.push_back(t.value); break;
            case COMMON_GRAMMAR_TRIGGER_TYPE_PATTERN_FULL: {
                const std::string & p = t.value;
                out.grammar_trigger_patterns.push_back(p.empty() ? "^$" : (p.front() != '^' ? "^" : "") + p + (p.back() != '$' ? "$" : ""));
                break;
            }
            case COMMON_GRAMMAR_TRIGGER_TYPE_TOKEN: out.grammar_trigger_tokens.push_back(t.token); break;
        }
    }
}

// Tools for a template that describes none: llama.cpp's generic format (COMMON_CHAT_FORMAT_GENERIC
// of its later versions, which the pinned chat layer lacks). The tools are described in the system
// message and the reply is one JSON object the grammar forces from its first token:
// {"tool_call": {"name", "arguments"}} ({"tool_calls": [...]} when several calls may come) or,
// unless a call is required, {"response": "..."}; parse_generic reads it back. Earlier calls and
// tool results become that JSON too (as llama.cpp's template polyfills write them), the results in
// user messages, since such a template knows no tool role.
using ojson = nlohmann::ordered_json;

ojson call_json(const ToolCall & c) {
    ojson call{{"name", c.name}, {"arguments", ojson::parse(c.arguments)}};
    if (!c.id.empty()) call["id"] = c.id;
    return call;
}

std::vector<ChatMessage> generic_messages(const ChatInput & input) {
    ojson tools = ojson::array();
    for (const ChatTool & t : input.tools) {
        tools.push_back({{"type", "function"},
                         {"function", {{"name", t.name}, {"description", t.description}, {"parameters", ojson::parse(t.parameters)}}}});
    }
    const std::string calls = input.parallel_tool_calls ? "`tool_calls` (requests to call tools)" : "`tool_call` (a request to call a tool)";
    const std::string instruction = "You can call any of the following tools to satisfy the user's requests: " + tools.dump(2) +
                                    "\n\nRespond in JSON format, " +
                                    (input.tool_choice == ToolChoice::Required ? "with " + calls : "either with " + calls + " or with `response` reply to the user's request");
    std::vector<ChatMessage> out;
    for (const ChatMessage & m : input.messages) {
        ChatMessage shown = m;
        if (!m.tool_calls.empty()) {
            ojson content;
            if (m.tool_calls.size() == 1 && !input.parallel_tool_calls) {
                content["tool_call"] = call_json(m.tool_calls[0]);
            } else {
                for (const ToolCall & c : m.tool_calls) content["tool_calls"].push_back(call_json(c));
            }
            shown.content = content.dump(2);
            shown.tool_calls.clear();
        } else if (m.role == "tool") {
            shown.role = "user";
            shown.content = ojson{{"tool_response", {{"tool_call_id", m.tool_call_id}, {"content", m.content}}}}.dump(2);
            shown.tool_call_id.clear();
        }
        out.push_back(std::move(shown));
    }
    if (!out.empty() && out.front().role == "system") out.front().content += "\n\n" + instruction;
    else out.insert(out.begin(), ChatMessage{"system", instruction, {}, ""});
    return out;
}

std::string generic_grammar(const ChatInput & input) {
    ojson each = ojson::array();
    for (const ChatTool & t : input.tools) {
        each.push_back({{"type", "object"},
                        {"properties", {{"name", {{"type", "string"}, {"const", t.name}}}, {"arguments", ojson::parse(t.parameters)}}},
                        {"required", {"name", "arguments"}}});
    }
    const ojson call = each.size() == 1 ? each[0] : ojson{{"anyOf", each}};
    const ojson calls = input.parallel_tool_calls
                            ? ojson{{"type", "object"}, {"properties", {{"tool_calls", {{"type", "array"}, {"items", call}, {"minItems", 1}}}}}, {"required", {"tool_calls"}}}
                            : ojson{{"type", "object"}, {"properties", {{"tool_call", call}}}, {"required", {"tool_call"}}};
    const ojson schema = input.tool_choice == ToolChoice::Required
                             ? calls
                             : ojson{{"anyOf", {calls, {{"type", "object"}, {"properties", {{"response", {{"type", "string"}}}}}, {"required", {"response"}}}}}};
    return json_schema_to_grammar(common_json::parse(schema.dump()), /*force_gbnf=*/true);
}

// The generic format's reply: calls, or the response as content; a reply that is not such an
// object stays content (a partial one nothing yet: its JSON is not whole).
ChatReply parse_generic(const std::string & reply, bool partial) {
    ojson j;
    try {
        j = ojson::parse(reply);
    } catch (const std::exception &) {
        return partial ? ChatReply{} : ChatReply{reply, {}, {}};
    }
    ChatReply out;
    auto take = [&out](const ojson & c) {
        if (!c.is_object()) return;
        const ojson args = c.value("arguments", ojson::object());
        out.tool_calls.push_back({c.value("id", std::string()), c.value("name", std::string()), args.is_string() ? args.get<std::string>() : args.dump()});
    };
    if (j.is_object() && j.contains("tool_calls") && j.at("tool_calls").is_array()) {
        for (const ojson & c : j.at("tool_calls")) take(c);
    } else if (j.is_object() && j.contains("tool_call")) {
        take(j.at("tool_call"));
    } else if (j.is_object() && j.contains("response")) {
        out.content = j.at("response").is_string() ? j.at("response").get<std::string>() : j.at("response").dump();
    } else {
        out.content = reply;
    }
    return out;
}

common_reasoning_format to_common(ReasoningFormat format) {
    switch (format) {
        case ReasoningFormat::Deepseek: return COMMON_REASONING_FORMAT_DEEPSEEK;
        case ReasoningFormat::DeepseekLegacy: return COMMON_REASONING_FORMAT_DEEPSEEK_LEGACY;
        case ReasoningFormat::None: break;
    }
    return COMMON_REASONING_FORMAT_NONE;
}

common_chat_continuation to_common(Continuation c) {
    switch (c) {
        case Continuation::Auto: return COMMON_CHAT_CONTINUATION_AUTO;
        case Continuation::Content: return COMMON_CHAT_CONTINUATION_CONTENT;
        case Continuation::Reasoning: return COMMON_CHAT_CONTINUATION_REASONING;
        case Continuation::None: break;
    }
    return COMMON_CHAT_CONTINUATION_NONE;
}

// `text` without `prefix` when it starts with it.
void drop_prefix(std::string & text, const std::string & prefix) {
    if (!prefix.empty() && text.compare(0, prefix.size(), prefix) == 0) text.erase(0, prefix.size());
}

common_chat_tool_choice to_common(ToolChoice choice) {
    switch (choice) {
        case ToolChoice::None: return COMMON_CHAT_TOOL_CHOICE_NONE;
        case ToolChoice::Required: return COMMON_CHAT_TOOL_CHOICE_REQUIRED;
        case ToolChoice::Auto: break;
    }
    return COMMON_CHAT_TOOL_CHOICE_AUTO;
}
}  // namespace

ReasoningFormat reasoning_format_from_name(const std::string & name) {
    if (name == "none") return ReasoningFormat::None;
    if (name == "auto" || name == "deepseek") return ReasoningFormat::Deepseek;
    if (name == "deepseek-legacy") return ReasoningFormat::DeepseekLegacy;
    throw Error("reasoning format \"" + name + "\": none, auto, deepseek or deepseek-legacy");
}

std::vector<std::string> ChatTemplate::builtin_template_names() {
    std::vector<const char *> names(static_cast<size_t>(std::max(0, llama_chat_builtin_templates(nullptr, 0))));
    llama_chat_builtin_templates(names.data(), names.size());
    return {names.begin(), names.end()};
}

ChatTemplate::ChatTemplate(const llama_model * vocab_model, bool gemma_turns, const std::string & source)
    : templates_(nullptr, common_chat_templates_free) {
    common_chat_templates_ptr made;
    const std::vector<std::string> builtin = builtin_template_names();
    if (!source.empty() && std::find(builtin.begin(), builtin.end(), source) != builtin.end()) {
        // A built-in template by name, rendered by libllama as the gemma fallback below is.
        made = init_templates(vocab_model, source);
        jinja_ = false;
        builtin_ = source;
    } else if (!source.empty() || llama_model_chat_template(vocab_model, nullptr)) {
        made = init_templates(vocab_model, source);
    } else if (gemma_turns) {
        // llama.cpp's built-in gemma template, rendered by libllama (the chat layer's route for a
        // template it knows by name); the Jinja engine would print the name as text.
        made = init_templates(vocab_model, "gemma");
        jinja_ = false;
        builtin_ = "gemma";
    } else {
        made = init_templates(vocab_model, "");  // the chat layer's Jinja chatml
    }
    templates_.reset(made.release());
    if (jinja_) {
        const std::map<std::string, bool> caps = common_chat_templates_get_caps(templates_.get());
        describes_tools_ = caps.at("supports_tools");
        shows_tool_calls_ = caps.at("supports_tool_calls");
    }
}

ChatTemplate::~ChatTemplate() = default;

ChatPrompt ChatTemplate::render(const ChatInput & input, bool add_assistant) const {
    // A template without tools gets the generic format; with tool_choice none the tools go unsaid.
    const bool generic = !input.tools.empty() && !describes_tools_ && input.tool_choice != ToolChoice::None;
    const std::string which = jinja_ ? "the chat template" : "llama.cpp's built-in \"" + builtin_ + "\" template";
    const bool continuing = input.continuation != Continuation::None;
    if (continuing) {
        if (input.messages.empty() || input.messages.back().role != "assistant") throw Error("the final message is not the assistant's: only an assistant's message can be continued");
        const std::string last = "messages[" + std::to_string(input.messages.size() - 1) + "]";
        if (!input.messages.back().tool_calls.empty()) throw Error(last + ": an assistant message with tool calls cannot be continued");
        if (generic) throw Error(last + ": an assistant message cannot be continued under the generic tool format, whose reply is a JSON object from its first token: give a Jinja template with tool support (--chat-template FILE)");
        if (!input.tools.empty() && input.tool_choice == ToolChoice::Required) throw Error(last + ": an assistant message cannot be continued when a tool call is required, which the reply must begin with");
    }
    if (!generic) {
        for (size_t i = 0; i < input.messages.size(); ++i) {
            if (!input.messages[i].tool_calls.empty() && !shows_tool_calls_) {
                throw Error("messages[" + std::to_string(i) + "].tool_calls: " + which + " shows no tool calls: give 'tools' (the generic tool format) or a Jinja template with tool support (--chat-template FILE)");
            }
        }
    }
    common_chat_templates_inputs in;
    in.use_jinja = jinja_;
    in.add_generation_prompt = add_assistant && input.add_generation_prompt && !continuing;
    try {
        for (const ChatMessage & m : generic ? generic_messages(input) : input.messages) in.messages.push_back(to_common(m));
    } catch (const ojson::exception & e) {
        throw Error(std::string("tools: a tool's parameters or a call's arguments are not JSON: ") + e.what());
    }
    // A Jinja template's continuation is the chat layer's (the generation prompt of the messages
    // before the final one, then its text: common_chat_templates_apply); libllama's built-in
    // templates know none, so the same is done here: the others with the generation prompt, the
    // final message's text after it.
    std::string continued_text;
    if (continuing && jinja_) {
        in.continue_final_message = to_common(input.continuation);
    } else if (continuing) {
        const ChatMessage & last = input.messages.back();
        const bool reasoning = input.continuation == Continuation::Reasoning ||
                               (input.continuation == Continuation::Auto && last.content.empty() && !last.reasoning_content.empty());
        continued_text = reasoning ? last.reasoning_content : last.content;
        in.messages.pop_back();
        in.add_generation_prompt = true;
    }
    if (describes_tools_) {
        for (const ChatTool & t : input.tools) in.tools.push_back({t.name, t.description, t.parameters});
    }
    in.tool_choice = to_common(input.tool_choice);
    in.parallel_tool_calls = input.parallel_tool_calls;
    in.reasoning_format = to_common(input.reasoning);
    in.enable_thinking = input.enable_thinking;
    in.chat_template_kwargs = input.template_kwargs;
    common_chat_params params;
    try {
        params = common_chat_templates_apply(templates_.get(), in);
    } catch (const std::exception & e) {
        throw Error(std::string("the chat template cannot render these messages: ") + e.what());
    }
    ChatPrompt out;
    out.text = std::move(params.prompt) + continued_text;
    if (generic) {
        auto format = std::make_shared<ReplyFormat>();
        format->generic = true;
        try {
            out.grammar = generic_grammar(input);
        } catch (const std::exception & e) {
            throw Error(std::string("tools: the generic tool format's grammar: ") + e.what());
        }
        out.additional_stops = std::move(params.additional_stops);
        out.reply_format = std::move(format);
        return out;
    }
    // A lazy grammar (tool choice auto) reads the reply from its trigger on, which the generation
    // prompt never holds: it stays as the chat layer made it.
    out.grammar = params.grammar_lazy ? params.grammar : grammar_of_reply(params.grammar, params.generation_prompt);
    if (!input.parallel_tool_calls) out.grammar = with_one_call_block(std::move(out.grammar));
    out.grammar_lazy = params.grammar_lazy && !params.grammar.empty();
    if (out.grammar_lazy) add_triggers(params.grammar_triggers, out);
    out.additional_stops = std::move(params.additional_stops);
    auto format = std::make_shared<ReplyFormat>();
    format->params = common_chat_parser_params(params);
    // Without thinking markers the chat layer's parsers have no reasoning to take out: the reply
    // is then all content, a "<think>" the model writes included, as with format None.
    out.parses_reasoning = input.reasoning != ReasoningFormat::None && params.supports_thinking;
    format->params.reasoning_format = out.parses_reasoning ? to_common(input.reasoning) : COMMON_REASONING_FORMAT_NONE;
    format->params.parse_tool_calls = !input.tools.empty() && input.tool_choice != ToolChoice::None;
    if (!params.parser.empty()) format->params.parser.load(params.parser);
    out.reply_format = std::move(format);
    if (continuing && jinja_) {
        // What the chat layer parses before the reply (generation_prompt holds the continued text).
        auto with_prefill = std::make_shared<ReplyFormat>(*out.reply_format);
        with_prefill->prefill = parse(out, "", /*partial=*/true);
        out.reply_format = std::move(with_prefill);
    }
    return out;
}

std::string ChatTemplate::source() const { return jinja_ ? common_chat_templates_source(templates_.get()) : builtin_; }

ChatReply ChatTemplate::parse(const ChatPrompt & prompt, const std::string & reply, bool partial) {
    if (!prompt.reply_format) return {reply, {}};
    if (prompt.reply_format->generic) return parse_generic(reply, partial);
    common_chat_msg msg;
    try {
        msg = common_chat_parse(reply, partial, prompt.reply_format->params);
    } catch (const std::exception &) {
        return {reply, {}};  // not the template's format: all of it is text
    }
    ChatReply out;
    out.reasoning_content = std::move(msg.reasoning_content);
    out.content = std::move(msg.content);
    drop_prefix(out.reasoning_content, prompt.reply_format->prefill.reasoning_content);
    drop_prefix(out.content, prompt.reply_format->prefill.content);
    for (common_chat_tool_call & c : msg.tool_calls) out.tool_calls.push_back({std::move(c.id), std::move(c.name), std::move(c.arguments)});
    return out;
}

}  // namespace specula
