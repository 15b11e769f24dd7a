// Rotary embeddings and KV-cache writes: the cos/sin tables of a batch, rotation in place, the copy of new K/V rows
// into their cache slots, and the fused form of all three that the attention layers call. Launchers follow launcher.h.
//
//   cuda::LaunchRopeCosSin(positions, n, inv_freq, half, scale, cos, sin, stream);
//   cuda::RopeWriteArgs a{...};                 // q, k, v, cos, sin, slots, caches
//   cuda::LaunchRopeWriteCache(a, stream);      // rotates q and k, writes k and v to the cache
#pragma once

#include <cstdint>

#include "backend/cuda/launcher.h"

namespace fathom::cuda {

// cos, sin [n, half] = cos/sin(positions[t] * inv_freq[i]) * scale (the angle's sin and cos in double).
int LaunchRopeCosSin(const int32_t* positions, int64_t n, const float* inv_freq, int64_t half, float scale, float* cos,
                     float* sin, Stream s);

// x [n, heads, >= 2 * half] with strides (s0, s1, 1); rotates in place.
int LaunchApplyRope(float* x, int64_t n, int64_t heads, int64_t s0, int64_t s1, const float* cos, const float* sin,
                    int64_t half, bool interleaved, Stream s);

// src [n, heads, dim] strides (s0, s1, 1) -> cache rows at slot_mapping (slot -1: a padding row, not written). An f8
// cache gets e4m3 codes and a scale per group (launcher.h's CacheView), as the CPU reference quantizes.
int LaunchWriteCache(const float* src, int64_t n, int64_t heads, int64_t dim, int64_t s0, int64_t s1,
                     const int32_t* slot_mapping, int64_t block_size, CacheView cache, Stream s);

// Rotates q [n, heads, >= 2 * half] and k [n, kv_heads, k_dim] in place, then writes k and v [n, kv_heads, v_dim]
// (v may be null) into their cache slots: one launch for ApplyRope(q), ApplyRope(k) and WriteKv. The two caches have
// one dtype.
struct RopeWriteArgs {
  float* q;
  int64_t q_s0, q_s1, heads;
  float* k;
  int64_t k_s0, k_s1, kv_heads, k_dim;
  const float* v;
  int64_t v_s0, v_s1, v_dim;
  const float* cos;
  const float* sin;
  int64_t half;
  bool interleaved;
  const int32_t* slot_mapping;
  int64_t block_size;
  CacheView k_cache, v_cache;
  int64_t n;
};
int LaunchRopeWriteCache(const RopeWriteArgs& a, Stream s);

}  // namespace fathom::cuda
