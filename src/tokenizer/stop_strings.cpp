#include "tokenizer/stop_strings.h"

#include <algorithm>

#include "specula/error.h"

namespace specula {

StopStrings::StopStrings(std::vector<std::string> stops) : stops_(std::move(stops)) {
    for (const std::string & s : stops_) {
        if (s.empty()) throw Error("a stop string must not be empty");
    }
}

std::string StopStrings::push(std::string_view piece) {
    if (stopped_) return {};
    held_ += piece;
    // The earliest complete stop string. Every match starts inside held_: released text never
    // ends with the start of one (below).
    size_t first = std::string::npos;
    for (const std::string & s : stops_) {
        const size_t at = held_.find(s);
        if (at < first) first = at, matched_ = s;
    }
    if (first != std::string::npos) {
        stopped_ = true;
        std::string released = held_.substr(0, first);
        held_.clear();
        return released;
    }
    // Hold back the longest end of the text that some stop string starts with.
    size_t hold = 0;
    for (const std::string & s : stops_) {
        for (size_t k = std::min(s.size() - 1, held_.size()); k > hold; --k) {
            if (held_.compare(held_.size() - k, k, s, 0, k) == 0) {
                hold = k;
                break;
            }
        }
    }
    std::string released = held_.substr(0, held_.size() - hold);
    held_.erase(0, held_.size() - hold);
    return released;
}

std::string StopStrings::flush() {
    std::string rest;
    rest.swap(held_);
    return rest;
}

}  // namespace specula
