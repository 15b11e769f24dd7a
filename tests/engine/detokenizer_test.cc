// Incremental detokenization: deltas add up to the text, UTF-8 characters are never split, stop strings that span
// tokens are caught and never half-emitted.
#include "engine/detokenizer.h"

#include <gtest/gtest.h>

#include <map>

namespace fathom {
namespace {

// Byte pieces; like HF's lossy decode, an incomplete UTF-8 tail becomes U+FFFD.
std::string FakeDecode(std::span<const int32_t> ids) {
  static const std::map<int32_t, std::string> pieces = {
      {1, "Hel"}, {2, "lo wo"}, {3, "rld"}, {4, "\xE2\x82"}, {5, "\xAC"}, {6, "!"}, {7, " "}, {8, "END"}, {9, "x"}};
  std::string s;
  for (int32_t id : ids) s += pieces.at(id);
  size_t i = s.size();
  size_t back = 0;
  while (i > 0 && back < 4 && (static_cast<unsigned char>(s[i - 1]) & 0xC0) == 0x80) --i, ++back;
  if (i > 0) {
    const unsigned char lead = static_cast<unsigned char>(s[i - 1]);
    const size_t need = lead >= 0xF0 ? 3 : lead >= 0xE0 ? 2 : lead >= 0xC0 ? 1 : 0;
    if (need > back) s = s.substr(0, i - 1) + "\xEF\xBF\xBD";
  }
  return s;
}

std::string Feed(IncrementalDetokenizer& d, const std::vector<int32_t>& ids, std::vector<std::string>* deltas,
                 bool* stopped) {
  std::string all;
  *stopped = false;
  for (int32_t id : ids) {
    DetokenizeStep s = d.Add(id);
    deltas->push_back(s.delta);
    all += s.delta;
    if (s.stopped) {
      *stopped = true;
      return all;
    }
  }
  const std::string rest = d.Flush();
  deltas->push_back(rest);
  return all + rest;
}

TEST(DetokenizerTest, DeltasAddUpToTheWholeText) {
  IncrementalDetokenizer d(FakeDecode, std::vector<int32_t>{9}, {});
  std::vector<std::string> deltas;
  bool stopped;
  EXPECT_EQ(Feed(d, {1, 2, 3, 6}, &deltas, &stopped), "Hello world!");
  EXPECT_FALSE(stopped);
  EXPECT_EQ(deltas, (std::vector<std::string>{"Hel", "lo wo", "rld", "!", ""}));
}

TEST(DetokenizerTest, HoldsBackAnIncompleteUtf8Character) {
  IncrementalDetokenizer d(FakeDecode, {}, {});
  std::vector<std::string> deltas;
  bool stopped;
  EXPECT_EQ(Feed(d, {6, 4, 5, 6}, &deltas, &stopped), "!\xE2\x82\xAC!");
  EXPECT_EQ(deltas, (std::vector<std::string>{"!", "", "\xE2\x82\xAC", "!", ""}));
}

TEST(DetokenizerTest, CatchesAStopStringAcrossTokenBoundaries) {
  IncrementalDetokenizer d(FakeDecode, {}, {"o w", "never"});
  std::vector<std::string> deltas;
  bool stopped;
  const std::string text = Feed(d, {1, 2, 3}, &deltas, &stopped);
  EXPECT_TRUE(stopped);
  EXPECT_EQ(text, "Hell");
  // "Hel" may only release what cannot start a stop string: the last 4 bytes ("never" - 1) are held back.
  EXPECT_EQ(deltas, (std::vector<std::string>{"", "Hell"}));
  EXPECT_EQ(d.text(), "Hell");
}

TEST(DetokenizerTest, StopStringSplitOverThreeTokens) {
  IncrementalDetokenizer d(FakeDecode, {}, {"lo world!"});
  std::vector<std::string> deltas;
  bool stopped;
  EXPECT_EQ(Feed(d, {1, 2, 3, 6, 1}, &deltas, &stopped), "Hel");
  EXPECT_TRUE(stopped);
}

TEST(DetokenizerTest, HeldBackTextIsFlushedAtTheEnd) {
  IncrementalDetokenizer d(FakeDecode, {}, {"ENDX"});
  std::vector<std::string> deltas;
  bool stopped;
  EXPECT_EQ(Feed(d, {9, 8}, &deltas, &stopped), "xEND");
  EXPECT_FALSE(stopped);
  EXPECT_EQ(deltas.back(), "END");
}

}  // namespace
}  // namespace fathom
