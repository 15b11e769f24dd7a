// Scalar CPU kernels shared by CpuBackend's ops and its attention layouts' providers (attention_layouts.h): a
// vectorized dot product and the paged cache's rows (their addresses, FP8 scales, loads and stores). (Dtype conversion
// of whole rows is core's ConvertToF32 / ConvertFromF32.)
//
//   float d = DotF32(a, b, n);
//   LoadCacheRow(CacheRow(cache.k, slot, bs, head), cache.k.dtype(), nullptr, 0, k_dim, row);
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace fathom::cpu {

float DotF32(const float* a, const float* b, int64_t n);

// Element pointer of a [blocks, block_size, heads, dim] cache view at (slot, head), as bytes.
char* CacheRow(const TensorView& cache, int64_t slot, int64_t block_size, int64_t head);
// Row `head` of `slot` in a cache view's scales (f32 [blocks, block_size, heads, groups]).
float* ScaleRow(const TensorView& scale, int64_t slot, int64_t block_size, int64_t head);
// Stores `dim` values at `dst` (a cache row of `dtype`). FP8: each group of dim / groups values gets the scale
// max|x| / 448 in scales[g] (at least FLT_MIN, so that 1 / scale stays finite; 1 for an all-zero group) and
// e4m3(x * (1 / scale)) values, as KvLayerView describes.
void StoreCacheRow(const float* src, int64_t dim, DType dtype, char* dst, float* scales, int64_t groups);
// The first `dim` values of a cache row (of `dtype`; FP8 with its group scales, groups of `group` values) as f32.
void LoadCacheRow(const char* src, DType dtype, const float* scales, int64_t group, int64_t dim, float* out);
// A cache view's scale group (0 without scales).
int64_t GroupOf(const TensorView& cache, const TensorView& scale);

}  // namespace fathom::cpu
