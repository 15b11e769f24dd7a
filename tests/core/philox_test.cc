#include "core/philox.h"

#include <gtest/gtest.h>

#include <set>

namespace fathom {
namespace {

// Random123's known-answer vectors for philox4x32_10 (also what cuRAND's curand_Philox4x32_10 returns).
TEST(PhiloxTest, MatchesTheKnownAnswerVectors) {
  struct Case {
    PhiloxBlock ctr;
    uint32_t k0, k1;
    PhiloxBlock want;
  };
  const Case cases[] = {
      {{0, 0, 0, 0}, 0, 0, {0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}},
      {{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
       0xffffffffu,
       0xffffffffu,
       {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}},
      {{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u},
       0xa4093822u,
       0x299f31d0u,
       {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}},
  };
  for (const Case& c : cases) {
    const PhiloxBlock r = Philox4x32(c.ctr, c.k0, c.k1);
    EXPECT_EQ(r.x, c.want.x);
    EXPECT_EQ(r.y, c.want.y);
    EXPECT_EQ(r.z, c.want.z);
    EXPECT_EQ(r.w, c.want.w);
  }
}

TEST(PhiloxTest, UniformIsInRangeDistinctAndDependsOnSeedAndCounter) {
  std::set<double> seen;
  double sum = 0;
  constexpr int kN = 100000;
  for (uint64_t i = 0; i < kN; ++i) {
    const double u = PhiloxUniform(42, i);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    seen.insert(u);
    sum += u;
  }
  EXPECT_EQ(seen.size(), static_cast<size_t>(kN));
  EXPECT_NEAR(sum / kN, 0.5, 0.005);
  EXPECT_NE(PhiloxUniform(42, 0), PhiloxUniform(43, 0));
  EXPECT_NE(PhiloxUniform(1ull << 32, 0), PhiloxUniform(0, 0));  // the seed's high half counts
  EXPECT_NE(PhiloxUniform(0, 1ull << 32), PhiloxUniform(0, 0));  // and the counter's
  EXPECT_EQ(PhiloxUniform(7, 3), PhiloxUniform(7, 3));
}

}  // namespace
}  // namespace fathom
