#include "core/dtype.h"

#include <gtest/gtest.h>

#include <cmath>

namespace fathom {
namespace {

TEST(DTypeTest, SizesAndNames) {
  EXPECT_EQ(DTypeSize(DType::kF32), 4u);
  EXPECT_EQ(DTypeSize(DType::kBF16), 2u);
  EXPECT_EQ(DTypeSize(DType::kF8E4M3), 1u);
  EXPECT_EQ(DTypeSize(DType::kI64), 8u);
  for (DType t : kAllDTypes) {
    StatusOr<DType> back = DTypeFromSafetensors(DTypeSafetensorsName(t));
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, t);
  }
  EXPECT_FALSE(DTypeFromSafetensors("F64").ok());
  EXPECT_NE(DTypeFromSafetensors("C64").status().message().find("supported"), std::string::npos);
  EXPECT_EQ(*DTypeFromString("bfloat16"), DType::kBF16);
  EXPECT_FALSE(DTypeFromString("int4").ok());
}

TEST(DTypeTest, Bf16RoundTripAndRounding) {
  EXPECT_EQ(F32ToBf16(1.0f), 0x3f80);
  EXPECT_EQ(Bf16ToF32(0x3f80), 1.0f);
  EXPECT_EQ(Bf16ToF32(0xc000), -2.0f);
  // 1 + 2^-8 is exactly halfway between bf16 1.0 and 1.0078125: ties to even -> 1.0.
  EXPECT_EQ(F32ToBf16(1.00390625f), 0x3f80);
  // Just above halfway rounds up.
  EXPECT_EQ(F32ToBf16(1.0040f), 0x3f81);
  EXPECT_TRUE(std::isnan(Bf16ToF32(F32ToBf16(NAN))));
}

TEST(DTypeTest, F16KnownValues) {
  EXPECT_EQ(F16ToF32(0x3c00), 1.0f);
  EXPECT_EQ(F16ToF32(0xc000), -2.0f);
  EXPECT_EQ(F16ToF32(0x7bff), 65504.0f);
  EXPECT_EQ(F16ToF32(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_TRUE(std::isinf(F16ToF32(0x7c00)));
  for (uint32_t h = 0; h < 0x7c00; h += 7) {  // every finite positive value class round-trips
    EXPECT_EQ(F32ToF16(F16ToF32(static_cast<uint16_t>(h))), h) << h;
  }
  EXPECT_EQ(F32ToF16(1e6f), 0x7c00);  // overflow -> inf
}

TEST(DTypeTest, F8E4M3KnownValues) {
  EXPECT_EQ(F8E4M3ToF32(0x38), 1.0f);
  EXPECT_EQ(F8E4M3ToF32(0x7e), 448.0f);  // largest finite
  EXPECT_EQ(F8E4M3ToF32(0xfe), -448.0f);
  EXPECT_EQ(F8E4M3ToF32(0x01), std::ldexp(1.0f, -9));  // smallest subnormal
  EXPECT_EQ(F8E4M3ToF32(0x08), std::ldexp(1.0f, -6));  // smallest normal
  EXPECT_TRUE(std::isnan(F8E4M3ToF32(0x7f)));
  for (int b = 0; b < 0x7f; ++b) EXPECT_EQ(F32ToF8E4M3(F8E4M3ToF32(static_cast<uint8_t>(b))), b);
  EXPECT_EQ(F32ToF8E4M3(1000.0f), 0x7e);  // saturates
  EXPECT_EQ(F32ToF8E4M3(-1.0f), 0xb8);
}

}  // namespace
}  // namespace fathom
