#include "backend/cpu/kernels.h"

#include <algorithm>
#include <cmath>
#include <limits>

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

char* CacheRow(const TensorView& cache, int64_t slot, int64_t block_size, int64_t head) {
  const int64_t block = slot / block_size, off = slot % block_size;
  const int64_t elem = block * cache.stride(0) + off * cache.stride(1) + head * cache.stride(2);
  return static_cast<char*>(cache.raw()) + elem * static_cast<int64_t>(DTypeSize(cache.dtype()));
}

float* ScaleRow(const TensorView& scale, int64_t slot, int64_t block_size, int64_t head) {
  const int64_t block = slot / block_size, off = slot % block_size;
  return scale.data<float>() + block * scale.stride(0) + off * scale.stride(1) + head * scale.stride(2);
}

void StoreCacheRow(const float* src, int64_t dim, DType dtype, char* dst, float* scales, int64_t groups) {
  if (dtype != DType::kF8E4M3) {
    ConvertFromF32(src, dim, dtype, dst, 0);
    return;
  }
  const int64_t g = dim / groups;
  auto* out = reinterpret_cast<uint8_t*>(dst);
  for (int64_t i = 0; i < groups; ++i) {
    float amax = 0.0f;
    for (int64_t j = i * g; j < (i + 1) * g; ++j) amax = std::max(amax, std::fabs(src[j]));
    const float scale = amax > 0.0f ? std::max(amax / 448.0f, std::numeric_limits<float>::min()) : 1.0f;
    scales[i] = scale;
    const float inv = 1.0f / scale;
    for (int64_t j = i * g; j < (i + 1) * g; ++j) out[j] = F32ToF8E4M3(src[j] * inv);
  }
}

void LoadCacheRow(const char* src, DType dtype, const float* scales, int64_t group, int64_t dim, float* out) {
  if (dtype != DType::kF8E4M3) {
    ConvertToF32(src, dtype, 0, dim, out);
    return;
  }
  const auto* in = reinterpret_cast<const uint8_t*>(src);
  for (int64_t j = 0; j < dim; ++j) out[j] = F8E4M3ToF32(in[j]) * scales[j / group];
}

int64_t GroupOf(const TensorView& cache, const TensorView& scale) {
  return scale.empty() ? 0 : cache.dim(3) / scale.dim(3);
}

}  // namespace fathom::cpu
