// The elementwise kernels and the dummy-weight fill (elementwise.h).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "backend/cuda/dtype.cuh"
#include "backend/cuda/elementwise.h"
#include "backend/cuda/launch.cuh"

namespace fathom::cuda {

namespace {

// Elementwise kernels: one block per (row, chunk of 256 columns), numbered row-major on a 1-d grid (a 2-d grid
// would cap rows at 65535), so that a single decode row still spreads over many SMs.
__global__ void AddKernel(float* a, int64_t as, const float* b, int64_t bs, int64_t cols) {
  PdlPrologue();
  const int64_t cb = (cols + blockDim.x - 1) / blockDim.x, r = blockIdx.x / cb;
  const int64_t i = static_cast<int64_t>(blockIdx.x % cb) * blockDim.x + threadIdx.x;
  if (i < cols) a[r * as + i] += b[r * bs + i];
}

// silu(gate) * up, one expression for both outputs: float32 (SiluMul), or that float rounded to nearest even into bf16
// (SiluMulToBf16, the down projection's cuBLASLt input).
template <typename TO>
__global__ void SiluMulKernel(const float* g, int64_t gs, const float* u, int64_t us, TO* o, int64_t os, int64_t cols) {
  PdlPrologue();
  const int64_t cb = (cols + blockDim.x - 1) / blockDim.x, r = blockIdx.x / cb;
  const int64_t i = static_cast<int64_t>(blockIdx.x % cb) * blockDim.x + threadIdx.x;
  if (i < cols) {
    const float gv = g[r * gs + i];
    Store(o, r * os + i, gv / (1.0f + expf(-gv)) * u[r * us + i]);
  }
}

__device__ uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// The same bits as core/dtype.h's F32ToBf16 (round to nearest even, NaN kept quiet).
__device__ uint16_t Bf16Bits(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

template <typename T>
__global__ void FillDummyKernel(void* out, int64_t n, uint64_t key, float scale, bool has_constant,
                                uint32_t constant_bits) {
  PdlPrologue();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint64_t r = SplitMix64(key + static_cast<uint64_t>(i));
    const float u = static_cast<float>(r >> 40) * (1.0f / 16777216.0f);
    const float v = __fmul_rn(__fsub_rn(__fmul_rn(2.0f, u), 1.0f), scale);
    if constexpr (std::is_same_v<T, float>) {
      static_cast<uint32_t*>(out)[i] = has_constant ? constant_bits : __float_as_uint(v);
    } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
      static_cast<uint16_t*>(out)[i] = has_constant ? static_cast<uint16_t>(constant_bits) : Bf16Bits(v);
    } else if constexpr (std::is_same_v<T, __half>) {
      static_cast<__half*>(out)[i] =
          has_constant ? __ushort_as_half(static_cast<uint16_t>(constant_bits)) : __float2half_rn(v);
    } else if constexpr (std::is_same_v<T, int32_t>) {  // packed 4-bit codes: the low 32 random bits
      static_cast<uint32_t*>(out)[i] = has_constant ? constant_bits : static_cast<uint32_t>(r);
    } else {
      static_cast<uint8_t*>(out)[i] =
          has_constant ? static_cast<uint8_t>(constant_bits) : static_cast<uint8_t>(r & 0xbf);
    }
  }
}

// The fill's grid-stride loop runs on at most this many blocks per SM.
constexpr int64_t kFillBlocksPerSm = 64;

}  // namespace

int LaunchAddInPlace(float* a, int64_t as, const float* b, int64_t bs, int64_t rows, int64_t cols, Stream s) {
  if (rows == 0) return 0;
  LaunchKernel(AddKernel, RowBlocks(rows, cols), 256, 0, S(s), a, as, b, bs, cols);
  return Done();
}

int LaunchSiluMul(const float* g, int64_t gs, const float* u, int64_t us, float* o, int64_t os, int64_t rows,
                  int64_t cols, Stream s) {
  if (rows == 0) return 0;
  LaunchKernel(SiluMulKernel<float>, RowBlocks(rows, cols), 256, 0, S(s), g, gs, u, us, o, os, cols);
  return Done();
}

int LaunchSiluMulToBf16(const float* g, int64_t gs, const float* u, int64_t us, int64_t rows, int64_t cols, void* out,
                        Stream s) {
  if (rows == 0) return 0;
  LaunchKernel(SiluMulKernel<__nv_bfloat16>, RowBlocks(rows, cols), 256, 0, S(s), g, gs, u, us,
               static_cast<__nv_bfloat16*>(out), cols, cols);
  return Done();
}

int LaunchFillDummy(void* out, int dtype, int64_t n, uint64_t key, float scale, bool has_constant,
                    uint32_t constant_bits, int sm_count, Stream s) {
  if (n == 0) return 0;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((n + 255) / 256, kFillBlocksPerSm * sm_count));
  if (dtype == kI32) {
    LaunchKernel(FillDummyKernel<int32_t>, blocks, 256, 0, S(s), out, n, key, scale, has_constant, constant_bits);
    return Done();
  }
  return DispatchDType<float, __half, __nv_bfloat16, __nv_fp8_e4m3>(dtype, [&](auto tag) {
    using T = decltype(tag);
    LaunchKernel(FillDummyKernel<T>, blocks, 256, 0, S(s), out, n, key, scale, has_constant, constant_bits);
    return Done();
  });
}

}  // namespace fathom::cuda
