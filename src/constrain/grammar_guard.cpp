#include "constrain/grammar_guard.h"

#include <algorithm>
#include <deque>
#include <string>
#include <vector>

#include "llama-grammar.h"
#include "specula/error.h"

namespace specula {

namespace {

[[noreturn]] void exceeds(const std::string & what) { throw GrammarError("the grammar exceeds a limit: " + what); }

size_t saturating_add(size_t a, size_t b, size_t cap) { return std::min(cap, std::min(a, cap) + std::min(b, cap)); }
size_t saturating_mul(size_t a, size_t b, size_t cap) { return a != 0 && b > cap / a ? cap : std::min(cap, a * b); }

// libllama's name characters (no underscore).
bool name_char(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-'; }
bool digit(char c) { return c >= '0' && c <= '9'; }

// What an item of a sequence costs once expanded: symbols as the grammar's author counts them (a
// character class is one), elements as libllama stores them (a class is one per character).
struct Size {
    size_t symbols = 0;
    size_t elements = 0;
};

}  // namespace

void check_gbnf_limits(std::string_view g) {
    if (g.size() > kMaxGrammarBytes) exceeds("larger than " + std::to_string(kMaxGrammarBytes / 1024) + " KiB");
    constexpr size_t kCap = size_t{1} << 40;
    // One level per open group: its size so far and its last item's, which a repetition copies.
    struct Level {
        Size total, last;
    };
    std::vector<Level> levels(1);
    size_t rules = 0, alternatives = 0, elements = 0;
    const auto item = [&](Size s) {
        levels.back().last = s;
        levels.back().total.symbols = saturating_add(levels.back().total.symbols, s.symbols, kCap);
        levels.back().total.elements = saturating_add(levels.back().total.elements, s.elements, kCap);
        elements = saturating_add(elements, s.elements, kCap);
        if (elements > kMaxGrammarSymbols) exceeds("more than " + std::to_string(kMaxGrammarSymbols) + " symbols");
    };
    const auto repeat = [&](size_t copies) {  // the last item `copies` times in all
        const Size last = levels.back().last;
        if (saturating_mul(last.symbols, copies, kCap) > kMaxRepetitionSymbols) {
            exceeds("a repetition expands to more than " + std::to_string(kMaxRepetitionSymbols) + " symbols");
        }
        if (copies <= 1) return;
        item({saturating_mul(last.symbols, copies - 1, kCap), saturating_mul(last.elements, copies - 1, kCap)});
        levels.back().last = {last.symbols * copies, saturating_mul(last.elements, copies, kCap)};
    };
    const auto number = [&](size_t & i) {  // digits at i, saturated; i past them
        size_t v = 0;
        for (; i < g.size() && digit(g[i]); ++i) v = std::min<size_t>(v * 10 + (g[i] - '0'), kCap);
        return v;
    };
    const auto skip_blanks = [&](size_t & i) {
        while (i < g.size() && (g[i] == ' ' || g[i] == '\t')) ++i;
    };
    // A literal's or class's body up to `close`, escapes skipped; its character count. Each
    // character spans the bytes libllama's parser reads for it: as many as its first byte's UTF-8
    // length says, whatever they are, so that a quote or bracket inside one ends nothing.
    const auto body = [&](size_t & i, char close) {
        static constexpr int kUtf8Length[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
        size_t n = 0;
        for (; i < g.size() && g[i] != close; ++n) {
            if (g[i] == '\\') {
                i += 2;
                continue;
            }
            const size_t end = i + kUtf8Length[static_cast<uint8_t>(g[i]) >> 4];
            for (++i; i < end && i < g.size() && g[i] != '\0'; ++i) {
            }
        }
        ++i;
        return n;
    };
    for (size_t i = 0; i < g.size();) {
        const char c = g[i];
        if (c == '#') {
            while (i < g.size() && g[i] != '\n' && g[i] != '\r') ++i;
        } else if (c == '"') {
            ++i;
            const size_t n = body(i, '"');
            item({n, n});
        } else if (c == '[') {
            ++i;
            item({1, std::max<size_t>(1, body(i, ']'))});
        } else if (c == '<' || c == '!') {  // a token, <[id]> or <text>
            while (i < g.size() && g[i] != '>') ++i;
            ++i;
            item({1, 1});
        } else if (name_char(c)) {
            while (i < g.size() && name_char(g[i])) ++i;
            size_t j = i;
            skip_blanks(j);
            if (g.substr(j, 3) == "::=") {  // a rule's definition: a new top level
                if (++rules > kMaxGrammarRules) exceeds("more than " + std::to_string(kMaxGrammarRules) + " rules");
                if (++alternatives > kMaxGrammarAlternatives) exceeds("more than " + std::to_string(kMaxGrammarAlternatives) + " alternatives");
                levels.assign(1, Level{});
                i = j + 3;
            } else {
                item({1, 1});
            }
        } else if (c == '(') {
            if (static_cast<int>(levels.size()) > kMaxGrammarNesting) exceeds("nesting deeper than " + std::to_string(kMaxGrammarNesting));
            if (++alternatives > kMaxGrammarAlternatives) exceeds("more than " + std::to_string(kMaxGrammarAlternatives) + " alternatives");
            levels.emplace_back();
            ++i;
        } else if (c == ')') {
            ++i;
            if (levels.size() == 1) continue;  // unbalanced: the parser's to refuse
            const Size group = levels.back().total;
            levels.pop_back();
            levels.back().last = group;
            levels.back().total.symbols = saturating_add(levels.back().total.symbols, group.symbols, kCap);
            levels.back().total.elements = saturating_add(levels.back().total.elements, group.elements, kCap);
        } else if (c == '|') {
            if (++alternatives > kMaxGrammarAlternatives) exceeds("more than " + std::to_string(kMaxGrammarAlternatives) + " alternatives");
            levels.back().last = {};
            ++i;
        } else if (c == '*' || c == '?') {
            repeat(1);
            ++i;
        } else if (c == '+') {
            repeat(2);
            ++i;
        } else if (c == '{') {
            ++i;
            skip_blanks(i);
            const size_t min = number(i);
            skip_blanks(i);
            size_t max = min;
            bool bounded = true;
            if (i < g.size() && g[i] == ',') {
                ++i;
                skip_blanks(i);
                bounded = i < g.size() && digit(g[i]);
                if (bounded) max = number(i);
            }
            if (bounded && min > max) {
                exceeds("repetition {" + std::to_string(min) + "," + std::to_string(max) + "} has its minimum above its maximum");
            }
            // libllama repeats a maximum above 2000 as no maximum: the minimum, then one more copy.
            constexpr size_t kLibllamaMaxRepetition = 2000;
            repeat(bounded && max <= kLibllamaMaxRepetition ? max : saturating_add(min, 1, kCap));
        } else if (c == '.') {
            item({1, 1});
            ++i;
        } else {
            ++i;
        }
    }
}

void check_gbnf_rules(const llama_grammar_parser & parser, size_t root) {
    const llama_grammar_rules & rules = parser.rules;
    const size_t n = rules.size();
    constexpr size_t kCap = size_t{1} << 40;
    const auto terminal = [](const llama_grammar_element & e) {
        return e.type == LLAMA_GRETYPE_CHAR || e.type == LLAMA_GRETYPE_CHAR_NOT || e.type == LLAMA_GRETYPE_CHAR_ANY || e.type == LLAMA_GRETYPE_TOKEN ||
               e.type == LLAMA_GRETYPE_TOKEN_NOT;
    };
    // Each rule's alternatives as element ranges.
    struct Alt {
        size_t rule, begin, end;
    };
    std::vector<Alt> alts;
    std::vector<std::vector<size_t>> alts_of(n);
    for (size_t r = 0; r < n; ++r) {
        size_t begin = 0;
        for (size_t i = 0; i < rules[r].size(); ++i) {
            if (rules[r][i].type != LLAMA_GRETYPE_END && rules[r][i].type != LLAMA_GRETYPE_ALT) continue;
            alts_of[r].push_back(alts.size());
            alts.push_back({r, begin, i});
            begin = i + 1;
            if (rules[r][i].type == LLAMA_GRETYPE_END) break;
        }
    }
    for (const auto & rule : rules) {
        for (const auto & e : rule) {
            if (e.type == LLAMA_GRETYPE_RULE_REF && e.value >= n) throw Error("the grammar does not parse as GBNF: a rule is referenced but not defined");
        }
    }

    // Which rules may match the empty text: an alternative of references only, all to such rules.
    std::vector<char> nullable(n, 0);
    std::vector<size_t> pending(alts.size(), 0);
    std::vector<std::vector<size_t>> users(n);  // the all-reference alternatives naming each rule
    std::deque<size_t> todo;
    for (size_t a = 0; a < alts.size(); ++a) {
        const auto & rule = rules[alts[a].rule];
        if (std::any_of(rule.begin() + alts[a].begin, rule.begin() + alts[a].end, terminal)) continue;
        for (size_t i = alts[a].begin; i < alts[a].end; ++i) {
            if (rule[i].type == LLAMA_GRETYPE_RULE_REF) ++pending[a], users[rule[i].value].push_back(a);
        }
        if (pending[a] == 0 && !nullable[alts[a].rule]) nullable[alts[a].rule] = 1, todo.push_back(alts[a].rule);
    }
    while (!todo.empty()) {
        const size_t x = todo.front();
        todo.pop_front();
        for (size_t a : users[x]) {
            if (--pending[a] == 0 && !nullable[alts[a].rule]) nullable[alts[a].rule] = 1, todo.push_back(alts[a].rule);
        }
    }

    const auto left_recursive = [&](size_t r) {
        std::string name = std::to_string(r);
        for (const auto & [symbol, id] : parser.symbol_ids) {
            if (id == r) name = symbol;
        }
        throw Error("the grammar is left-recursive: rule '" + name + "' can begin with itself");
    };
    const auto has_empty_alternative = [&](size_t r) {
        return std::any_of(alts_of[r].begin(), alts_of[r].end(), [&](size_t a) { return alts[a].begin == alts[a].end; });
    };

    // The rules each alternative can begin with, past rules that may be empty (`begins`), and
    // past rules with an empty alternative only (`direct`: the ones libllama's check follows).
    struct Edge {
        size_t to;
        bool last;  // the reference ends its alternative
    };
    std::vector<std::vector<Edge>> begins(n);
    std::vector<std::vector<size_t>> begun_by(n), direct(n), direct_by(n);
    for (const Alt & alt : alts) {
        bool followed = true;
        for (size_t i = alt.begin; i < alt.end; ++i) {
            const llama_grammar_element & e = rules[alt.rule][i];
            if (e.type != LLAMA_GRETYPE_RULE_REF) break;
            begins[alt.rule].push_back({e.value, i + 1 == alt.end});
            begun_by[e.value].push_back(alt.rule);
            if (followed) direct[alt.rule].push_back(e.value), direct_by[e.value].push_back(alt.rule);
            followed = followed && has_empty_alternative(e.value);
            if (!nullable[e.value]) break;
        }
    }

    // libllama refuses a cycle of `direct` itself, but only after walking, from every rule, each
    // of its leftmost paths without remembering what it walked. Sorted (Kahn), its steps are
    // counted from the last rule back.
    std::vector<size_t> indegree(n, 0), order;
    for (size_t r = 0; r < n; ++r) {
        for (size_t x : direct[r]) ++indegree[x];
    }
    for (size_t r = 0; r < n; ++r) {
        if (indegree[r] == 0) order.push_back(r);
    }
    for (size_t k = 0; k < order.size(); ++k) {
        for (size_t x : direct[order[k]]) {
            if (--indegree[x] == 0) order.push_back(x);
        }
    }
    if (order.size() < n) {
        // A rule left over is on a cycle or after one; walking back through rules left over reaches a cycle.
        size_t r = std::find_if(indegree.begin(), indegree.end(), [](size_t d) { return d > 0; }) - indegree.begin();
        std::vector<char> seen(n, 0);
        while (!seen[r]) {
            seen[r] = 1;
            r = *std::find_if(direct_by[r].begin(), direct_by[r].end(), [&](size_t p) { return indegree[p] > 0; });
        }
        left_recursive(r);
    }
    std::vector<size_t> steps(n, 0);
    size_t total_steps = 0;
    for (size_t k = n; k-- > 0;) {
        const size_t r = order[k];
        size_t s = rules[r].size();
        for (size_t x : direct[r]) s = saturating_add(s, steps[x], kCap);
        steps[r] = s;
        total_steps = saturating_add(total_steps, s, kCap);
    }
    if (total_steps > kMaxLeftRecursionCheck) exceeds("rules that branch into more than " + std::to_string(kMaxLeftRecursionCheck) + " leftmost paths");

    // The cycles of `begins` (its strongly connected components, Kosaraju's, iterative; numbered
    // sources first). A rule reached again with more of its alternative after it pushes that rest
    // each time: libllama's stacks grow without end. Reached again as an alternative's last element,
    // it only repeats a stack libllama has, which it drops.
    std::vector<size_t> finished;
    std::vector<char> visited(n, 0);
    std::vector<std::pair<size_t, size_t>> walk;  // (rule, its next edge)
    for (size_t start = 0; start < n; ++start) {
        if (visited[start]) continue;
        visited[start] = 1;
        walk.push_back({start, 0});
        while (!walk.empty()) {
            const size_t v = walk.back().first;
            if (walk.back().second < begins[v].size()) {
                const size_t w = begins[v][walk.back().second++].to;
                if (!visited[w]) visited[w] = 1, walk.push_back({w, 0});
            } else {
                finished.push_back(v);
                walk.pop_back();
            }
        }
    }
    constexpr size_t kNone = static_cast<size_t>(-1);
    std::vector<size_t> component(n, kNone);
    std::vector<std::vector<size_t>> members;
    for (size_t k = n; k-- > 0;) {
        if (component[finished[k]] != kNone) continue;
        const size_t c = members.size();
        members.emplace_back();
        std::vector<size_t> todo_c{finished[k]};
        component[finished[k]] = c;
        while (!todo_c.empty()) {
            const size_t v = todo_c.back();
            todo_c.pop_back();
            members[c].push_back(v);
            for (size_t p : begun_by[v]) {
                if (component[p] == kNone) component[p] = c, todo_c.push_back(p);
            }
        }
    }
    for (size_t r = 0; r < n; ++r) {
        for (const Edge & e : begins[r]) {
            if (component[e.to] == component[r] && !e.last) left_recursive(r);
        }
    }

    // The parse stacks a rule opens, at most: one per way to its first character (or its end),
    // a cycle's rules together (each opens what any of them does). Counted sinks first.
    std::vector<size_t> opens(n, 0);
    for (size_t c = members.size(); c-- > 0;) {
        size_t stacks = 0;
        for (size_t m : members[c]) {
            for (size_t a : alts_of[m]) {
                size_t i = alts[a].begin;
                for (; i < alts[a].end; ++i) {
                    const llama_grammar_element & e = rules[m][i];
                    if (e.type != LLAMA_GRETYPE_RULE_REF || component[e.value] == c) break;
                    stacks = saturating_add(stacks, opens[e.value], kCap);
                    if (!nullable[e.value]) break;
                }
                const bool reached_end = i == alts[a].end;
                const bool at_character = i < alts[a].end && rules[m][i].type != LLAMA_GRETYPE_RULE_REF;
                if (reached_end || at_character) stacks = saturating_add(stacks, 1, kCap);
            }
        }
        for (size_t m : members[c]) opens[m] = stacks;
    }
    if (root < n && opens[root] > kMaxGrammarStacks) exceeds("more than " + std::to_string(kMaxGrammarStacks) + " parse stacks at its start");
    // After a character, the rest of its alternative opens the stacks (counted from its end back).
    for (const Alt & alt : alts) {
        size_t stacks = 1;
        for (size_t i = alt.end; i-- > alt.begin;) {
            const llama_grammar_element & e = rules[alt.rule][i];
            stacks = e.type != LLAMA_GRETYPE_RULE_REF ? 1 : saturating_add(opens[e.value], nullable[e.value] ? stacks : 0, kCap);
            if (stacks > kMaxGrammarStacks) exceeds("more than " + std::to_string(kMaxGrammarStacks) + " parse stacks after one character");
        }
    }
}

void too_many_stacks() {
    exceeds("more than " + std::to_string(kMaxGrammarStacks) +
            " parse stacks at once (one per way the text so far parses: an ambiguous rule such as x ::= \"a\" x \"b\" | \"a\" x \"c\" "
            "doubles them at each level of nesting; factor the alternatives' common beginning out: x ::= \"a\" x (\"b\" | \"c\"))");
}

void check_json_schema_limits(const nlohmann::json & schema) {
    size_t nodes = 0, refs = 0;
    std::vector<const nlohmann::json *> todo{&schema};
    while (!todo.empty()) {
        const nlohmann::json & v = *todo.back();
        todo.pop_back();
        if (++nodes > kMaxSchemaNodes) throw Error("the JSON schema exceeds a limit: more than " + std::to_string(kMaxSchemaNodes) + " values");
        if (v.is_object() && v.contains("$ref") && ++refs > kMaxSchemaRefs) {
            throw Error("the JSON schema exceeds a limit: more than " + std::to_string(kMaxSchemaRefs) + " \"$ref\"s");
        }
        // llama.cpp's converter spells an object's optional properties as every run of them,
        // copying the rest of the list at each: its time and memory grow with their square.
        if (v.is_object() && v.contains("properties") && v.at("properties").is_object()) {
            size_t optional = v.at("properties").size();
            if (v.contains("required") && v.at("required").is_array()) {
                for (const auto & name : v.at("required")) optional -= name.is_string() && v.at("properties").contains(name.get<std::string>()) && optional > 0;
            }
            if (optional > kMaxSchemaOptionalProperties) {
                throw Error("the JSON schema exceeds a limit: an object with more than " + std::to_string(kMaxSchemaOptionalProperties) + " optional properties");
            }
        }
        if (v.is_structured()) {
            for (const auto & child : v) todo.push_back(&child);
        }
    }
}

}  // namespace specula
