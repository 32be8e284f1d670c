#include "tokenizer/utf8.h"

#include <cstdint>

namespace specula {
namespace {

// Length of the longest prefix of `s` that ends on a UTF-8 character boundary (a malformed lead
// byte counts as a character, so nothing is held back forever).
size_t complete_utf8_prefix(const std::string & s) {
    size_t i = s.size();
    // Walk back over at most 3 continuation bytes to the last lead byte.
    size_t back = 0;
    while (back < 4 && i > 0 && (static_cast<uint8_t>(s[i - 1]) & 0xC0) == 0x80) {
        --i;
        ++back;
    }
    if (i == 0) return back >= 4 ? s.size() : 0;
    const uint8_t lead = static_cast<uint8_t>(s[i - 1]);
    const size_t need = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3
                                       : lead >= 0xC0   ? 2
                                                        : 1;
    return back + 1 >= need ? s.size() : i - 1;
}

}  // namespace

std::string Utf8Stream::push(const std::string & piece) {
    partial_ += piece;
    const size_t n = complete_utf8_prefix(partial_);
    std::string complete = partial_.substr(0, n);
    partial_.erase(0, n);
    return complete;
}

std::string Utf8Stream::flush() {
    std::string rest;
    rest.swap(partial_);
    return rest;
}

}  // namespace specula
