#include "engine/infer/text_stream.h"

#include <gtest/gtest.h>

namespace tandem::infer {
namespace {

// A toy vocabulary: each id decodes to a fixed byte string, like a byte-level BPE whose pieces
// may cut a UTF-8 character in two (decode then shows U+FFFD for the cut tail).
std::string decodeBytes(std::span<const int32_t> ids, const std::vector<std::string>& vocab) {
  std::string bytes;
  for (int32_t id : ids) bytes += vocab.at(static_cast<size_t>(id));
  // Replace a trailing incomplete UTF-8 sequence as tokenizers' decode does.
  size_t lead = bytes.size();
  while (lead > 0 && (static_cast<unsigned char>(bytes[lead - 1]) & 0xC0) == 0x80) --lead;
  if (lead > 0) {
    const unsigned char c = static_cast<unsigned char>(bytes[lead - 1]);
    const size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    if (need > 1 && bytes.size() - (lead - 1) < need) bytes = bytes.substr(0, lead - 1) + "\xEF\xBF\xBD";
  }
  return bytes;
}

struct Streamed {
  std::vector<std::string> pieces;
  std::string text;
  bool stopped = false;
};

Streamed streamAll(const std::vector<std::string>& vocab, const std::vector<int32_t>& ids, std::vector<std::string> stops) {
  TextStream stream([&](std::span<const int32_t> s) { return decodeBytes(s, vocab); }, std::move(stops));
  Streamed r;
  for (int32_t id : ids) {
    const std::string piece = stream.push(id);
    r.pieces.push_back(piece);
    r.text += piece;
  }
  r.text += stream.finish();
  r.stopped = stream.stopped();
  EXPECT_EQ(r.text, stream.emitted());
  return r;
}

TEST(TextStream, EmitsEveryTokenWhenNothingIsHeldBack) {
  const Streamed r = streamAll({"Hel", "lo", " world"}, {0, 1, 2}, {});
  EXPECT_EQ(r.pieces, (std::vector<std::string>{"Hel", "lo", " world"}));
  EXPECT_EQ(r.text, "Hello world");
}

TEST(TextStream, HoldsBackACutUtf8CharacterUntilItCompletes) {
  // "ä" is C3 A4, split over two tokens.
  const Streamed r = streamAll({"a", "\xC3", "\xA4", "b"}, {0, 1, 2, 3}, {});
  EXPECT_EQ(r.pieces, (std::vector<std::string>{"a", "", "\xC3\xA4", "b"}));
  EXPECT_EQ(r.text, "a\xC3\xA4" "b");
}

TEST(TextStream, CutsAtAStopStringSplitAcrossTokens) {
  const Streamed r = streamAll({"one ", "E", "N", "D two"}, {0, 1, 2, 3}, {"END"});
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.text, "one ");
  EXPECT_EQ(r.pieces, (std::vector<std::string>{"one ", "", "", ""}));
}

TEST(TextStream, ReleasesAPartialStopStringThatDoesNotComplete) {
  const Streamed r = streamAll({"x", "EN", "Dy", "EN"}, {0, 1, 0, 3}, {"END"});
  EXPECT_FALSE(r.stopped);
  EXPECT_EQ(r.pieces, (std::vector<std::string>{"x", "", "ENx", ""}));
  EXPECT_EQ(r.text, "xENxEN");  // the held "EN" at the end comes out at finish()
}

TEST(TextStream, EarliestOfSeveralStopStringsWins) {
  const Streamed r = streamAll({"ab", "cd", "ef"}, {0, 1, 2}, {"ef", "bc"});
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.text, "a");
}

TEST(TextStream, IgnoresIdsAfterStopping) {
  TextStream stream([](std::span<const int32_t> s) { return std::string(s.size(), 'x'); }, {"xx"});
  EXPECT_EQ(stream.push(0), "");
  EXPECT_EQ(stream.push(0), "");
  EXPECT_TRUE(stream.stopped());
  EXPECT_EQ(stream.push(0), "");
  EXPECT_EQ(stream.finish(), "");
}

}  // namespace
}  // namespace tandem::infer
