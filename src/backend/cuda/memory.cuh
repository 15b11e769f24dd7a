// Global-memory access patterns of the kernels: streaming 16-byte loads that bypass L1 (weights, read once),
// cp.async copies from global to shared memory, and vector loads of 2, 4, 8 or 16 bytes widened to float32. Include
// from .cu files only.
//
//   uint4 w = LoadStreaming(row + k);                 // 8 bf16 (16 f8) weights, not kept in L1
//   PrefetchBulkL2(next_row, 1152);                   // a later tile's row toward L2, nothing waits on it
//   CpAsync16(smem + r * kRow + c, src, in_range ? 16 : 0);
//   CpAsyncCommit();
//   CpAsyncWait<0>();                                 // then __syncthreads() before reading smem
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/dtype.cuh"

namespace fathom::cuda {

// 16 bytes that are read once (weights): not allocated in L1.
__device__ __forceinline__ uint4 LoadStreaming(const uint4* p) {
  uint4 r;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(p));
  return r;
}

// The 128-byte line at p into L2 (no registers, no wait). L2 is where every write lands, so a prefetch never leaves a
// stale copy: it may run before the kernel that writes p has finished.
__device__ __forceinline__ void PrefetchL2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

// `bytes` (a multiple of 16) from p (16-byte aligned) into L2 by one bulk prefetch (sm_90's TMA unit), or a line at a
// time before sm_90.
__device__ __forceinline__ void PrefetchBulkL2(const void* p, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
#else
  const char* c = static_cast<const char*>(p);
  for (uint32_t o = 0; o < bytes; o += 128) PrefetchL2(c + o);
  PrefetchL2(c + bytes - 1);
#endif
}

// 16 bytes global -> shared without the registers; src_bytes 0 fills zeros.
__device__ __forceinline__ void CpAsync16(void* smem, const void* src, int src_bytes) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(addr), "l"(src), "r"(src_bytes) : "memory");
}
// 4 bytes global -> shared (through L1: a scale read by several warps); src_bytes 0 fills zeros.
__device__ __forceinline__ void CpAsync4(void* smem, const void* src, int src_bytes) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(addr), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void CpAsyncCommit() {
  asm volatile("cp.async.commit_group;" ::: "memory");
}
template <int kPending>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory");
}

// kPer consecutive values of type T (f32, f16, bf16 or f8 e4m3; 2, 4, 8 or 16 bytes in all, aligned) in one load, as
// floats.
template <typename T, int kPer>
__device__ __forceinline__ void LoadVec(const T* p, float* out) {
  constexpr int kBytes = kPer * static_cast<int>(sizeof(T));
  static_assert(kBytes == 2 || kBytes == 4 || kBytes == 8 || kBytes == 16, "vector width");
  if constexpr (kBytes == 2) {
    const uint16_t r = *reinterpret_cast<const uint16_t*>(p);
    const T* e = reinterpret_cast<const T*>(&r);
#pragma unroll
    for (int i = 0; i < kPer; ++i) out[i] = ToF(e[i]);
  } else if constexpr (kBytes == 16) {
    const uint4 r = *reinterpret_cast<const uint4*>(p);
    const T* e = reinterpret_cast<const T*>(&r);
#pragma unroll
    for (int i = 0; i < kPer; ++i) out[i] = ToF(e[i]);
  } else if constexpr (kBytes == 8) {
    const uint2 r = *reinterpret_cast<const uint2*>(p);
    const T* e = reinterpret_cast<const T*>(&r);
#pragma unroll
    for (int i = 0; i < kPer; ++i) out[i] = ToF(e[i]);
  } else {
    const uint32_t r = *reinterpret_cast<const uint32_t*>(p);
    const T* e = reinterpret_cast<const T*>(&r);
#pragma unroll
    for (int i = 0; i < kPer; ++i) out[i] = ToF(e[i]);
  }
}

}  // namespace fathom::cuda
