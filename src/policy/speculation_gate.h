#pragma once
// Whether a server step lets its sequences draft at all, chosen by what each choice has measured at
// this load. Inside a drafting step the per-round policies still size every draft from their cost
// model; the gate is the check on that model where it is weakest: a step shared by many sequences,
// whose extra rows, drafter levels and catch-up the model prices from one sequence's curve and a
// line through past steps. On a CPU a busy step's rows cost nearly what a token does (SmolLM2-135M,
// 8 sequences: ~0.7 ms a row in a ~7 ms step of 8 tokens), and drafts the model priced as paying
// left the server 13-22% below plain decoding at 4-16 clients; on a device where rows are cheap the
// same drafts pay, and the gate keeps them.
//
// A lone sequence is left to its policies: its step is the one-sequence verify curve they price
// drafts with, and its drafting rate swings with the text (16-step windows of one chat reply
// measured 0.50 to 0.77 tokens per ms against plain's steady 0.54), so windows compared one after
// another took a hard passage for a slow arm: gated, a lone EAGLE-3 client ran at 1.01x plain,
// ungated at 1.38x.
// Steps run in windows of `window_steps`; a window either allows drafting or not, decided at its
// start for the load then (sequences decoding, bucketed by powers of two: 2, 3-4, 5-8, ...).
// Each window's steps after the first kSettle (the switch's transient: an EAGLE head catching up on
// the tokens it skipped) that carry no prompt chunk add their emitted tokens and wall time to that
// arm at the step's load.
// Each arm is tried kMinWindows windows at a load before the faster one is kept, drafting only when
// it measured more than kDraftingMargin faster: what the decode steps do not show costs drafting
// too (sequences fall out of the lock-step plain decoding keeps, so prompts prefill in more, smaller
// steps; measured with SmolLM2 at 4 clients: drafting steps as fast as plain ones, the server 6%
// slower). The other arm is tried again every kExploreClose-th window at that load while the two
// rates are within kClose of each other, every kExploreFar-th otherwise, so a change in the traffic
// (code that drafts well, chat that does not) is noticed; each look that leaves the choice as it
// was doubles that period (up to 2^kMaxBackoff times), a change of choice resets it: in steady
// traffic the looks cost less and less.
#include <array>
#include <vector>

namespace specula {

class SpeculationGate {
public:
    explicit SpeculationGate(int window_steps = 16);

    // At the start of a step with `decoding` sequences past their prompt: may they draft? (Always
    // when there is one: such steps are neither gated nor measured.)
    bool allow(int decoding);
    // The step that followed allow(): its tokens and wall time (drafting, forward, verification).
    // A step that carried prompt chunks counts toward the window but is not measured: its time is
    // the prompts' more than the drafts', and prompts arrive in waves that would land in one arm.
    void observe(int decoding, int tokens, double ms, bool verify_only = true);

    // Measured tokens per ms of the arm at a load (0 until observed), for /metrics and tests.
    double rate(int decoding, bool drafting) const;
    static int load_bucket(int decoding);

    static constexpr int kSettle = 2;
    static constexpr int kMinWindows = 2;
    static constexpr int kExploreClose = 16, kExploreFar = 32;
    static constexpr double kClose = 0.15, kDraftingMargin = 0.05;
    static constexpr int kMaxBackoff = 3;

private:
    struct Arm {
        double tokens = 0.0, ms = 0.0;  // decayed sums
        int steps = 0;                  // observed steps (not decayed)
    };
    struct Load {
        std::array<Arm, 2> arm;  // [0] no drafting, [1] drafting
        int windows_since_explore = 0;
        bool best = true;  // the arm chosen at the last decision
        int backoff = 0;   // exploration period doubled this many times
    };
    Load & load(int decoding);
    bool choose(Load & l);

    int window_steps_;
    int left_ = 0;         // steps left in the current window
    int step_in_window_ = 0;
    bool drafting_ = true;
    std::vector<Load> loads_;
};

}  // namespace specula
