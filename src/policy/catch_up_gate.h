#pragma once
// Whether a request's model drafter reads its prompt at all. A draft model reads every prompt
// token its cache lacks before its first draft (the catch-up, round_policy.h); on a long prompt
// with a short reply (an editor's /infill: a thousand tokens in, a line out) that pass costs more
// than drafting can save in the reply, and a draft model makes the request slower than plain.
// The gate prices the pass once per request, at its first decoding round:
//   cost    lag x the measured catch-up ms per token (earlier catch-ups of >= kMinTimedLag tokens);
//   saving  expected reply tokens x (ms per token without the model - ms per token with it),
//           both measured over earlier requests' replies after the catch-up; until a request ran
//           without the model, its ms per token is the one-row forward of the verify-cost curve;
//   reply   min(tokens the request may still emit, the decayed mean of earlier replies).
// A request whose cost exceeds its saving runs without the model: its rounds verify the free
// draft (prompt lookup) or the root alone. Until the catch-up and a drafting request are measured
// every request drafts. Of the requests the gate would keep out, one in kExploreEvery drafts anyway,
// so that a text turning predictable (or a reply growing) is noticed; each such look that leaves
// the next request kept out doubles that period (up to kExploreEvery x 2^kMaxBackoff), and a
// request the price lets in resets it.
// The terms (round, catch-up, free draft, ...) are those defined at the top of policy/round_policy.h.

namespace specula {

class CatchUpGate {
public:
    // plain_ms: the target's one-row forward (the verify-cost curve's first point).
    explicit CatchUpGate(double plain_ms);

    // A request's first decoding round: may its model drafter catch up on `lag` tokens, with at
    // most `tokens_left` tokens still to emit? A lag below kMinTimedLag is always allowed.
    bool allow(int lag, int tokens_left);
    // The first drafting round of a request that was allowed: its lag and the drafter's time.
    void observe_catch_up(int lag, double draft_ms);
    // A finished request: its reply tokens, and its generation time after the catch-up (a
    // drafting request's first drafting round left out). drafted: it ran with its model drafter.
    void observe_reply(int tokens, double ms, bool drafted);

    // For observers and tests: the measured rates (0 until measured).
    double catch_up_ms_per_token() const { return catch_up_ms_per_token_; }
    double ms_per_token(bool drafted) const { return arm_[drafted].tokens > 0.0 ? arm_[drafted].ms / arm_[drafted].tokens : 0.0; }
    double mean_reply() const { return replies_ > 0.0 ? reply_tokens_ / replies_ : 0.0; }

    static constexpr int kMinTimedLag = 64;
    static constexpr int kExploreEvery = 8;
    static constexpr int kMaxBackoff = 3;
    static constexpr double kKeep = 0.8;  // weight of what was measured before, per observation

private:
    struct Arm {
        double tokens = 0.0, ms = 0.0;  // decayed sums
    };
    double plain_ms_;
    double catch_up_ms_per_token_ = 0.0;
    Arm arm_[2];  // [0] without the model drafter, [1] with it
    double reply_tokens_ = 0.0, replies_ = 0.0;
    int kept_out_ = 0;       // requests kept out since one drafted
    int backoff_ = 0;        // the exploration period doubled this many times
    bool explored_ = false;  // the last request was let in to look again
};

}  // namespace specula
