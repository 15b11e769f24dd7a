// Streaming detokenization: no piece ever holds a partial UTF-8 character, the pieces concatenate to the full decode,
// and stop strings split across tokens are caught while the text before them still comes out.
#include "tokenizer/streaming.h"

#include <gtest/gtest.h>

#include "tests_tokenizer_util.h"
#include "tokenizer/utf8.h"

namespace fathom {
namespace {

const Tokenizer& DeepSeek() {
  static const std::unique_ptr<Tokenizer> tok = [] {
    auto t = Tokenizer::FromDirectory(std::string(FATHOM_TOKENIZER_TEST_DATA) + "/deepseek-v3");
    FATHOM_CHECK(t.ok(), "{}", t.status().ToString());
    return std::move(t).value();
  }();
  return *tok;
}

// Streams `ids` one token at a time; checks every piece and returns them.
std::vector<std::string> Stream(const Tokenizer& tok, const std::vector<int32_t>& ids) {
  StreamingDecoder stream(tok);
  std::vector<std::string> pieces;
  for (int32_t id : ids) pieces.push_back(stream.Add(id));
  pieces.push_back(stream.Flush());
  for (const auto& p : pieces) EXPECT_TRUE(IsValidUtf8(p)) << "partial UTF-8 in a piece";
  return pieces;
}

std::string Join(const std::vector<std::string>& pieces) {
  std::string out;
  for (const auto& p : pieces) out += p;
  return out;
}

TEST(StreamingTest, ByteLevelEmojiAndCjkSplitAcrossTokens) {
  const Tokenizer& tok = DeepSeek();
  const std::string text = "emoji 😀😃 and 👩‍💻 and 🇨🇳 — 深度求索 檾墈⎬ 👍🏽 done";
  const auto ids = tok.Encode(text);
  // The test only means something if some character really is split across tokens.
  int partial_tokens = 0;
  for (int32_t id : ids) {
    const std::string alone = tok.Decode(std::vector<int32_t>{id});
    partial_tokens += alone.find("\xEF\xBF\xBD") != std::string::npos;
  }
  ASSERT_GT(partial_tokens, 0);
  const auto pieces = Stream(tok, ids);
  EXPECT_EQ(Join(pieces), tok.Decode(ids));
  EXPECT_EQ(Join(pieces), text);
  // Some tokens produced no text (their character was incomplete), and the final flush had nothing left.
  EXPECT_GT(std::count(pieces.begin(), pieces.end() - 1, std::string()), 0);
  EXPECT_EQ(pieces.back(), "");
}

TEST(StreamingTest, ByteLevelCorpusRoundTrips) {
  const Tokenizer& tok = DeepSeek();
  for (const char* text : {"Hello, world!", "你好，世界！", "ﾯｴｿﾣ⎅💭🔸💊👊💶🕂", "<｜User｜>Hi<｜Assistant｜>",
                           "  spaces  \n\n", "Tiếng Việt có dấu"}) {
    const auto ids = tok.Encode(text);
    EXPECT_EQ(Join(Stream(tok, ids)), tok.Decode(ids)) << text;
  }
}

TEST(StreamingTest, ByteFallbackMultiByteCharacters) {
  auto tok = Load(SentencePieceJson(/*byte_fallback=*/true, /*metaspace=*/false));
  const std::string text = "hello h\xC3\xA9llo \xF0\x9F\x98\x80 world";  // "hello héllo 😀 world"
  const auto ids = tok->Encode(text);
  const auto pieces = Stream(*tok, ids);
  EXPECT_EQ(Join(pieces), tok->Decode(ids));
  EXPECT_EQ(Join(pieces), text);
  // 😀 is four <0x..> tokens: the first three yield nothing, the fourth the whole character.
  bool saw_emoji_piece = false;
  for (const auto& p : pieces) saw_emoji_piece |= p.find("\xF0\x9F\x98\x80") != std::string::npos;
  EXPECT_TRUE(saw_emoji_piece);
}

TEST(StreamingTest, IncompleteTailIsFlushedAsReplacement) {
  auto tok = Load(SentencePieceJson(true, false));
  // "hello" followed by only the first two bytes of 😀.
  std::vector<int32_t> ids = tok->Encode("hello");
  ids.push_back(*tok->TokenToId("<0xF0>"));
  ids.push_back(*tok->TokenToId("<0x9F>"));
  StreamingDecoder stream(*tok);
  std::string out;
  for (int32_t id : ids) out += stream.Add(id);
  EXPECT_EQ(out, "hello");
  out += stream.Flush();
  EXPECT_EQ(out, tok->Decode(ids));
}

TEST(StopStringTest, HoldsBackAPossibleStopAndCutsBeforeIt) {
  StopStringMatcher stops({"</answer>", "STOP"});
  std::string emitted;
  auto r = stops.Add("The answer is 42</an");
  EXPECT_EQ(r.text, "The answer is 42");  // "</an" might start a stop: held back
  EXPECT_FALSE(r.stopped);
  emitted += r.text;
  r = stops.Add("swer> trailing");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.matched_stop, "</answer>");
  EXPECT_EQ(r.text, "");
  emitted += r.text;
  EXPECT_EQ(emitted, "The answer is 42");
  EXPECT_TRUE(stops.Add("more").stopped);
}

TEST(StopStringTest, ReleasesHeldTextWhenTheStopCannotMatch) {
  StopStringMatcher stops({"</answer>"});
  EXPECT_EQ(stops.Add("a</a").text, "a");
  EXPECT_EQ(stops.Add("b").text, "</ab");
  EXPECT_EQ(stops.Add("</").text, "");
  EXPECT_EQ(stops.Flush(), "</");
}

TEST(StopStringTest, StopSplitAcrossStreamedTokens) {
  const Tokenizer& tok = DeepSeek();
  const std::string text = "先说结论：答案是四十二。<|STOP|>后面的文字不应出现";
  const auto ids = tok.Encode(text);
  StreamingDecoder stream(tok);
  StopStringMatcher stops({"<|STOP|>"});
  std::string emitted;
  bool stopped = false;
  int tokens_fed = 0;
  for (int32_t id : ids) {
    ++tokens_fed;
    auto r = stops.Add(stream.Add(id));
    emitted += r.text;
    EXPECT_TRUE(IsValidUtf8(r.text));
    if (r.stopped) {
      stopped = true;
      break;
    }
  }
  ASSERT_TRUE(stopped);
  EXPECT_EQ(emitted, "先说结论：答案是四十二。");
  // The stop string spans more than one token, so it was found only on its last token.
  EXPECT_LT(tokens_fed, static_cast<int>(ids.size()));
  EXPECT_GT(tok.Encode("<|STOP|>").size(), 1u);
}

TEST(StopStringTest, MultiByteStopString) {
  StopStringMatcher stops({"。\n"});
  auto r = stops.Add("第一句。");
  EXPECT_EQ(r.text, "第一句");
  r = stops.Add("\n第二句");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.text, "");
}

}  // namespace
}  // namespace fathom
