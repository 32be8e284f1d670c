#pragma once
// Token pieces are bytes: a multi-byte UTF-8 character may be split across tokens. Utf8Stream holds
// back an incomplete character's bytes until the rest arrives, so streamed text never splits one.
#include <string>

namespace specula {

class Utf8Stream {
public:
    // `piece` appended; returns the text that now ends on a character boundary (may be empty).
    std::string push(const std::string & piece);
    // At the end: the bytes still held back (an unfinished character is what the model produced).
    std::string flush();

private:
    std::string partial_;
};

}  // namespace specula
