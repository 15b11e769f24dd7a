// DeepSeek-V4's built-in prompt encoding against DeepSeek's reference encoder (encoding_dsv4.py's encode_messages):
// tests/data/chat/deepseek_v4/expected.json holds what the reference printed for each conversation of
// conversations.json (tests/data/tools/make_dsv4_encodings.py), and fathom must print the same bytes, or refuse where
// the reference refused. The hand-checked cases below pin the format's shape on their own.
#include "tokenizer/deepseek_v4_encoding.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace fathom {
namespace {

using ojson = nlohmann::ordered_json;

ojson ReadJson(const std::string& name) {
  std::ifstream in(std::string(FATHOM_TEST_DATA_DIR) + "/chat/deepseek_v4/" + name);
  EXPECT_TRUE(in.good()) << name;
  return ojson::parse(in, nullptr, /*allow_exceptions=*/false);
}

std::string Encode(const ojson& messages, bool thinking, const ojson& tools = ojson(), const std::string& effort = "") {
  DeepseekV4EncodeOptions o;
  o.thinking = thinking;
  o.reasoning_effort = effort;
  StatusOr<std::string> s = EncodeDeepseekV4(messages, tools, o);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return s.ok() ? *s : std::string();
}

constexpr const char* kBos = "<｜begin▁of▁sentence｜>";

TEST(DeepseekV4EncodingTest, MatchesTheReferenceEncoderByteForByte) {
  const ojson conversations = ReadJson("conversations.json")["conversations"];
  const ojson expected = ReadJson("expected.json");
  ASSERT_TRUE(expected.contains("prompts")) << "expected.json has no prompts";
  const ojson& prompts = expected["prompts"];
  ASSERT_GE(conversations.size(), 22u);
  int compared = 0, refused = 0;
  for (const ojson& c : conversations) {
    const std::string name = c["name"].get<std::string>();
    ASSERT_TRUE(prompts.contains(name)) << name << " has no reference prompt: re-run make_dsv4_encodings.py";
    DeepseekV4EncodeOptions o;
    o.thinking = c["thinking"].get<bool>();
    o.drop_thinking = c.value("drop_thinking", true);
    o.reasoning_effort = c.value("reasoning_effort", "");
    const StatusOr<std::string> got = EncodeDeepseekV4(c["messages"], c.contains("tools") ? c["tools"] : ojson(), o);
    if (prompts[name].is_object()) {
      EXPECT_EQ(got.status().code(), StatusCode::kInvalidArgument)
          << name << ": the reference refused it (" << prompts[name].dump() << ")";
      ++refused;
      continue;
    }
    ASSERT_TRUE(got.ok()) << name << ": " << got.status().ToString();
    EXPECT_EQ(*got, prompts[name].get<std::string>()) << name;
    ++compared;
  }
  EXPECT_GE(compared, 22);
  EXPECT_GE(refused, 7);
  RecordProperty("compared", compared);
  RecordProperty("refused", refused);
}

TEST(DeepseekV4EncodingTest, TheLastUserTurnOpensThinkingOnlyInThinkingMode) {
  const ojson m = ojson::parse(R"([{"role": "user", "content": "Hi"}])");
  EXPECT_EQ(Encode(m, false), std::string(kBos) + "<｜User｜>Hi<｜Assistant｜></think>");
  EXPECT_EQ(Encode(m, true), std::string(kBos) + "<｜User｜>Hi<｜Assistant｜><think>");
  // An earlier turn is closed, and its reasoning dropped in thinking mode; a later one keeps it.
  const ojson turns = ojson::parse(R"([{"role": "system", "content": "S"}, {"role": "user", "content": "a"},
      {"role": "assistant", "content": "b", "reasoning_content": "r"}, {"role": "user", "content": "c"},
      {"role": "assistant", "content": "d", "reasoning_content": "q"}])");
  EXPECT_EQ(Encode(turns, true),
            std::string(kBos) +
                "S<｜User｜>a<｜Assistant｜></think>b<｜end▁of▁sentence｜><｜User｜>c<｜Assistant｜><think>"
                "q</think>d<｜end▁of▁sentence｜>");
  EXPECT_EQ(Encode(turns, false),
            std::string(kBos) +
                "S<｜User｜>a<｜Assistant｜></think>b<｜end▁of▁sentence｜><｜User｜>c<｜Assistant｜></think>"
                "d<｜end▁of▁sentence｜>");
}

TEST(DeepseekV4EncodingTest, ToolResultsAreAUserTurnInTheOrderOfTheCalls) {
  const ojson m = ojson::parse(R"([{"role": "user", "content": "w?"},
      {"role": "assistant", "content": "", "tool_calls": [
        {"id": "1", "type": "function", "function": {"name": "f", "arguments": "{\"city\": \"Paris\", \"days\": 2}"}},
        {"id": "2", "type": "function", "function": {"name": "g", "arguments": "{\"opts\": {\"a\": [1, true]}}"}}]},
      {"role": "tool", "tool_call_id": "2", "content": "second"},
      {"role": "tool", "tool_call_id": "1", "content": "first"},
      {"role": "user", "content": "thanks"}])");
  EXPECT_EQ(Encode(m, false),
            std::string(kBos) +
                "<｜User｜>w?<｜Assistant｜></think>\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n"
                "<｜DSML｜parameter name=\"city\" string=\"true\">Paris</｜DSML｜parameter>\n"
                "<｜DSML｜parameter name=\"days\" string=\"false\">2</｜DSML｜parameter>\n"
                "</｜DSML｜invoke>\n<｜DSML｜invoke name=\"g\">\n"
                "<｜DSML｜parameter name=\"opts\" string=\"false\">{\"a\": [1, true]}</｜DSML｜parameter>\n"
                "</｜DSML｜invoke>\n</｜DSML｜tool_calls><｜end▁of▁sentence｜>"
                "<｜User｜><tool_result>first</tool_result>\n\n<tool_result>second</tool_result>\n\n"
                "thanks<｜Assistant｜></think>");
  // Arguments text that is not JSON is written as one string parameter, as the script does.
  const ojson raw = ojson::parse(R"([{"role": "user", "content": "x"}, {"role": "assistant", "content": "",
      "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "not json"}}]}])");
  EXPECT_NE(
      Encode(raw, false).find("<｜DSML｜parameter name=\"arguments\" string=\"true\">not json</｜DSML｜parameter>"),
      std::string::npos);
}

TEST(DeepseekV4EncodingTest, ToolsGoOnTheFirstSystemMessageOrOneOfTheirOwn) {
  const ojson tools = ojson::parse(R"([{"type": "function", "function": {"name": "now", "parameters": {}}}])");
  const std::string alone = Encode(ojson::parse(R"([{"role": "user", "content": "t?"}])"), false, tools);
  EXPECT_EQ(alone.rfind(std::string(kBos) + "\n\n## Tools\n\n", 0), 0u) << alone;
  EXPECT_NE(alone.find("### Available Tool Schemas\n\n{\"name\": \"now\", \"parameters\": {}}\n\nYou MUST strictly "
                       "follow the above defined tool name and parameter schemas to invoke tool calls.\n<｜User｜>t?"),
            std::string::npos)
      << alone;
  const std::string after_system =
      Encode(ojson::parse(R"([{"role": "system", "content": "S"}, {"role": "user", "content": "t?"}])"), false, tools);
  EXPECT_EQ(after_system.rfind(std::string(kBos) + "S\n\n## Tools\n\n", 0), 0u) << after_system;
  // Tools keep the reasoning of earlier turns in thinking mode.
  const std::string kept = Encode(ojson::parse(R"([{"role": "user", "content": "a"},
      {"role": "assistant", "content": "b", "reasoning_content": "r"}, {"role": "user", "content": "c"}])"),
                                  true, tools);
  EXPECT_NE(
      kept.find("<｜User｜>a<｜Assistant｜><think>r</think>b<｜end▁of▁sentence｜><｜User｜>c<｜Assistant｜><think>"),
      std::string::npos)
      << kept;
}

TEST(DeepseekV4EncodingTest, ReasoningEffortMaxComesFirstInThinkingModeOnly) {
  const ojson m = ojson::parse(R"([{"role": "user", "content": "Hi"}])");
  const std::string max = Encode(m, true, ojson(), "max");
  EXPECT_EQ(max.rfind(std::string(kBos) + "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n", 0), 0u);
  EXPECT_NE(max.find("no assumption is left unchecked.\n\n<｜User｜>Hi<｜Assistant｜><think>"), std::string::npos);
  EXPECT_EQ(Encode(m, true, ojson(), "high"), Encode(m, true));
  EXPECT_EQ(Encode(m, false, ojson(), "max"), Encode(m, false));
}

TEST(DeepseekV4EncodingTest, RemindersAndTasks) {
  EXPECT_EQ(Encode(ojson::parse(R"([{"role": "user", "content": "q"},
                                    {"role": "latest_reminder", "content": "It is Monday."}])"),
                   true),
            std::string(kBos) + "<｜User｜>q<｜Assistant｜><think><｜latest_reminder｜>It is Monday.");
  EXPECT_EQ(Encode(ojson::parse(R"([{"role": "user", "content": "ramen", "task": "query"}])"), true),
            std::string(kBos) + "<｜User｜>ramen<｜query｜>");
  EXPECT_EQ(Encode(ojson::parse(R"([{"role": "user", "content": "go", "task": "action"}])"), false),
            std::string(kBos) + "<｜User｜>go<｜Assistant｜></think><｜action｜>");
  // A task's output has no thinking part.
  EXPECT_EQ(Encode(ojson::parse(R"([{"role": "user", "content": "t", "task": "title"},
                                    {"role": "assistant", "content": "T", "reasoning_content": "r"}])"),
                   true),
            std::string(kBos) + "<｜User｜>t<｜title｜>T<｜end▁of▁sentence｜>");
}

TEST(DeepseekV4EncodingTest, TextPartsAreJoined) {
  // The script takes strings; a list of OpenAI text parts is their text.
  const ojson m = ojson::parse(R"([{"role": "system", "content": [{"type": "text", "text": "A"},
      {"type": "text", "text": "B"}]}, {"role": "user", "content": [{"type": "text", "text": "C"}]}])");
  EXPECT_EQ(Encode(m, false), std::string(kBos) + "AB<｜User｜>C<｜Assistant｜></think>");
}

TEST(DeepseekV4EncodingTest, WhatTheReferenceRejectsIsRefused) {
  DeepseekV4EncodeOptions chat;
  const char* bad[] = {
      R"({"role": "user", "content": "not a list"})",
      R"([["not an object"]])",
      R"([{"role": "user", "content": "x"}, {"role": "wizard", "content": "?"}])",  // unknown role
      R"([{"content": "no role"}])",
      R"([{"role": "developer", "content": ""}])",  // a developer message needs content
      R"([{"role": "user", "content": null}])",
      R"([{"role": "user", "content": 7}])",
      R"([{"role": "user", "content": "x", "task": "summarize"}])",  // unknown task
      R"([{"role": "user", "content": "x"}, {"role": "assistant", "content": "", "tool_calls": [{"function":
          {"name": "f", "arguments": "[1, 2]"}}]}])",                // arguments not an object
      R"([{"role": "user", "content": "x"}, {"role": "assistant", "content": "", "tool_calls": [{"function":
          {"arguments": "{}"}}]}])",                                 // no name
      R"([{"role": "user", "content": "x"}, {"role": "assistant", "content": "", "tool_calls": {"a": 1}}])",
      R"([{"role": "user", "content": "x"}, {"role": "assistant", "content": "", "tool_calls": [{"id": 5,
          "function": {"name": "f", "arguments": "{}"}}]}])",  // an id that is not a string
      R"([{"role": "tool", "content": null}])",                // would print None
      R"([{"role": "tool", "content": "r", "tool_call_id": [1]}])",
      R"([{"role": "tool", "content": [7]}])",
      R"([{"role": "user", "content": "x"}, {"role": "latest_reminder"}])",
      R"([{"role": "system", "content": "S", "tools": [{"name": "no function"}]}])",
  };
  for (const char* b : bad) {
    const StatusOr<std::string> s = EncodeDeepseekV4(ojson::parse(b), ojson(), chat);
    EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument) << b;
  }
  const ojson hi = ojson::parse(R"([{"role": "user", "content": "Hi"}])");
  DeepseekV4EncodeOptions low;
  low.reasoning_effort = "low";  // the script takes high and max only
  EXPECT_EQ(EncodeDeepseekV4(hi, ojson(), low).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(EncodeDeepseekV4(hi, ojson::parse(R"({"not": "a list"})"), chat).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(EncodeDeepseekV4(hi, ojson::parse(R"([{"type": "function"}])"), chat).status().code(),
            StatusCode::kInvalidArgument);
  // The refusal names the message.
  const StatusOr<std::string> named =
      EncodeDeepseekV4(ojson::parse(R"([{"role": "user", "content": "x"}, {"role": "developer"}])"), ojson(), chat);
  EXPECT_NE(named.status().message().find("messages[1]"), std::string::npos) << named.status().ToString();
}

TEST(DeepseekV4EncodingTest, NestingPastTheJsonLimitIsRefusedNotThrown) {
  std::string deep = "{\"a\": ";
  for (int i = 0; i < 300; ++i) deep += "[";
  for (int i = 0; i < 300; ++i) deep += "]";
  deep += "}";
  ojson m = ojson::parse(R"([{"role": "user", "content": "x"}, {"role": "assistant", "content": "",
      "tool_calls": [{"function": {"name": "f"}}]}])");
  m[1]["tool_calls"][0]["function"]["arguments"] = deep;
  StatusOr<std::string> s = EncodeDeepseekV4(m, ojson(), DeepseekV4EncodeOptions());
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
}

TEST(DeepseekV4EncodingTest, TheChatTemplateNamedDeepseekV4IsThisEncoding) {
  StatusOr<std::unique_ptr<Tokenizer>> tok =
      Tokenizer::FromDirectory(std::string(FATHOM_TOKENIZER_TEST_DATA) + "/deepseek-v3");
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  StatusOr<std::unique_ptr<ChatTemplate>> chat = ChatTemplate::FromTokenizer(**tok, ChatTemplate::kDeepseekV4);
  ASSERT_TRUE(chat.ok()) << chat.status().ToString();
  EXPECT_TRUE((*chat)->builtin());
  EXPECT_NE((*chat)->source().find("<｜DSML｜tool_calls>"), std::string::npos);
  ChatRequest req;
  req.messages = ojson::parse(R"([{"role": "user", "content": "Hi"}])");
  EXPECT_EQ(*(*chat)->Render(req), std::string(kBos) + "<｜User｜>Hi<｜Assistant｜></think>");
  req.extra = ojson::parse(R"({"thinking": true, "reasoning_effort": "max"})");
  EXPECT_EQ((*chat)->Render(req)->rfind(std::string(kBos) + "Reasoning Effort: ", 0), 0u);
  req.extra = ojson::parse(R"({"thinking": true, "reasoning_effort": "low"})");
  EXPECT_EQ((*chat)->Render(req).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace fathom
