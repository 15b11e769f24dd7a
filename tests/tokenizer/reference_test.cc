// Golden tests against the HF tokenizers 0.23 oracle (tests/data/tokenizers, copied from shared/reference): every
// corpus text encodes to the oracle's ids and decodes to its `decoded`, and every chat conversation renders byte for
// byte and encodes to the oracle's ids (or fails where the oracle failed).
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace fathom {
namespace {

nlohmann::ordered_json ReadJson(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  std::stringstream ss;
  ss << in.rdbuf();
  return nlohmann::ordered_json::parse(ss.str());
}

// Loading takes a while; share one tokenizer per name across the tests of this binary.
const Tokenizer& GetTokenizer(const std::string& name) {
  static std::map<std::string, std::unique_ptr<Tokenizer>> cache;
  auto& slot = cache[name];
  if (!slot) {
    auto tok = Tokenizer::FromDirectory(std::string(FATHOM_TOKENIZER_TEST_DATA) + "/" + name);
    FATHOM_CHECK(tok.ok(), "{}", tok.status().ToString());
    slot = std::move(tok).value();
  }
  return *slot;
}

nlohmann::ordered_json Expected(const std::string& name) {
  return ReadJson(std::string(FATHOM_TEST_DATA_DIR) + "/tokenizers/" + name + "/expected.json");
}

class ReferenceTest : public testing::TestWithParam<std::string> {};

TEST_P(ReferenceTest, CorpusEncodesExactly) {
  const Tokenizer& tok = GetTokenizer(GetParam());
  const auto expected = Expected(GetParam());
  int passed = 0, total = 0;
  for (const auto& entry : expected.at("encode")) {
    ++total;
    const std::string text = entry.at("text").get<std::string>();
    const auto want = entry.at("ids").get<std::vector<int32_t>>();
    const auto got = tok.Encode(text);
    EXPECT_EQ(got, want) << "text: " << nlohmann::ordered_json(text).dump();
    passed += got == want;
  }
  std::cout << GetParam() << ": encode " << passed << "/" << total << "\n";
  EXPECT_EQ(total, 196);
}

TEST_P(ReferenceTest, CorpusDecodesExactly) {
  const Tokenizer& tok = GetTokenizer(GetParam());
  const auto expected = Expected(GetParam());
  int passed = 0, total = 0;
  for (const auto& entry : expected.at("encode")) {
    ++total;
    const auto ids = entry.at("ids").get<std::vector<int32_t>>();
    const std::string want = entry.at("decoded").get<std::string>();
    const std::string got = tok.Decode(ids);
    EXPECT_EQ(got, want) << "ids of text " << nlohmann::ordered_json(entry.at("text")).dump();
    passed += got == want;
  }
  std::cout << GetParam() << ": decode " << passed << "/" << total << "\n";
  EXPECT_EQ(total, 196);
}

TEST_P(ReferenceTest, ChatRendersExactly) {
  const Tokenizer& tok = GetTokenizer(GetParam());
  auto chat = ChatTemplate::FromTokenizer(tok);
  ASSERT_TRUE(chat.ok()) << chat.status().ToString();
  const auto expected = Expected(GetParam());
  int passed = 0, total = 0;
  for (const auto& entry : expected.at("chat")) {
    ++total;
    ChatRequest request;
    request.messages = entry.at("messages");
    request.add_generation_prompt = entry.at("add_generation_prompt").get<bool>();
    if (entry.contains("tools")) request.tools = entry.at("tools");
    const auto rendered = (*chat)->Render(request);
    if (entry.contains("error")) {
      // The oracle's template raised; so must ours, with a message naming the template and the line.
      ASSERT_FALSE(rendered.ok()) << "expected an error like " << entry.at("error") << ", got " << *rendered;
      EXPECT_NE(rendered.status().message().find("template 'default', line "), std::string::npos)
          << rendered.status().message();
      std::cout << GetParam() << ": oracle error " << entry.at("error") << " -> ours: " << rendered.status().message()
                << "\n";
      ++passed;
      continue;
    }
    ASSERT_TRUE(rendered.ok()) << rendered.status().ToString();
    const std::string want = entry.at("rendered").get<std::string>();
    EXPECT_EQ(*rendered, want) << "messages: " << entry.at("messages").dump();
    const auto want_ids = entry.at("ids").get<std::vector<int32_t>>();
    const auto ids = (*chat)->EncodePrompt(*rendered);
    EXPECT_EQ(ids, want_ids) << "messages: " << entry.at("messages").dump();
    passed += *rendered == want && ids == want_ids;
  }
  std::cout << GetParam() << ": chat " << passed << "/" << total << "\n";
  EXPECT_EQ(passed, total);
}

// Prefix completion: the prompt is the conversation without a generation prompt, cut right after the last
// (assistant) message's text, so the model continues that text instead of opening a new turn.
TEST(PrefixCompletionTest, DeepSeekV3EndsInsideTheLastAssistantMessage) {
  const Tokenizer& tok = GetTokenizer("deepseek-v3");
  auto chat = ChatTemplate::FromTokenizer(tok);
  ASSERT_TRUE(chat.ok()) << chat.status().ToString();
  ChatRequest request;
  request.messages = nlohmann::ordered_json::parse(
      R"([{"role": "user", "content": "Write a haiku"}, {"role": "assistant", "content": "Autumn wind,"}])");
  const auto whole = (*chat)->Render(request);
  ASSERT_TRUE(whole.ok());
  request.continue_final_message = true;
  request.add_generation_prompt = true;  // overridden: a prefix completion opens no new turn
  const auto cut = (*chat)->Render(request);
  ASSERT_TRUE(cut.ok()) << cut.status().ToString();
  EXPECT_EQ(*cut, "<｜begin▁of▁sentence｜><｜User｜>Write a haiku<｜Assistant｜>Autumn wind,");
  EXPECT_EQ(whole->substr(0, cut->size()), *cut);
  EXPECT_GT(whole->size(), cut->size());  // the end of the turn, which the cut leaves out

  request.messages = nlohmann::ordered_json::parse(R"([{"role": "user", "content": "hi"}])");
  auto err = (*chat)->Render(request);
  ASSERT_FALSE(err.ok());
  EXPECT_NE(err.status().message().find("must be an assistant's"), std::string::npos) << err.status().message();
  request.messages = nlohmann::ordered_json::parse(R"([{"role": "user", "content": "hi"}, {"role": "assistant",
      "content": ""}])");
  err = (*chat)->Render(request);
  ASSERT_FALSE(err.ok());
  EXPECT_NE(err.status().message().find("needs text"), std::string::npos) << err.status().message();
}

TEST_P(ReferenceTest, SpecialTokensMatchTheOracle) {
  const Tokenizer& tok = GetTokenizer(GetParam());
  const auto special = Expected(GetParam()).at("special");
  if (special.contains("bos_token")) {
    ASSERT_TRUE(tok.config().bos_token.has_value());
    EXPECT_EQ(*tok.config().bos_token, special.at("bos_token").get<std::string>());
  } else {
    EXPECT_FALSE(tok.config().bos_token.has_value());
  }
  ASSERT_TRUE(tok.config().eos_token.has_value());
  EXPECT_EQ(*tok.config().eos_token, special.at("eos_token").get<std::string>());
}

INSTANTIATE_TEST_SUITE_P(Tokenizers, ReferenceTest, testing::Values("deepseek-v3", "qwen3", "llama-3.1"),
                         [](const testing::TestParamInfo<std::string>& param_info) {
                           std::string name = param_info.param;
                           for (char& c : name) {
                             if (c == '-' || c == '.') c = '_';
                           }
                           return name;
                         });

}  // namespace
}  // namespace fathom
