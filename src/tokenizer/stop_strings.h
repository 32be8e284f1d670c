#pragma once
// Stop strings (OpenAI's `stop`, `generate --stop`): generated text goes in piece by piece, and
// what comes out is the text that can be shown, ending where the first stop string starts (the
// stop string itself is never shown). The end of the text that could still become a stop string is
// held back until it completes one or can no longer, so a stream never shows text it must take back.
#include <string>
#include <string_view>
#include <vector>

namespace specula {

class StopStrings {
public:
    // Throws Error on an empty stop string (it would match before any text).
    explicit StopStrings(std::vector<std::string> stops = {});

    // Appends `piece` to the text; returns the text it releases (may be empty). Once a stop string
    // has completed, stopped() holds, everything before it has been released, and later pieces
    // release nothing.
    std::string push(std::string_view piece);
    // At the end of the generation: the text still held back (none after a stop).
    std::string flush();
    bool stopped() const { return stopped_; }
    const std::string & matched() const { return matched_; }  // the stop string that stopped the text, or ""
    bool empty() const { return stops_.empty(); }

private:
    std::vector<std::string> stops_;
    std::string held_;
    std::string matched_;
    bool stopped_ = false;
};

}  // namespace specula
