// core/env.h: the one reading of switches and numbers from the environment.
#include "core/env.h"

#include <gtest/gtest.h>

#include <cstdlib>

namespace fathom {
namespace {

TEST(EnvTest, SwitchesTakeTheSameWordsInAnyCase) {
  for (const char* on : {"1", "true", "on", "yes", "TRUE", "On", " 1 "}) EXPECT_TRUE(*ParseSwitch("X", on)) << on;
  for (const char* off : {"0", "false", "off", "no", "NO", "\t0"}) EXPECT_FALSE(*ParseSwitch("X", off)) << off;
  for (const char* bad : {"", "2", "enable", "truee", "y", "-1"}) {
    const StatusOr<bool> r = ParseSwitch("FATHOM_X", bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().message(),
              std::string("FATHOM_X='") + bad + "': a switch takes 1, true, on, yes or 0, false, off, no");
  }
}

TEST(EnvTest, IntegersAreWholeDecimalNumbers) {
  EXPECT_EQ(*ParseInteger("X", "256"), 256);
  EXPECT_EQ(*ParseInteger("X", " -3 "), -3);
  EXPECT_EQ(*ParseInteger("X", "+7"), 7);
  for (const char* bad : {"", "8k", "1e3", "0x10", "99999999999999999999", "- 1"}) {
    const StatusOr<int64_t> r = ParseInteger("FATHOM_N", bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("FATHOM_N"), std::string::npos);
  }
}

TEST(EnvTest, UnsetOrEmptyIsNotGiven) {
  unsetenv("FATHOM_ENV_TEST");
  EXPECT_FALSE(EnvSwitch("FATHOM_ENV_TEST")->has_value());
  setenv("FATHOM_ENV_TEST", "", 1);
  EXPECT_FALSE(EnvInteger("FATHOM_ENV_TEST")->has_value());
  setenv("FATHOM_ENV_TEST", "off", 1);
  EXPECT_EQ(*EnvSwitch("FATHOM_ENV_TEST"), std::optional<bool>(false));
  EXPECT_FALSE(EnvInteger("FATHOM_ENV_TEST").ok());
  unsetenv("FATHOM_ENV_TEST");
}

}  // namespace
}  // namespace fathom
