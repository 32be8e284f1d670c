#pragma once
// Text <-> tokens and chat templates, through libllama loaded vocab-only from the model's GGUF,
// so that specula tokenizes exactly as llama.cpp does.
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tokenizer/chat_template.h"

struct llama_model;
struct llama_vocab;

namespace specula {

// Whether text spelling a control token becomes that token (Parse) or stays text (Text).
// User-defined tokens of a vocabulary (added words) match in both, as in llama.cpp and HF tokenizers.
enum class SpecialTokens {
    Parse,
    Text
};

class Tokenizer {
public:
    explicit Tokenizer(const std::string & gguf_path);  // throws Error
    ~Tokenizer();
    Tokenizer(const Tokenizer &) = delete;
    Tokenizer & operator=(const Tokenizer &) = delete;

    // add_bos: prepend BOS when the vocabulary asks for it. `specials`: whether text that spells a
    // control token ("<|im_start|>") becomes that token. Parse for the operator's own text (generate
    // -p, benchmarks' prompt sets); Text for text from outside (a server request's prompt), which
    // then cannot forge the model's markup.
    std::vector<int32_t> tokenize(const std::string & text, bool add_bos = true, SpecialTokens specials = SpecialTokens::Parse) const;
    // A token's bytes; a control token's own text (`<|im_start|>`) with `special`, else nothing.
    std::string piece(int32_t token, bool special = false) const;
    // The token whose piece is exactly `text` (a control token never), or -1; where several spell
    // it, the lowest id that is not a byte token. The table of pieces is built on first use.
    int32_t token_spelling(std::string_view text) const;
    std::string detokenize(const std::vector<int32_t> & tokens) const;
    bool is_end_of_generation(int32_t token) const;
    // The control tokens that do not end generation, sorted: a chat template's turn markup
    // ("<|im_start|>"), which a reply does not hold, so prompt lookup never proposes them.
    const std::vector<int32_t> & markup_tokens() const { return markup_tokens_; }
    // The tokens is_end_of_generation() is true of, sorted.
    const std::vector<int32_t> & end_of_generation_tokens() const { return end_tokens_; }
    int n_vocab() const;
    // The vocabulary's identity: token count and a hash of every token's text.
    uint64_t fingerprint() const;

    const llama_vocab * vocabulary() const { return vocab_; }  // libllama's, for its grammar sampler (src/constrain/)
    // The model's chat template (chat_template.h: its own Jinja template, else the built-in one
    // its turn tokens name), built on first use; set_chat_template replaces it by Jinja source
    // (--chat-template FILE) and is called before any use from other threads.
    const ChatTemplate & chat_template() const;
    void set_chat_template(const std::string & jinja_source);  // throws Error
    // The messages through chat_template() as text.
    std::string apply_chat_template(const std::vector<std::pair<std::string, std::string>> & messages,
                                    bool add_assistant) const;
    // The conversation through chat_template() as tokens, ending with the assistant's turn opened,
    // and the rendering's grammar and reply format. BOS is added once: templates that write the
    // BOS text themselves do not get a second one. Only the template's markup becomes control
    // tokens: message contents are Text (a user who types "<|im_start|>system" opens no turn)
    // unless `contents` is Parse (serve --special-tokens-in-prompt). Contents without control-token
    // text tokenize with the whole rendering, as llama.cpp does; otherwise markup and contents are
    // tokenized piece by piece, and a content the template does not render verbatim (or trimmed of
    // surrounding whitespace, as llama.cpp's gemma template does) throws Error naming the message.
    // Control-token text elsewhere (tool calls, tool definitions) throws Error unless Parse.
    struct Chat {
        std::vector<int32_t> tokens;
        ChatPrompt prompt;
    };
    Chat tokenize_conversation(const ChatInput & input, SpecialTokens contents = SpecialTokens::Text) const;
    // (role, content) messages, as above.
    std::vector<int32_t> tokenize_chat(const std::vector<std::pair<std::string, std::string>> & messages,
                                       SpecialTokens contents = SpecialTokens::Text) const;

private:
    std::vector<int32_t> tokenize_markup_and_contents(const ChatInput & input, const std::string & rendered) const;
    bool spells_control(const std::string & text) const;

    llama_model * model_ = nullptr;
    const llama_vocab * vocab_ = nullptr;
    std::vector<std::string> control_texts_;  // the texts that Parse turns into tokens and Text does not
    std::vector<int32_t> markup_tokens_;
    std::vector<int32_t> end_tokens_;
    // Looked up by string_view (the hash is transparent): a grammar's forced text is matched
    // prefix by prefix without a copy per prefix.
    struct PieceHash {
        using is_transparent = void;
        size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
    };
    mutable std::unordered_map<std::string, int32_t, PieceHash, std::equal_to<>> token_of_piece_;
    mutable std::once_flag pieces_indexed_;
    mutable std::unique_ptr<ChatTemplate> chat_template_;
    mutable std::once_flag chat_template_built_;
};

// Initializes libllama with its log captured (runtime/library_log.h); idempotent.
void init_llama_backend();

}  // namespace specula
