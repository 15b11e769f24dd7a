#include "core/check.h"

#include <gtest/gtest.h>

namespace fathom {
namespace {

TEST(CheckDeathTest, CheckPrintsFileLineAndMessage) {
  const int layer = 3;
  EXPECT_DEATH(FATHOM_CHECK(layer < 2, "layer {} out of range", layer),
               "FATHOM_CHECK failed at .*check_test.cc:[0-9]+: layer < 2 layer 3 out of range");
}

TEST(CheckDeathTest, CheckOpPrintsBothValues) {
  const int rows = 4, cols = 5;
  EXPECT_DEATH(FATHOM_CHECK_EQ(rows, cols), "rows == cols \\(4 vs 5\\)");
  EXPECT_DEATH(FATHOM_CHECK_LT(cols, rows), "cols < rows \\(5 vs 4\\)");
}

TEST(CheckTest, PassingChecksDoNothing) {
  FATHOM_CHECK(true);
  FATHOM_CHECK_EQ(1, 1);
  FATHOM_CHECK_LE(1, 2);
  FATHOM_CHECK_GE(2, 2);
  FATHOM_CHECK_NE(1, 2);
  FATHOM_CHECK_GT(3, 2);
  SUCCEED();
}

}  // namespace
}  // namespace fathom
