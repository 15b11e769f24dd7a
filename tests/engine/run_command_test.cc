// `fathom run` in-process: ids through the engine match the oracle; text streams with a real tokenizer over dummy
// weights given as a config.json path; bad flag combinations fail cleanly.
#include "cli/run_command.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "testing/golden.h"

namespace fathom {
namespace {

namespace fs = std::filesystem;

struct RunResult {
  int exit_code = 0;
  std::string out;
  std::string err;
};

RunResult RunFathom(std::vector<std::string> args) {
  CLI::App app{"fathom"};
  app.require_subcommand(1);
  AddRunCommand(app);
  args.insert(args.begin(), "fathom");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  RunResult r;
  ::testing::internal::CaptureStdout();
  ::testing::internal::CaptureStderr();
  try {
    app.parse(static_cast<int>(argv.size()), argv.data());
  } catch (const CLI::ParseError& e) {
    r.exit_code = e.get_exit_code();
  }
  std::fflush(stdout);
  r.out = ::testing::internal::GetCapturedStdout();
  r.err = ::testing::internal::GetCapturedStderr();
  return r;
}

std::string Join(const std::vector<int32_t>& v, const char* sep) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? sep : "") + std::to_string(v[i]);
  return s;
}

TEST(RunCommandTest, TokensPrintTheOracleGreedyIds) {
  const std::string dir = testing::ModelDir("llama3-distill-tiny");
  auto golden = testing::LoadGolden(dir);
  ASSERT_TRUE(golden.ok());
  const auto& c = golden->cases[3];
  RunResult r = RunFathom({"run", "--model", dir, "--ignore-eos", "--max-tokens", "16", "--tokens",
                           Join(c.input_ids, ","), "--num-kv-blocks", "64"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, Join(c.greedy, " ") + "\n");

  // n = 2 greedy samples fork the prompt and both give the oracle's tokens.
  RunResult n2 = RunFathom({"run", "--model", dir, "--ignore-eos", "--max-tokens", "16", "-n", "2", "--tokens",
                            Join(c.input_ids, ","), "--num-kv-blocks", "64"});
  ASSERT_EQ(n2.exit_code, 0) << n2.err;
  EXPECT_EQ(n2.out, Join(c.greedy, " ") + "\n" + Join(c.greedy, " ") + "\n");
}

class DummyQwen : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("fathom_run_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    std::ifstream in(testing::ModelDir("qwen2-distill-tiny") + "/config.json");
    nlohmann::json cfg = nlohmann::json::parse(in);
    cfg["vocab_size"] = 151936;  // the Qwen vocabulary, so that the reference tokenizer fits
    cfg["eos_token_id"] = 151643;
    std::ofstream(dir_ / "config.json") << cfg.dump();
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
  const std::string tokenizer_ = std::string(FATHOM_TOKENIZER_TEST_DATA) + "/qwen3";
};

TEST_F(DummyQwen, PromptStreamsTextFromAConfigPath) {
  RunResult r = RunFathom({"run", "--model", (dir_ / "config.json").string(), "--load-format", "dummy", "--tokenizer",
                           tokenizer_, "--prompt", "hello", "--max-tokens", "8", "--ignore-eos", "--show-stats",
                           "--kv-cache-memory", "16MiB"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_FALSE(r.out.empty());
  EXPECT_EQ(r.out.back(), '\n');
  EXPECT_NE(r.err.find("finish length"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("completion 8"), std::string::npos) << r.err;
}

TEST_F(DummyQwen, ChatUsesTheChatTemplate) {
  RunResult r = RunFathom({"run", "--model", (dir_ / "config.json").string(), "--load-format", "dummy", "--tokenizer",
                           tokenizer_, "--chat", "hi there", "--max-tokens", "3", "--ignore-eos", "--show-stats",
                           "--kv-cache-memory", "16MiB"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("completion 3"), std::string::npos) << r.err;
  // The rendered chat prompt is longer than the bare message.
  EXPECT_EQ(r.err.find("prompt 2 tokens"), std::string::npos) << r.err;
}

TEST(RunCommandTest, RejectsBadInputCombinations) {
  const std::string dir = testing::ModelDir("llama3-distill-tiny");
  RunResult none = RunFathom({"run", "--model", dir});
  EXPECT_EQ(none.exit_code, 1);
  EXPECT_NE(none.err.find("exactly one of --prompt, --chat or --tokens"), std::string::npos) << none.err;
  RunResult two = RunFathom({"run", "--model", dir, "--tokens", "1,2", "--prompt", "x"});
  EXPECT_EQ(two.exit_code, 1);
  RunResult too_long =
      RunFathom({"run", "--model", dir, "--tokens", "1,2,3", "--max-model-len", "4", "--max-tokens", "8"});
  EXPECT_EQ(too_long.exit_code, 1);
  EXPECT_NE(too_long.err.find("max-model-len"), std::string::npos) << too_long.err;
  RunResult bad_temp = RunFathom({"run", "--model", dir, "--tokens", "1,2", "--temperature", "-1"});
  EXPECT_EQ(bad_temp.exit_code, 1);
  EXPECT_NE(bad_temp.err.find("temperature"), std::string::npos) << bad_temp.err;
  for (const char* dtype : {"fp8_e5m2", "int4"}) {
    RunResult bad_kv = RunFathom({"run", "--model", dir, "--tokens", "1,2", "--kv-cache-dtype", dtype});
    EXPECT_EQ(bad_kv.exit_code, 1) << dtype;
    EXPECT_NE(bad_kv.err.find("--kv-cache-dtype"), std::string::npos) << bad_kv.err;
    EXPECT_NE(bad_kv.err.find("auto, float32, float16, bfloat16 or fp8"), std::string::npos) << bad_kv.err;
  }
}

// Every KV-cache dtype the flag takes gives the fixture's greedy tokens (the tiny model's margins are wide; FP8's
// accuracy is golden_test's Fp8KvCacheAgreesWithBf16Kv).
TEST(RunCommandTest, KvCacheDtypesGiveTheSameGreedyTokens) {
  const std::string dir = testing::ModelDir("qwen2-distill-tiny");
  const RunResult f32 = RunFathom({"run", "--model", dir, "--tokens", "1,2,3", "--max-tokens", "4"});
  ASSERT_EQ(f32.exit_code, 0) << f32.err;
  ASSERT_FALSE(f32.out.empty());
  for (const char* dtype : {"float16", "bfloat16", "float32", "auto", "fp8", "fp8_e4m3"}) {
    const RunResult r =
        RunFathom({"run", "--model", dir, "--tokens", "1,2,3", "--max-tokens", "4", "--kv-cache-dtype", dtype});
    ASSERT_EQ(r.exit_code, 0) << dtype << ": " << r.err;
    EXPECT_EQ(r.out, f32.out) << dtype;
  }
}

}  // namespace
}  // namespace fathom
