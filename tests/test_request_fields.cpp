// The request surface of `specula serve` without a model: stop strings (tokenizer/stop_strings.h)
// and the fields parse_request reads into a request (server/openai.h).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "specula/error.h"
#include "tokenizer/stop_strings.h"

namespace specula {
namespace {

// Feeds `pieces` one by one; returns what each push released, then the flush (when not stopped).
std::vector<std::string> feed(StopStrings & stops, const std::vector<std::string> & pieces) {
    std::vector<std::string> out;
    for (const std::string & p : pieces) out.push_back(stops.push(p));
    if (!stops.stopped()) out.push_back(stops.flush());
    return out;
}

std::string joined(const std::vector<std::string> & parts) {
    std::string s;
    for (const std::string & p : parts) s += p;
    return s;
}

// Catches: a stop string found only inside one piece, the stop string itself returned, or text
// after it released.
TEST(StopStrings, TheTextEndsWhereAStopStringSpanningPiecesStarts) {
    StopStrings stops({"END"});
    const auto out = feed(stops, {"Hello E", "N", "D and more", "never"});
    EXPECT_TRUE(stops.stopped());
    EXPECT_EQ(joined(out), "Hello ");
    EXPECT_EQ(out[0], "Hello ");  // "E" held back: it may start the stop string
    EXPECT_EQ(out[3], "");
}

// Catches: held-back text lost or released twice when the match fails, or released before it is
// known not to start a stop string.
TEST(StopStrings, AHeldPrefixIsReleasedOnceItCanNoLongerMatch) {
    StopStrings stops({"</s>", "###"});
    const auto out = feed(stops, {"a </", "b ##", "x", "#"});
    EXPECT_FALSE(stops.stopped());
    EXPECT_EQ(out[0], "a ");
    EXPECT_EQ(out[1], "</b ");
    EXPECT_EQ(out[2], "##x");
    EXPECT_EQ(out[3], "");
    EXPECT_EQ(out[4], "#");  // the end: a prefix that never completed is text
}

// Catches: the first stop string in the list winning over one that starts earlier in the text,
// or a stop string inside a piece that continues past it.
TEST(StopStrings, TheEarliestStopStringInTheTextWins) {
    StopStrings stops({"world", "lo"});
    EXPECT_EQ(joined(feed(stops, {"hello world"})), "hel");
    StopStrings one({"\n"});
    EXPECT_EQ(joined(feed(one, {"line one\nline two"})), "line one");
    StopStrings none;
    EXPECT_EQ(joined(feed(none, {"a", "b"})), "ab");
    EXPECT_THROW(StopStrings({"ok", ""}), Error);
}

// Catches: a stop string that overlaps itself ("aab" in "aaab") missed after a partial match.
TEST(StopStrings, AnOverlappingPartialMatchStillFindsTheStop) {
    StopStrings stops({"aab"});
    EXPECT_EQ(joined(feed(stops, {"x", "a", "a", "a", "b", "y"})), "xa");
    EXPECT_TRUE(stops.stopped());
}

}  // namespace
}  // namespace specula
