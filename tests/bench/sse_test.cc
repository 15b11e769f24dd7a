// The incremental SSE parser on split and merged pieces, CRLF, comments and multi-line data.
#include "bench/sse.h"

#include <gtest/gtest.h>

namespace fathom::bench {
namespace {

std::vector<SseEvent> FeedPieces(const std::vector<std::string>& pieces, SseParser* parser = nullptr) {
  SseParser local;
  SseParser& p = parser ? *parser : local;
  std::vector<SseEvent> out;
  for (const std::string& s : pieces) p.Feed(s, out);
  return out;
}

std::vector<std::string> Datas(const std::vector<SseEvent>& events) {
  std::vector<std::string> out;
  for (const SseEvent& e : events) out.push_back(e.data);
  return out;
}

TEST(SseParserTest, OneEventPerBlankLine) {
  auto ev = FeedPieces({"id: 1\ndata: {\"a\":1}\n\nid: 2\ndata: [DONE]\n\n"});
  ASSERT_EQ(ev.size(), 2u);
  EXPECT_EQ(ev[0].data, "{\"a\":1}");
  EXPECT_EQ(ev[0].id, "1");
  EXPECT_EQ(ev[0].event, "message");
  EXPECT_EQ(ev[1].data, "[DONE]");
  EXPECT_EQ(ev[1].id, "2");
}

TEST(SseParserTest, EverySplitGivesTheSameEvents) {
  const std::string stream =
      "id: 7\r\ndata: hello\r\n\r\n: keep-alive\r\n\r\ndata: a\ndata: b\n\nevent: x\rdata: c\r\r";
  const std::vector<std::string> want = {"hello", "a\nb", "c"};
  EXPECT_EQ(Datas(FeedPieces({stream})), want);
  for (size_t cut = 0; cut <= stream.size(); ++cut) {
    EXPECT_EQ(Datas(FeedPieces({stream.substr(0, cut), stream.substr(cut)})), want) << "cut at " << cut;
  }
  std::vector<std::string> bytes;
  for (char c : stream) bytes.emplace_back(1, c);
  auto ev = FeedPieces(bytes);
  EXPECT_EQ(Datas(ev), want);
  ASSERT_EQ(ev.size(), 3u);
  EXPECT_EQ(ev[2].event, "x");
  EXPECT_EQ(ev[2].id, "7");  // the last id carries over
}

TEST(SseParserTest, CrLfSplitBetweenPiecesIsOneLineEnd) {
  // "data: x\r" | "\n\r\n": the LF after the CR must not count as a second (blank) line end.
  auto ev = FeedPieces({"data: x\r", "\ndata: y\r", "\n\r\n"});
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].data, "x\ny");
}

TEST(SseParserTest, CommentsFieldsAndSpaces) {
  auto ev =
      FeedPieces({":comment only\n\ndata:no-space\n\ndata:  two spaces\n\ndata\n\nretry: 100\nfoo: bar\ndata: z\n\n"});
  const std::vector<std::string> want = {"no-space", " two spaces", "", "z"};
  EXPECT_EQ(Datas(ev), want);
}

TEST(SseParserTest, MergedEventsInOnePiece) {
  std::string s;
  for (int i = 0; i < 100; ++i) s += "data: " + std::to_string(i) + "\n\n";
  auto ev = FeedPieces({s});
  ASSERT_EQ(ev.size(), 100u);
  EXPECT_EQ(ev[99].data, "99");
}

TEST(SseParserTest, PartialEventAtEnd) {
  SseParser p;
  auto ev = FeedPieces({"data: done\n\ndata: {\"cut"}, &p);
  EXPECT_EQ(ev.size(), 1u);
  EXPECT_TRUE(p.HasPartialEvent());
  SseParser q;
  FeedPieces({"data: a\n"}, &q);
  EXPECT_TRUE(q.HasPartialEvent());  // no blank line yet
  SseParser r;
  FeedPieces({"data: a\n\n"}, &r);
  EXPECT_FALSE(r.HasPartialEvent());
}

TEST(SseParserTest, ByteOrderMark) {
  auto ev = FeedPieces({"\xEF\xBB",
                        "\xBF"
                        "data: x\n\n"});
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].data, "x");
}

}  // namespace
}  // namespace fathom::bench
