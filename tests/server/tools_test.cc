#include "server/tools.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "grammar/grammar.h"
#include "jinja/template.h"

namespace fathom::server {
namespace {

using Json = nlohmann::ordered_json;

std::string TemplateOf(const std::string& name) {
  std::ifstream in(std::string(FATHOM_TEST_DATA_DIR) + "/tokenizers/" + name + "/tokenizer_config.json");
  std::stringstream ss;
  ss << in.rdbuf();
  return Json::parse(ss.str()).at("chat_template").get<std::string>();
}

// Feeds `text` whole, and one byte at a time, and checks both give the same content and calls.
struct Parsed {
  std::string content;
  std::vector<ToolCall> calls;
  std::vector<ToolCallDelta> deltas;
};

Parsed Parse(ToolFormat format, std::string_view text, size_t piece) {
  int n = 0;
  ToolCallParser p(format, [&n] { return "call_" + std::to_string(n++); });
  Parsed out;
  auto take = [&](ToolDelta d) {
    out.content += d.content;
    for (auto& c : d.calls) out.deltas.push_back(std::move(c));
  };
  for (size_t i = 0; i < text.size(); i += piece) take(p.Push(text.substr(i, piece)));
  take(p.Finish());
  out.calls = p.calls();
  return out;
}

Parsed ParseBoth(ToolFormat format, std::string_view text) {
  Parsed whole = Parse(format, text, text.size() + 1);
  Parsed bytes = Parse(format, text, 1);
  EXPECT_EQ(whole.content, bytes.content) << text;
  EXPECT_EQ(whole.calls.size(), bytes.calls.size()) << text;
  for (size_t i = 0; i < std::min(whole.calls.size(), bytes.calls.size()); ++i) {
    EXPECT_EQ(whole.calls[i].name, bytes.calls[i].name);
    EXPECT_EQ(whole.calls[i].arguments, bytes.calls[i].arguments);
  }
  // The streamed deltas add up to the calls: the first of each carries id and name, the rest its arguments.
  std::vector<ToolCall> joined;
  for (const ToolCallDelta& d : bytes.deltas) {
    if (d.first) {
      EXPECT_EQ(d.index, static_cast<int32_t>(joined.size()));
      joined.push_back({d.id, d.name, d.arguments});
    } else {
      EXPECT_TRUE(d.id.empty() && d.name.empty());
      EXPECT_EQ(d.index + 1, static_cast<int32_t>(joined.size()));
      if (!joined.empty()) joined.back().arguments += d.arguments;
    }
  }
  EXPECT_EQ(joined.size(), bytes.calls.size());
  for (size_t i = 0; i < std::min(joined.size(), bytes.calls.size()); ++i) {
    EXPECT_EQ(joined[i].arguments, bytes.calls[i].arguments);
    EXPECT_EQ(joined[i].id, bytes.calls[i].id);
  }
  return whole;
}

const char* kV3Two =
    "Let me check.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
    "{\"city\": \"Paris\"}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n```json\n"
    "{\"tz\": \"CET\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>";

TEST(ToolCallParserTest, DeepSeekV3CallsWithContentBefore) {
  Parsed p = ParseBoth(ToolFormat::kDeepSeekV3, kV3Two);
  EXPECT_EQ(p.content, "Let me check.");
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_EQ(p.calls[0].name, "get_weather");
  EXPECT_EQ(p.calls[0].arguments, R"({"city": "Paris"})");
  EXPECT_EQ(p.calls[1].name, "get_time");
  EXPECT_EQ(p.calls[1].arguments, R"({"tz": "CET"})");
  EXPECT_EQ(p.calls[0].id, "call_0");
  EXPECT_EQ(p.calls[1].id, "call_1");
}

TEST(ToolCallParserTest, DeepSeekV3StreamsArgumentsAsTheyCome) {
  int n = 0;
  ToolCallParser p(ToolFormat::kDeepSeekV3, [&n] { return "id" + std::to_string(n++); });
  ToolDelta a = p.Push("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{\"a\": ");
  ASSERT_EQ(a.calls.size(), 1u);  // the name, with the first fragment
  EXPECT_TRUE(a.calls[0].first);
  EXPECT_EQ(a.calls[0].name, "f");
  EXPECT_EQ(a.calls[0].arguments, "{\"a\": ");
  ToolDelta b = p.Push("1}\n`");  // the newline and backquote may begin the closing fence: held back
  ASSERT_EQ(b.calls.size(), 1u);
  EXPECT_EQ(b.calls[0].arguments, "1}");
  ToolDelta c = p.Push("``<｜tool▁call▁end｜><｜tool▁calls▁end｜>");
  EXPECT_TRUE(c.calls.empty());
  EXPECT_EQ(p.calls().at(0).arguments, "{\"a\": 1}");
  EXPECT_TRUE(p.Finish().content.empty());
}

TEST(ToolCallParserTest, DeepSeekV31AndPlainText) {
  Parsed p = ParseBoth(ToolFormat::kDeepSeekV31,
                       "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>search<｜tool▁sep｜>{\"q\":\"x\"}<｜tool▁call▁end｜>"
                       "<｜tool▁call▁begin｜>open<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜>");
  EXPECT_EQ(p.content, "");
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_EQ(p.calls[0].name, "search");
  EXPECT_EQ(p.calls[0].arguments, R"({"q":"x"})");
  EXPECT_EQ(p.calls[1].name, "open");
  EXPECT_EQ(p.calls[1].arguments, "{}");
  // Text without calls is content, including a '<' that starts no marker.
  Parsed t = ParseBoth(ToolFormat::kDeepSeekV3, "a < b and <｜tool▁ is not a call");
  EXPECT_EQ(t.content, "a < b and <｜tool▁ is not a call");
  EXPECT_TRUE(t.calls.empty());
}

TEST(ToolCallParserTest, DeepSeekCallCutShortKeepsItsArguments) {
  Parsed p = ParseBoth(ToolFormat::kDeepSeekV3,
                       "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{\"a\": [1, 2");
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].name, "f");
  EXPECT_EQ(p.calls[0].arguments, "{\"a\": [1, 2");
}

// Cut short by max_tokens anywhere in a call, the output never shows the format's markup: a marker cut short is
// dropped, a name cut short is no call, arguments keep the JSON text so far (without a closing fence begun).
TEST(ToolCallParserTest, CallsCutShortLeaveNoMarkup) {
  const std::string v3 = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>";
  Parsed begin = ParseBoth(ToolFormat::kDeepSeekV3, "Let me check.<｜tool▁calls▁beg");
  EXPECT_EQ(begin.content, "Let me check.");
  EXPECT_TRUE(begin.calls.empty());
  // A split character: the marker cut inside a 3-byte "▁".
  Parsed split = ParseBoth(ToolFormat::kDeepSeekV3, "Sure<｜tool\xe2\x96");
  EXPECT_EQ(split.content, "Sure");
  // The detokenizer's U+FFFD for a character cut inside its bytes, after the marker's start.
  // (It arrives whole, as the detokenizer's last delta: not byte by byte.)
  for (const std::string second : {"<｜tool▁calls▁begin｜><｜tool▁call▁begin\xEF\xBF\xBD", "Sure<\xEF\xBF\xBD"}) {
    Parsed replaced = Parse(ToolFormat::kDeepSeekV3, second, second.size() + 1);
    EXPECT_EQ(replaced.content, second[0] == 'S' ? "Sure" : "") << second;
    EXPECT_TRUE(replaced.calls.empty());
    int n = 0;
    ToolCallParser p(ToolFormat::kDeepSeekV3, [&n] { return "call_" + std::to_string(n++); });
    const size_t cut = second.size() - 3;
    std::string content = p.Push(second.substr(0, cut)).content;
    content += p.Push(second.substr(cut)).content;
    content += p.Finish().content;
    EXPECT_EQ(content, second[0] == 'S' ? "Sure" : "") << second;
  }
  Parsed lone = ParseBoth(ToolFormat::kDeepSeekV3, "a <");  // a lone '<' is as likely text: kept
  EXPECT_EQ(lone.content, "a <");
  Parsed second = ParseBoth(ToolFormat::kDeepSeekV3, "<｜tool▁calls▁begin｜><｜tool▁call▁beg");
  EXPECT_EQ(second.content, "");
  EXPECT_TRUE(second.calls.empty());
  Parsed name = ParseBoth(ToolFormat::kDeepSeekV3, v3 + "ge");
  EXPECT_EQ(name.content, "");
  EXPECT_TRUE(name.calls.empty());
  for (const char* tail : {"\n```<｜", "\n```<｜tool▁call▁e", "\n``", "\n"}) {
    Parsed args = ParseBoth(ToolFormat::kDeepSeekV3, v3 + "get_weather\n```json\n{\"city\": \"Paris\"}" + tail);
    ASSERT_EQ(args.calls.size(), 1u) << tail;
    EXPECT_EQ(args.calls[0].name, "get_weather");
    EXPECT_EQ(args.calls[0].arguments, "{\"city\": \"Paris\"}") << tail;
    EXPECT_EQ(args.content, "");
  }
  const std::string replaced_end = v3 + "get_weather\n```json\n{\"a\": 1}\n```<\xEF\xBF\xBD";  // whole, as delivered
  Parsed replaced_args = Parse(ToolFormat::kDeepSeekV3, replaced_end, replaced_end.size() + 1);
  ASSERT_EQ(replaced_args.calls.size(), 1u);
  EXPECT_EQ(replaced_args.calls[0].arguments, "{\"a\": 1}");
  Parsed fence = ParseBoth(ToolFormat::kDeepSeekV3, v3 + "get_weather\n```js");
  ASSERT_EQ(fence.calls.size(), 1u);
  EXPECT_EQ(fence.calls[0].arguments, "");
  Parsed v31 = ParseBoth(ToolFormat::kDeepSeekV31, "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_wea");
  EXPECT_TRUE(v31.calls.empty());
  EXPECT_EQ(v31.content, "");
  Parsed v31_args = ParseBoth(ToolFormat::kDeepSeekV31,
                              "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{\"a\": 1}<｜tool▁ca");
  ASSERT_EQ(v31_args.calls.size(), 1u);
  EXPECT_EQ(v31_args.calls[0].arguments, "{\"a\": 1}");
  // After the calls, a second block cut short.
  Parsed after = ParseBoth(ToolFormat::kDeepSeekV3, std::string(kV3Two) + " ok<｜tool▁calls");
  EXPECT_EQ(after.calls.size(), 2u);
  EXPECT_EQ(after.content, "Let me check. ok");
  // hermes: the call so far where its name is complete, else nothing.
  Parsed h = ParseBoth(ToolFormat::kHermes,
                       "I'll look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Par");
  EXPECT_EQ(h.content, "I'll look.\n");
  ASSERT_EQ(h.calls.size(), 1u);
  EXPECT_EQ(h.calls[0].name, "get_weather");
  EXPECT_EQ(h.calls[0].arguments, "{\"city\": \"Par");
  Parsed h_name = ParseBoth(ToolFormat::kHermes, "ok <tool_call>\n{\"name\": \"get_w");
  EXPECT_EQ(h_name.content, "ok ");
  EXPECT_TRUE(h_name.calls.empty());
  Parsed h_tag = ParseBoth(ToolFormat::kHermes, "ok <tool_c");
  EXPECT_EQ(h_tag.content, "ok ");
  EXPECT_TRUE(h_tag.calls.empty());
}

TEST(ToolCallParserTest, Hermes) {
  Parsed p = ParseBoth(ToolFormat::kHermes,
                       "I'll look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}\n"
                       "</tool_call>\n<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>");
  EXPECT_EQ(p.content, "I'll look.\n");
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_EQ(p.calls[0].name, "get_weather");
  EXPECT_EQ(p.calls[0].arguments, R"({"city":"Rome"})");
  EXPECT_EQ(p.calls[1].arguments, "{}");
  // A body that is not a call stays content, markers and all.
  Parsed bad = ParseBoth(ToolFormat::kHermes, "x<tool_call>{not json}</tool_call>y");
  EXPECT_EQ(bad.content, "x<tool_call>{not json}</tool_call>y");
  EXPECT_TRUE(bad.calls.empty());
  // The closing tag never came: a complete object is still a call.
  Parsed open = ParseBoth(ToolFormat::kHermes, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"k\": 1}}\n");
  ASSERT_EQ(open.calls.size(), 1u);
  EXPECT_EQ(open.calls[0].arguments, R"({"k":1})");
}

// The model's text is bounded like a client's JSON before it is parsed as a call: arguments nested 100,000 deep
// stay content (a recursive dump of them would overflow the stack).
TEST(ToolCallParserTest, HermesCallNestedTooDeepStaysContent) {
  const std::string text = "<tool_call>\n{\"name\": \"f\", \"arguments\": " + std::string(100000, '[') +
                           std::string(100000, ']') + "}\n</tool_call>";
  Parsed p = Parse(ToolFormat::kHermes, text, text.size() + 1);
  EXPECT_TRUE(p.calls.empty());
  EXPECT_EQ(p.content, text);
}

TEST(ToolCallParserTest, Llama3Json) {
  Parsed p = ParseBoth(ToolFormat::kLlama3Json,
                       "<|python_tag|>{\"name\": \"a\", \"parameters\": {\"x\": \"1;2\"}}; {\"name\": \"b\", "
                       "\"parameters\": {}}");
  EXPECT_EQ(p.content, "");
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_EQ(p.calls[0].name, "a");
  EXPECT_EQ(p.calls[0].arguments, R"({"x":"1;2"})");
  EXPECT_EQ(p.calls[1].name, "b");
  Parsed text = ParseBoth(ToolFormat::kLlama3Json, "The answer is {42}.");
  EXPECT_EQ(text.content, "The answer is {42}.");
  EXPECT_TRUE(text.calls.empty());
  Parsed braces = ParseBoth(ToolFormat::kLlama3Json, "{not a call}");
  EXPECT_EQ(braces.content, "{not a call}");
  EXPECT_TRUE(braces.calls.empty());
}

// DeepSeek-V3.2's DSML, as its encoding writes calls (tokenizer/deepseek_v32_encoding.h): parameters become a JSON
// object, strings raw (string="true") and other values as the JSON the model wrote.
const char* kDsmlTwo =
    "Let me check.\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"get_weather\">\n"
    "<｜DSML｜parameter name=\"city\" string=\"true\">São \"Paulo\"\\n</｜DSML｜parameter>\n"
    "<｜DSML｜parameter name=\"days\" string=\"false\">2</｜DSML｜parameter>\n"
    "<｜DSML｜parameter name=\"opts\" string=\"false\">{\"a\": [1, true]}</｜DSML｜parameter>\n</｜DSML｜invoke>\n"
    "<｜DSML｜invoke name=\"get_time\">\n\n</｜DSML｜invoke>\n</｜DSML｜function_calls>";

TEST(ToolCallParserTest, DeepSeekV32DsmlCalls) {
  Parsed p = ParseBoth(ToolFormat::kDeepSeekV32, kDsmlTwo);
  EXPECT_EQ(p.content, "Let me check.");  // the blank line before the block is the format's, not the answer's
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_EQ(p.calls[0].name, "get_weather");
  EXPECT_EQ(p.calls[0].arguments, R"({"city": "São \"Paulo\"\\n", "days": 2, "opts": {"a": [1, true]}})");
  EXPECT_EQ(Json::parse(p.calls[0].arguments)["city"], "São \"Paulo\"\\n");
  EXPECT_EQ(p.calls[1].name, "get_time");
  EXPECT_EQ(p.calls[1].arguments, "{}");
  // Streamed a parameter at a time: the name first, then each complete parameter.
  int n = 0;
  ToolCallParser s(ToolFormat::kDeepSeekV32, [&n] { return "id" + std::to_string(n++); });
  ToolDelta a =
      s.Push("Hi\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"k\" str");
  EXPECT_EQ(a.content, "Hi");
  ASSERT_EQ(a.calls.size(), 1u);
  EXPECT_EQ(a.calls[0].name, "f");
  EXPECT_EQ(a.calls[0].arguments, "");
  ToolDelta b = s.Push("ing=\"false\">[1,2]</｜DSML｜parameter>\n<｜DSML｜para");
  ASSERT_EQ(b.calls.size(), 1u);
  EXPECT_EQ(b.calls[0].arguments, "{\"k\": [1,2]");
  ToolDelta c = s.Push("meter name=\"x\" string=\"false\">not json</｜DSML｜parameter>\n</｜DSML｜invoke>");
  ASSERT_EQ(c.calls.size(), 1u);
  EXPECT_EQ(c.calls[0].arguments, ", \"x\": \"not json\"}");  // not JSON: kept as a string, not lost
  EXPECT_TRUE(s.Push("\n</｜DSML｜function_calls>").content.empty());
  EXPECT_TRUE(s.Finish().content.empty());
  EXPECT_EQ(Json::parse(s.calls().at(0).arguments), Json::parse(R"({"k": [1, 2], "x": "not json"})"));
  // Blank lines that no block follows are the answer's; text that only looks like DSML is content.
  Parsed text = ParseBoth(ToolFormat::kDeepSeekV32, "a\n\nb <｜DSML｜ c\n\n");
  EXPECT_EQ(text.content, "a\n\nb <｜DSML｜ c\n\n");
  EXPECT_TRUE(text.calls.empty());
}

// Cut short by max_tokens, a DSML call keeps the parameters that were complete; a name or marker cut short leaves
// nothing, not even the blank line before it.
TEST(ToolCallParserTest, DeepSeekV32CutShortLeavesNoMarkup) {
  const std::string head = "Ok\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"f\">\n";
  for (const std::string tail : {"", "<｜DSML｜param", "<｜DSML｜parameter name=\"b\" string=\"true\">par",
                                 "<｜DSML｜parameter name=\"b\" string=\"true\">x</｜DSML｜param", "</｜DSML｜inv"}) {
    Parsed p = ParseBoth(ToolFormat::kDeepSeekV32,
                         head + "<｜DSML｜parameter name=\"a\" string=\"false\">1</｜DSML｜parameter>\n" + tail);
    EXPECT_EQ(p.content, "Ok") << tail;
    ASSERT_EQ(p.calls.size(), 1u) << tail;
    EXPECT_EQ(p.calls[0].arguments, "{\"a\": 1") << tail;
  }
  for (const char* text :
       {"Ok\n\n<｜DSML｜func", "Ok\n\n<｜DS", "Ok\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"ge"}) {
    Parsed p = ParseBoth(ToolFormat::kDeepSeekV32, text);
    EXPECT_EQ(p.content, "Ok") << text;
    EXPECT_TRUE(p.calls.empty()) << text;
  }
}

// DeepSeek-V4 writes the same DSML in <｜DSML｜tool_calls> blocks (tokenizer/deepseek_v4_encoding.h).
TEST(ToolCallParserTest, DeepSeekV4DsmlCalls) {
  std::string v4 = kDsmlTwo;
  for (const std::string_view name : {"<｜DSML｜function_calls>", "</｜DSML｜function_calls>"}) {
    v4.replace(v4.find(name), name.size(), name[1] == '/' ? "</｜DSML｜tool_calls>" : "<｜DSML｜tool_calls>");
  }
  Parsed p = ParseBoth(ToolFormat::kDeepSeekV4, v4);
  EXPECT_EQ(p.content, "Let me check.");
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_EQ(p.calls[0].name, "get_weather");
  EXPECT_EQ(p.calls[0].arguments, R"({"city": "São \"Paulo\"\\n", "days": 2, "opts": {"a": [1, true]}})");
  EXPECT_EQ(p.calls[1].name, "get_time");
  EXPECT_EQ(p.calls[1].arguments, "{}");
  // Each format reads its own block only.
  EXPECT_TRUE(ParseBoth(ToolFormat::kDeepSeekV32, v4).calls.empty());
  EXPECT_TRUE(ParseBoth(ToolFormat::kDeepSeekV4, kDsmlTwo).calls.empty());
  // Cut short: the complete parameters stay, no markup shows.
  const std::string head = "Ok\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n";
  for (const std::string tail : {"", "<｜DSML｜param", "</｜DSML｜inv"}) {
    Parsed cut = ParseBoth(ToolFormat::kDeepSeekV4,
                           head + "<｜DSML｜parameter name=\"a\" string=\"false\">1</｜DSML｜parameter>\n" + tail);
    EXPECT_EQ(cut.content, "Ok") << tail;
    ASSERT_EQ(cut.calls.size(), 1u) << tail;
    EXPECT_EQ(cut.calls[0].arguments, "{\"a\": 1") << tail;
  }
  for (const char* text : {"Ok\n\n<｜DSML｜tool_ca", "Ok\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"ge"}) {
    Parsed cut = ParseBoth(ToolFormat::kDeepSeekV4, text);
    EXPECT_EQ(cut.content, "Ok") << text;
    EXPECT_TRUE(cut.calls.empty()) << text;
  }
}

TEST(ToolFormatTest, DetectedFromTheTemplatesAndNamedByTheFlag) {
  EXPECT_EQ(DetectToolFormat(TemplateOf("deepseek-v3"), nullptr), ToolFormat::kDeepSeekV3);
  EXPECT_EQ(DetectToolFormat(TemplateOf("qwen3"), nullptr), ToolFormat::kHermes);
  EXPECT_EQ(DetectToolFormat("{{ '<｜tool▁call▁begin｜>' + tool['function']['name'] + '<｜tool▁sep｜>' }}", nullptr),
            ToolFormat::kDeepSeekV31);
  EXPECT_EQ(DetectToolFormat("{{ '<|python_tag|>' }}", nullptr), ToolFormat::kLlama3Json);
  EXPECT_EQ(DetectToolFormat("writes calls in <｜DSML｜function_calls> blocks", nullptr), ToolFormat::kDeepSeekV32);
  EXPECT_EQ(DetectToolFormat("writes calls in <｜DSML｜tool_calls> blocks", nullptr), ToolFormat::kDeepSeekV4);
  EXPECT_EQ(DetectToolFormat(TemplateOf("llama-3.1"), nullptr), ToolFormat::kNone);  // this one shows no tools
  EXPECT_EQ(ParseToolCallParser("deepseek_v3").value(), ToolFormat::kDeepSeekV3);
  EXPECT_EQ(ParseToolCallParser("deepseek_v32").value(), ToolFormat::kDeepSeekV32);
  EXPECT_EQ(ParseToolCallParser("deepseek_v4").value(), ToolFormat::kDeepSeekV4);
  EXPECT_EQ(ParseToolCallParser("qwen25").value(), ToolFormat::kHermes);
  EXPECT_FALSE(ParseToolCallParser("auto").value().has_value());
  EXPECT_FALSE(ParseToolCallParser("mistral").ok());
}

ToolsSpec WeatherTools(ToolsSpec::Choice choice = ToolsSpec::Choice::kAuto) {
  ToolsSpec spec;
  spec.tools = Json::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                     "additionalProperties": false}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}])");
  spec.choice = choice;
  return spec;
}

std::string RenderDeepSeek(const ChatRequest& cr) {
  auto t = jinja::Template::Parse(TemplateOf("deepseek-v3"), "default");
  EXPECT_TRUE(t.ok());
  jinja::Value ctx = jinja::Value::MakeObject();
  ctx.as_object().Set("bos_token", jinja::Value(std::string("<BOS>")));
  ctx.as_object().Set("messages", jinja::Value::FromJson(cr.messages));
  ctx.as_object().Set("tools", jinja::Value::FromJson(cr.tools));
  ctx.as_object().Set("add_generation_prompt", jinja::Value(true));
  auto text = (*t)->Render(ctx);
  EXPECT_TRUE(text.ok()) << text.status().ToString();
  return text.ok() ? *text : "";
}

TEST(ToolPromptTest, DeepSeekTemplateGetsToolsInTheSystemPromptAndRendersTheHistory) {
  ChatRequest cr;
  cr.messages = Json::parse(R"([
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function",
      "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "18C"}])");
  const std::string source = TemplateOf("deepseek-v3");
  ASSERT_TRUE(PrepareToolPrompt(ToolFormat::kDeepSeekV3, source, WeatherTools(), &cr).ok());
  EXPECT_TRUE(cr.tools.is_null());  // this template does not read `tools`: they went into the system prompt
  const std::string system = cr.messages[0].at("content").get<std::string>();
  EXPECT_EQ(system.rfind("Be brief.\n\n## Tools\n", 0), 0u) << system;
  EXPECT_NE(system.find("### get_weather\nDescription: Weather of a city\n\nParameters: {\"type\":\"object\""),
            std::string::npos);
  EXPECT_TRUE(cr.messages[2].at("content").is_null());  // empty content: null, so that the template writes the calls
  const std::string text = RenderDeepSeek(cr);
  EXPECT_NE(text.find("<｜User｜>Weather in Paris?<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function"
                      "<｜tool▁sep｜>get_weather\n```json\n{\"city\":\"Paris\"}\n```<｜tool▁call▁end｜>"
                      "<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>18C<｜tool▁output▁end｜><｜tool▁outputs▁end｜>"),
            std::string::npos)
      << text;
  // tool_choice none: no tools in the prompt.
  ChatRequest none;
  none.messages = Json::parse(R"([{"role": "user", "content": "hi"}])");
  ASSERT_TRUE(PrepareToolPrompt(ToolFormat::kDeepSeekV3, source, WeatherTools(ToolsSpec::Choice::kNone), &none).ok());
  EXPECT_EQ(none.messages.size(), 1u);
}

TEST(ToolPromptTest, TemplatesThatReadToolsGetThemAndOthersGetTextAndRoles) {
  ChatRequest cr;
  cr.messages = Json::parse(R"([{"role": "user", "content": "q"}])");
  ASSERT_TRUE(PrepareToolPrompt(ToolFormat::kHermes, TemplateOf("qwen3"), WeatherTools(), &cr).ok());
  EXPECT_EQ(cr.tools, WeatherTools().tools);
  EXPECT_EQ(cr.messages.size(), 1u);
  // A template with neither tools, tool_calls nor a tool role (this Llama 3.1 one).
  ChatRequest plain;
  plain.messages = Json::parse(R"([
    {"role": "user", "content": "q"},
    {"role": "assistant", "content": null, "tool_calls": [{"id": "c", "type": "function",
      "function": {"name": "get_time", "arguments": "{}"}}]},
    {"role": "tool", "content": "noon"}])");
  ASSERT_TRUE(PrepareToolPrompt(ToolFormat::kLlama3Json, TemplateOf("llama-3.1"), WeatherTools(), &plain).ok());
  ASSERT_EQ(plain.messages.size(), 4u);
  EXPECT_EQ(plain.messages[0].at("role"), "system");
  EXPECT_NE(plain.messages[0].at("content").get<std::string>().find("\"name\": \"get_weather\""), std::string::npos);
  EXPECT_EQ(plain.messages[2].at("content"), R"({"name": "get_time", "parameters": {}})");
  EXPECT_FALSE(plain.messages[2].contains("tool_calls"));
  EXPECT_EQ(plain.messages[3].at("role"), "ipython");
  // No known format: tools are refused with the flag to pass.
  ChatRequest unknown;
  unknown.messages = Json::parse(R"([{"role": "user", "content": "q"}])");
  Status s = PrepareToolPrompt(ToolFormat::kNone, TemplateOf("llama-3.1"), WeatherTools(), &unknown);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("--tool-call-parser"), std::string::npos);
  // DSML (--tool-call-parser deepseek_v32) under a template without tool_calls: the calls as V3.2's encoding writes
  // them after the content, and arguments that are not an object (DSML writes their values) refused by name.
  ChatRequest dsml;
  dsml.messages = Json::parse(R"([
    {"role": "user", "content": "q"},
    {"role": "assistant", "content": "Sure.", "tool_calls": [{"id": "c", "type": "function",
      "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}]}])");
  Json bad = dsml.messages;
  ASSERT_TRUE(PrepareToolPrompt(ToolFormat::kDeepSeekV32, TemplateOf("llama-3.1"), WeatherTools(), &dsml).ok());
  EXPECT_EQ(
      dsml.messages[2].at("content"),
      "Sure.\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"get_weather\">\n<｜DSML｜parameter name=\"city\" "
      "string=\"true\">Oslo</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜function_calls>");
  EXPECT_FALSE(dsml.messages[2].contains("tool_calls"));
  bad[1]["tool_calls"][0]["function"]["arguments"] = "[1]";
  ChatRequest refused;
  refused.messages = bad;
  s = PrepareToolPrompt(ToolFormat::kDeepSeekV32, TemplateOf("llama-3.1"), WeatherTools(), &refused);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("tool_calls"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("not a JSON object"), std::string::npos) << s.message();
  // DeepSeek-V4's (--tool-call-parser deepseek_v4): its own tools section and block.
  ChatRequest v4;
  v4.messages = bad;
  v4.messages[1]["tool_calls"][0]["function"]["arguments"] = "{\"city\": \"Oslo\"}";
  ASSERT_TRUE(PrepareToolPrompt(ToolFormat::kDeepSeekV4, TemplateOf("llama-3.1"), WeatherTools(), &v4).ok());
  EXPECT_NE(v4.messages[0].at("content").get<std::string>().find("### Available Tool Schemas\n\n{\"name\": "
                                                                 "\"get_weather\""),
            std::string::npos)
      << v4.messages[0].dump();
  EXPECT_EQ(v4.messages[2].at("content"),
            "Sure.\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n<｜DSML｜parameter name=\"city\" "
            "string=\"true\">Oslo</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>");
}

std::shared_ptr<const grammar::CompiledGrammar> CompileTools(ToolFormat f, const ToolsSpec& spec) {
  auto g = ToolCallGrammar(f, spec);
  EXPECT_TRUE(g.ok()) << g.status().ToString();
  if (!g.ok()) return nullptr;
  auto c = grammar::Compile(*g, {});
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.ok() ? *c : nullptr;
}

TEST(ToolGrammarTest, RequiredAndNamedCallsInEachFormat) {
  for (ToolFormat f : {ToolFormat::kDeepSeekV3, ToolFormat::kDeepSeekV31, ToolFormat::kDeepSeekV32,
                       ToolFormat::kDeepSeekV4, ToolFormat::kHermes, ToolFormat::kLlama3Json}) {
    SCOPED_TRACE(std::string(ToolFormatName(f)));
    const Json weather = Json::parse(R"([{"function": {"name": "get_weather", "arguments": "{\"city\":\"Oslo\"}"}}])");
    const Json two = Json::parse(R"([{"function": {"name": "get_weather", "arguments": "{\"city\":\"Oslo\"}"}},
                                     {"function": {"name": "get_time", "arguments": "{}"}}])");
    const Json bad_args = Json::parse(R"([{"function": {"name": "get_weather", "arguments": "{\"town\":\"Oslo\"}"}}])");
    const Json bad_name = Json::parse(R"([{"function": {"name": "get_wind", "arguments": "{}"}}])");
    auto required = CompileTools(f, WeatherTools(ToolsSpec::Choice::kRequired));
    ASSERT_NE(required, nullptr);
    EXPECT_TRUE(grammar::Matches(*required, FormatToolCalls(f, weather)));
    EXPECT_TRUE(grammar::Matches(*required, FormatToolCalls(f, two)));
    EXPECT_FALSE(grammar::Matches(*required, FormatToolCalls(f, bad_args)));
    EXPECT_FALSE(grammar::Matches(*required, FormatToolCalls(f, bad_name)));
    EXPECT_FALSE(grammar::Matches(*required, "Sure, here you go."));
    // The text the grammar allows parses back into the same calls.
    Parsed back = ParseBoth(f, FormatToolCalls(f, two));
    ASSERT_EQ(back.calls.size(), 2u);
    EXPECT_EQ(back.calls[1].name, "get_time");
    EXPECT_EQ(back.content, "");

    ToolsSpec one = WeatherTools(ToolsSpec::Choice::kRequired);
    one.parallel = false;
    auto single = CompileTools(f, one);
    EXPECT_TRUE(grammar::Matches(*single, FormatToolCalls(f, weather)));
    EXPECT_FALSE(grammar::Matches(*single, FormatToolCalls(f, two)));

    ToolsSpec named = WeatherTools(ToolsSpec::Choice::kNamed);
    named.name = "get_time";
    auto time = CompileTools(f, named);
    EXPECT_TRUE(grammar::Matches(*time, FormatToolCalls(f, Json::parse(R"([{"function": {"name": "get_time",
                                                                           "arguments": "{}"}}])"))));
    EXPECT_FALSE(grammar::Matches(*time, FormatToolCalls(f, weather)));
  }
  ToolsSpec refused = WeatherTools(ToolsSpec::Choice::kRequired);
  refused.tools[1]["function"]["parameters"] = Json::parse(R"({"type": "object", "not": {}})");
  for (ToolFormat f : {ToolFormat::kDeepSeekV3, ToolFormat::kDeepSeekV32}) {
    auto g = ToolCallGrammar(f, refused);
    ASSERT_FALSE(g.ok());
    EXPECT_NE(g.status().message().find("tool 'get_time'"), std::string::npos) << g.status().message();
    EXPECT_NE(g.status().message().find("'not'"), std::string::npos) << g.status().message();
  }
}

// DSML parameters under a forced call: one line a property in the schema's order, required ones always; strings raw
// (string="true", a length bound or an enum kept), other values JSON by their own schema, $refs into the document
// resolved.
TEST(ToolGrammarTest, DeepSeekV32ParametersFollowTheSchema) {
  ToolsSpec spec;
  spec.choice = ToolsSpec::Choice::kRequired;
  spec.parallel = false;
  spec.tools = Json::parse(R"([{"type": "function", "function": {"name": "plan", "parameters": {
      "type": "object", "$defs": {"d": {"type": "integer", "minimum": 1, "maximum": 7}},
      "properties": {"city": {"type": "string", "maxLength": 6}, "unit": {"enum": ["c", "f"]},
                     "days": {"$ref": "#/$defs/d"}, "tags": {"type": "array", "items": {"type": "string"}}},
      "required": ["city"]}}}])");
  auto g = CompileTools(ToolFormat::kDeepSeekV32, spec);
  ASSERT_NE(g, nullptr);
  const auto call = [](const std::string& args) {
    return FormatToolCalls(ToolFormat::kDeepSeekV32,
                           Json::array({Json{{"function", Json{{"name", "plan"}, {"arguments", args}}}}}));
  };
  EXPECT_TRUE(grammar::Matches(*g, call(R"({"city": "Lisboa"})")));
  EXPECT_TRUE(grammar::Matches(*g, call(R"({"city": "Porto", "unit": "c", "days": 7, "tags": ["a", "b"]})")));
  EXPECT_TRUE(grammar::Matches(*g, call(R"({"city": "", "tags": []})")));
  EXPECT_FALSE(grammar::Matches(*g, call(R"({"city": "Coimbra"})")));             // 7 characters
  EXPECT_FALSE(grammar::Matches(*g, call(R"({"city": "Porto", "days": 8})")));    // past the $ref's maximum
  EXPECT_FALSE(grammar::Matches(*g, call(R"({"city": "Porto", "unit": "k"})")));  // not in the enum
  EXPECT_FALSE(grammar::Matches(*g, call(R"({"days": 2, "city": "Porto"})")));    // out of the schema's order
  EXPECT_FALSE(grammar::Matches(*g, call(R"({"unit": "c"})")));                   // city is required
  EXPECT_FALSE(grammar::Matches(*g, call(R"({"city": "a<b"})")));                 // no '<' in a raw value
  EXPECT_FALSE(grammar::Matches(*g, call(R"({"city": "Porto", "tags": "a"})")));  // not an array
  // The text it allows parses back to the arguments.
  Parsed back = ParseBoth(ToolFormat::kDeepSeekV32, call(R"({"city": "Porto", "days": 3, "tags": ["x"]})"));
  ASSERT_EQ(back.calls.size(), 1u);
  EXPECT_EQ(back.calls[0].arguments, R"({"city": "Porto", "days": 3, "tags": ["x"]})");
}

}  // namespace
}  // namespace fathom::server
