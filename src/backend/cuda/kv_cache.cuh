// The paged KV cache as kernels read it: a value of a cache row as float32, an f8 cache's value times its group's
// scale (launcher.h's CacheView; model/backend.h's KvLayerView). Include from .cu files only.
//
//   const int64_t blk = slot / block_size, off = slot % block_size;
//   const int64_t base = blk * c.s0 + off * c.s1 + head * c.s2;
//   float v = LoadCache<T>(c, base, blk, off, head, i);   // value i of that row
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/dtype.cuh"
#include "backend/cuda/launcher.h"

namespace fathom::cuda {

// The scale of value i of the row at (block blk, offset off, head h) of an f8 cache.
__device__ __forceinline__ float CacheScale(const CacheView& c, int64_t blk, int64_t off, int64_t h, int64_t i) {
  // A row holds at most a few thousand values: a 32-bit division.
  return c.scale[blk * c.ss0 + off * c.ss1 + h * c.ss2 + static_cast<int32_t>(i) / static_cast<int32_t>(c.group)];
}

// Value i of the row that starts at element `base` (block blk, offset off, head h), as float32: f8 values times their
// scale (the same product as the CPU reference's), others widened.
template <typename T>
__device__ __forceinline__ float LoadCache(const CacheView& c, int64_t base, int64_t blk, int64_t off, int64_t h,
                                           int64_t i) {
  const float v = Load(static_cast<const T*>(c.data), base + i);
  if constexpr (kIsF8<T>) {
    return v * CacheScale(c, blk, off, h, i);
  } else {
    return v;
  }
}

// Whether an f8 cache view carries scales whose groups divide `dim` (other dtypes: true).
inline bool CacheScalesFit(const CacheView& c, int64_t dim) {
  if (c.dtype != kF8) return true;
  return c.scale != nullptr && c.group > 0 && dim % c.group == 0;
}

}  // namespace fathom::cuda
