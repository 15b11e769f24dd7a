// The block-scaled FP8 format's kernels (fp8.h).
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/fp8.cuh"
#include "backend/cuda/fp8.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/mma.cuh"

namespace fathom::cuda {

namespace {

// One thread per 16 weights of a row (k % 16 == 0, 16-byte aligned rows), else one per weight.
__global__ void DequantF8Kernel(const uint8_t* w, int64_t ws, int64_t m, int64_t k, const float* scale, int64_t ss,
                                int64_t bn, int64_t bk, __nv_bfloat16* out, bool vec) {
  PdlPrologue();
  const int64_t per = vec ? 16 : 1, pieces = k / per;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= m * pieces) return;
  const int64_t r = i / pieces, c0 = (i % pieces) * per;
  const float* sr = scale + (r / bn) * ss;
  if (vec) {  // 16 values share one block scale when bk % 16 == 0
    float f[16];
    F8x16(*reinterpret_cast<const uint4*>(w + r * ws + c0), sr[c0 / bk], f);
    uint32_t packed[8];
#pragma unroll
    for (int q = 0; q < 8; ++q) packed[q] = Pack2(__float2bfloat16_rn(f[2 * q]), __float2bfloat16_rn(f[2 * q + 1]));
    uint4* d = reinterpret_cast<uint4*>(out + r * k + c0);
    d[0] = make_uint4(packed[0], packed[1], packed[2], packed[3]);
    d[1] = make_uint4(packed[4], packed[5], packed[6], packed[7]);
  } else {
    __nv_fp8_e4m3 v;
    v.__x = w[r * ws + c0];
    out[r * k + c0] = __float2bfloat16_rn(static_cast<float>(v) * sr[c0 / bk]);
  }
}

// One warp per (token, group of 128 columns), four values a lane.
constexpr int kQuantWarps = 8;
__global__ void __launch_bounds__(kQuantWarps * 32)
    QuantizeF8Kernel(const float* x, int64_t xs, int64_t n, int64_t n_pad, int64_t k, uint8_t* xq, float* scales) {
  PdlPrologue();
  const int64_t groups = k / 128;
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kQuantWarps + threadIdx.x / 32;
  if (item >= n_pad * groups) return;
  const int64_t t = item / groups, g = item % groups;
  const int lane = static_cast<int>(threadIdx.x % 32);
  float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  if (t < n) v = reinterpret_cast<const float4*>(x + t * xs + g * 128)[lane];
  float amax = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  const float scale = amax > 0.0f ? amax / 448.0f : 1.0f;
  const __nv_fp8x2_storage_t lo = __nv_cvt_float2_to_fp8x2(make_float2(v.x / scale, v.y / scale), __NV_SATFINITE,
                                                           __NV_E4M3),
                             hi = __nv_cvt_float2_to_fp8x2(make_float2(v.z / scale, v.w / scale), __NV_SATFINITE,
                                                           __NV_E4M3);
  reinterpret_cast<uint32_t*>(xq + t * k + g * 128)[lane] =
      static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
  if (lane == 0) scales[g * n_pad + t] = scale;
}

}  // namespace

int LaunchDequantF8ToBf16(const void* w, int64_t ws, int64_t m, int64_t k, const float* scale, int64_t ss, int64_t bn,
                          int64_t bk, void* out, Stream s) {
  if (m == 0 || k == 0) return 0;
  const bool vec = k % 16 == 0 && ws % 16 == 0 && bk % 16 == 0 && reinterpret_cast<uintptr_t>(w) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(out) % 16 == 0;
  const int64_t threads = m * (vec ? k / 16 : k);
  LaunchKernel(DequantF8Kernel, static_cast<unsigned>((threads + 255) / 256), 256, 0, S(s),
               static_cast<const uint8_t*>(w), ws, m, k, scale, ss, bn, bk, static_cast<__nv_bfloat16*>(out), vec);
  return Done();
}

int LaunchQuantizeF8(const float* x, int64_t xs, int64_t n, int64_t n_pad, int64_t k, void* xq, float* scales,
                     Stream s) {
  if (n_pad == 0) return 0;
  if (k % 128 != 0 || xs % 4 != 0 || n_pad < n || reinterpret_cast<uintptr_t>(x) % 16 != 0) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  const int64_t items = n_pad * (k / 128);
  LaunchKernel(QuantizeF8Kernel, static_cast<unsigned>((items + kQuantWarps - 1) / kQuantWarps), kQuantWarps * 32, 0,
               S(s), x, xs, n, n_pad, k, static_cast<uint8_t*>(xq), scales);
  return Done();
}

}  // namespace fathom::cuda
