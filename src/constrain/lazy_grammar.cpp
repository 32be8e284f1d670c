#include "constrain/lazy_grammar.h"

#include <llama.h>

#include <algorithm>
#include <cmath>
#include <exception>
#include <regex>

#include "constrain/grammar.h"
#include "specula/error.h"
#include "tokenizer/tokenizer.h"

namespace specula {

namespace {

struct SamplerFree {
    void operator()(llama_sampler * s) const { llama_sampler_free(s); }
};
using SamplerPtr = std::unique_ptr<llama_sampler, SamplerFree>;

// The sampler's apply leaves a row alone while it awaits its trigger and masks it after; its
// accept buffers the text until a trigger matches, then feeds the grammar from the match on.
class LazyGrammarState final : public LogitsState {
public:
    LazyGrammarState(SamplerPtr sampler, int n_tokens) : sampler_(std::move(sampler)), n_tokens_(n_tokens) {}
    std::unique_ptr<LogitsState> clone() const override {
        auto copy = std::make_unique<LazyGrammarState>(SamplerPtr(llama_sampler_clone(sampler_.get())), n_tokens_);
        copy->broken_ = broken_;
        return copy;
    }

    void apply_values(std::span<float>) const override {}  // a grammar only bans

    void apply_bans(std::span<float> logits) const override {
        if (!broken_.empty()) throw Error(broken_);
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
        if (!any) throw Error("the grammar allows no token here");
    }

    bool allows(int32_t token) const override {
        if (token < 0 || token >= n_tokens_ || !broken_.empty()) return false;
        llama_token_data one{token, 0.0f, 0.0f};
        llama_token_data_array array{&one, 1, -1, false};
        llama_sampler_apply(sampler_.get(), &array);
        return one.logit != -INFINITY;
    }

    // Free text before the trigger may not follow the grammar from the trigger's match on. Plain
    // decoding fails there; a drafted path the target may still reject must not fail the request,
    // so the failure waits until that path's row is asked for (and then is plain decoding's).
    void accept(int32_t token) override {
        if (!broken_.empty()) return;
        try {
            llama_sampler_accept(sampler_.get(), token);
        } catch (const std::exception & e) {
            broken_ = "token " + std::to_string(token) + " does not follow the grammar: " + e.what();
        }
    }

private:
    SamplerPtr sampler_;
    int n_tokens_;
    std::string broken_;                                // why the grammar cannot go on; empty: it can
    mutable std::vector<llama_token_data> candidates_;  // apply_bans()'s scratch
};

}  // namespace

std::unique_ptr<LogitsState> make_lazy_grammar_state(const Tokenizer & tokenizer, const std::string & gbnf, const std::vector<std::string> & trigger_patterns,
                                                     const std::vector<int32_t> & trigger_tokens) {
    if (trigger_patterns.empty() && trigger_tokens.empty()) throw Error("a lazy grammar needs a trigger pattern or token");
    make_grammar_state(tokenizer, gbnf);  // throws naming why the GBNF does not parse
    for (const std::string & pattern : trigger_patterns) {
        try {
            std::regex{pattern};
        } catch (const std::regex_error & e) {
            throw Error("the grammar's trigger pattern \"" + pattern + "\" does not parse as a regex: " + e.what());
        }
    }
    for (int32_t token : trigger_tokens) {
        if (token < 0 || token >= tokenizer.n_vocab()) throw Error("the grammar's trigger token " + std::to_string(token) + " is not in the vocabulary");
    }
    std::vector<const char *> patterns;
    for (const std::string & p : trigger_patterns) patterns.push_back(p.c_str());
    SamplerPtr sampler(llama_sampler_init_grammar_lazy_patterns(tokenizer.vocabulary(), gbnf.c_str(), "root", patterns.data(), patterns.size(),
                                                                trigger_tokens.data(), trigger_tokens.size()));
    if (!sampler) throw Error("the lazy grammar cannot be made");
    return std::make_unique<LazyGrammarState>(std::move(sampler), tokenizer.n_vocab());
}

}  // namespace specula
