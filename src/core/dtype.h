// Element types and scalar conversions.
//
//   DType t = DType::kBF16;
//   size_t bytes = DTypeSize(t) * numel;
//   float x = Bf16ToF32(raw_bits);
//   StatusOr<DType> d = DTypeFromSafetensors("F8_E4M3");
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string_view>

#include "core/status.h"

namespace fathom {

// kF8E8M0: an 8-bit power of two, 2^(code - 127) (code 255: NaN), the OCP microscaling formats' shared scale
// (DeepSeek-V4's FP8 block scales and MXFP4 expert scales). Not a floating type for IsFloating: only scales take it.
enum class DType : uint8_t { kF32, kF16, kBF16, kF8E4M3, kI64, kI32, kI8, kU8, kF8E8M0 };

inline constexpr DType kAllDTypes[] = {DType::kF32, DType::kF16, DType::kBF16, DType::kF8E4M3, DType::kI64,
                                       DType::kI32, DType::kI8,  DType::kU8,   DType::kF8E8M0};

constexpr size_t DTypeSize(DType t) {
  switch (t) {
    case DType::kF32:
      return 4;
    case DType::kF16:
      return 2;
    case DType::kBF16:
      return 2;
    case DType::kF8E4M3:
      return 1;
    case DType::kI64:
      return 8;
    case DType::kI32:
      return 4;
    case DType::kI8:
      return 1;
    case DType::kU8:
      return 1;
    case DType::kF8E8M0:
      return 1;
  }
  return 0;
}

constexpr bool IsFloating(DType t) {
  return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16 || t == DType::kF8E4M3;
}

// Short lower-case name used in logs and in `fathom inspect`: "f32", "bf16", "f8_e4m3", ...
std::string_view DTypeName(DType t);
// The safetensors header spelling: "F32", "BF16", "F8_E4M3", ...
std::string_view DTypeSafetensorsName(DType t);
StatusOr<DType> DTypeFromSafetensors(std::string_view name);
// Accepts HF `torch_dtype` values ("bfloat16", "float16", "float32") and our short names.
StatusOr<DType> DTypeFromString(std::string_view name);

inline float Bf16ToF32(uint16_t bits) {
  return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16);
}

// Round to nearest even, NaN stays NaN.
inline uint16_t F32ToBf16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

inline float F16ToF32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t man = h & 0x3ffu;
  if (exp == 0) {
    // Zero or subnormal: man * 2^-24.
    float v = std::ldexp(static_cast<float>(man), -24);
    return sign ? -v : v;
  }
  if (exp == 31) return std::bit_cast<float>(sign | 0x7f800000u | (man << 13));
  return std::bit_cast<float>(sign | ((exp + 112u) << 23) | (man << 13));
}

uint16_t F32ToF16(float f);

// float8_e4m3fn: 1 sign, 4 exponent (bias 7), 3 mantissa bits; no infinities, 0x7f/0xff are NaN.
inline float F8E4M3ToF32(uint8_t b) {
  const bool neg = b & 0x80u;
  const uint32_t exp = (b >> 3) & 0xfu;
  const uint32_t man = b & 0x7u;
  float v;
  if (exp == 0xf && man == 0x7) {
    v = std::numeric_limits<float>::quiet_NaN();
  } else if (exp == 0) {
    v = std::ldexp(static_cast<float>(man), -9);  // (man / 8) * 2^-6
  } else {
    v = std::bit_cast<float>(((exp + 120u) << 23) | (man << 20));
  }
  return neg ? -v : v;
}

// float8_e8m0fnu: 2^(code - 127); 0xff is NaN.
inline float F8E8M0ToF32(uint8_t b) {
  if (b == 0xff) return std::numeric_limits<float>::quiet_NaN();
  // code 0 is 2^-127, a float32 subnormal.
  return b == 0 ? std::ldexp(1.0f, -127) : std::bit_cast<float>(static_cast<uint32_t>(b) << 23);
}

// Converts `count` elements of `src` (of `dtype`, any float dtype or kF8E8M0) starting at element `offset` into
// float32.
void ConvertToF32(const void* src, DType dtype, int64_t offset, int64_t count, float* dst);
// Converts float32 into `dtype` (f32, f16 or bf16) at element `offset` of `dst`.
void ConvertFromF32(const float* src, int64_t count, DType dtype, void* dst, int64_t offset);

// Nearest-even rounding with saturation to ±448, as torch's float8_e4m3fn cast does for finite values.
uint8_t F32ToF8E4M3(float f);

}  // namespace fathom
