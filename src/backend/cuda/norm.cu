// The RMSNorm kernels (norm.h).
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/dtype.cuh"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/norm.h"
#include "backend/cuda/reduce.cuh"

namespace fathom::cuda {

namespace {

template <typename TW>
__global__ void RmsNormKernel(float* x, int64_t xs, const float* add, int64_t as, const TW* w, float eps, float* out,
                              int64_t os, int64_t cols) {
  PdlPrologue();
  const int64_t r = blockIdx.x;
  float* xr = x + r * xs;
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) {
    float v = xr[i];
    if (add != nullptr) {
      v += add[r * as + i];
      xr[i] = v;
    }
    ss += v * v;
  }
  ss = BlockSum(ss);
  const float inv = rsqrtf(ss / static_cast<float>(cols) + eps);
  for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) out[r * os + i] = Load(w, i) * (xr[i] * inv);
}

// RMSNorm with the row held in registers (float4 per thread, kPer of them): one read and one write of x.
template <int kPer, typename TW>
__global__ void __launch_bounds__(512) RmsNormVecKernel(float* x, int64_t xs, const float* add, int64_t as, const TW* w,
                                                        float eps, float* out, int64_t os, int64_t cols) {
  PdlPrologue();
  const int64_t r = blockIdx.x, nv = cols / 4;
  float4* xr = reinterpret_cast<float4*>(x + r * xs);
  const float4* ar = add != nullptr ? reinterpret_cast<const float4*>(add + r * as) : nullptr;
  float4 v[kPer];
  float ss = 0.0f;
#pragma unroll
  for (int p = 0; p < kPer; ++p) {
    const int64_t i = threadIdx.x + static_cast<int64_t>(p) * blockDim.x;
    if (i < nv) {
      float4 a = xr[i];
      if (ar != nullptr) {
        const float4 b = ar[i];
        a.x += b.x;
        a.y += b.y;
        a.z += b.z;
        a.w += b.w;
        xr[i] = a;
      }
      v[p] = a;
      ss += a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w;
    }
  }
  ss = BlockSum(ss);
  const float inv = rsqrtf(ss / static_cast<float>(cols) + eps);
  float4* orow = reinterpret_cast<float4*>(out + r * os);
#pragma unroll
  for (int p = 0; p < kPer; ++p) {
    const int64_t i = threadIdx.x + static_cast<int64_t>(p) * blockDim.x;
    if (i < nv) {
      float4 o;
      o.x = Load(w, 4 * i) * (v[p].x * inv);
      o.y = Load(w, 4 * i + 1) * (v[p].y * inv);
      o.z = Load(w, 4 * i + 2) * (v[p].z * inv);
      o.w = Load(w, 4 * i + 3) * (v[p].w * inv);
      orow[i] = o;
    }
  }
}

__global__ void LayerNormKernel(float* x, int64_t xs, const float* w, const float* b, float eps, int64_t cols) {
  PdlPrologue();
  float* xr = x + static_cast<int64_t>(blockIdx.x) * xs;
  float sum = 0.0f;
  for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) sum += xr[i];
  const float mean = BlockSum(sum) / static_cast<float>(cols);
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) ss += (xr[i] - mean) * (xr[i] - mean);
  const float inv = rsqrtf(BlockSum(ss) / static_cast<float>(cols) + eps);
  __syncthreads();  // every thread has read the row before any writes it
  for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) xr[i] = (xr[i] - mean) * inv * w[i] + b[i];
}

}  // namespace

int LaunchRmsNorm(float* x, int64_t xs, const float* add, int64_t as, const void* w, int wd, float eps, float* out,
                  int64_t os, int64_t rows, int64_t cols, Stream s) {
  if (rows == 0) return 0;
  return DispatchFloat(wd, [&](auto tag) {
    using TW = decltype(tag);
    const TW* wt = static_cast<const TW*>(w);
    const auto a16 = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
    const int64_t nv = cols / 4;
    if (cols % 4 == 0 && xs % 4 == 0 && os % 4 == 0 && a16(x) && a16(out) &&
        (add == nullptr || (as % 4 == 0 && a16(add))) && nv <= 8 * 512) {
      const unsigned g = static_cast<unsigned>(rows);
      if (nv <= 512) {
        LaunchKernel(RmsNormVecKernel<1, TW>, g, 512, 0, S(s), x, xs, add, as, wt, eps, out, os, cols);
      } else if (nv <= 1024) {
        LaunchKernel(RmsNormVecKernel<2, TW>, g, 512, 0, S(s), x, xs, add, as, wt, eps, out, os, cols);
      } else if (nv <= 2048) {
        LaunchKernel(RmsNormVecKernel<4, TW>, g, 512, 0, S(s), x, xs, add, as, wt, eps, out, os, cols);
      } else {
        LaunchKernel(RmsNormVecKernel<8, TW>, g, 512, 0, S(s), x, xs, add, as, wt, eps, out, os, cols);
      }
      return Done();
    }
    LaunchKernel(RmsNormKernel<TW>, static_cast<unsigned>(rows), 256, 0, S(s), x, xs, add, as, wt, eps, out, os, cols);
    return Done();
  });
}

int LaunchLayerNorm(float* x, int64_t x_stride, const float* w, const float* b, float eps, int64_t rows, int64_t cols,
                    Stream s) {
  if (rows == 0 || cols == 0) return 0;
  LaunchKernel(LayerNormKernel, static_cast<unsigned>(rows), 128, 0, S(s), x, x_stride, w, b, eps, cols);
  return Done();
}

}  // namespace fathom::cuda
