// The tensor-core decode attention kernel (attention.h's SplitAttentionKind::kMma; its launch: attention_common.cuh).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "backend/cuda/attention.h"
#include "backend/cuda/attention_common.cuh"
#include "backend/cuda/dtype.cuh"
#include "backend/cuda/fp8.cuh"
#include "backend/cuda/kv_cache.cuh"
#include "backend/cuda/mma.cuh"

namespace fathom::cuda {

namespace {

// Tensor-core flash-decoding for bf16/f16 caches, with the same grid, chunks and partial states as
// GqaAttentionKernel. Each warp takes tiles of 16 keys (its K and V rows staged in shared memory with 16-byte
// loads) and runs mma.m16n8k16 twice: S^T = K Q^T (16 keys x 8 query heads, the group padded to 8) and
// O^T += V^T P^T (head dims x 8 heads, V^T through ldmatrix.trans), with an online softmax in base 2 per head.
// Q (pre-scaled by scale * log2 e) and P are rounded to the cache dtype, as FlashAttention does; accumulation is
// float32. The fragment layouts are PTX's for m16n8k16: g = lane / 4, t = lane % 4.
// An f8 cache (TC = e4m3, one scale per key row: MmaAttentionFits) runs the bf16 form on the raw codes, which bf16
// holds exactly: each key's K scale multiplies its scores after the first mma, and its V scale its softmax weights
// before they are rounded for the second (the row sums l stay unscaled).
template <typename TC, int kD>
__global__ void __launch_bounds__(kMmaWarps * 32)
    MmaAttentionKernel(AttentionArgs a, int64_t chunk, int64_t chunks, float* part_m, float* part_l, float* part_acc) {
  constexpr bool kF8Cache = kIsF8<TC>;
  using T = std::conditional_t<kF8Cache, __nv_bfloat16, TC>;  // the mma operands' type
  constexpr int kRow = kD + 8;  // shared row stride in elements: 16 bytes of padding against bank conflicts
  constexpr int kDT = kD / 16;
  constexpr int kTileBytes = kMmaTile * kRow * static_cast<int>(sizeof(T));
  constexpr int kLoopBytes = kMmaWarps * (2 * kTileBytes + kMmaTile * 8 * static_cast<int>(sizeof(T)));
  constexpr int kMergeBytes = kMmaWarps * 8 * kD * static_cast<int>(sizeof(float));
  // The tiles of the key loop and the warps' output states of the merge share one buffer.
  __shared__ __align__(16) unsigned char raw[kLoopBytes > kMergeBytes ? kLoopBytes : kMergeBytes];
  __shared__ __align__(16) T sq[8][kD];
  __shared__ float sm_m[kMmaWarps][8], sm_l[kMmaWarps][8];
  GroupBlock b;
  if (!StartGroupBlock(a, chunk, chunks, part_m, part_l, &b)) return;
  const int64_t t = b.t, kvh = b.kvh, c = b.c, j0 = b.j0, j1 = b.j1;
  const int group = b.group;
  const int32_t* table = b.table;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, tq = lane % 4;
  constexpr float kLog2e = 1.4426950408889634f;
  for (int e = threadIdx.x; e < 8 * kD; e += blockDim.x) {
    const int h = e / kD, d = e % kD;
    const float v = h < group ? a.q[t * a.q_s0 + (kvh * group + h) * a.q_s1 + d] * (a.scale * kLog2e) : 0.0f;
    sq[h][d] = FromF<T>(v);
  }
  __syncthreads();
  uint32_t qb[kDT][2];
#pragma unroll
  for (int dt = 0; dt < kDT; ++dt) {
    qb[dt][0] = *reinterpret_cast<const uint32_t*>(&sq[g][dt * 16 + 2 * tq]);
    qb[dt][1] = *reinterpret_cast<const uint32_t*>(&sq[g][dt * 16 + 8 + 2 * tq]);
  }
  T* sk = reinterpret_cast<T*>(raw) + warp * 2 * kMmaTile * kRow;                        // [16][kRow]
  T* sv = sk + kMmaTile * kRow;                                                          // [16][kRow]
  T* sp = reinterpret_cast<T*>(raw + kMmaWarps * 2 * kTileBytes) + warp * kMmaTile * 8;  // P^T [16 keys][8 heads]
  const TC* kc = static_cast<const TC*>(a.k.data) + kvh * a.k.s2;
  const TC* vc = static_cast<const TC*>(a.v.data) + kvh * a.v.s2;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;  // heads 2tq and 2tq + 1
  float o[kDT][4];
#pragma unroll
  for (int dt = 0; dt < kDT; ++dt) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.0f;
  constexpr int kChunksPerRow = kD / 8;  // 16-byte pieces of a 16-bit row
  // f8: each key's K and V scales, staged with its rows ([warp][K, V][16 keys]).
  __shared__ float s_scale[kF8Cache ? kMmaWarps : 1][2][kMmaTile];
  const int32_t bs = static_cast<int32_t>(a.block_size);
  for (int64_t jb = j0 + warp * kMmaTile; jb < j1; jb += kMmaWarps * kMmaTile) {
    if constexpr (kF8Cache) {
      // 16 codes (one 16-byte load) a piece, widened to 16 exact bf16 values (two 16-byte stores): half the loads of
      // the 16-bit form for the same keys. Lanes 0-15 stage key `lane`'s K scale, lanes 16-31 its V scale.
      constexpr int kF8Pieces = kD / 16;
#pragma unroll
      for (int i = lane; i < kMmaTile * kF8Pieces; i += 32) {
        const int r = i / kF8Pieces, col = (i % kF8Pieces) * 16;
        const int64_t j = jb + r;
        uint4 k16 = make_uint4(0, 0, 0, 0), v16 = make_uint4(0, 0, 0, 0);
        if (j < j1) {
          const int32_t jj = static_cast<int32_t>(j);
          const int64_t blk = table[jj / bs], off = jj % bs;
          k16 = *reinterpret_cast<const uint4*>(kc + blk * a.k.s0 + off * a.k.s1 + col);
          v16 = *reinterpret_cast<const uint4*>(vc + blk * a.v.s0 + off * a.v.s1 + col);
        }
        const uint32_t kw[4] = {k16.x, k16.y, k16.z, k16.w}, vw[4] = {v16.x, v16.y, v16.z, v16.w};
        uint32_t kb[8], vb[8];
#pragma unroll
        for (int w = 0; w < 4; ++w) {
          kb[2 * w] = F8PairToBf16(static_cast<uint16_t>(kw[w] & 0xffffu), 1.0f);
          kb[2 * w + 1] = F8PairToBf16(static_cast<uint16_t>(kw[w] >> 16), 1.0f);
          vb[2 * w] = F8PairToBf16(static_cast<uint16_t>(vw[w] & 0xffffu), 1.0f);
          vb[2 * w + 1] = F8PairToBf16(static_cast<uint16_t>(vw[w] >> 16), 1.0f);
        }
        *reinterpret_cast<uint4*>(sk + r * kRow + col) = make_uint4(kb[0], kb[1], kb[2], kb[3]);
        *reinterpret_cast<uint4*>(sk + r * kRow + col + 8) = make_uint4(kb[4], kb[5], kb[6], kb[7]);
        *reinterpret_cast<uint4*>(sv + r * kRow + col) = make_uint4(vb[0], vb[1], vb[2], vb[3]);
        *reinterpret_cast<uint4*>(sv + r * kRow + col + 8) = make_uint4(vb[4], vb[5], vb[6], vb[7]);
      }
      {
        const int r = lane % kMmaTile, which = lane / kMmaTile;  // 0: K, 1: V
        const int64_t j = jb + r;
        float sc = 0.0f;
        if (j < j1) {
          const int32_t jj = static_cast<int32_t>(j);
          sc = CacheScale(which == 0 ? a.k : a.v, table[jj / bs], jj % bs, kvh, 0);
        }
        s_scale[warp][which][r] = sc;
      }
    } else {
#pragma unroll
      for (int i = lane; i < kMmaTile * kChunksPerRow; i += 32) {
        const int r = i / kChunksPerRow, col = (i % kChunksPerRow) * 8;
        const int64_t j = jb + r;
        uint4 kv4 = make_uint4(0, 0, 0, 0), vv4 = make_uint4(0, 0, 0, 0);
        if (j < j1) {
          const int32_t jj = static_cast<int32_t>(j);
          const int64_t blk = table[jj / bs], off = jj % bs;
          kv4 = *reinterpret_cast<const uint4*>(kc + blk * a.k.s0 + off * a.k.s1 + col);
          vv4 = *reinterpret_cast<const uint4*>(vc + blk * a.v.s0 + off * a.v.s1 + col);
        }
        *reinterpret_cast<uint4*>(sk + r * kRow + col) = kv4;
        *reinterpret_cast<uint4*>(sv + r * kRow + col) = vv4;
      }
    }
    __syncwarp();
    float s[4] = {0.0f, 0.0f, 0.0f, 0.0f};  // S^T: (key g, heads 2tq, 2tq+1), (key g + 8, same heads)
#pragma unroll
    for (int dt = 0; dt < kDT; ++dt) {
      uint32_t af[4];
      LdMatrixX4(af, sk + ((lane & 7) + ((lane >> 3) & 1) * 8) * kRow + dt * 16 + ((lane >> 4) & 1) * 8, false);
      Mma16816<T>(s, af, qb[dt][0], qb[dt][1]);
    }
    float vs0 = 1.0f, vs1 = 1.0f;  // f8: the V scales of keys g and g + 8 (0 past the chunk: their weights are 0)
    if constexpr (kF8Cache) {
      const float ks0 = s_scale[warp][0][g], ks1 = s_scale[warp][0][g + 8];
      s[0] *= ks0;
      s[1] *= ks0;
      s[2] *= ks1;
      s[3] *= ks1;
      vs0 = s_scale[warp][1][g];
      vs1 = s_scale[warp][1][g + 8];
    }
    if (jb + g >= j1) s[0] = s[1] = -INFINITY;
    if (jb + g + 8 >= j1) s[2] = s[3] = -INFINITY;
    float x0 = fmaxf(s[0], s[2]), x1 = fmaxf(s[1], s[3]);
#pragma unroll
    for (int off = 4; off < 32; off *= 2) {
      x0 = fmaxf(x0, __shfl_xor_sync(0xffffffffu, x0, off));
      x1 = fmaxf(x1, __shfl_xor_sync(0xffffffffu, x1, off));
    }
    const float n0 = fmaxf(m0, x0), n1 = fmaxf(m1, x1);  // finite: key jb is in range
    const float c0 = exp2f(m0 - n0), c1 = exp2f(m1 - n1);
    const float p0 = exp2f(s[0] - n0), p1 = exp2f(s[1] - n1), p2 = exp2f(s[2] - n0), p3 = exp2f(s[3] - n1);
    l0 = l0 * c0 + p0 + p2;
    l1 = l1 * c1 + p1 + p3;
    m0 = n0;
    m1 = n1;
#pragma unroll
    for (int dt = 0; dt < kDT; ++dt) {
      o[dt][0] *= c0;
      o[dt][1] *= c1;
      o[dt][2] *= c0;
      o[dt][3] *= c1;
    }
    sp[g * 8 + 2 * tq] = FromF<T>(p0 * vs0);
    sp[g * 8 + 2 * tq + 1] = FromF<T>(p1 * vs0);
    sp[(g + 8) * 8 + 2 * tq] = FromF<T>(p2 * vs1);
    sp[(g + 8) * 8 + 2 * tq + 1] = FromF<T>(p3 * vs1);
    __syncwarp();
    const uint32_t pb0 = Pack2<T>(sp[(2 * tq) * 8 + g], sp[(2 * tq + 1) * 8 + g]);
    const uint32_t pb1 = Pack2<T>(sp[(2 * tq + 8) * 8 + g], sp[(2 * tq + 9) * 8 + g]);
#pragma unroll
    for (int dt = 0; dt < kDT; ++dt) {
      uint32_t af[4];
      LdMatrixX4(af, sv + ((lane & 7) + ((lane >> 4) & 1) * 8) * kRow + dt * 16 + ((lane >> 3) & 1) * 8, true);
      Mma16816<T>(o[dt], af, pb0, pb1);
    }
    __syncwarp();
  }
#pragma unroll
  for (int off = 4; off < 32; off *= 2) {
    l0 += __shfl_xor_sync(0xffffffffu, l0, off);
    l1 += __shfl_xor_sync(0xffffffffu, l1, off);
  }
  __syncthreads();  // every warp is done with its tiles: the buffer now holds the warps' states
  float* sm_acc = reinterpret_cast<float*>(raw);  // [kMmaWarps][8][kD]
  if (g == 0) {
    sm_m[warp][2 * tq] = m0;
    sm_m[warp][2 * tq + 1] = m1;
    sm_l[warp][2 * tq] = l0;
    sm_l[warp][2 * tq + 1] = l1;
  }
#pragma unroll
  for (int dt = 0; dt < kDT; ++dt) {
    float* w = sm_acc + warp * 8 * kD;
    w[(2 * tq) * kD + dt * 16 + g] = o[dt][0];
    w[(2 * tq + 1) * kD + dt * 16 + g] = o[dt][1];
    w[(2 * tq) * kD + dt * 16 + g + 8] = o[dt][2];
    w[(2 * tq + 1) * kD + dt * 16 + g + 8] = o[dt][3];
  }
  __syncthreads();
  FinishGroupChunk<kMmaWarps, true>(a, t, kvh, group, c, chunks, kD, sm_m, sm_l, sm_acc, part_m, part_l, part_acc);
}

template <typename T>
void LaunchMma(const AttentionArgs& a, int64_t chunk, int64_t chunks, float* pm, float* pl, float* pa, cudaStream_t s) {
  LaunchGroup(MmaAttentionKernel<T, 64>, MmaAttentionKernel<T, 128>, kMmaWarps, a, chunk, chunks, pm, pl, pa, s);
}

}  // namespace

// The tensor-core kernel's conditions: 16-bit or f8 caches (one scale per row) with rows 16-byte aligned; head dim 64
// or 128; groups of up to 8.
bool MmaAttentionFits(const AttentionArgs& a) {
  if (a.k_dim != a.v_dim || (a.k_dim != 64 && a.k_dim != 128)) return false;
  if (a.kv_heads <= 0 || a.heads % a.kv_heads != 0 || a.heads / a.kv_heads > 8) return false;
  if (a.k.dtype != a.v.dtype || (a.k.dtype != kF16 && a.k.dtype != kBF16 && a.k.dtype != kF8)) return false;
  const bool f8 = a.k.dtype == kF8;
  const int64_t piece = f8 ? 16 : 8;  // elements of one 16-byte load
  for (const CacheView* c : {&a.k, &a.v}) {
    if (c->s0 % piece != 0 || c->s1 % piece != 0 || c->s2 % piece != 0) return false;
    if (reinterpret_cast<uintptr_t>(c->data) % 16 != 0) return false;
    if (f8 && (c->scale == nullptr || c->group != a.k_dim)) return false;
  }
  return true;
}

void LaunchMmaAttention(const AttentionArgs& a, int64_t chunk, int64_t chunks, float* pm, float* pl, float* pa,
                        cudaStream_t s) {
  if (a.k.dtype == kF16) {
    LaunchMma<__half>(a, chunk, chunks, pm, pl, pa, s);
  } else if (a.k.dtype == kF8) {
    LaunchMma<__nv_fp8_e4m3>(a, chunk, chunks, pm, pl, pa, s);
  } else {
    LaunchMma<__nv_bfloat16>(a, chunk, chunks, pm, pl, pa, s);
  }
}

}  // namespace fathom::cuda
