// MLA's choice of attention form per step (model/mla.h), on DeepSeek-V2-Lite's dimensions.
#include "model/mla.h"

#include <gtest/gtest.h>

namespace fathom {
namespace {

constexpr MlaConfig kV2Lite{0, 512, 128, 64, 128};

int64_t PromptPairs(int64_t n) {
  return n * (n + 1) / 2;
}

TEST(MlaTest, LongPromptsTakeTheUpProjectedForm) {
  // Per head: 1,536 FLOPs saved per pair against 262,144 per context row; the switch at a ratio of 0.75.
  EXPECT_FALSE(MlaUpProjectedPays(kV2Lite, PromptPairs(128), 128));
  EXPECT_FALSE(MlaUpProjectedPays(kV2Lite, PromptPairs(254), 254));
  EXPECT_TRUE(MlaUpProjectedPays(kV2Lite, PromptPairs(256), 256));
  EXPECT_TRUE(MlaUpProjectedPays(kV2Lite, PromptPairs(8192), 8192));
  EXPECT_TRUE(MlaUpProjectedPays(kV2Lite, 16 * PromptPairs(512), 16 * 512));
}

TEST(MlaTest, AShortChunkNextToLongDecodeContextsKeepsTheAbsorbedForm) {
  // A 512-token prompt in one step with 63 decoding sequences of 1,000 tokens each: their whole contexts would be
  // up-projected for one query apiece.
  EXPECT_FALSE(MlaUpProjectedPays(kV2Lite, PromptPairs(512) + 63 * 1000, 512 + 63 * 1000));
  // A 2,048-token chunk after 6,144 cached tokens: every new query sees the whole prefix.
  EXPECT_TRUE(MlaUpProjectedPays(kV2Lite, 2048 * 6144 + PromptPairs(2048), 8192));
}

}  // namespace
}  // namespace fathom
