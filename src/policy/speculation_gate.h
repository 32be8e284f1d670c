#pragma once
// Whether a server step lets its sequences draft at all, chosen by what each choice has measured at
// this load. Inside a drafting step the per-round policies still size every draft; the gate checks
// their cost model where it is weakest: a step shared by many sequences, whose extra rows the model
// prices from one sequence's curve. On a CPU a busy step's rows cost nearly what a token does, so
// drafts priced as paying can lose; where rows are cheap the same drafts pay, and the gate keeps
// them. A lone sequence is left to its policies: its drafting rate swings with the text too much
// for windows compared one after another. The rules and their reasons: docs/server.md.
//
// Steps run in windows of `window_steps`; a window either allows drafting or not, decided at its
// start for the load then (sequences decoding, bucketed by powers of two: 2, 3-4, 5-8, ...). Each
// window's steps after the first kSettle (an EAGLE head catching up) that carry no prompt chunk add
// their tokens and wall time to that arm at the step's load. After kMinWindows windows of each arm
// the faster is kept, drafting only when more than kDraftingMargin faster (drafting also costs what
// decode steps do not show: prompts prefill in more, smaller steps). The other arm is tried again
// every kExploreClose-th window while the rates are within kClose, every kExploreFar-th otherwise;
// each look that confirms the choice doubles that period (up to 2^kMaxBackoff), a change resets it.
// The terms (round, step, row, plain step, StepShare, promised, gamma, free draft, explore, skip,
// probe, gate, ...) are those defined at the top of policy/round_policy.h.
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
    int left_ = 0;  // steps left in the current window
    int step_in_window_ = 0;
    bool drafting_ = true;
    std::vector<Load> loads_;
};

}  // namespace specula
