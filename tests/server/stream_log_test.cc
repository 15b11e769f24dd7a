#include "server/stream_log.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "server/server.h"

namespace fathom::server {
namespace {

TEST(StreamLogTest, ReplaysAfterLastEventThenGoesLive) {
  StreamLog log("s");
  log.Append(1, "a");
  log.Append(2, "b");
  log.Append(3, "c");
  std::vector<std::string> got;
  bool done = false;
  log.Subscribe(1, [&](const std::string& e, bool d) {
    if (d) {
      done = true;
    } else {
      got.push_back(e);
    }
    return true;
  });
  EXPECT_EQ(got, (std::vector<std::string>{"b", "c"}));
  log.Append(4, "d");
  EXPECT_EQ(got.back(), "d");
  EXPECT_FALSE(done);
  log.Finish();
  EXPECT_TRUE(done);
  bool late_done = false;
  std::vector<std::string> late;
  log.Subscribe(3, [&](const std::string& e, bool d) {
    d ? void(late_done = true) : late.push_back(e);
    return true;
  });
  EXPECT_EQ(late, (std::vector<std::string>{"d"}));
  EXPECT_TRUE(late_done);
}

// A subscriber whose reader left says so; it is dropped, and live_subscribers (what a resumable stream's grace
// period looks at) counts only readers still there.
TEST(StreamLogTest, DropsSubscribersWhoseReaderLeft) {
  StreamLog log("s");
  int calls = 0;
  bool alive = true;
  log.Subscribe(0, [&](const std::string&, bool) {
    ++calls;
    return alive;
  });
  EXPECT_EQ(log.live_subscribers(), 1u);
  log.Append(1, "a");
  alive = false;
  log.Append(2, "b");  // the reader is gone: dropped
  EXPECT_EQ(log.live_subscribers(), 0u);
  log.Append(3, "c");
  EXPECT_EQ(calls, 2);
}

TEST(StreamLogsTest, RetentionAndByteBudget) {
  StreamLogs logs({.retention_s = 10, .max_bytes = 10});
  auto a = logs.Create("a");
  a->Append(1, "123456");
  a->Finish();
  logs.MarkFinished("a");
  EXPECT_NE(logs.Find("a"), nullptr);
  auto b = logs.Create("b");
  b->Append(1, "123456");  // 12 bytes in all: over budget, "a" (finished) goes, "b" (live) stays
  b->Finish();
  logs.Sweep();
  EXPECT_EQ(logs.Find("a"), nullptr);
  EXPECT_NE(logs.Find("b"), nullptr);
  logs.MarkFinished("b");
  logs.Sweep(StreamLogs::Clock::now() + std::chrono::seconds(11));
  EXPECT_EQ(logs.size(), 0u);
}

// RFC 7235: the auth scheme is case-insensitive; the token is exact.
TEST(ServerHelpersTest, BearerToken) {
  EXPECT_EQ(BearerToken("Bearer abc"), "abc");
  EXPECT_EQ(BearerToken("bearer abc"), "abc");
  EXPECT_EQ(BearerToken("BEARER  abc "), "abc");
  EXPECT_EQ(BearerToken("Basic abc"), "");
  EXPECT_EQ(BearerToken("Bearer"), "");
  EXPECT_EQ(BearerToken("Bearerabc"), "");
  EXPECT_EQ(BearerToken(""), "");
}

// Last-Event-ID: decimal digits only; -1, " 1", "+1" and overflow are refused rather than wrapped or trimmed.
TEST(ServerHelpersTest, ParseEventId) {
  EXPECT_EQ(ParseEventId("0"), 0u);
  EXPECT_EQ(ParseEventId("42"), 42u);
  EXPECT_EQ(ParseEventId("9223372036854775807"), 9223372036854775807ull);
  for (const char* bad : {"-1", " 1", "+1", "1 ", "", "1e3", "0x10", "9223372036854775808", "99999999999999999999"}) {
    EXPECT_FALSE(ParseEventId(bad).has_value()) << bad;
  }
}

TEST(ServerHelpersTest, ConstantTimeEquals) {
  EXPECT_TRUE(ConstantTimeEquals("secret", "secret"));
  EXPECT_FALSE(ConstantTimeEquals("secret", "secreT"));
  EXPECT_FALSE(ConstantTimeEquals("secret", "secret2"));
  EXPECT_FALSE(ConstantTimeEquals("", "x"));
  EXPECT_TRUE(ConstantTimeEquals("", ""));
}

TEST(ServerHelpersTest, ReasoningParserNames) {
  bool automatic = false;
  EXPECT_EQ(*ParseReasoningParser("deepseek-r1", &automatic), ReasoningParser::kDeepSeekR1);
  EXPECT_FALSE(automatic);
  EXPECT_EQ(*ParseReasoningParser("auto", &automatic), ReasoningParser::kNone);
  EXPECT_TRUE(automatic);
  EXPECT_FALSE(ParseReasoningParser("qwen", &automatic).ok());
}

}  // namespace
}  // namespace fathom::server
