// The offline benchmark's token budget, which the memory plan is made for.
#include "bench/offline.h"

#include <gtest/gtest.h>

#include <functional>
#include <limits>
#include <vector>

namespace fathom::bench {
namespace {

TEST(FittedTokenBudgetTest, CoversTheLargestBatchsPromptsInOneStep) {
  EXPECT_EQ(FittedTokenBudget(2048, {1, 64, 256}, 512), 256 * 512);
  EXPECT_EQ(FittedTokenBudget(2048, {256, 1}, 512), 256 * 512);  // in any order
}

TEST(FittedTokenBudgetTest, KeepsALargerConfiguredBudget) {
  EXPECT_EQ(FittedTokenBudget(8192, {1, 4}, 512), 8192);
  EXPECT_EQ(FittedTokenBudget(2048, {}, 512), 2048);
}

TEST(FittedTokenBudgetTest, SaturatesInsteadOfOverflowing) {
  EXPECT_EQ(FittedTokenBudget(2048, {1 << 20}, 1 << 20), std::numeric_limits<int32_t>::max());
}

// A memory plan that holds at most `limit` tokens of step activations, recording each budget tried.
std::function<Status(int32_t)> PlanUpTo(int32_t limit, std::vector<int32_t>* tried) {
  return [limit, tried](int32_t budget) {
    tried->push_back(budget);
    return budget <= limit ? OkStatus() : ResourceExhaustedError("the activations do not fit");
  };
}

TEST(LargestPlannedTokenBudgetTest, KeepsTheFittedBudgetWhereItPlans) {
  std::vector<int32_t> tried;
  EXPECT_EQ(LargestPlannedTokenBudget(2048, 262144, PlanUpTo(1 << 30, &tried)).value(), 262144);
  EXPECT_EQ(tried, std::vector<int32_t>({262144}));
}

TEST(LargestPlannedTokenBudgetTest, HalvesUntilThePlanFits) {
  // 256 x 1k prompts of Qwen-7B on an 80 GB GPU: about 70k tokens of activations fit.
  std::vector<int32_t> tried;
  EXPECT_EQ(LargestPlannedTokenBudget(2048, 262144, PlanUpTo(70000, &tried)).value(), 65536);
  EXPECT_EQ(tried, std::vector<int32_t>({262144, 131072, 65536}));
}

TEST(LargestPlannedTokenBudgetTest, NeverGoesBelowTheConfiguredBudget) {
  std::vector<int32_t> tried;
  const StatusOr<int32_t> r = LargestPlannedTokenBudget(2048, 8192, PlanUpTo(1000, &tried));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted);  // the plan's own error, for the smallest budget
  EXPECT_EQ(tried, std::vector<int32_t>({8192, 4096, 2048}));
}

TEST(LargestPlannedTokenBudgetTest, TriesTheConfiguredBudgetLast) {
  // 5000 is no power-of-two multiple of 2048: 2500 fails, and 2048 itself is tried before giving up.
  std::vector<int32_t> tried;
  EXPECT_EQ(LargestPlannedTokenBudget(2048, 5000, PlanUpTo(2100, &tried)).value(), 2048);
  EXPECT_EQ(tried, std::vector<int32_t>({5000, 2500, 2048}));
}

TEST(OfflineKvBlocksTest, EverySequencesPromptAndOutputWithASpareBlock) {
  // 1,152 tokens are 72 blocks of 16, plus a spare: 73 a sequence, and one more block.
  EXPECT_EQ(OfflineKvBlocks(256, 1024, 128, 16), 256 * 73 + 1);
  EXPECT_EQ(OfflineKvBlocks(1, 10, 7, 16), 4);  // 17 tokens: 2 blocks, a spare, one more
}

TEST(LargestPlannedTokenBudgetTest, StopsAtAnErrorThatIsNotAboutMemory) {
  std::vector<int32_t> tried;
  const StatusOr<int32_t> r = LargestPlannedTokenBudget(2048, 65536, [&](int32_t budget) {
    tried.push_back(budget);
    return InvalidArgumentError("--kv-cache-dtype fp8 is not served");
  });
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(tried, std::vector<int32_t>({65536}));
}

}  // namespace
}  // namespace fathom::bench
