#include "constrain/grammar.h"

#include <llama.h>

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <mutex>
#include <limits>
#include <stdexcept>
#include <vector>

#include "json-schema-to-grammar.h"
#include "runtime/library_log.h"
#include "specula/error.h"
#include "tokenizer/tokenizer.h"

namespace specula {

namespace {

struct SamplerFree {
    void operator()(llama_sampler * s) const { llama_sampler_free(s); }
};
using SamplerPtr = std::unique_ptr<llama_sampler, SamplerFree>;

// libllama's grammar sampler: its apply masks a candidate array, its accept advances the stacks.
class GrammarState final : public LogitsState {
public:
    GrammarState(SamplerPtr sampler, int n_tokens) : sampler_(std::move(sampler)), n_tokens_(n_tokens) {}
    std::unique_ptr<LogitsState> clone() const override {
        return std::make_unique<GrammarState>(SamplerPtr(llama_sampler_clone(sampler_.get())), n_tokens_);
    }

    void apply_values(std::span<float>) const override {}  // a grammar only bans

    void apply_bans(std::span<float> logits) const override {
        const int n = std::min<int>(n_tokens_, static_cast<int>(logits.size()));
        candidates_.resize(n);
        for (int i = 0; i < n; ++i) candidates_[i] = llama_token_data{i, logits[i], 0.0f};
        llama_token_data_array array{candidates_.data(), candidates_.size(), -1, false};
        llama_sampler_apply(sampler_.get(), &array);
        bool any = false;
        for (int i = 0; i < n; ++i) {
            logits[i] = candidates_[i].logit;
            any = any || logits[i] != -INFINITY;
        }
        for (size_t i = n; i < logits.size(); ++i) logits[i] = -INFINITY;
        if (!any) throw Error("the grammar allows no token of the vocabulary here (nor the end of generation)");
    }

    bool allows(int32_t token) const override {
        if (token < 0 || token >= n_tokens_) return false;
        llama_token_data one{token, 0.0f, 0.0f};
        llama_token_data_array array{&one, 1, -1, false};
        llama_sampler_apply(sampler_.get(), &array);
        return one.logit != -INFINITY;
    }

    void accept(int32_t token) override {
        try {
            llama_sampler_accept(sampler_.get(), token);
        } catch (const std::exception & e) {
            throw Error(std::string("token ") + std::to_string(token) + " does not follow the grammar: " + e.what());
        }
    }

private:
    SamplerPtr sampler_;
    int n_tokens_;
    mutable std::vector<llama_token_data> candidates_;  // apply()'s scratch
};

// libllama's GBNF parser prints why a grammar does not parse on stderr, not to its log: the
// reason belongs in the Error (and the CLI's stderr holds its one error line alone). Its output
// during the parse goes to a temporary file instead; returns the parser's reason, if it gave one.
std::string parse_errors_of(const std::function<void()> & parse) {
    static std::mutex redirecting;
    const std::lock_guard lock(redirecting);
    FILE * sink = std::tmpfile();
    if (!sink) {
        parse();
        return {};
    }
    std::fflush(stderr);
    const int saved = dup(STDERR_FILENO);
    dup2(fileno(sink), STDERR_FILENO);
    parse();
    std::fflush(stderr);
    dup2(saved, STDERR_FILENO);
    close(saved);
    std::string text;
    std::rewind(sink);
    for (int c; (c = std::fgetc(sink)) != EOF;) text.push_back(static_cast<char>(c));
    std::fclose(sink);
    const std::string marker = "error parsing grammar: ";
    const size_t at = text.find(marker);
    if (at == std::string::npos) return {};
    const size_t from = at + marker.size();
    return text.substr(from, text.find('\n', from) - from);
}

}  // namespace

std::unique_ptr<LogitsState> make_grammar_state(const Tokenizer & tokenizer, const std::string & gbnf) {
    capture_library_log();
    take_library_errors();
    SamplerPtr sampler;
    const std::string reason = parse_errors_of([&] { sampler.reset(llama_sampler_init_grammar(tokenizer.vocabulary(), gbnf.c_str(), "root")); });
    const std::string logged = take_library_errors();
    if (!sampler) {
        const std::string why = !reason.empty() ? reason : logged;
        throw Error("the grammar does not parse as GBNF" + (why.empty() ? std::string() : ": " + why));
    }
    return std::make_unique<GrammarState>(std::move(sampler), tokenizer.n_vocab());
}

std::string json_schema_to_gbnf(const std::string & schema_json) {
    try {
        return json_schema_to_grammar(common_json::parse(schema_json), /*force_gbnf=*/true);
    } catch (const std::exception & e) {
        throw Error(std::string("the JSON schema cannot be compiled to a grammar: ") + e.what());
    }
}

std::unique_ptr<LogitsState> make_logits_state(const SamplingParams & params, const std::string & gbnf, std::span<const int32_t> history,
                                               const Tokenizer * tokenizer) {
    std::vector<std::unique_ptr<LogitsState>> states;
    const int n_vocab = tokenizer ? tokenizer->n_vocab() : std::numeric_limits<int>::max();
    if (auto penalties = make_penalty_state(params, history, n_vocab)) states.push_back(std::move(penalties));
    if (!gbnf.empty()) {
        if (!tokenizer) throw Error("a grammar needs the model's vocabulary: this generation has no tokenizer");
        states.push_back(make_grammar_state(*tokenizer, gbnf));
    }
    if (states.empty()) return nullptr;
    if (states.size() == 1) return std::move(states.front());
    return std::make_unique<LogitsStates>(std::move(states));
}

}  // namespace specula
