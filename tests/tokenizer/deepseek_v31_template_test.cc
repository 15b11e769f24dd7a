// DeepSeek-V3.1's chat template (hybrid thinking: the `thinking` variable ends the prompt in <think> or </think>; its
// tool calls name + <｜tool▁sep｜> + arguments; tool outputs) through fathom's Jinja engine against Hugging Face
// transformers' apply_chat_template: tests/data/chat/deepseek_v31/expected.json holds what transformers rendered for
// each conversation of conversations.json (tests/data/tools/make_dsv31_renders.py, over the DeepSeek-V3 tokenizer of
// tests/data/tokenizers, whose special tokens the template writes), and fathom must render the same bytes.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace fathom {
namespace {

using ojson = nlohmann::ordered_json;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << path;
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(DeepseekV31TemplateTest, MatchesTransformersWithThinkingOnAndOff) {
  const std::string data = std::string(FATHOM_TEST_DATA_DIR) + "/chat/deepseek_v31/";
  const ojson conversations = ojson::parse(ReadFile(data + "conversations.json"))["conversations"];
  const ojson expected = ojson::parse(ReadFile(data + "expected.json"));
  ASSERT_TRUE(expected.contains("prompts"));
  // DeepSeek-V3's tokenizer with V3.1's template in its tokenizer_config.json.
  const std::string tok_dir = std::string(FATHOM_TOKENIZER_TEST_DATA) + "/deepseek-v3";
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("fathom_v31_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(tok_dir + "/tokenizer.json", dir / "tokenizer.json",
                             std::filesystem::copy_options::overwrite_existing);
  ojson config = ojson::parse(ReadFile(tok_dir + "/tokenizer_config.json"));
  config["chat_template"] = ReadFile(data + "chat_template.jinja");
  std::ofstream(dir / "tokenizer_config.json") << config.dump();
  auto tok = Tokenizer::FromDirectory(dir.string());
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  auto chat = ChatTemplate::FromTokenizer(**tok);
  ASSERT_TRUE(chat.ok()) << chat.status().ToString();
  int compared = 0, thinking = 0;
  for (const ojson& c : conversations) {
    const std::string name = c["name"].get<std::string>();
    ASSERT_TRUE(expected["prompts"].contains(name)) << name << ": re-run make_dsv31_renders.py";
    ChatRequest r;
    r.messages = c["messages"];
    r.add_generation_prompt = c["add_generation_prompt"].get<bool>();
    r.extra["thinking"] = c["thinking"].get<bool>();
    StatusOr<std::string> got = (*chat)->Render(r);
    ASSERT_TRUE(got.ok()) << name << ": " << got.status().ToString();
    EXPECT_EQ(*got, expected["prompts"][name].get<std::string>()) << name;
    ++compared;
    thinking += c["thinking"].get<bool>() ? 1 : 0;
  }
  EXPECT_GE(compared, 20);
  EXPECT_GT(thinking, 0);
  EXPECT_LT(thinking, compared);
  // The switch as the server finds it: thinking on ends the generation prompt in <think>, off in </think>.
  ChatRequest r;
  r.messages = ojson::parse(R"([{"role": "user", "content": "hi"}])");
  r.add_generation_prompt = true;
  r.extra["thinking"] = true;
  EXPECT_EQ((*chat)->Render(r).value(), "<｜begin▁of▁sentence｜><｜User｜>hi<｜Assistant｜><think>");
  r.extra["thinking"] = false;
  EXPECT_EQ((*chat)->Render(r).value(), "<｜begin▁of▁sentence｜><｜User｜>hi<｜Assistant｜></think>");
}

}  // namespace
}  // namespace fathom
