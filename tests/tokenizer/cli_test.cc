// The tokenize / detokenize / render-chat subcommands, run in-process on the DeepSeek-V3 and Qwen3 tokenizers.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "cli/tokenizer_commands.h"

namespace fathom {
namespace {

const std::string kDeepSeek = std::string(FATHOM_TOKENIZER_TEST_DATA) + "/deepseek-v3";
const std::string kQwen = std::string(FATHOM_TOKENIZER_TEST_DATA) + "/qwen3";

struct Result {
  int exit_code = 0;
  std::string out;
};

Result RunCli(std::vector<std::string> args) {
  CLI::App app{"test"};
  app.require_subcommand(1);
  std::ostringstream out;
  AddTokenizerCommands(app, out);
  args.insert(args.begin(), "fathom");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  Result r;
  try {
    app.parse(static_cast<int>(argv.size()), argv.data());
  } catch (const CLI::ParseError& e) {
    r.exit_code = e.get_exit_code();
  }
  r.out = out.str();
  return r;
}

std::string WriteTemp(const std::string& name, const std::string& content) {
  const auto path = std::filesystem::temp_directory_path() / ("fathom_cli_test_" + name);
  std::ofstream(path) << content;
  return path.string();
}

TEST(TokenizerCliTest, TokenizeTextAndJsonl) {
  EXPECT_EQ(RunCli({"tokenize", "--tokenizer", kDeepSeek, "--text", "Hello, world!"}).out, "[19923,14,2058,3]\n");
  EXPECT_EQ(RunCli({"tokenize", "--tokenizer", kDeepSeek, "--text", "Hello, world!", "--add-special-tokens"}).out,
            "[0,19923,14,2058,3]\n");
  const std::string file = WriteTemp("in.jsonl", "\"Hello, world!\"\n\"Hello, world!\"\n");
  EXPECT_EQ(RunCli({"tokenize", "--tokenizer", kDeepSeek, "--input-jsonl", file}).out,
            "[19923,14,2058,3]\n[19923,14,2058,3]\n");
  const std::string bad = WriteTemp("bad.jsonl", "[1,2]\n");
  EXPECT_EQ(RunCli({"tokenize", "--tokenizer", kDeepSeek, "--input-jsonl", bad}).exit_code, 1);
  EXPECT_NE(RunCli({"tokenize", "--tokenizer", kDeepSeek}).exit_code, 0);
  EXPECT_EQ(RunCli({"tokenize", "--tokenizer", "/nonexistent", "--text", "x"}).exit_code, 1);
}

TEST(TokenizerCliTest, Detokenize) {
  EXPECT_EQ(RunCli({"detokenize", "--tokenizer", kDeepSeek, "--ids", "19923,14,2058,3"}).out, "\"Hello, world!\"\n");
  const std::string file = WriteTemp("ids.jsonl", "[0,19923]\n[2058,3]\n");
  EXPECT_EQ(RunCli({"detokenize", "--tokenizer", kDeepSeek, "--input-jsonl", file, "--skip-special-tokens"}).out,
            "\"Hello\"\n\" world!\"\n");
  EXPECT_EQ(RunCli({"detokenize", "--tokenizer", kDeepSeek, "--ids", "1,x"}).exit_code, 1);
}

TEST(TokenizerCliTest, RenderChat) {
  const std::string input =
      WriteTemp("chat.json", R"({"messages": [{"role": "user", "content": "Hello!"}], "add_generation_prompt": true})");
  EXPECT_EQ(
      RunCli({"render-chat", "--tokenizer", kDeepSeek, "--input", input}).out,
      "{\"rendered\":\"<｜begin▁of▁sentence｜><｜User｜>Hello!<｜Assistant｜>\",\"ids\":[0,128803,19923,3,128804]}\n");
}

TEST(TokenizerCliTest, RenderChatTemplateErrorPrintsErrorJson) {
  // Qwen3's template evaluates `'</think>' in message.content`, which fails for a null content.
  const std::string input = WriteTemp("chat_err.json", R"({"messages": [
      {"role": "user", "content": "Weather?"},
      {"role": "assistant", "content": null, "tool_calls": [{"type": "function",
        "function": {"name": "get_weather", "arguments": "{}"}}]}], "add_generation_prompt": true})");
  const Result r = RunCli({"render-chat", "--tokenizer", kQwen, "--input", input});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(
      r.out,
      "{\"error\":\"chat template: template 'default', line 34: argument of type 'NoneType' is not iterable\"}\n");
}

}  // namespace
}  // namespace fathom
