// libFuzzer target: the input is a GGUF file whose vocabulary is loaded by specula's Tokenizer
// (its own checks, then libllama's vocabulary loader, vocab-only), which then tokenizes,
// detokenizes and renders a chat. A specula::Error is how a hostile input must end; a
// signal, a sanitizer report, any other exception or a leak is a finding.
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz_input.h"
#include "specula/error.h"
#include "tokenizer/tokenizer.h"

namespace {

std::string g_input_path;

// Text that reaches every branch of a tokenizer: ASCII words and spaces, a newline, multi-byte and
// invalid UTF-8, digits, and the spellings of common control tokens.
const std::string kText = "Hello  world\n\tüñí 日本語 \xf0\x9f\x99\x82 \xff\xfe 12345 <s></s><|im_start|>user<|im_end|><start_of_turn>";

}  // namespace

extern "C" int LLVMFuzzerInitialize(int *, char ***) {
    g_input_path = specula::fuzz::input_path("tokenizer", "input.gguf");
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t * data, size_t size) {
    specula::fuzz::write_input(g_input_path, data, size);
    try {
        const specula::Tokenizer tokenizer(g_input_path);
        for (specula::SpecialTokens specials : {specula::SpecialTokens::Parse, specula::SpecialTokens::Text}) {
            const std::vector<int32_t> ids = tokenizer.tokenize(kText, true, specials);
            tokenizer.detokenize(ids);
            for (int32_t id : ids) tokenizer.is_end_of_generation(id);
        }
        for (int32_t id : {0, tokenizer.n_vocab() - 1}) tokenizer.piece(id);
        tokenizer.fingerprint();
        tokenizer.tokenize_chat({{"system", "Be brief."}, {"user", kText}});
    } catch (const specula::Error &) {
    }
    return 0;
}
