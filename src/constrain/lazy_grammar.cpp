#include "constrain/lazy_grammar.h"

#include <llama.h>

#include <algorithm>
#include <cmath>
#include <exception>
#include <optional>
#include <regex>
#include <span>

#include "constrain/grammar.h"
#include "constrain/grammar_guard.h"
#include "llama-grammar.h"
#include "llama-vocab.h"
#include "specula/error.h"
#include "tokenizer/tokenizer.h"

namespace specula {

namespace {

// A trigger pattern as the awaiting state searches for it. libllama's lazy sampler runs std::regex
// over all the text since the reply began on every token: the square of the reply's length, and
// libstdc++'s recursive regex can overflow the stack on a long text. Here a plain word (a pattern
// that escapes every special character, as the chat layer makes of a trigger word) is found with
// std::string::find in the new text and the word's length before it; another pattern is searched
// in the last kRegexWindow bytes before the new text and the new text; one anchored at the text's
// start ('^') is tried while the whole text is within kRegexWindow. A match longer than the window
// is the only one libllama would find that this does not.
struct Trigger {
    static constexpr size_t kRegexWindow = 1024;

    std::string pattern;
    std::optional<std::string> word;         // the pattern is this text, its special characters escaped
    std::regex regex;                        // when it is not
    bool anchored = false;                   // begins with '^': matched from the text's start
    bool whole = false;                      // ...and ends with '$': the whole text must match (as libllama)
    llama_grammar_trigger_pattern libllama;  // libllama's search, which places the grammar's start in the replayed text

    explicit Trigger(const std::string & p) : pattern(p), word(plain_word(p)), libllama{p, std::regex(p)} {
        if (word) return;
        regex = libllama.regex;
        anchored = !p.empty() && p.front() == '^';
        whole = anchored && p.back() == '$';
    }

    // Where the first match in `text` starts, searched from `from` on for a plain word or an
    // unanchored pattern; npos when none. `text` begins at the text's start when `anchored`.
    size_t find(const std::string & text, size_t from) const {
        if (word) return text.find(*word, from);
        std::smatch m;
        const bool found = whole ? std::regex_match(text.begin() + from, text.end(), m, regex)
                                 : std::regex_search(text.begin() + from, text.end(), m, regex);
        return found ? from + static_cast<size_t>(m.position(0)) : std::string::npos;
    }

    static std::optional<std::string> plain_word(const std::string & p) {
        static const std::string special = ".^$|()*+?[]{}\\";
        std::string out;
        for (size_t i = 0; i < p.size(); ++i) {
            if (p[i] == '\\' && i + 1 < p.size() && special.find(p[i + 1]) != std::string::npos) out += p[++i];
            else if (special.find(p[i]) == std::string::npos) out += p[i];
            else return std::nullopt;
        }
        return out.empty() ? std::nullopt : std::optional<std::string>(out);
    }
};

struct Triggers {
    const llama_vocab * vocab;
    std::unique_ptr<LogitsState> start;  // the grammar at its start (make_grammar_state), cloned at each trigger
    std::vector<Trigger> patterns;
    std::vector<int32_t> tokens;
    size_t keep = 0;  // bytes before the new text that a search may need
};

// The grammar from the trigger on, as libllama's lazy grammar makes it: given `token` (a trigger
// token), or the `replay` tokens from the one where `pattern`'s match starts, it searches their
// text token by token and, once it matches, takes the text from the match's start (the rest of
// the token it starts in), then each later token whole. Each under the grammar state's limits.
std::unique_ptr<LogitsState> triggered(const Triggers & t, const Trigger * pattern, std::span<const int32_t> replay) {
    std::unique_ptr<LogitsState> grammar = t.start->clone();
    if (!pattern) {
        accept_grammar_text(*grammar, replay[0], t.vocab->token_to_piece(replay[0]));
        return grammar;
    }
    std::string text;
    std::vector<size_t> starts;  // each replayed token's first byte in `text`
    size_t k = 0, at = std::string::npos;
    for (; k < replay.size() && at == std::string::npos; ++k) {
        starts.push_back(text.size());
        text += t.vocab->token_to_piece(replay[k]);
        at = pattern->libllama.find(text);
    }
    if (at == std::string::npos) throw Error("the grammar's trigger pattern \"" + pattern->pattern + "\" does not match again from the token its match starts in");
    for (size_t i = 0; i < k; ++i) {
        const size_t end = i + 1 < k ? starts[i + 1] : text.size();
        if (end <= at) continue;
        const size_t from = std::max(starts[i], at);
        accept_grammar_text(*grammar, replay[i], text.substr(from, end - from));
    }
    for (; k < replay.size(); ++k) grammar->accept(replay[k]);
    return grammar;
}

// Free until a trigger (a pattern found in the output's text, or a trigger token), then a grammar
// state (make_grammar_state: byte-checked accept, stacks limit, budgeted mask) from the trigger on. Awaiting, it keeps the text's tail a search needs
// and the tokens that spelled it.
class LazyGrammarState final : public LogitsState {
public:
    LazyGrammarState(std::shared_ptr<const Triggers> triggers, int n_tokens) : triggers_(std::move(triggers)), n_tokens_(n_tokens) {}
    std::unique_ptr<LogitsState> clone() const override {
        auto copy = std::make_unique<LazyGrammarState>(triggers_, n_tokens_);
        if (grammar_) copy->grammar_ = grammar_->clone();
        copy->tail_ = tail_;
        copy->tail_tokens_ = tail_tokens_;
        copy->tail_starts_ = tail_starts_;
        copy->tail_at_ = tail_at_;
        copy->broken_ = broken_;
        return copy;
    }

    void apply_values(std::span<float>) const override {}  // a grammar only bans

    void apply_bans(std::span<float> logits) const override {
        if (!broken_.empty()) throw GrammarError(broken_);
        if (grammar_) grammar_->apply_bans(logits);  // else awaiting its trigger: free
    }

    bool allows(int32_t token) const override {
        if (token < 0 || token >= n_tokens_ || !broken_.empty()) return false;
        return !grammar_ || grammar_->allows(token);
    }

    // Free text before the trigger may not follow the grammar from the trigger's match on. Plain
    // decoding fails there; a drafted path the target may still reject must not fail the request,
    // so the failure waits until that path's row is asked for (and then is plain decoding's).
    void accept(int32_t token) override {
        if (!broken_.empty()) return;
        try {
            if (grammar_) grammar_->accept(token);
            else await(token);
        } catch (const Error & e) {
            broken_ = e.what();
        } catch (const std::exception & e) {
            broken_ = "token " + std::to_string(token) + " does not follow the grammar: " + e.what();
        }
    }

private:
    void await(int32_t token) {
        const Triggers & t = *triggers_;
        if (std::find(t.tokens.begin(), t.tokens.end(), token) != t.tokens.end()) {
            grammar_ = triggered(t, nullptr, std::span(&token, 1));
            return;
        }
        char buf[256];
        int32_t n = llama_token_to_piece(t.vocab, token, buf, sizeof buf, 0, /*special=*/true);  // as libllama's buffer spells it
        std::string big;
        if (n < 0) {
            big.resize(-n);
            n = llama_token_to_piece(t.vocab, token, big.data(), static_cast<int32_t>(big.size()), 0, true);
        }
        const size_t before = tail_.size();
        tail_tokens_.push_back(token);
        tail_starts_.push_back(before);
        tail_.append(big.empty() ? buf : big.data(), std::max(n, 0));
        const bool whole_text = tail_at_ == 0 && tail_.size() <= Trigger::kRegexWindow;
        for (const Trigger & trigger : t.patterns) {
            if (trigger.anchored && !whole_text) continue;
            const size_t reach = trigger.word ? trigger.word->size() - 1 : Trigger::kRegexWindow;
            const size_t at = trigger.find(tail_, trigger.anchored ? 0 : before - std::min(before, reach));
            if (at == std::string::npos) continue;
            // From the token the match starts in: libllama finds it there again, and replays it.
            const size_t first = static_cast<size_t>(std::upper_bound(tail_starts_.begin(), tail_starts_.end(), at) - tail_starts_.begin()) - 1;
            const std::vector<int32_t> replay(tail_tokens_.begin() + (trigger.anchored ? 0 : first), tail_tokens_.end());
            grammar_ = triggered(t, &trigger, replay);
            tail_.clear(), tail_tokens_.clear(), tail_starts_.clear();
            return;
        }
        // The tokens whose text no later search reaches go; an anchored pattern needs the whole
        // text while it fits the window.
        size_t drop = 0;
        const size_t keep = whole_text ? Trigger::kRegexWindow : t.keep;
        while (drop + 1 < tail_starts_.size() && tail_.size() - tail_starts_[drop + 1] >= keep) ++drop;
        if (drop == 0) return;
        const size_t cut = tail_starts_[drop];
        tail_.erase(0, cut);
        tail_tokens_.erase(tail_tokens_.begin(), tail_tokens_.begin() + drop);
        tail_starts_.erase(tail_starts_.begin(), tail_starts_.begin() + drop);
        for (size_t & start : tail_starts_) start -= cut;
        tail_at_ += cut;
    }

    std::shared_ptr<const Triggers> triggers_;
    int n_tokens_;
    std::unique_ptr<LogitsState> grammar_;  // null while awaiting the trigger
    std::string tail_;                      // awaiting: the end of the text so far, from the start of tail_tokens_' first
    std::vector<int32_t> tail_tokens_;
    std::vector<size_t> tail_starts_;  // each tail token's first byte in tail_
    size_t tail_at_ = 0;               // bytes of the text before tail_
    std::string broken_;               // why the grammar cannot go on; empty: it can
};

}  // namespace

std::unique_ptr<LogitsState> make_lazy_grammar_state(const Tokenizer & tokenizer, const std::string & gbnf, const std::vector<std::string> & trigger_patterns,
                                                     const std::vector<int32_t> & trigger_tokens) {
    if (trigger_patterns.empty() && trigger_tokens.empty()) throw Error("a lazy grammar needs a trigger pattern or token");
    std::unique_ptr<LogitsState> start = make_grammar_state(tokenizer, gbnf);  // throws naming why the GBNF does not parse
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
    auto triggers = std::make_shared<Triggers>();
    triggers->vocab = tokenizer.vocabulary();
    triggers->start = std::move(start);
    triggers->tokens = trigger_tokens;
    for (const std::string & p : trigger_patterns) {
        const Trigger & t = triggers->patterns.emplace_back(p);
        triggers->keep = std::max(triggers->keep, t.word ? t.word->size() : Trigger::kRegexWindow + 1);
    }
    return std::make_unique<LazyGrammarState>(std::move(triggers), tokenizer.n_vocab());
}

}  // namespace specula
