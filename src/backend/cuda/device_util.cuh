// Device helpers shared by the CUDA kernel files (kernels.cu, moe_kernels.cu): streaming loads, cp.async copies to
// shared memory, bf16 and f8 e4m3 unpacking and the tensor-core fragments of mma.m16n8k16 (PTX's layouts: g = lane / 4,
// t = lane % 4). Include from .cu files only.
//
//   uint4 w = LoadStreaming(row + k);         // 8 bf16 weights, not kept in L1
//   Mma16816<__nv_bfloat16>(acc, a, b0, b1);  // acc [16 x 8] += A [16 x 16] B [16 x 8]
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

namespace fathom::cuda {

// 16 bytes that are read once (weights): not allocated in L1.
__device__ __forceinline__ uint4 LoadStreaming(const uint4* p) {
  uint4 r;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(p));
  return r;
}

// 16 bytes global -> shared without the registers; src_bytes 0 fills zeros.
__device__ __forceinline__ void CpAsync16(void* smem, const void* src, int src_bytes) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(addr), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void CpAsyncCommit() {
  asm volatile("cp.async.commit_group;" ::: "memory");
}
template <int kPending>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory");
}

// 8 bf16 values (one 16-byte load) as floats.
__device__ __forceinline__ void Bf16x8(const uint4& raw, float* f) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const float2 v = __bfloat1622float2(h[e]);
    f[2 * e] = v.x;
    f[2 * e + 1] = v.y;
  }
}

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

template <typename T>
__device__ __forceinline__ void Mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

__device__ __forceinline__ void LdMatrixX4(uint32_t (&r)[4], const void* smem, bool trans) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  if (trans) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
  } else {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
  }
}

template <typename T>
__device__ __forceinline__ T FromF(float v) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __float2bfloat16(v);
  } else {
    return __float2half(v);
  }
}

template <typename T>
__device__ __forceinline__ uint32_t Pack2(T lo, T hi) {
  return static_cast<uint32_t>(reinterpret_cast<const uint16_t&>(lo)) |
         (static_cast<uint32_t>(reinterpret_cast<const uint16_t&>(hi)) << 16);
}

}  // namespace fathom::cuda
