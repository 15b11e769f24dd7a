#include "backend/cpu/kernels.h"

#include "core/check.h"

namespace fathom::cpu {

// Compiled twice: for AVX2+FMA machines and for baseline x86-64; the loader picks one at run time.
#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__)
#define FATHOM_CLONES [[gnu::target_clones("arch=x86-64-v3", "default")]]
#else
#define FATHOM_CLONES
#endif

FATHOM_CLONES float DotF32(const float* a, const float* b, int64_t n) {
  float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
  for (int64_t i = 0; i < n; ++i) acc += a[i] * b[i];
  return acc;
}

FATHOM_CLONES static void Bf16ToF32Row(const uint16_t* src, int64_t n, float* dst) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) dst[i] = Bf16ToF32(src[i]);
}

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

}  // namespace fathom::cpu
