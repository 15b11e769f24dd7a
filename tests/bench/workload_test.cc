// Workload generation with a real tokenizer: random-token prompts of exact lengths, a shared prefix, datasets.
#include "bench/workload.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>

namespace fathom::bench {
namespace {

const Tokenizer& DeepSeek() {
  static const std::unique_ptr<Tokenizer> tok = [] {
    auto t = Tokenizer::FromDirectory(std::string(FATHOM_TOKENIZER_TEST_DATA) + "/deepseek-v3");
    FATHOM_CHECK(t.ok(), "{}", t.status().ToString());
    return std::move(t).value();
  }();
  return *tok;
}

TEST(RandomPromptsTest, ExactLengthsWithTheModelsTokenizer) {
  auto counter = MakeLocalTokenCounter(DeepSeek());
  auto candidates = counter->CandidateIds();
  ASSERT_TRUE(candidates.ok());
  EXPECT_GT(candidates->size(), 100000u);  // most of the 128k vocabulary decodes to clean text alone
  WorkloadOptions w{.num_requests = 30, .input_len = 64, .output_len = 16, .range_ratio = 0.5, .seed = 3};
  auto prompts = MakeRandomPrompts(*counter, w);
  ASSERT_TRUE(prompts.ok()) << prompts.status().ToString();
  ASSERT_EQ(prompts->size(), 30u);
  std::set<int32_t> lens;
  for (const BenchPrompt& p : *prompts) {
    const auto ids = DeepSeek().Encode(p.text);
    EXPECT_EQ(static_cast<int32_t>(ids.size()), p.prompt_len);  // prompt_len is the real count
    EXPECT_GE(p.prompt_len, 31);
    EXPECT_LE(p.prompt_len, 97);
    EXPECT_GE(p.output_len, 8);
    EXPECT_LE(p.output_len, 24);
    lens.insert(p.prompt_len);
  }
  EXPECT_GT(lens.size(), 5u);  // the range ratio spreads lengths
  // Same seed, same prompts; another seed, other prompts.
  auto again = MakeRandomPrompts(*counter, w);
  EXPECT_EQ((*again)[7].text, (*prompts)[7].text);
  w.seed = 4;
  EXPECT_NE((*MakeRandomPrompts(*counter, w))[7].text, (*prompts)[7].text);
}

TEST(RandomPromptsTest, HitsTheTargetLength) {
  auto counter = MakeLocalTokenCounter(DeepSeek());
  auto prompts = MakeRandomPrompts(*counter, {.num_requests = 20, .input_len = 100, .output_len = 4, .seed = 9});
  ASSERT_TRUE(prompts.ok());
  int exact = 0;
  for (const BenchPrompt& p : *prompts) {
    exact += p.prompt_len == 100;
    EXPECT_NEAR(p.prompt_len, 100, 2);
  }
  EXPECT_GE(exact, 18);
}

TEST(RandomPromptsTest, SharedPrefix) {
  auto counter = MakeLocalTokenCounter(DeepSeek());
  auto prompts =
      MakeRandomPrompts(*counter, {.num_requests = 8, .input_len = 20, .output_len = 4, .shared_prefix_len = 50});
  ASSERT_TRUE(prompts.ok());
  const auto& first = (*prompts)[0];
  for (const BenchPrompt& p : *prompts) {
    EXPECT_NEAR(p.prompt_len, 70, 2);
    // The same first 49 tokens (the 50th may merge with what follows).
    ASSERT_GE(p.ids.size(), 49u);
    EXPECT_EQ(std::vector<int32_t>(p.ids.begin(), p.ids.begin() + 49),
              std::vector<int32_t>(first.ids.begin(), first.ids.begin() + 49));
  }
  EXPECT_NE((*prompts)[0].text, (*prompts)[1].text);
}

TEST(RandomPromptsTest, RejectsBadOptions) {
  auto counter = MakeLocalTokenCounter(DeepSeek());
  EXPECT_FALSE(MakeRandomPrompts(*counter, {.num_requests = 1, .input_len = 0}).ok());
  EXPECT_FALSE(MakeRandomPrompts(*counter, {.num_requests = 1, .range_ratio = 1.5}).ok());
}

TEST(DatasetTest, LoadsCyclesAndCounts) {
  const auto path =
      std::filesystem::temp_directory_path() / ("fathom_bench_ds_" + std::to_string(::getpid()) + ".jsonl");
  {
    std::ofstream out(path);
    out << R"({"prompt": "Hello there, how are you?"})"
        << "\n\n";
    out << R"({"prompt": "Write a poem.", "output_len": 64})"
        << "\n";
  }
  auto counter = MakeLocalTokenCounter(DeepSeek());
  auto p = LoadDatasetPrompts(path.string(), {.num_requests = 5, .output_len = 10}, counter.get());
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  ASSERT_EQ(p->size(), 5u);
  EXPECT_EQ((*p)[0].text, "Hello there, how are you?");
  EXPECT_EQ((*p)[0].output_len, 10);
  EXPECT_EQ((*p)[1].output_len, 64);
  EXPECT_EQ((*p)[2].text, (*p)[0].text);
  EXPECT_EQ((*p)[0].prompt_len, static_cast<int32_t>(DeepSeek().Encode("Hello there, how are you?").size()));
  // Without a tokenizer the lengths are unknown (usage will tell).
  auto q = LoadDatasetPrompts(path.string(), {.num_requests = 2, .output_len = 10}, nullptr);
  ASSERT_TRUE(q.ok());
  EXPECT_EQ((*q)[0].prompt_len, 0);
  {
    std::ofstream out(path);
    out << R"({"text": "no prompt key"})"
        << "\n";
  }
  auto bad = LoadDatasetPrompts(path.string(), {.num_requests = 1}, nullptr);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find(":1:"), std::string::npos);
  std::filesystem::remove(path);
  EXPECT_FALSE(LoadDatasetPrompts("/nonexistent.jsonl", {.num_requests = 1}, nullptr).ok());
}

}  // namespace
}  // namespace fathom::bench
