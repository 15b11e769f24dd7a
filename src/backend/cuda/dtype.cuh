// Element types on the device: fathom::DType's codes as the launchers receive them, typed loads and stores that
// widen to or round from float32, 16-byte unpacking of bf16, and DispatchDType, which turns a launcher's runtime dtype
// into the element type its kernel is templated on. Include from .cu files only.
//
//   return DispatchFloat(w_dtype, [&](auto tag) {   // f32, f16 or bf16; cudaErrorInvalidValue for any other
//     using TW = decltype(tag);
//     LaunchKernel(NormKernel<TW>, rows, 256, 0, S(s), static_cast<const TW*>(w), ...);
//     return Done();
//   });
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

namespace fathom::cuda {

// fathom::DType values (core/dtype.h).
constexpr int kF32 = 0, kF16 = 1, kBF16 = 2, kF8 = 3, kI32 = 5;

// The DType code of an element type.
template <typename T>
struct DTypeCode;
template <>
struct DTypeCode<float> : std::integral_constant<int, kF32> {};
template <>
struct DTypeCode<__half> : std::integral_constant<int, kF16> {};
template <>
struct DTypeCode<__nv_bfloat16> : std::integral_constant<int, kBF16> {};
template <>
struct DTypeCode<__nv_fp8_e4m3> : std::integral_constant<int, kF8> {};

template <typename T>
constexpr bool kIsF8 = std::is_same_v<T, __nv_fp8_e4m3>;

// f(T{}) for the element type T among Ts whose code is `dtype`, returning what f returns (a cudaError_t as int);
// cudaErrorInvalidValue when none is. Each T instantiates the kernels f launches: list only the types the op can get.
template <typename... Ts, typename F>
int DispatchDType(int dtype, F&& f) {
  int result = static_cast<int>(cudaErrorInvalidValue);
  const bool found = ((dtype == DTypeCode<Ts>::value ? (result = f(Ts{}), true) : false) || ...);
  (void)found;
  return result;
}
// The float types of weights, tables, biases and caches: f32, f16, bf16.
template <typename F>
int DispatchFloat(int dtype, F&& f) {
  return DispatchDType<float, __half, __nv_bfloat16>(dtype, static_cast<F&&>(f));
}
// Those and f8 e4m3 (block-scaled linear weights, FP8 KV caches).
template <typename F>
int DispatchFloatOrF8(int dtype, F&& f) {
  return DispatchDType<float, __half, __nv_bfloat16, __nv_fp8_e4m3>(dtype, static_cast<F&&>(f));
}

// Element i as float32.
__device__ __forceinline__ float Load(const float* p, int64_t i) {
  return p[i];
}
__device__ __forceinline__ float Load(const __half* p, int64_t i) {
  return __half2float(p[i]);
}
__device__ __forceinline__ float Load(const __nv_bfloat16* p, int64_t i) {
  return __bfloat162float(p[i]);
}
__device__ __forceinline__ float Load(const __nv_fp8_e4m3* p, int64_t i) {
  __nv_fp8_e4m3 v;
  v.__x = reinterpret_cast<const __nv_fp8_storage_t*>(p)[i];
  return static_cast<float>(v);
}

// Element i = v, rounded to nearest even.
__device__ __forceinline__ void Store(float* p, int64_t i, float v) {
  p[i] = v;
}
__device__ __forceinline__ void Store(__half* p, int64_t i, float v) {
  p[i] = __float2half_rn(v);
}
__device__ __forceinline__ void Store(__nv_bfloat16* p, int64_t i, float v) {
  p[i] = __float2bfloat16_rn(v);
}

// A value as float32.
__device__ __forceinline__ float ToF(float v) {
  return v;
}
__device__ __forceinline__ float ToF(__half v) {
  return __half2float(v);
}
__device__ __forceinline__ float ToF(__nv_bfloat16 v) {
  return __bfloat162float(v);
}
__device__ __forceinline__ float ToF(__nv_fp8_e4m3 v) {
  return static_cast<float>(v);
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

}  // namespace fathom::cuda
