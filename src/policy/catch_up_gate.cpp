#include "policy/catch_up_gate.h"

#include <algorithm>

#include "specula/error.h"

namespace specula {

CatchUpGate::CatchUpGate(double plain_ms) : plain_ms_(plain_ms) {
    if (!(plain_ms > 0.0)) throw Error("catch-up gate: the one-row forward time must be positive");
}

bool CatchUpGate::allow(int lag, int tokens_left) {
    if (lag < kMinTimedLag) return true;
    const double with_model = ms_per_token(true);
    if (catch_up_ms_per_token_ == 0.0 || with_model == 0.0) return true;  // not measured yet: draft, and measure
    const double without_model = arm_[0].tokens > 0.0 ? ms_per_token(false) : plain_ms_;
    const double reply = std::min(static_cast<double>(std::max(0, tokens_left)), replies_ > 0.0 ? mean_reply() : 1e9);
    const double saving = reply * (without_model - with_model);
    if (lag * catch_up_ms_per_token_ <= saving) {
        kept_out_ = backoff_ = 0;
        return true;
    }
    if (kept_out_ == 0 && explored_) backoff_ = std::min(backoff_ + 1, kMaxBackoff);  // the last look changed nothing
    explored_ = false;
    if (++kept_out_ >= (kExploreEvery << backoff_)) {
        kept_out_ = 0;
        explored_ = true;
        return true;
    }
    return false;
}

void CatchUpGate::observe_catch_up(int lag, double draft_ms) {
    if (lag < kMinTimedLag || !(draft_ms > 0.0)) return;
    const double per_token = draft_ms / lag;
    catch_up_ms_per_token_ = catch_up_ms_per_token_ == 0.0 ? per_token : kKeep * catch_up_ms_per_token_ + (1.0 - kKeep) * per_token;
}

void CatchUpGate::observe_reply(int tokens, double ms, bool drafted) {
    if (tokens <= 0 || !(ms > 0.0)) return;
    reply_tokens_ = kKeep * reply_tokens_ + tokens;
    replies_ = kKeep * replies_ + 1.0;
    Arm & a = arm_[drafted];
    a.tokens = kKeep * a.tokens + tokens;
    a.ms = kKeep * a.ms + ms;
}

}  // namespace specula
