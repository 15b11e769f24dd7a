// Warp- and block-wide reductions of float32 values by shuffles (and 32 floats of shared memory for a block), each in
// one fixed order, so that a kernel's sums do not change from run to run. Include from .cu files only.
//
//   float d = 0.0f;
//   for (int64_t i = lane; i < n; i += 32) d += q[i] * k[i];
//   d = WarpSum(d);            // every lane of the warp gets the sum
//   ss = BlockSum(ss);         // every thread of the block (blockDim.x a multiple of 32, up to 1024)
#pragma once

#include <cuda_runtime.h>

#include <cmath>

namespace fathom::cuda {

__device__ __forceinline__ float WarpSum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float WarpMax(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Block-wide sum for blockDim.x a multiple of 32, up to 1024.
__device__ inline float BlockSum(float v) {
  __shared__ float part[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  v = WarpSum(v);
  __syncthreads();
  if (lane == 0) part[warp] = v;
  __syncthreads();
  const int warps = blockDim.x / 32;
  v = threadIdx.x < warps ? part[threadIdx.x] : 0.0f;
  if (warp == 0) v = WarpSum(v);
  if (threadIdx.x == 0) part[0] = v;
  __syncthreads();
  return part[0];
}

__device__ inline float BlockMax(float v) {
  __shared__ float part[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  v = WarpMax(v);
  __syncthreads();
  if (lane == 0) part[warp] = v;
  __syncthreads();
  const int warps = blockDim.x / 32;
  v = threadIdx.x < warps ? part[threadIdx.x] : -INFINITY;
  if (warp == 0) v = WarpMax(v);
  if (threadIdx.x == 0) part[0] = v;
  __syncthreads();
  return part[0];
}

}  // namespace fathom::cuda
