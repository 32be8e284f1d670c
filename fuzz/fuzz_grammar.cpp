// libFuzzer target: the input is a client's grammar as `specula serve` receives it, GBNF text or,
// when it starts with '{', a JSON schema (response_format, tools). It is checked against the
// grammar limits, compiled over a vocabulary and walked a few tokens, each time taking the first
// token the grammar allows. A specula::Error is how a hostile grammar must end; a signal, a
// sanitizer report, any other exception, a leak or a hang (the replay's timeout) is a finding.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "constrain/grammar.h"
#include "sample/logits_state.h"
#include "specula/error.h"
#include "tokenizer/tokenizer.h"

namespace {
const specula::Tokenizer * g_tokenizer = nullptr;
constexpr int kSteps = 16;
}  // namespace

extern "C" int LLVMFuzzerInitialize(int *, char ***) {
    const char * model = std::getenv("SPECULA_FUZZ_HTTP_MODEL");
    if (!model) {
        std::fprintf(stderr, "fuzz_grammar: set SPECULA_FUZZ_HTTP_MODEL to the model whose vocabulary grammars compile over\n");
        std::exit(1);
    }
    g_tokenizer = new specula::Tokenizer(model);
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t * data, size_t size) {
    const std::string text(reinterpret_cast<const char *>(data), size);
    try {
        const std::string gbnf = !text.empty() && text[0] == '{' ? specula::json_schema_to_gbnf(text) : text;
        std::unique_ptr<specula::LogitsState> state = specula::make_grammar_state(*g_tokenizer, gbnf);
        for (int step = 0; step < kSteps; ++step) {
            int32_t next = -1;
            for (int32_t t = 0; t < g_tokenizer->n_vocab() && next < 0; ++t) {
                if (state->allows(t)) next = t;
            }
            if (next < 0) break;
            state->accept(next);
        }
    } catch (const specula::Error &) {
    }
    return 0;
}
