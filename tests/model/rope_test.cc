#include "model/rope.h"

#include <gtest/gtest.h>

#include <cmath>

namespace fathom {
namespace {

TEST(RopeTest, DefaultAndLinear) {
  RopeConfig r;
  r.theta = 10000;
  auto f = ComputeRopeFrequencies(r, 8, 4096);
  ASSERT_EQ(f.inv_freq.size(), 4u);
  EXPECT_FLOAT_EQ(f.inv_freq[0], 1.0f);
  EXPECT_NEAR(f.inv_freq[1], std::pow(10000.0, -0.25), 1e-7);
  EXPECT_EQ(f.attention_scale, 1.0f);
  r.type = RopeType::kLinear;
  r.factor = 4;
  auto g = ComputeRopeFrequencies(r, 8, 4096);
  for (int i = 0; i < 4; ++i) EXPECT_FLOAT_EQ(g.inv_freq[i], f.inv_freq[i] / 4);
}

TEST(RopeTest, Llama3KeepsHighFrequenciesAndScalesLowOnes) {
  RopeConfig r;
  r.type = RopeType::kLlama3;
  r.theta = 500000;
  r.factor = 8;
  r.low_freq_factor = 1;
  r.high_freq_factor = 4;
  r.original_max_position_embeddings = 64;
  RopeConfig plain;
  plain.theta = 500000;
  const int dim = 16;
  auto f = ComputeRopeFrequencies(r, dim, 4096);
  auto p = ComputeRopeFrequencies(plain, dim, 4096);
  for (int i = 0; i < dim / 2; ++i) {
    const double wavelen = 2 * M_PI / p.inv_freq[i];
    if (wavelen < 64.0 / 4) {
      EXPECT_FLOAT_EQ(f.inv_freq[i], p.inv_freq[i]) << i;  // high frequency: unchanged
    } else if (wavelen > 64.0) {
      EXPECT_FLOAT_EQ(f.inv_freq[i], p.inv_freq[i] / 8) << i;  // low frequency: divided by factor
    } else {
      const double smooth = (64.0 / wavelen - 1) / (4 - 1);
      EXPECT_NEAR(f.inv_freq[i], (1 - smooth) * p.inv_freq[i] / 8 + smooth * p.inv_freq[i], 1e-6) << i;
    }
  }
}

TEST(RopeTest, YarnAttentionFactor) {
  RopeConfig r;
  r.type = RopeType::kYarn;
  r.factor = 40;
  r.original_max_position_embeddings = 4096;
  auto f = ComputeRopeFrequencies(r, 64, 163840);
  EXPECT_NEAR(f.attention_scale, 0.1 * std::log(40.0) + 1, 1e-6);
  r.mscale = 1.0;
  r.mscale_all_dim = 1.0;
  EXPECT_NEAR(ComputeRopeFrequencies(r, 64, 163840).attention_scale, 1.0, 1e-7);
  r.mscale = 0.707;
  r.mscale_all_dim = 0.707;
  EXPECT_NEAR(ComputeRopeFrequencies(r, 64, 163840).attention_scale, 1.0, 1e-7);
  // Extrapolated (fastest) frequency unchanged, slowest one interpolated by the factor.
  RopeConfig plain;
  auto p = ComputeRopeFrequencies(plain, 64, 163840);
  EXPECT_FLOAT_EQ(f.inv_freq[0], p.inv_freq[0]);
  EXPECT_NEAR(f.inv_freq[31], p.inv_freq[31] / 40, 1e-12);
  EXPECT_NEAR(YarnMscale(40, 0.707), 0.1 * 0.707 * std::log(40.0) + 1, 1e-12);
  EXPECT_EQ(YarnMscale(1.0, 5.0), 1.0);
}

}  // namespace
}  // namespace fathom
