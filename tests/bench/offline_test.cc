// The offline benchmark's token budget, which the memory plan is made for.
#include "bench/offline.h"

#include <gtest/gtest.h>

#include <limits>

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

}  // namespace
}  // namespace fathom::bench
