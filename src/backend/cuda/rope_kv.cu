// The rotary-embedding and KV-cache write kernels (rope_kv.h).
#include <cuda_runtime.h>

#include <cfloat>
#include <cstdint>

#include "backend/cuda/dtype.cuh"
#include "backend/cuda/kv_cache.cuh"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/reduce.cuh"
#include "backend/cuda/rope_kv.h"

namespace fathom::cuda {

namespace {

__global__ void RopeCosSinKernel(const int32_t* pos, const float* inv, int64_t half, float scale, float* c, float* s) {
  PdlPrologue();
  const int64_t t = blockIdx.x;
  for (int64_t i = threadIdx.x; i < half; i += blockDim.x) {
    const float angle = static_cast<float>(pos[t]) * inv[i];
    // Double precision sin/cos of the float angle, as the CPU reference and transformers do.
    c[t * half + i] = static_cast<float>(cos(static_cast<double>(angle))) * scale;
    s[t * half + i] = static_cast<float>(sin(static_cast<double>(angle))) * scale;
  }
}

__global__ void ApplyRopeKernel(float* x, int64_t heads, int64_t s0, int64_t s1, const float* c, const float* s,
                                int64_t half, bool interleaved) {
  PdlPrologue();
  const int64_t t = blockIdx.x;
  for (int64_t k = threadIdx.x; k < heads * half; k += blockDim.x) {
    const int64_t h = k / half, i = k % half;
    float* v = x + t * s0 + h * s1;
    const int64_t ia = interleaved ? 2 * i : i, ib = interleaved ? 2 * i + 1 : i + half;
    const float x1 = v[ia], x2 = v[ib], cc = c[t * half + i], sn = s[t * half + i];
    v[ia] = x1 * cc - x2 * sn;
    v[ib] = x2 * cc + x1 * sn;
  }
}

template <typename TC>
__global__ void WriteCacheKernel(const float* src, int64_t heads, int64_t dim, int64_t s0, int64_t s1,
                                 const int32_t* slots, int64_t bs, CacheView c) {
  PdlPrologue();
  TC* const cache = static_cast<TC*>(c.data);
  const int64_t t = blockIdx.x;
  const int64_t slot = slots[t];
  if (slot < 0) return;  // a padding row: no cache write
  const int64_t base = (slot / bs) * c.s0 + (slot % bs) * c.s1;
  for (int64_t k = threadIdx.x; k < heads * dim; k += blockDim.x) {
    const int64_t h = k / dim, i = k % dim;
    Store(cache, base + h * c.s2 + i, src[t * s0 + h * s1 + i]);
  }
}

// Quantizes each (token, head) row of `dim` values into an f8 cache, one warp per (head, group of c.group values):
// scale = max|x| / 448 (at least FLT_MIN; 1 for an all-zero group) and the codes e4m3(x * (1 / scale)), rounded to
// nearest even and saturated: the CPU reference's operations (cpu_backend.cc, StoreCacheRow), each rounded as IEEE
// says whatever the compiler flags (the _rn intrinsics), so the bits agree.
__global__ void WriteCacheF8Kernel(const float* src, int64_t heads, int64_t dim, int64_t s0, int64_t s1,
                                   const int32_t* slots, int64_t bs, CacheView c) {
  PdlPrologue();
  const int64_t t = blockIdx.x;
  const int64_t slot = slots[t];
  if (slot < 0) return;  // a padding row: no cache write
  const int64_t blk = slot / bs, off = slot % bs, groups = dim / c.group;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  auto* const cache = static_cast<__nv_fp8_storage_t*>(c.data);
  for (int64_t p = warp; p < heads * groups; p += warps) {
    const int64_t h = p / groups, g = p % groups;
    const float* x = src + t * s0 + h * s1 + g * c.group;
    float amax = 0.0f;
    for (int64_t i = lane; i < c.group; i += 32) amax = fmaxf(amax, fabsf(x[i]));
    amax = WarpMax(amax);
    const float scale = amax > 0.0f ? fmaxf(__fdiv_rn(amax, 448.0f), FLT_MIN) : 1.0f;
    const float inv = __frcp_rn(scale);
    __nv_fp8_storage_t* row = cache + blk * c.s0 + off * c.s1 + h * c.s2 + g * c.group;
    for (int64_t i = lane; i < c.group; i += 32)
      row[i] = __nv_cvt_float_to_fp8(__fmul_rn(x[i], inv), __NV_SATFINITE, __NV_E4M3);
    if (lane == 0) c.scale[blk * c.ss0 + off * c.ss1 + h * c.ss2 + g] = scale;
  }
}

template <typename TC>
__global__ void RopeWriteCacheKernel(RopeWriteArgs a) {
  PdlPrologue();
  TC* const k_cache = static_cast<TC*>(a.k_cache.data);
  TC* const v_cache = static_cast<TC*>(a.v_cache.data);
  const int64_t t = blockIdx.x, h = blockIdx.y;
  const float* c = a.cos + t * a.half;
  const float* sn = a.sin + t * a.half;
  const bool is_q = h < a.heads;
  const int64_t g = is_q ? 0 : h - a.heads;
  // Slot -1: a padding row of a captured graph's batch; it writes no cache.
  const bool write = !is_q && a.slot_mapping[t] >= 0;
  float* x = is_q ? a.q + t * a.q_s0 + h * a.q_s1 : a.k + t * a.k_s0 + g * a.k_s1;
  int64_t kbase = 0;
  if (write) {
    const int64_t slot = a.slot_mapping[t];
    kbase = (slot / a.block_size) * a.k_cache.s0 + (slot % a.block_size) * a.k_cache.s1 + g * a.k_cache.s2;
  }
  for (int64_t i = threadIdx.x; i < a.half; i += blockDim.x) {
    const int64_t ia = a.interleaved ? 2 * i : i, ib = a.interleaved ? 2 * i + 1 : i + a.half;
    const float x1 = x[ia], x2 = x[ib], cc = c[i], ss = sn[i];
    const float y1 = x1 * cc - x2 * ss, y2 = x2 * cc + x1 * ss;
    x[ia] = y1;
    x[ib] = y2;
    if (write) {
      Store(k_cache, kbase + ia, y1);
      Store(k_cache, kbase + ib, y2);
    }
  }
  if (!write) return;
  for (int64_t i = 2 * a.half + threadIdx.x; i < a.k_dim; i += blockDim.x) {
    Store(k_cache, kbase + i, x[i]);
  }
  if (a.v == nullptr) return;
  const int64_t slot = a.slot_mapping[t];
  const int64_t vbase = (slot / a.block_size) * a.v_cache.s0 + (slot % a.block_size) * a.v_cache.s1 + g * a.v_cache.s2;
  const float* vr = a.v + t * a.v_s0 + g * a.v_s1;
  for (int64_t i = threadIdx.x; i < a.v_dim; i += blockDim.x) Store(v_cache, vbase + i, vr[i]);
}

}  // namespace

int LaunchRopeCosSin(const int32_t* pos, int64_t n, const float* inv, int64_t half, float scale, float* c, float* sn,
                     Stream s) {
  if (n == 0) return 0;
  LaunchKernel(RopeCosSinKernel, static_cast<unsigned>(n), 64, 0, S(s), pos, inv, half, scale, c, sn);
  return Done();
}

int LaunchApplyRope(float* x, int64_t n, int64_t heads, int64_t s0, int64_t s1, const float* c, const float* sn,
                    int64_t half, bool interleaved, Stream s) {
  if (n == 0) return 0;
  LaunchKernel(ApplyRopeKernel, static_cast<unsigned>(n), 128, 0, S(s), x, heads, s0, s1, c, sn, half, interleaved);
  return Done();
}

int LaunchWriteCache(const float* src, int64_t n, int64_t heads, int64_t dim, int64_t s0, int64_t s1,
                     const int32_t* slots, int64_t bs, CacheView c, Stream s) {
  if (n == 0) return 0;
  if (c.dtype == kF8) {
    if (!CacheScalesFit(c, dim)) return static_cast<int>(cudaErrorInvalidValue);
    LaunchKernel(WriteCacheF8Kernel, static_cast<unsigned>(n), 128, 0, S(s), src, heads, dim, s0, s1, slots, bs, c);
    return Done();
  }
  return DispatchFloat(c.dtype, [&](auto tag) {
    using TC = decltype(tag);
    LaunchKernel(WriteCacheKernel<TC>, static_cast<unsigned>(n), 128, 0, S(s), src, heads, dim, s0, s1, slots, bs, c);
    return Done();
  });
}

int LaunchRopeWriteCache(const RopeWriteArgs& a, Stream s) {
  if (a.n == 0) return 0;
  if (a.v != nullptr && a.v_cache.dtype != a.k_cache.dtype) return static_cast<int>(cudaErrorInvalidValue);
  return DispatchFloat(a.k_cache.dtype, [&](auto tag) {
    using TC = decltype(tag);
    LaunchKernel(RopeWriteCacheKernel<TC>,
                 dim3(static_cast<unsigned>(a.n), static_cast<unsigned>(a.heads + a.kv_heads)), 64, 0, S(s), a);
    return Done();
  });
}

}  // namespace fathom::cuda
