// f8 e4m3 on the device: 16 values of one 16-byte load unpacked to float32 (scaled by their block's scale_inv, or
// raw for kernels that scale a partial sum once), and two values scaled and rounded to a bf16 pair for a tensor-core
// fragment. Used by the GEMV (linear.cu), the routed experts (moe.cu) and the FP8 format kernels (fp8.cu). Include
// from .cu files only.
//
//   float f[16];
//   F8x16Raw(LoadStreaming(row + k), f);        // 16 weights, unscaled
//   acc += scale * dot(f, x);                   // the piece's block scale once
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/mma.cuh"

namespace fathom::cuda {

// 16 f8 e4m3 values (one 16-byte load) as floats, each times `scale` (its 128 x 128 block's scale_inv: the same
// products as the CPU's dequantized weights), or unscaled with scale 1 (F8x16Raw, for kernels that scale a partial sum
// once).
__device__ __forceinline__ void F8x16Raw(const uint4& raw, float* f) {
  const __nv_fp8x2_storage_t* p = reinterpret_cast<const __nv_fp8x2_storage_t*>(&raw);
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    const float2 v = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(p[e], __NV_E4M3)));
    f[2 * e] = v.x;
    f[2 * e + 1] = v.y;
  }
}
__device__ __forceinline__ void F8x16(const uint4& raw, float scale, float* f) {
  F8x16Raw(raw, f);
#pragma unroll
  for (int e = 0; e < 16; ++e) f[e] *= scale;
}

// Two e4m3 weights (one 16-bit shared-memory load) times their block's scale, as a bf16 pair: a B fragment register.
__device__ __forceinline__ uint32_t F8PairToBf16(uint16_t v, float scale) {
  const float2 f = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(v, __NV_E4M3)));
  return Pack2(__float2bfloat16(f.x * scale), __float2bfloat16(f.y * scale));
}

}  // namespace fathom::cuda
