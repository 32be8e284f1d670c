#include "policy/speculation_gate.h"

#include <algorithm>
#include <cmath>

#include "specula/error.h"

namespace specula {

SpeculationGate::SpeculationGate(int window_steps) : window_steps_(window_steps) {
    if (window_steps <= kSettle) throw Error("speculation gate: a window must be longer than its settling steps");
}

int SpeculationGate::load_bucket(int decoding) {
    int b = 0;  // 0 and 1 sequences share bucket 0
    while ((1 << b) < decoding) ++b;
    return b;
}

SpeculationGate::Load & SpeculationGate::load(int decoding) {
    const size_t b = static_cast<size_t>(load_bucket(decoding));
    if (loads_.size() <= b) loads_.resize(b + 1);
    return loads_[b];
}

double SpeculationGate::rate(int decoding, bool drafting) const {
    const size_t b = static_cast<size_t>(load_bucket(decoding));
    if (b >= loads_.size()) return 0.0;
    const Arm & a = loads_[b].arm[drafting];
    return a.ms > 0.0 ? a.tokens / a.ms : 0.0;
}

bool SpeculationGate::choose(Load & l) {
    const int min_steps = kMinWindows * (window_steps_ - kSettle);
    if (l.arm[1].steps < min_steps) return true;  // drafting first: a lone sequence starts as without the gate
    if (l.arm[0].steps < min_steps) return false;
    const double on = l.arm[1].tokens / l.arm[1].ms, off = l.arm[0].tokens / l.arm[0].ms;
    const bool best = on > off * (1.0 + kDraftingMargin);
    if (best != l.best) l.best = best, l.backoff = 0;  // the traffic changed: look again soon
    const bool close = off > 0.0 && std::abs(on / off - 1.0) < kClose;
    if (++l.windows_since_explore >= (close ? kExploreClose : kExploreFar) << l.backoff) {
        l.windows_since_explore = 0;
        l.backoff = std::min(l.backoff + 1, kMaxBackoff);
        return !best;
    }
    return best;
}

bool SpeculationGate::allow(int decoding) {
    if (decoding <= 1) return true;
    if (left_ == 0) {
        drafting_ = choose(load(decoding));
        left_ = window_steps_;
        step_in_window_ = 0;
    }
    return drafting_;
}

void SpeculationGate::observe(int decoding, int tokens, double ms, bool verify_only) {
    if (decoding <= 1) return;
    if (left_ > 0) --left_;
    if (step_in_window_++ < kSettle || !verify_only || ms <= 0.0) return;
    constexpr double kKeep = 0.95;  // about the arm's last 20 steps at this load: one exploring window is half its estimate
    Arm & a = load(decoding).arm[drafting_];
    a.tokens = kKeep * a.tokens + tokens;
    a.ms = kKeep * a.ms + ms;
    ++a.steps;
}

}  // namespace specula
