// DeepSeek-V3.2's built-in prompt encoding against DeepSeek's reference encoder (encoding_dsv32.py's
// encode_messages): tests/data/chat/deepseek_v32/expected.json holds what the reference printed for each conversation
// of conversations.json (tests/data/tools/make_dsv32_encodings.py), and fathom must print the same bytes, or refuse
// where the reference refused. The hand-checked cases below pin the format's shape on their own.
#include "tokenizer/deepseek_v32_encoding.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

namespace fathom {
namespace {

using ojson = nlohmann::ordered_json;

ojson ReadJson(const std::string& name) {
  std::ifstream in(std::string(FATHOM_TEST_DATA_DIR) + "/chat/deepseek_v32/" + name);
  EXPECT_TRUE(in.good()) << name;
  return ojson::parse(in, nullptr, /*allow_exceptions=*/false);
}

std::string Encode(const ojson& messages, bool thinking, const ojson& tools = ojson()) {
  DeepseekV32EncodeOptions o;
  o.thinking = thinking;
  StatusOr<std::string> s = EncodeDeepseekV32(messages, tools, o);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return s.ok() ? *s : std::string();
}

TEST(DeepseekV32EncodingTest, MatchesTheReferenceEncoderByteForByte) {
  const ojson conversations = ReadJson("conversations.json")["conversations"];
  const ojson expected = ReadJson("expected.json");
  ASSERT_TRUE(expected.contains("prompts")) << "expected.json has no prompts";
  const ojson& prompts = expected["prompts"];
  ASSERT_GE(conversations.size(), 20u);
  int compared = 0, refused = 0;
  for (const ojson& c : conversations) {
    const std::string name = c["name"].get<std::string>();
    ASSERT_TRUE(prompts.contains(name)) << name << " has no reference prompt: re-run make_dsv32_encodings.py";
    DeepseekV32EncodeOptions o;
    o.thinking = c["thinking"].get<bool>();
    const StatusOr<std::string> got = EncodeDeepseekV32(c["messages"], c.contains("tools") ? c["tools"] : ojson(), o);
    if (prompts[name].is_object()) {
      EXPECT_FALSE(got.ok()) << name << ": the reference refused it (" << prompts[name].dump() << ")";
      ++refused;
      continue;
    }
    ASSERT_TRUE(got.ok()) << name << ": " << got.status().ToString();
    EXPECT_EQ(*got, prompts[name].get<std::string>()) << name;
    ++compared;
  }
  EXPECT_GE(compared, 20);
  RecordProperty("compared", compared);
  RecordProperty("refused", refused);
}

TEST(DeepseekV32EncodingTest, TheLastUserTurnOpensThinkingOnlyInThinkingMode) {
  const ojson m = ojson::parse(R"([{"role": "user", "content": "Hi"}])");
  EXPECT_EQ(Encode(m, false), "<｜begin▁of▁sentence｜><｜User｜>Hi<｜Assistant｜></think>");
  EXPECT_EQ(Encode(m, true), "<｜begin▁of▁sentence｜><｜User｜>Hi<｜Assistant｜><think>");
  // An earlier turn is closed, and its reasoning dropped in thinking mode.
  const ojson turns = ojson::parse(R"([{"role": "system", "content": "S"}, {"role": "user", "content": "a"},
      {"role": "assistant", "content": "b", "reasoning_content": "r"}, {"role": "user", "content": "c"}])");
  EXPECT_EQ(Encode(turns, true),
            "<｜begin▁of▁sentence｜>S<｜User｜>a<｜Assistant｜></"
            "think>b<｜end▁of▁sentence｜><｜User｜>c<｜Assistant｜><think>");
}

TEST(DeepseekV32EncodingTest, ToolCallsAreDsmlBlocksAndResultsFollowThem) {
  const ojson m = ojson::parse(R"([{"role": "user", "content": "w?"},
      {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "f",
        "arguments": "{\"city\": \"Paris\", \"days\": 2, \"opts\": {\"a\": [1, true]}}"}}]},
      {"role": "tool", "content": "sunny"}])");
  const std::string p = Encode(m, false);
  EXPECT_NE(p.find("<｜User｜>w?<｜Assistant｜></think>\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"f\">\n"
                   "<｜DSML｜parameter name=\"city\" string=\"true\">Paris</｜DSML｜parameter>\n"
                   "<｜DSML｜parameter name=\"days\" string=\"false\">2</｜DSML｜parameter>\n"
                   "<｜DSML｜parameter name=\"opts\" string=\"false\">{\"a\": [1, true]}</｜DSML｜parameter>\n"
                   "</｜DSML｜invoke>\n</｜DSML｜function_calls><｜end▁of▁sentence｜>"
                   "\n\n<function_results>\n<result>sunny</result>\n</function_results>\n\n</think>"),
            std::string::npos)
      << p;
}

TEST(DeepseekV32EncodingTest, ToolsGoToAFirstSystemMessageAsJsonLines) {
  const ojson tools = ojson::parse(R"([{"type": "function", "function": {"name": "now", "parameters": {}}}])");
  const std::string p = Encode(ojson::parse(R"([{"role": "user", "content": "t?"}])"), false, tools);
  EXPECT_EQ(p.rfind("<｜begin▁of▁sentence｜>\n\n## Tools\n\n", 0), 0u) << p;
  EXPECT_NE(p.find("<functions>\n{\"name\": \"now\", \"parameters\": {}}\n</functions>\n<｜User｜>t?"),
            std::string::npos)
      << p;
}

TEST(DeepseekV32EncodingTest, WhatTheReferenceRejectsIsRefused) {
  DeepseekV32EncodeOptions chat, thinking;
  thinking.thinking = true;
  const char* bad[] = {
      R"([{"role": "tool", "content": "orphan"}])",  // no call before it
      R"([{"role": "user", "content": "a"}, {"role": "assistant", "content": "x"}, {"role": "tool", "content": "r"}])",
      R"([{"role": "wizard", "content": "?"}])",         // unknown role
      R"([{"role": "user", "content": "a"}, {"role": "assistant", "content": "", "tool_calls": [{"function":
          {"name": "f", "arguments": "not json"}}]}])",  // arguments
      R"([{"role": "user"}])",                           // no content
      R"({"role": "user", "content": "not a list"})",
  };
  for (const char* b : bad) {
    const StatusOr<std::string> s = EncodeDeepseekV32(ojson::parse(b), ojson(), chat);
    EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument) << b;
  }
  // Thinking mode: a final assistant turn with neither reasoning nor calls.
  const ojson m = ojson::parse(R"([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}])");
  EXPECT_EQ(EncodeDeepseekV32(m, ojson(), thinking).status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(EncodeDeepseekV32(m, ojson(), chat).ok());
}

}  // namespace
}  // namespace fathom
