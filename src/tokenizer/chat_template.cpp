#include "tokenizer/chat_template.h"

#include <algorithm>
#include <map>
#include <regex>

#include "chat.h"
#include "common.h"
#include "json-schema-to-grammar.h"
#include "llama.h"
#include "specula/error.h"

namespace specula {

struct ReplyFormat {
    common_chat_parser_params params;
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

common_reasoning_format to_common(ReasoningFormat format) {
    switch (format) {
        case ReasoningFormat::Deepseek: return COMMON_REASONING_FORMAT_DEEPSEEK;
        case ReasoningFormat::DeepseekLegacy: return COMMON_REASONING_FORMAT_DEEPSEEK_LEGACY;
        case ReasoningFormat::None: break;
    }
    return COMMON_REASONING_FORMAT_NONE;
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

ChatTemplate::ChatTemplate(const llama_model * vocab_model, bool gemma_turns, const std::string & source)
    : templates_(nullptr, common_chat_templates_free) {
    common_chat_templates_ptr made;
    if (!source.empty() || llama_model_chat_template(vocab_model, nullptr)) {
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
    // What the template cannot show would vanish from the prompt unsaid (llama.cpp's chat layer of
    // this version adds no generic tool prompt): refused instead.
    const std::string which = jinja_ ? "the chat template" : "llama.cpp's built-in \"" + builtin_ + "\" template (the model has none of its own)";
    const std::string way_out = ": give a Jinja template with tool support (--chat-template FILE)";
    if (!input.tools.empty() && !describes_tools_) throw Error("tools: " + which + " describes no tools" + way_out);
    for (size_t i = 0; i < input.messages.size(); ++i) {
        if (!input.messages[i].tool_calls.empty() && !shows_tool_calls_) {
            throw Error("messages[" + std::to_string(i) + "].tool_calls: " + which + " shows no tool calls" + way_out);
        }
    }
    common_chat_templates_inputs in;
    in.use_jinja = jinja_;
    in.add_generation_prompt = add_assistant;
    for (const ChatMessage & m : input.messages) in.messages.push_back(to_common(m));
    for (const ChatTool & t : input.tools) in.tools.push_back({t.name, t.description, t.parameters});
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
    out.text = std::move(params.prompt);
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
    return out;
}

std::string ChatTemplate::source() const { return jinja_ ? common_chat_templates_source(templates_.get()) : builtin_; }

ChatReply ChatTemplate::parse(const ChatPrompt & prompt, const std::string & reply, bool partial) {
    if (!prompt.reply_format) return {reply, {}};
    common_chat_msg msg;
    try {
        msg = common_chat_parse(reply, partial, prompt.reply_format->params);
    } catch (const std::exception &) {
        return {reply, {}};  // not the template's format: all of it is text
    }
    ChatReply out;
    out.reasoning_content = std::move(msg.reasoning_content);
    out.content = std::move(msg.content);
    for (common_chat_tool_call & c : msg.tool_calls) out.tool_calls.push_back({std::move(c.id), std::move(c.name), std::move(c.arguments)});
    return out;
}

}  // namespace specula
