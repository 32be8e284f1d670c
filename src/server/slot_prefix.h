#pragma once
// The server's prefix cache: a finished request's slot keeps its KV stream, its drafter's state
// and the tokens they hold, and the next request goes to the free slot whose tokens share the
// longest prefix with its prompt. What is kept is exact for any later request: the target's own
// K/V rows of accepted tokens (never a rejected draft's, never a lossy SpecEE request's), and
// drafter state only for the drafter that built it (another drafter is reset).
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace specula {

class Drafter;
class KvCache;

struct SlotPrefix {
    std::vector<int32_t> tokens;        // the stream's rows are the target's exact K/V of these tokens
    const Drafter * drafter = nullptr;  // the drafter whose state was built from them (nullptr: none)
    uint64_t last_used = 0;             // when the slot last took a request (least recently used first)
    std::string scope;                  // whose rows they are: only a request of this scope reuses them (Tenancy::scope)
};

size_t common_prefix(std::span<const int32_t> a, std::span<const int32_t> b);
// The common prefix of kept tokens (a slot's, a stored entry's) and a prompt when it covers half
// the prompt or half the kept tokens, else 0: a few shared tokens (a BOS, a chat template's
// header) are no reason to overwrite a slot that holds another conversation.
size_t matched_prefix(std::span<const int32_t> kept, std::span<const int32_t> prompt);

// Of the free slots, the index of the one whose tokens share the longest prefix with `prompt`,
// counted when it covers half the prompt or half the slot's tokens (a shared BOS or template
// header leaves another conversation's slot alone) and the slot's scope is `scope` (another
// tenant's rows are never reused); ties and no match: the least recently used. -1 when no slot is
// free.
int choose_slot(std::span<const SlotPrefix * const> prefixes, std::span<const char> free, std::span<const int32_t> prompt,
                const std::string & scope);

// Before a request of `prompt` starts on the slot with `drafter` (nullptr: none): cuts the cache
// to the common prefix, short of the prompt's last token (the first root), and resets the
// drafter unless its state is of these tokens. The Sequence then keeps what its drafter can.
void reuse_prefix(SlotPrefix & prefix, KvCache & cache, Drafter * drafter, std::span<const int32_t> prompt);

// After a request: `history` (prompt and reply) as far as its first n_exact tokens, whose exact
// K/V the cache holds (rows past them are cut), built by `drafter`.
void keep_prefix(SlotPrefix & prefix, KvCache & cache, std::span<const int32_t> history, int n_exact, const Drafter * drafter);

// A further choice of an n-choice request: takes the first choice's prefilled prompt, the rows of
// `first_cache` and the state of `first_drafter` (both of the same groups as the slot's), so that
// reuse_prefix() then keeps them. Without drafters (nullptr) only the rows.
void share_prompt(SlotPrefix & prefix, KvCache & cache, Drafter * drafter, const KvCache & first_cache, const Drafter * first_drafter,
                  std::span<const int32_t> prompt);

// Nothing reusable: the cache emptied (a lossy SpecEE request's rows, a failed step's).
void forget_prefix(SlotPrefix & prefix, KvCache & cache);

}  // namespace specula
