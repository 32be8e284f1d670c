#pragma once
// Text <-> tokens and chat templates, through libllama loaded vocab-only from the model's GGUF,
// so that specula tokenizes exactly as llama.cpp does.
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

struct llama_model;
struct llama_vocab;

namespace specula {

class Tokenizer {
public:
    explicit Tokenizer(const std::string & gguf_path);  // throws Error
    ~Tokenizer();
    Tokenizer(const Tokenizer &) = delete;
    Tokenizer & operator=(const Tokenizer &) = delete;

    // add_bos: prepend BOS when the vocabulary asks for it.
    std::vector<int32_t> tokenize(const std::string & text, bool add_bos = true) const;
    std::string piece(int32_t token) const;
    std::string detokenize(const std::vector<int32_t> & tokens) const;
    bool is_end_of_generation(int32_t token) const;
    int n_vocab() const;
    // The vocabulary's identity: token count and a hash of every token's text.
    uint64_t fingerprint() const;

    // The model's chat template; without one in the file, llama.cpp's template named by the
    // vocabulary's turn tokens ("gemma" for <start_of_turn>/<end_of_turn>), else "chatml".
    const char * chat_template() const;
    // The messages through chat_template() as text.
    std::string apply_chat_template(const std::vector<std::pair<std::string, std::string>> & messages,
                                    bool add_assistant) const;
    // The messages through chat_template() as tokens, ending with the assistant's turn opened. BOS is added once: templates that write
    // the BOS text themselves do not get a second one.
    std::vector<int32_t> tokenize_chat(const std::vector<std::pair<std::string, std::string>> & messages) const;

private:
    llama_model * model_ = nullptr;
    const llama_vocab * vocab_ = nullptr;
};

// Initializes libllama with its log captured (runtime/library_log.h); idempotent.
void init_llama_backend();

}  // namespace specula
