#include "core/dtype.h"

#include <limits>
#include <string>

#include "core/check.h"

namespace fathom {

std::string_view DTypeName(DType t) {
  switch (t) {
    case DType::kF32:
      return "f32";
    case DType::kF16:
      return "f16";
    case DType::kBF16:
      return "bf16";
    case DType::kF8E4M3:
      return "f8_e4m3";
    case DType::kI64:
      return "i64";
    case DType::kI32:
      return "i32";
    case DType::kI8:
      return "i8";
    case DType::kU8:
      return "u8";
    case DType::kF8E8M0:
      return "f8_e8m0";
  }
  return "?";
}

std::string_view DTypeSafetensorsName(DType t) {
  switch (t) {
    case DType::kF32:
      return "F32";
    case DType::kF16:
      return "F16";
    case DType::kBF16:
      return "BF16";
    case DType::kF8E4M3:
      return "F8_E4M3";
    case DType::kI64:
      return "I64";
    case DType::kI32:
      return "I32";
    case DType::kI8:
      return "I8";
    case DType::kU8:
      return "U8";
    case DType::kF8E8M0:
      return "F8_E8M0";
  }
  return "?";
}

StatusOr<DType> DTypeFromSafetensors(std::string_view name) {
  for (DType t : kAllDTypes) {
    if (DTypeSafetensorsName(t) == name) return t;
  }
  return InvalidArgumentError("unsupported safetensors dtype '" + std::string(name) +
                              "' (supported: F32, F16, BF16, F8_E4M3, I64, I32, I8, U8, F8_E8M0)");
}

StatusOr<DType> DTypeFromString(std::string_view name) {
  if (name == "float32" || name == "f32" || name == "float") return DType::kF32;
  if (name == "float16" || name == "f16" || name == "half") return DType::kF16;
  if (name == "bfloat16" || name == "bf16") return DType::kBF16;
  if (name == "float8_e4m3fn" || name == "f8_e4m3") return DType::kF8E4M3;
  return InvalidArgumentError("unsupported dtype '" + std::string(name) +
                              "' (supported: float32, float16, bfloat16, float8_e4m3fn)");
}

uint16_t F32ToF16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);   // NaN
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow -> inf
  if (abs < 0x38800000u) {
    // Subnormal half (or zero): round abs * 2^24 to an integer, nearest even.
    const float v = std::bit_cast<float>(abs) * 16777216.0f;
    const float r = std::nearbyint(v);
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(r));
  }
  uint32_t m = abs + 0xfffu + ((abs >> 13) & 1u);  // round to nearest even on the 13 dropped bits
  return static_cast<uint16_t>(sign | ((m - 0x38000000u) >> 13));
}

uint8_t F32ToF8E4M3(float f) {
  if (std::isnan(f)) return 0x7f;
  const uint8_t sign = std::signbit(f) ? 0x80 : 0x00;
  float a = std::fabs(f);
  if (a >= 448.0f) return sign | 0x7e;  // saturate to the largest finite value
  // Search the 127 non-negative finite codes for the nearest, ties to even mantissa. Slow but exact; used for
  // test data and dummy weights only.
  uint8_t best = 0;
  float best_err = std::numeric_limits<float>::infinity();
  for (uint8_t code = 0; code <= 0x7e; ++code) {
    const float err = std::fabs(F8E4M3ToF32(code) - a);
    if (err < best_err || (err == best_err && (code & 1) == 0)) {
      best = code;
      best_err = err;
    }
  }
  return sign | best;
}

namespace {
static void Bf16ToF32Row(const uint16_t* src, int64_t n, float* dst) {
  for (int64_t i = 0; i < n; ++i) dst[i] = Bf16ToF32(src[i]);
}
}  // namespace

void ConvertToF32(const void* src, DType dtype, int64_t offset, int64_t count, float* dst) {
  switch (dtype) {
    case DType::kF32: {
      const float* s = static_cast<const float*>(src) + offset;
      for (int64_t i = 0; i < count; ++i) dst[i] = s[i];
      return;
    }
    case DType::kBF16:
      Bf16ToF32Row(static_cast<const uint16_t*>(src) + offset, count, dst);
      return;
    case DType::kF16: {
      const uint16_t* s = static_cast<const uint16_t*>(src) + offset;
      for (int64_t i = 0; i < count; ++i) dst[i] = F16ToF32(s[i]);
      return;
    }
    case DType::kF8E4M3: {
      const uint8_t* s = static_cast<const uint8_t*>(src) + offset;
      for (int64_t i = 0; i < count; ++i) dst[i] = F8E4M3ToF32(s[i]);
      return;
    }
    case DType::kF8E8M0: {
      const uint8_t* s = static_cast<const uint8_t*>(src) + offset;
      for (int64_t i = 0; i < count; ++i) dst[i] = F8E8M0ToF32(s[i]);
      return;
    }
    default:
      FATHOM_CHECK(false, "ConvertToF32 from {}", DTypeName(dtype));
  }
}

void ConvertFromF32(const float* src, int64_t count, DType dtype, void* dst, int64_t offset) {
  switch (dtype) {
    case DType::kF32: {
      float* d = static_cast<float*>(dst) + offset;
      for (int64_t i = 0; i < count; ++i) d[i] = src[i];
      return;
    }
    case DType::kBF16: {
      uint16_t* d = static_cast<uint16_t*>(dst) + offset;
      for (int64_t i = 0; i < count; ++i) d[i] = F32ToBf16(src[i]);
      return;
    }
    case DType::kF16: {
      uint16_t* d = static_cast<uint16_t*>(dst) + offset;
      for (int64_t i = 0; i < count; ++i) d[i] = F32ToF16(src[i]);
      return;
    }
    default:
      FATHOM_CHECK(false, "ConvertFromF32 to {}", DTypeName(dtype));
  }
}

}  // namespace fathom
