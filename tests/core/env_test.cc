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

// A variable of named values takes one of them in any case, and refuses the rest with the list.
TEST(EnvTest, ChoicesTakeOneOfTheirNamesInAnyCase) {
  EXPECT_EQ(*ParseChoice("X", " Up ", {"auto", "up", "absorbed"}), "up");
  EXPECT_EQ(*ParseChoice("X", "ABSORBED", {"auto", "up", "absorbed"}), "absorbed");
  const StatusOr<std::string_view> bad = ParseChoice("FATHOM_MLA_PREFILL", "1", {"auto", "up", "absorbed"});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(), "FATHOM_MLA_PREFILL='1': takes one of auto, up, absorbed");
  unsetenv("FATHOM_ENV_TEST");
  EXPECT_FALSE(EnvChoice("FATHOM_ENV_TEST", {"a"})->has_value());
  setenv("FATHOM_ENV_TEST", "b", 1);
  EXPECT_FALSE(EnvChoice("FATHOM_ENV_TEST", {"a"}).ok());
  setenv("FATHOM_ENV_TEST", "A", 1);
  EXPECT_EQ(*EnvChoice("FATHOM_ENV_TEST", {"a"}), std::optional<std::string_view>("a"));
  unsetenv("FATHOM_ENV_TEST");
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
