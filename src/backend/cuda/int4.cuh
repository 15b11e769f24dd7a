// Device helpers of the 4-bit tile layout (int4.h), shared by the W4A16 kernels of int4.cu and the grouped expert
// kernels of moe.cu: a lane's A fragment of a 16 x 16 tile from one tiled word, minus its group's zeros, the
// per-group scaling of the accumulators, and WarpRowBlock, a warp's sums over one 16-row block streamed from global
// memory against tokens staged in shared memory (the GEMV-like kernels of both files).
//
//   const GroupMeta gm = MakeMeta(zeros2, s0, s1, /*zshift=*/4 * (lane / 4), zero_offset);
//   const uint32_t a[4] = {CodesMinusZero(word, gm.zz0), CodesMinusZero(word >> 4, gm.zz1),
//                          CodesMinusZero(word >> 8, gm.zz0), CodesMinusZero(word >> 12, gm.zz1)};
//   Mma16816<__nv_bfloat16>(tmp, a, b0, b1);   // then AddScaled(acc, tmp, gm.s0, gm.s1) at the group's end
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "backend/cuda/dtype.cuh"
#include "backend/cuda/memory.cuh"
#include "backend/cuda/mma.cuh"

namespace fathom::cuda::int4 {

// (a & b) | c.
__device__ __forceinline__ uint32_t Lop3AndOr(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t d;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

// Two codes (bits 0..3 and 16..19 of `word`) minus their zero, as bf16x2: 0x4300 | q is the bf16 128 + q, and
// zz holds 128 + z twice; the difference, an integer in [-16, 15], is exact.
__device__ __forceinline__ uint32_t CodesMinusZero(uint32_t word, uint32_t zz) {
  const uint32_t v = Lop3AndOr(word, 0x000F000Fu, 0x43004300u);
  const __nv_bfloat162 d =
      __hsub2(reinterpret_cast<const __nv_bfloat162&>(v), reinterpret_cast<const __nv_bfloat162&>(zz));
  return reinterpret_cast<const uint32_t&>(d);
}

// A lane's A fragment (rows r0 and r0 + 8 of its 16 x 16 tile) from a tiled word.
__device__ __forceinline__ void Fragment(uint32_t word, uint32_t zz0, uint32_t zz1, uint32_t (&a)[4]) {
  a[0] = CodesMinusZero(word, zz0);
  a[1] = CodesMinusZero(word >> 4, zz1);
  a[2] = CodesMinusZero(word >> 8, zz0);
  a[3] = CodesMinusZero(word >> 12, zz1);
}

// acc += s * tmp (rows r0: s0, r0 + 8: s1), then tmp = 0: one group's sums, scaled, into the totals.
template <int NT>
__device__ __forceinline__ void AddScaled(float (&acc)[NT][4], float (&tmp)[NT][4], float s0, float s1) {
#pragma unroll
  for (int tt = 0; tt < NT; ++tt) {
    acc[tt][0] += s0 * tmp[tt][0];
    acc[tt][1] += s0 * tmp[tt][1];
    acc[tt][2] += s1 * tmp[tt][2];
    acc[tt][3] += s1 * tmp[tt][3];
    tmp[tt][0] = tmp[tt][1] = tmp[tt][2] = tmp[tt][3] = 0.0f;
  }
}

// The zeros and scales of one group for a lane's two rows (r0, r0 + 8).
struct GroupMeta {
  uint32_t zz0, zz1;  // 128 + z, twice, as bf16x2 (CodesMinusZero)
  float s0, s1;
};

// z: the group's two zero words (rows 16 rb + 0..7 and + 8..15); zshift = 4 * (lane / 4).
__device__ __forceinline__ GroupMeta MakeMeta(uint2 z, float s0, float s1, int zshift, int zero_offset) {
  GroupMeta m;
  m.zz0 = 0x43004300u + (((z.x >> zshift) & 0xFu) + zero_offset) * 0x00010001u;
  m.zz1 = 0x43004300u + (((z.y >> zshift) & 0xFu) + zero_offset) * 0x00010001u;
  m.s0 = s0;
  m.s1 = s1;
  return m;
}

// A warp's sums over one 16-row block of kMats tiled weights that share their inputs (gate and up: 2), against NT n8
// tiles of tokens staged as bf16 in shared memory (token rows `pitch` elements apart; this lane reads token lane / 4 of
// each tile at inputs 4 (lane % 4) .. + 3 of each 16, the tile layout's B fragment). Rows of tokens at or past `valid`
// are not read (their products are zeros). Weights and their group's scales and zeros come straight from global
// memory, kUnroll chunks of 64 inputs in flight a lane before any is used.
template <int NT, int kMats, typename TS, bool kChunkGroup>
struct WarpRowBlock {
  const uint4* w[kMats];     // this lane's word of chunk 0: tiled weights + rb * chunks * 32 + lane
  const TS* s[kMats];        // the row block's scales [groups][16]
  const uint32_t* z[kMats];  // its zeros [groups][2]
  int64_t group;             // inputs a group (K for one group a row)
  int zero_offset, lane;
  float acc[kMats][NT][4];

  __device__ __forceinline__ void Zero() {
#pragma unroll
    for (int m = 0; m < kMats; ++m)
#pragma unroll
      for (int tt = 0; tt < NT; ++tt) acc[m][tt][0] = acc[m][tt][1] = acc[m][tt][2] = acc[m][tt][3] = 0.0f;
  }

  __device__ __forceinline__ GroupMeta Meta(int m, int64_t k) const {
    const int64_t g = k / group;
    return MakeMeta(*reinterpret_cast<const uint2*>(z[m] + 2 * g), ToF(s[m][g * 16 + lane / 4]),
                    ToF(s[m][g * 16 + lane / 4 + 8]), 4 * (lane / 4), zero_offset);
  }

  // acc += chunk c's products: weights wv, their groups gm (kChunkGroup: a chunk lies in one group; otherwise each
  // 16-input tile looks its group up), inputs at xb (this lane's B fragment of the chunk's first tile).
  __device__ __forceinline__ void Chunk(const uint4 (&wv)[kMats], GroupMeta (&gm)[kMats], int64_t c,
                                        const __nv_bfloat16* xb, int pitch, int valid) {
    float tmp[kMats][NT][4];
#pragma unroll
    for (int m = 0; m < kMats; ++m)
#pragma unroll
      for (int tt = 0; tt < NT; ++tt) tmp[m][tt][0] = tmp[m][tt][1] = tmp[m][tt][2] = tmp[m][tt][3] = 0.0f;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      uint32_t af[kMats][4];
#pragma unroll
      for (int m = 0; m < kMats; ++m) {
        if constexpr (!kChunkGroup) gm[m] = Meta(m, c * 64 + 16 * j);
        const uint32_t word = j == 0 ? wv[m].x : j == 1 ? wv[m].y : j == 2 ? wv[m].z : wv[m].w;
        Fragment(word, gm[m].zz0, gm[m].zz1, af[m]);
      }
#pragma unroll
      for (int tt = 0; tt < NT; ++tt) {
        const uint2 bv = 8 * tt + lane / 4 < valid ? *reinterpret_cast<const uint2*>(xb + tt * 8 * pitch + 16 * j)
                                                   : make_uint2(0u, 0u);
#pragma unroll
        for (int m = 0; m < kMats; ++m) Mma16816<__nv_bfloat16>(tmp[m][tt], af[m], bv.x, bv.y);
      }
      if constexpr (!kChunkGroup) {
#pragma unroll
        for (int m = 0; m < kMats; ++m) AddScaled(acc[m], tmp[m], gm[m].s0, gm[m].s1);
      }
    }
    if constexpr (kChunkGroup) {
#pragma unroll
      for (int m = 0; m < kMats; ++m) AddScaled(acc[m], tmp[m], gm[m].s0, gm[m].s1);
    }
  }

  // Chunks first, first + step, ... below end; chunk c's inputs at xlane + (c - base) * 64 (xlane: this lane's token
  // row and column offset in the stage).
  template <int kUnroll>
  __device__ __forceinline__ void Stream(int64_t first, int64_t end, int step, int64_t base, const __nv_bfloat16* xlane,
                                         int pitch, int valid) {
    for (int64_t c0 = first; c0 < end; c0 += static_cast<int64_t>(kUnroll) * step) {
      uint4 wv[kUnroll][kMats];
      GroupMeta gm[kUnroll][kMats];
#pragma unroll
      for (int q = 0; q < kUnroll; ++q) {
        const int64_t c = c0 + static_cast<int64_t>(q) * step;
#pragma unroll
        for (int m = 0; m < kMats; ++m) {
          if (c < end) {
            wv[q][m] = LoadStreaming(w[m] + c * 32);
            if constexpr (kChunkGroup) gm[q][m] = Meta(m, c * 64);
          }
        }
      }
#pragma unroll
      for (int q = 0; q < kUnroll; ++q) {
        const int64_t c = c0 + static_cast<int64_t>(q) * step;
        if (c < end) Chunk(wv[q], gm[q], c, xlane + (c - base) * 64, pitch, valid);
      }
    }
  }

  // Split-K within a block: the warps of splits 1 .. splits - 1 of a row block (slot `slot` of `slots` row blocks)
  // hand their sums to split 0's warp, which adds them in split order; `red` is shared memory of
  // (splits - 1) * slots * kMats * NT * 128 floats, free to reuse. Every thread of the block calls it (two barriers);
  // afterwards only split 0's acc is the total.
  __device__ __forceinline__ void AddSplits(float* red, int split, int splits, int slot, int slots, bool active) {
    constexpr int kVals = kMats * NT * 4;
    __syncthreads();
    if (split > 0 && active) {
      float* mine = red + (((split - 1) * slots + slot) * kVals) * 32 + lane;
#pragma unroll
      for (int m = 0; m < kMats; ++m)
#pragma unroll
        for (int tt = 0; tt < NT; ++tt)
#pragma unroll
          for (int v = 0; v < 4; ++v) mine[((m * NT + tt) * 4 + v) * 32] = acc[m][tt][v];
    }
    __syncthreads();
    if (split > 0 || !active) return;
    for (int sp = 1; sp < splits; ++sp) {
      const float* theirs = red + (((sp - 1) * slots + slot) * kVals) * 32 + lane;
#pragma unroll
      for (int m = 0; m < kMats; ++m)
#pragma unroll
        for (int tt = 0; tt < NT; ++tt)
#pragma unroll
          for (int v = 0; v < 4; ++v) acc[m][tt][v] += theirs[((m * NT + tt) * 4 + v) * 32];
    }
  }
};

}  // namespace fathom::cuda::int4
