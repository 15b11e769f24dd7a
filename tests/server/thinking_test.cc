// A request's `thinking` (DeepSeek's API) through a running server's /tokenize, which renders a chat request as
// generation does: on a template with a thinking switch (Qwen3's enable_thinking) it drives the switch; on one without
// (DeepSeek-V3's) {"type": "enabled"} is a 400 that says so; on one that always opens <think> (R1's form)
// {"type": "disabled"} is. An unknown field is ignored and logged once.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "loopback.h"
#include "server/server.h"
#include "testing/temp_dir.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace fathom::server {
namespace {

namespace fs = std::filesystem;

// A server over `dir`'s tokenizer and chat template, with no engine: /tokenize needs none.
struct TemplateServer {
  std::unique_ptr<Tokenizer> tok;
  std::unique_ptr<ChatTemplate> chat;
  std::unique_ptr<OpenAiServer> srv;

  explicit TemplateServer(const std::string& dir, const std::string& template_name = "") {
    auto t = Tokenizer::FromDirectory(dir);
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    tok = std::move(t).value();
    auto c = ChatTemplate::FromTokenizer(*tok, template_name);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    chat = std::move(c).value();
    ServerOptions o;
    o.http.port = 0;
    o.access_log = "";
    srv = std::make_unique<OpenAiServer>(o);
    srv->Attach({.tokenizer = tok.get(), .chat = chat.get(), .vocab_size = static_cast<int64_t>(tok->vocab_size())});
    EXPECT_TRUE(srv->Start().ok());
  }
  ~TemplateServer() { srv->Stop(); }

  // POST /tokenize with `fields` added to a one-message chat: the status and the body.
  std::pair<int, nlohmann::json> Tokenize(const std::string& fields) const {
    const std::string body = R"({"messages":[{"role":"user","content":"hi"}])" + fields + "}";
    const std::string r = Exchange(srv->port(),
                                   "POST /tokenize HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                                   "Content-Type: application/json\r\nContent-Length: " +
                                       std::to_string(body.size()) + "\r\n\r\n" + body);
    const int status = std::stoi(r.substr(9, 3));
    return {status, nlohmann::json::parse(r.substr(r.find("\r\n\r\n") + 4), nullptr, false)};
  }
  // The prompt text /tokenize rendered.
  std::string Prompt(const std::string& fields) const {
    auto [status, body] = Tokenize(fields);
    EXPECT_EQ(status, 200) << body.dump();
    const std::vector<int32_t> ids = body.value("tokens", std::vector<int32_t>{});
    return tok->Decode(ids, /*skip_special_tokens=*/false);
  }
};

const std::string kTokenizers = std::string(FATHOM_TOKENIZER_TEST_DATA) + "/";  // unpacked (tests/tokenizer)

TEST(ThinkingTest, DrivesTheTemplatesSwitch) {
  TemplateServer s(kTokenizers + "qwen3");
  // Qwen3 writes an empty think block when enable_thinking is false.
  EXPECT_NE(s.Prompt(R"(,"thinking":{"type":"disabled"})").find("<think>\n\n</think>"), std::string::npos);
  EXPECT_EQ(s.Prompt(R"(,"thinking":{"type":"enabled"})").find("</think>"), std::string::npos);
  EXPECT_EQ(s.Prompt("").find("</think>"), std::string::npos);
  // chat_template_kwargs may say the same; saying the opposite is a 400 naming `thinking`.
  EXPECT_NE(
      s.Prompt(R"(,"thinking":{"type":"disabled"},"chat_template_kwargs":{"enable_thinking":false})").find("</think>"),
      std::string::npos);
  auto [status, body] =
      s.Tokenize(R"(,"thinking":{"type":"disabled"},"chat_template_kwargs":{"enable_thinking":true})");
  EXPECT_EQ(status, 400);
  EXPECT_EQ(body["error"]["param"], "thinking") << body.dump();
}

TEST(ThinkingTest, AModelWithoutThinkingRefusesEnabled) {
  TemplateServer s(kTokenizers + "deepseek-v3");
  auto [status, body] = s.Tokenize(R"(,"thinking":{"type":"enabled"})");
  EXPECT_EQ(status, 400);
  EXPECT_EQ(body["error"]["param"], "thinking");
  EXPECT_NE(body["error"]["message"].get<std::string>().find("no thinking mode"), std::string::npos) << body.dump();
  EXPECT_EQ(s.Tokenize(R"(,"thinking":{"type":"disabled"})").first, 200);
  auto [bad, bad_body] = s.Tokenize(R"(,"thinking":{"type":"sometimes"})");
  EXPECT_EQ(bad, 400);
  EXPECT_EQ(bad_body["error"]["param"], "thinking.type");
}

TEST(ThinkingTest, AModelThatAlwaysThinksRefusesDisabled) {
  // DeepSeek-V3's tokenizer with R1's generation prompt: "<｜Assistant｜><think>\n".
  testing::TempDir dir("fathom-thinking-");
  const std::string src = kTokenizers + "deepseek-v3";
  fs::copy_file(src + "/tokenizer.json", dir.file("tokenizer.json"));
  nlohmann::ordered_json config = nlohmann::ordered_json::parse(std::ifstream(src + "/tokenizer_config.json"));
  std::string tmpl = config["chat_template"];
  const std::string assistant = "{{'<｜Assistant｜>'}}{% endif %}";
  ASSERT_NE(tmpl.rfind(assistant), std::string::npos);
  tmpl.replace(tmpl.rfind(assistant), assistant.size(), "{{'<｜Assistant｜><think>\\n'}}{% endif %}");
  config["chat_template"] = tmpl;
  std::ofstream(dir.file("tokenizer_config.json")) << config.dump();
  TemplateServer s(dir.path());
  EXPECT_NE(s.Prompt(R"(,"thinking":{"type":"enabled"})").find("<think>"), std::string::npos);
  auto [status, body] = s.Tokenize(R"(,"thinking":{"type":"disabled"})");
  EXPECT_EQ(status, 400);
  EXPECT_NE(body["error"]["message"].get<std::string>().find("always thinks"), std::string::npos) << body.dump();
}

// DeepSeek-V3.2's built-in encoding (its checkpoints ship no template) over DeepSeek-V3's tokenizer: `thinking`
// drives its thinking mode (the prompt then opens <think>, and such a request's output is reasoning first: Reasons),
// chat_template_kwargs.thinking does the same, and tools go into its system prompt as the encoding lists them, with
// earlier calls and their results in DSML.
TEST(ThinkingTest, DeepseekV32EncodingFollowsThinking) {
  TemplateServer s(kTokenizers + "deepseek-v3", ChatTemplate::kDeepseekV32);
  const std::string on = s.Prompt(R"(,"thinking":{"type":"enabled"})");
  const std::string off = s.Prompt(R"(,"thinking":{"type":"disabled"})");
  EXPECT_EQ(on, "<｜begin▁of▁sentence｜><｜User｜>hi<｜Assistant｜><think>");
  EXPECT_EQ(off, "<｜begin▁of▁sentence｜><｜User｜>hi<｜Assistant｜></think>");
  EXPECT_EQ(s.Prompt(""), off);  // chat mode unless asked
  EXPECT_EQ(s.Prompt(R"(,"chat_template_kwargs":{"thinking":true})"), on);
  const std::string tools = s.Prompt(
      R"(,"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{}}}}])");
  EXPECT_EQ(tools.rfind("<｜begin▁of▁sentence｜>\n\n## Tools\n\n", 0), 0u) << tools;
  EXPECT_NE(tools.find("<functions>\n{\"name\": \"f\", \"parameters\": {\"type\": \"object\", \"properties\": {}}}\n"
                       "</functions>\n<｜User｜>hi<｜Assistant｜></think>"),
            std::string::npos)
      << tools;
}

// `reasoning_effort` (DeepSeek-V4's API) reaches V4's built-in encoding: low, medium and high are its "high" (which
// adds nothing), xhigh and max its "max" (its effort prompt first); an effort asks for thinking unless the request says
// otherwise, and contradicting it is a 400 naming the field. A template that reads no effort refuses it.
TEST(ThinkingTest, ReasoningEffortReachesDeepseekV4Encoding) {
  TemplateServer s(kTokenizers + "deepseek-v3", ChatTemplate::kDeepseekV4);
  const std::string thinking = s.Prompt(R"(,"thinking":{"type":"enabled"})");
  EXPECT_EQ(thinking.find("Reasoning Effort"), std::string::npos) << thinking;
  for (const char* effort : {"low", "medium", "high"}) {
    EXPECT_EQ(s.Prompt(std::string(R"(,"reasoning_effort":")") + effort + "\""), thinking) << effort;
  }
  const std::string max = s.Prompt(R"(,"reasoning_effort":"max")");
  EXPECT_EQ(max.find("<｜begin▁of▁sentence｜>Reasoning Effort: Absolute maximum"), 0u) << max;
  EXPECT_EQ(max.substr(max.size() - 7), "<think>");
  EXPECT_EQ(s.Prompt(R"(,"reasoning_effort":"xhigh","thinking":{"type":"enabled"})"), max);
  EXPECT_EQ(s.Prompt(R"(,"reasoning_effort":"max","chat_template_kwargs":{"reasoning_effort":"max"})"), max);
  for (const char* refused :
       {R"(,"reasoning_effort":"max","thinking":{"type":"disabled"})",
        R"(,"reasoning_effort":"max","chat_template_kwargs":{"thinking":false})",
        R"(,"reasoning_effort":"max","chat_template_kwargs":{"reasoning_effort":"high"})",
        R"(,"reasoning_effort":"minimal")", R"(,"reasoning_effort":"extreme")", R"(,"reasoning_effort":3)"}) {
    auto [status, body] = s.Tokenize(refused);
    EXPECT_EQ(status, 400) << refused;
    EXPECT_EQ(body["error"]["param"], "reasoning_effort") << refused << " " << body.dump();
  }
  // A Jinja template that reads reasoning_effort and has no thinking switch gets the effort as it is mapped, and no
  // thinking is implied.
  testing::TempDir dir("fathom_effort");
  const std::string src = kTokenizers + "deepseek-v3";
  fs::copy_file(src + "/tokenizer.json", dir.file("tokenizer.json"));
  nlohmann::ordered_json config = nlohmann::ordered_json::parse(std::ifstream(src + "/tokenizer_config.json"));
  config["chat_template"] = "{% if reasoning_effort is defined %}effort {{ reasoning_effort }}: {% endif %}"
                            "{{ messages[0]['content'] }}";
  std::ofstream(dir.file("tokenizer_config.json")) << config.dump();
  {
    TemplateServer jinja(dir.path());
    EXPECT_EQ(jinja.Prompt(R"(,"reasoning_effort":"xhigh")"), "<｜begin▁of▁sentence｜>effort max: hi");
    EXPECT_EQ(jinja.Prompt(""), "<｜begin▁of▁sentence｜>hi");
  }
  TemplateServer v3(kTokenizers + "deepseek-v3");
  auto [status, body] = v3.Tokenize(R"(,"reasoning_effort":"high")");
  EXPECT_EQ(status, 400);
  EXPECT_EQ(body["error"]["code"], "unsupported_parameter") << body.dump();
  EXPECT_EQ(body["error"]["param"], "reasoning_effort") << body.dump();
}

}  // namespace
}  // namespace fathom::server
