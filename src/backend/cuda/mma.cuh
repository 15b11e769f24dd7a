// The tensor-core fragments of mma.m16n8k16 with float32 accumulation (PTX's layouts: g = lane / 4, t = lane % 4):
// the MMA itself for bf16 or f16 operands, ldmatrix loads of 8x8 tiles from shared memory, and packing of two 16-bit
// values into one fragment register. Include from .cu files only.
//
//   uint32_t a[4];
//   LdMatrixX4(a, smem_row_of_this_lane, /*trans=*/false);  // A [16 x 16]
//   Mma16816<__nv_bfloat16>(acc, a, b0, b1);               // acc [16 x 8] += A [16 x 16] B [16 x 8]
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

namespace fathom::cuda {

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
