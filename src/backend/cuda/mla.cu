// The MLA attention kernels (mla.h): decode over the latent cache, and the prefill context attention.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "backend/cuda/attention_common.cuh"
#include "backend/cuda/dtype.cuh"
#include "backend/cuda/flash_tile.cuh"
#include "backend/cuda/fp8.cuh"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/memory.cuh"
#include "backend/cuda/mla.h"
#include "backend/cuda/mma.cuh"
#include "backend/cuda/reduce.cuh"

namespace fathom::cuda {

namespace {

// MLA attention over the latent cache (the absorbed form: K is a token's 576-value latent row, V its first 512
// values, one KV head for every query head). A block takes one token, kMlaHeads query heads and a chunk of keys, in
// tiles of kMlaTile keys staged in shared memory once for all its heads (the generic kernel reads them once per
// head). Per tile, each warp computes S^T = K Q^T for its 16 keys x 16 heads (mma.m16n8k16; Q pre-scaled by
// scale * log2 e and rounded to the cache dtype), the warps share each head's tile maximum through shared memory so
// that they keep one running maximum, each writes P^T (rounded) for its keys, and then each warp accumulates
// O^T += V^T P^T over the whole tile for its 128 of the 512 value dims. Chunks and partial states are those of the
// other split kernels (MergeAttentionKernel combines them).
// MlaKernelOptions::decode_kernel = false (FATHOM_CUDA_NO_MLA_ATTENTION=1) turns it off: the generic kernels then
// serve MLA.
// The wide instance (MlaDecodeOptions::wide, kHG = 2 and kNT = 4) takes 64 heads a block with two groups of four
// warps, each warp 32 heads: a tile of rows staged once feeds four times the mma work, so V3's 128 heads read the
// cache twice a token instead of eight times.
constexpr int kMlaK = 576, kMlaV = 512, kMlaHeads = 16, kMlaTile = 64, kMlaWarps = 4, kMlaWideHeads = 64;
constexpr int kMlaRow = kMlaK + 8;  // shared row stride in elements: 16 bytes of padding against bank conflicts
// P^T's row stride for `heads` heads a block: 16 bytes of padding, so that the 32-bit stores of a warp's P pairs and
// the ldmatrix.trans reads of its 8-key rows fall in distinct banks (unpadded, 64 heads make rows 128 bytes apart:
// 4-way conflicts on the stores, 8-way on the reads).
constexpr int MlaPRow(int heads) {
  return heads + 8;
}
// Shared memory of the one-tile instance with `heads` heads a block: the tile of rows, Q, P^T, and the key groups'
// maxima and sums.
constexpr int MlaBaseSmemBytes(int heads) {
  return (kMlaTile + heads) * kMlaRow * 2 + kMlaTile * MlaPRow(heads) * 2 +
         2 * kMlaWarps * heads * static_cast<int>(sizeof(float));
}
constexpr int kMlaSmemBytes = MlaBaseSmemBytes(kMlaHeads);
static_assert(kMlaWarps * 128 == kMlaV && kMlaWarps * 16 == kMlaTile,
              "one warp of a head group per 16 keys and per 128 value dims");
// An f8 cache (MlaDecodeOptions::fp8): each tile's e4m3 codes and the rows' scales (one per kMlaGroup values) are
// widened to bf16 (code times scale, the CPU's product, rounded) into the same tile the 16-bit caches fill, and the
// rest of the kernel runs on bf16. With one stage the codes go through registers (the 16-bit instance's shared
// memory: two blocks a multiprocessor); with two they land by cp.async in staging areas first.
// kStages = 2 (MlaDecodeOptions::pipeline): the next tile's loads are in flight while the block computes on this one
// (two tiles of rows, or for f8 two staging areas, in shared memory: one block a multiprocessor).
constexpr int kMlaGroup = 64, kMlaScales = kMlaK / kMlaGroup;
constexpr int kMlaTileElems = kMlaTile * kMlaRow;
constexpr int kMlaStageBytes = kMlaTile * kMlaK + kMlaTile * kMlaScales * 4;  // f8: one tile's codes and scales
static_assert(kMlaSmemBytes % 16 == 0 && kMlaStageBytes % 16 == 0 && MlaBaseSmemBytes(kMlaWideHeads) % 16 == 0,
              "16-byte aligned areas");
// Shared memory of an instance: the tiles of rows (one for f8, which widens into it), Q, P^T and the per-warp maxima
// and sums (MlaBaseSmemBytes with one tile), then the two-stage f8 instance's staging areas.
constexpr int MlaSmemBytes(bool f8, int stages, int heads) {
  return MlaBaseSmemBytes(heads) + ((f8 ? 1 : stages) - 1) * kMlaTileElems * 2 +
         (f8 && stages == 2 ? stages * kMlaStageBytes : 0);
}

// kHG head groups of four warps, each warp kNT n-tiles of 8 heads: kHG * kNT * 8 heads a block (16: kHG 1, kNT 2;
// the wide instance 64: kHG 2, kNT 4). Warp w is key group and value-dims group wk = w % 4 of head group w / 4.
template <typename TC, int kStages, int kHG = 1, int kNT = 2>
__global__ void __launch_bounds__(kHG* kMlaWarps * 32)
    MlaAttentionKernel(AttentionArgs a, int64_t chunk, int64_t chunks, float* part_m, float* part_l, float* part_acc) {
  PdlPrologue();
  constexpr bool kF8 = kIsF8<TC>;
  using T = std::conditional_t<kF8, __nv_bfloat16, TC>;  // the mma operands' type
  constexpr int kTiles = kF8 ? 1 : kStages;
  constexpr int kH = kHG * kNT * 8;  // heads a block
  constexpr int kPRow = MlaPRow(kH);
  static_assert(kNT % 2 == 0, "ldmatrix.x4 loads two n-tiles of 8 heads");
  extern __shared__ __align__(16) unsigned char mla_smem[];
  T* tiles = reinterpret_cast<T*>(mla_smem);                        // [kTiles][kMlaTile][kMlaRow]: latent rows
  T* sq = tiles + kTiles * kMlaTileElems;                           // [kH][kMlaRow]
  T* sp = sq + kH * kMlaRow;                                        // P^T [kMlaTile][kPRow]
  float* sm_max = reinterpret_cast<float*>(sp + kMlaTile * kPRow);  // [kMlaWarps][kH]: each key group's tile maxima
  float* sm_l = sm_max + kMlaWarps * kH;                            // [kMlaWarps][kH]
  const int64_t groups = a.heads / kH;
  const int64_t t = blockIdx.x / groups, h0 = (blockIdx.x % groups) * kH, c = blockIdx.y;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, tq = lane % 4;
  const int wk = warp % kMlaWarps, hg = warp / kMlaWarps, hb = hg * kNT * 8;  // hb: the warp's first head in the block
  const int64_t j0 = c * chunk, j1 = min(static_cast<int64_t>(a.positions[t]) + 1, j0 + chunk);
  if (j0 >= j1) {  // past this token's context: weight 0 in the merge
    for (int h = threadIdx.x; h < kH; h += blockDim.x) {
      const int64_t idx = (t * a.heads + h0 + h) * chunks + c;
      part_m[idx] = -INFINITY;
      part_l[idx] = 0.0f;
    }
    return;
  }
  const int32_t* table = a.block_tables + a.block_table_start[SeqOfToken(a, t)];
  constexpr float kLog2e = 1.4426950408889634f;
  const float qscale = a.scale * kLog2e;
  if (a.q_s1 % 4 == 0 && a.q_s0 % 4 == 0 && reinterpret_cast<uintptr_t>(a.q) % 16 == 0) {
#pragma unroll 6
    for (int e = threadIdx.x; e < kH * kMlaK / 4; e += blockDim.x) {
      const int h = e / (kMlaK / 4), d = (e % (kMlaK / 4)) * 4;
      const float4 v = *reinterpret_cast<const float4*>(a.q + t * a.q_s0 + (h0 + h) * a.q_s1 + d);
      T* dst = sq + h * kMlaRow + d;
      dst[0] = FromF<T>(v.x * qscale);
      dst[1] = FromF<T>(v.y * qscale);
      dst[2] = FromF<T>(v.z * qscale);
      dst[3] = FromF<T>(v.w * qscale);
    }
  } else {
    for (int e = threadIdx.x; e < kH * kMlaK; e += blockDim.x) {
      const int h = e / kMlaK, d = e % kMlaK;
      sq[h * kMlaRow + d] = FromF<T>(a.q[t * a.q_s0 + (h0 + h) * a.q_s1 + d] * qscale);
    }
  }
  const TC* kc = static_cast<const TC*>(a.k.data);
  // f8: [kStages] x (codes [kMlaTile][kMlaK], then scales [kMlaTile][kMlaScales] as float)
  [[maybe_unused]] uint8_t* stages = reinterpret_cast<uint8_t*>(sm_l + kMlaWarps * kH);
  float m[kNT][2], l[kNT][2];  // [n-tile][i]: head hb + nt * 8 + 2 tq + i; the running max (log2 units), the warp's sum
  float o[8][kNT][4];          // O^T: dims wk * 128 + dt * 16 + (g, g + 8) x heads hb + nt * 8 + 2 tq (+ 1)
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt) {
    m[nt][0] = m[nt][1] = -INFINITY;
    l[nt][0] = l[nt][1] = 0.0f;
#pragma unroll
    for (int dt = 0; dt < 8; ++dt) o[dt][nt][0] = o[dt][nt][1] = o[dt][nt][2] = o[dt][nt][3] = 0.0f;
  }
  constexpr int kElems = kF8 ? 16 : 8;     // cache elements of one 16-byte piece
  constexpr int kPieces = kMlaK / kElems;  // 16-byte pieces of a latent row
  // Row 16 wk + lane % 16 of the tile at jb: its element offset in the cache (-1 past the context) and, for f8,
  // its scales' offset. One block-table load and one 32-bit division a row (the 64-bit division is a long emulated
  // sequence); the warp's lanes get a row's offset by shuffle. (Computed for every 16-byte piece, 36 a thread a tile,
  // the dependent loads and divisions sat on each tile's critical path: looked up once a row, the kernel measured
  // 1.33x at 16 heads and 1.55x at 128 on the H200, bench/results/2026-12-05-load-loops.json.)
  const auto find_row = [&](int64_t jb, int64_t& row_off, int64_t& scale_off) {
    const int64_t jl = jb + wk * 16 + (lane & 15);
    row_off = -1;
    scale_off = 0;
    if (jl < j1) {
      const int32_t jj = static_cast<int32_t>(jl), bs = static_cast<int32_t>(a.block_size);
      const int64_t blk = table[jj / bs], in_blk = jj % bs;
      row_off = blk * a.k.s0 + in_blk * a.k.s1;
      if constexpr (kF8) scale_off = blk * a.k.ss0 + in_blk * a.k.ss1;
    }
  };
  // The tile of keys [jb, jb + kMlaTile) in flight into buffer `st` (cp.async; rows past the context filled with
  // zeros): its rows, or for f8 its codes and scales into staging area `st`. The kHG warps of key group wk issue rows
  // 16 wk .. 16 wk + 15, each a share of every row's pieces.
  [[maybe_unused]] const auto issue = [&](int64_t jb, int st) {
    int64_t row_off, scale_off;
    find_row(jb, row_off, scale_off);
#pragma unroll 4
    for (int rr = 0; rr < 16; ++rr) {
      const int r = wk * 16 + rr;
      const int64_t off = __shfl_sync(0xffffffffu, row_off, rr);
      const bool in = off >= 0;
      for (int p = lane + 32 * hg; p < kPieces; p += 32 * kHG) {
        const int col = p * kElems;
        const TC* src = in ? kc + off + col : kc;
        if constexpr (kF8) {
          CpAsync16(stages + st * kMlaStageBytes + r * kMlaK + col, src, in ? 16 : 0);
        } else {
          CpAsync16(tiles + st * kMlaTileElems + r * kMlaRow + col, src, in ? 16 : 0);
        }
      }
      if constexpr (kF8) {  // the row's scales (0 past the context: its zero codes stay 0)
        const int64_t soff = __shfl_sync(0xffffffffu, scale_off, rr);
        float* scales = reinterpret_cast<float*>(stages + st * kMlaStageBytes + kMlaTile * kMlaK);
        if (hg == 0 && lane < kMlaScales) {
          CpAsync4(scales + r * kMlaScales + lane, in ? a.k.scale + soff + lane : a.k.scale, in ? 4 : 0);
        }
      }
    }
  };
  // 16 f8 codes times their scale, rounded to T, as 16 values of a tile row at dst.
  [[maybe_unused]] const auto widen = [](const uint4& codes, float scale, T* dst) {
    float f[16];
    F8x16(codes, scale, f);
    uint4 lo, hi;
    lo.x = Pack2(FromF<T>(f[0]), FromF<T>(f[1]));
    lo.y = Pack2(FromF<T>(f[2]), FromF<T>(f[3]));
    lo.z = Pack2(FromF<T>(f[4]), FromF<T>(f[5]));
    lo.w = Pack2(FromF<T>(f[6]), FromF<T>(f[7]));
    hi.x = Pack2(FromF<T>(f[8]), FromF<T>(f[9]));
    hi.y = Pack2(FromF<T>(f[10]), FromF<T>(f[11]));
    hi.z = Pack2(FromF<T>(f[12]), FromF<T>(f[13]));
    hi.w = Pack2(FromF<T>(f[14]), FromF<T>(f[15]));
    reinterpret_cast<uint4*>(dst)[0] = lo;
    reinterpret_cast<uint4*>(dst)[1] = hi;
  };
  // f8 with one stage: key group wk's 16 rows of codes straight into registers (18 16-byte pieces a lane of its kHG
  // warps' shares, in batches of 9 loads in flight), widened and stored as the tile's bf16 rows. No staging area, so
  // the instance needs the 16-bit one's shared memory and two blocks fit a multiprocessor (the staged form fits one).
  [[maybe_unused]] const auto load_widen = [&](int64_t jb) {
    int64_t row_off, scale_off;
    find_row(jb, row_off, scale_off);
    constexpr int kBatch = 9, kBatches = 2 / kHG;
    static_assert(!kF8 || 16 * kPieces == 2 * kBatch * 32, "a key group's 16 rows are two batches of 9 pieces a lane");
#pragma unroll
    for (int half = 0; half < kBatches; ++half) {
      uint4 codes[kBatch];
      float scale[kBatch];
#pragma unroll
      for (int k = 0; k < kBatch; ++k) {
        const int i = lane + 32 * ((half * kHG + hg) * kBatch + k), rl = i / kPieces, col = (i % kPieces) * kElems;
        const int64_t off = __shfl_sync(0xffffffffu, row_off, rl), soff = __shfl_sync(0xffffffffu, scale_off, rl);
        codes[k] = make_uint4(0, 0, 0, 0);
        scale[k] = 0.0f;
        if (off >= 0) {
          codes[k] = __ldg(reinterpret_cast<const uint4*>(kc + off + col));
          scale[k] = __ldg(a.k.scale + soff + col / kMlaGroup);
        }
      }
#pragma unroll
      for (int k = 0; k < kBatch; ++k) {
        const int i = lane + 32 * ((half * kHG + hg) * kBatch + k), rl = i / kPieces, col = (i % kPieces) * kElems;
        widen(codes[k], scale[k], tiles + (wk * 16 + rl) * kMlaRow + col);
      }
    }
  };
  // One stage: the tile at jb's rows toward L2 (a bulk prefetch a row, and the f8 rows' scales), issued while the block
  // computes on the tile before it. With one tile of rows in shared memory, a tile's loads otherwise start only after
  // the previous tile's compute and wait on DRAM with nothing else in flight (the wide instance, one block a
  // multiprocessor, idles through them); prefetched, they come from L2.
  [[maybe_unused]] const auto prefetch = [&](int64_t jb) {
    int64_t row_off, scale_off;
    find_row(jb, row_off, scale_off);
    if (hg != 0 || lane >= 16 || row_off < 0) return;
    PrefetchBulkL2(kc + row_off, kMlaK * sizeof(TC));
    if constexpr (kF8) {
      PrefetchL2(a.k.scale + scale_off);
      PrefetchL2(a.k.scale + scale_off + kMlaScales - 1);
    }
  };
  if constexpr (kStages == 2) {
    issue(j0, 0);
    CpAsyncCommit();
  }
  int st = 0;  // the buffer (or f8 staging area) of this pass's tile
  for (int64_t jb = j0; jb < j1; jb += kMlaTile) {
    __syncthreads();  // the previous tile is consumed, so its buffer may be refilled (and, on the first pass, Q is in
                      // place)
    if constexpr (kStages == 2) {
      if (jb + kMlaTile < j1) issue(jb + kMlaTile, st ^ 1);
      CpAsyncCommit();   // possibly empty: the wait below counts groups
      CpAsyncWait<1>();  // this tile has landed; the next may still be in flight
    } else if constexpr (kF8) {
      load_widen(jb);
      if (jb + kMlaTile < j1) prefetch(jb + kMlaTile);
    } else {
      issue(jb, 0);
      CpAsyncCommit();
      if (jb + kMlaTile < j1) prefetch(jb + kMlaTile);
      CpAsyncWait<0>();
    }
    __syncthreads();
    T* sk = tiles + (kF8 ? 0 : st) * kMlaTileElems;  // [kMlaTile][kMlaRow]: this tile's latent rows
    if constexpr (kF8 && kStages == 2) {  // widen the staged codes: 16 codes times their scale into 16 values
      const uint8_t* codes = stages + st * kMlaStageBytes;
      const float* scales = reinterpret_cast<const float*>(codes + kMlaTile * kMlaK);
      for (int i = threadIdx.x; i < kMlaTile * kPieces; i += blockDim.x) {
        const int r = i / kPieces, col = (i % kPieces) * 16;
        widen(*reinterpret_cast<const uint4*>(codes + r * kMlaK + col), scales[r * kMlaScales + col / kMlaGroup],
              sk + r * kMlaRow + col);
      }
      __syncthreads();
    }
    if constexpr (kStages == 2) st ^= 1;
    float s[kNT][4];  // (key g | g + 8) x (head hb + nt * 8 + 2tq, + 1)
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
    const T* kw = sk + wk * 16 * kMlaRow;
    // Q's B fragments by ldmatrix.x4, two n-tiles a load: matrices (n-tile nt, dims 0-7 | 8-15), then nt + 1's.
    const T* qw = sq + (hb + (lane >> 4) * 8 + (lane & 7)) * kMlaRow + ((lane >> 3) & 1) * 8;
#pragma unroll 4
    for (int dt = 0; dt < kMlaK / 16; ++dt) {
      uint32_t af[4];
      LdMatrixX4(af, kw + ((lane & 7) + ((lane >> 3) & 1) * 8) * kMlaRow + dt * 16 + ((lane >> 4) & 1) * 8, false);
#pragma unroll
      for (int nt = 0; nt < kNT; nt += 2) {
        uint32_t qf[4];
        LdMatrixX4(qf, qw + nt * 8 * kMlaRow + dt * 16, false);
        Mma16816<T>(s[nt], af, qf[0], qf[1]);
        Mma16816<T>(s[nt + 1], af, qf[2], qf[3]);
      }
    }
    const int64_t key0 = jb + wk * 16;
    float x[kNT][2];
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) {
      if (key0 + g >= j1) s[nt][0] = s[nt][1] = -INFINITY;
      if (key0 + g + 8 >= j1) s[nt][2] = s[nt][3] = -INFINITY;
      x[nt][0] = fmaxf(s[nt][0], s[nt][2]);
      x[nt][1] = fmaxf(s[nt][1], s[nt][3]);
#pragma unroll
      for (int off = 4; off < 32; off *= 2) {
        x[nt][0] = fmaxf(x[nt][0], __shfl_xor_sync(0xffffffffu, x[nt][0], off));
        x[nt][1] = fmaxf(x[nt][1], __shfl_xor_sync(0xffffffffu, x[nt][1], off));
      }
      if (g == 0) {
        sm_max[wk * kH + hb + nt * 8 + 2 * tq] = x[nt][0];
        sm_max[wk * kH + hb + nt * 8 + 2 * tq + 1] = x[nt][1];
      }
    }
    __syncthreads();
    float cf[kNT][2];
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int h = hb + nt * 8 + 2 * tq + i;
        float tile_max = sm_max[h];
#pragma unroll
        for (int w = 1; w < kMlaWarps; ++w) tile_max = fmaxf(tile_max, sm_max[w * kH + h]);
        const float nm = fmaxf(m[nt][i], tile_max);  // finite: key jb is in range
        cf[nt][i] = exp2f(m[nt][i] - nm);
        m[nt][i] = nm;
      }
      const float p0 = exp2f(s[nt][0] - m[nt][0]), p1 = exp2f(s[nt][1] - m[nt][1]);
      const float p2 = exp2f(s[nt][2] - m[nt][0]), p3 = exp2f(s[nt][3] - m[nt][1]);
      l[nt][0] = l[nt][0] * cf[nt][0] + p0 + p2;
      l[nt][1] = l[nt][1] * cf[nt][1] + p1 + p3;
      T* pr = sp + (wk * 16 + g) * kPRow + hb + nt * 8 + 2 * tq;
      *reinterpret_cast<uint32_t*>(pr) = Pack2(FromF<T>(p0), FromF<T>(p1));
      *reinterpret_cast<uint32_t*>(pr + 8 * kPRow) = Pack2(FromF<T>(p2), FromF<T>(p3));
#pragma unroll
      for (int dt = 0; dt < 8; ++dt) {
        o[dt][nt][0] *= cf[nt][0];
        o[dt][nt][1] *= cf[nt][1];
        o[dt][nt][2] *= cf[nt][0];
        o[dt][nt][3] *= cf[nt][1];
      }
    }
    __syncthreads();  // every warp's P^T is in place
#pragma unroll
    for (int kt = 0; kt < kMlaTile / 16; ++kt) {
      // P^T's B fragments by ldmatrix.x4.trans, two n-tiles a load: matrices (keys 0-7 | 8-15 of the 16, n-tile nt),
      // then nt + 1's; each lane gets keys 2tq, 2tq + 1 (+ 8, + 9) of head g.
      uint32_t pb[kNT][2];
#pragma unroll
      for (int nt = 0; nt < kNT; nt += 2) {
        uint32_t pf[4];
        LdMatrixX4(pf, sp + (kt * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * kPRow + hb + (nt + (lane >> 4)) * 8, true);
        pb[nt][0] = pf[0];
        pb[nt][1] = pf[1];
        pb[nt + 1][0] = pf[2];
        pb[nt + 1][1] = pf[3];
      }
#pragma unroll
      for (int dt = 0; dt < 8; ++dt) {
        uint32_t af[4];
        LdMatrixX4(
            af,
            sk + (kt * 16 + (lane & 7) + ((lane >> 4) & 1) * 8) * kMlaRow + wk * 128 + dt * 16 + ((lane >> 3) & 1) * 8,
            true);
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) Mma16816<T>(o[dt][nt], af, pb[nt][0], pb[nt][1]);
      }
    }
  }
  // Each head's sum over the block's keys: over the lanes that share tq, then over the key groups.
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
#pragma unroll
      for (int off = 4; off < 32; off *= 2) l[nt][i] += __shfl_xor_sync(0xffffffffu, l[nt][i], off);
      if (g == 0) sm_l[wk * kH + hb + nt * 8 + 2 * tq + i] = l[nt][i];
    }
  }
  __syncthreads();
  float total[kNT][2];
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int h = hb + nt * 8 + 2 * tq + i;
      total[nt][i] = 0.0f;
#pragma unroll
      for (int w = 0; w < kMlaWarps; ++w) total[nt][i] += sm_l[w * kH + h];
      if (chunks > 1 && wk == 0 && g == 0) {
        const int64_t idx = (t * a.heads + h0 + h) * chunks + c;
        part_m[idx] = m[nt][i] * 0.6931471805599453f;  // the merge kernel works in natural-log units
        part_l[idx] = total[nt][i];
      }
    }
  }
#pragma unroll
  for (int dt = 0; dt < 8; ++dt) {
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t d = wk * 128 + dt * 16 + g + (e >= 2 ? 8 : 0);
        const int i = e & 1;
        const int64_t h = h0 + hb + nt * 8 + 2 * tq + i;
        if (chunks == 1) {
          a.out[t * a.o_s0 + h * a.o_s1 + d] = o[dt][nt][e] / total[nt][i];
        } else {
          part_acc[((t * a.heads + h) * chunks + c) * kMlaV + d] = o[dt][nt][e];
        }
      }
    }
  }
}

constexpr int kCtxWarps = 4, kCtxMaxV = 256;
// One warp per (token, head): keys 0 .. position of the token's sequence in order, an online softmax, the values
// accumulated in registers (v_dim / 32 per lane).
__global__ void __launch_bounds__(kCtxWarps * 32) MlaContextAttentionKernel(MlaContextArgs a) {
  PdlPrologue();
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int64_t t = blockIdx.x, h = static_cast<int64_t>(blockIdx.y) * kCtxWarps + threadIdx.x / 32;
  if (h >= a.heads) return;
  int64_t s = 0, base = 0;
  while (s + 1 < a.num_seqs && a.query_start[s + 1] <= t) base += a.seq_lens[s++];
  const int64_t ctx = min(static_cast<int64_t>(a.positions[t]) + 1, static_cast<int64_t>(a.seq_lens[s]));
  const float* q = a.q + t * a.qs0 + h * a.qs1;
  float acc[kCtxMaxV / 32];
#pragma unroll
  for (int i = 0; i < kCtxMaxV / 32; ++i) acc[i] = 0.0f;
  float m = -INFINITY, l = 0.0f;
  for (int64_t j = 0; j < ctx; ++j) {
    const float* kn = a.k_nope + (base + j) * a.kns0 + h * a.kns1;
    const float* kr = a.k_rope + (base + j) * a.krs0;
    float dot = 0.0f;
    for (int64_t i = lane; i < a.nope; i += 32) dot += q[i] * kn[i];
    for (int64_t i = lane; i < a.rope; i += 32) dot += q[a.nope + i] * kr[i];
    dot = WarpSum(dot) * a.scale;
    const float m_new = fmaxf(m, dot), c = expf(m - m_new), p = expf(dot - m_new);
    l = l * c + p;
    const float* vr = a.v + (base + j) * a.vs0 + h * a.vs1;
#pragma unroll
    for (int i = 0; i < kCtxMaxV / 32; ++i) {
      const int64_t col = lane + 32 * i;
      if (col < a.v_dim) acc[i] = acc[i] * c + p * vr[col];
    }
    m = m_new;
  }
  float* o = a.out + t * a.os0 + h * a.os1;
  const float inv = 1.0f / l;
#pragma unroll
  for (int i = 0; i < kCtxMaxV / 32; ++i) {
    const int64_t col = lane + 32 * i;
    if (col < a.v_dim) o[col] = acc[i] * inv;
  }
}

// The tensor-core form of MlaContextAttention for DeepSeek's head sizes (nope 128, rope 64, v 128), flash-attention
// style: a block takes 64 query rows of one sequence and one head (4 warps x 16 rows) and walks the sequence's keys in
// tiles of 64 up to its last row's position. Q (pre-scaled by scale * log2 e) stays in registers as mma A fragments;
// each tile's keys [k_nope | k_rope] and values are rounded to bf16 into shared memory; S = Q K^T and O += P V by
// mma.m16n8k16 (P from S's accumulators, V's fragments by ldmatrix.trans), with an online softmax per row.
constexpr int kCtxQK = 192, kCtxNope = 128, kCtxV = 128, kCtxTile = 64, kCtxMmaWarps = 4;
constexpr int kCtxQRow = kCtxQK + 8, kCtxVRow = kCtxV + 8;  // shared row strides (elements): 16 bytes of padding
constexpr int kCtxSmemBytes = (2 * kCtxTile * kCtxQRow + kCtxTile * kCtxVRow) * 2;

bool MlaContextMmaFits(const MlaContextArgs& a) {
  if (a.nope != kCtxNope || a.nope + a.rope != kCtxQK || a.v_dim != kCtxV) return false;
  for (int64_t st : {a.qs0, a.qs1, a.kns0, a.kns1, a.krs0, a.vs0, a.vs1}) {
    if (st % 4 != 0) return false;
  }
  for (const void* p : {static_cast<const void*>(a.q), static_cast<const void*>(a.k_nope),
                        static_cast<const void*>(a.k_rope), static_cast<const void*>(a.v)}) {
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  }
  return true;
}

__global__ void __launch_bounds__(kCtxMmaWarps * 32) MlaContextMmaKernel(MlaContextArgs a) {
  PdlPrologue();
  extern __shared__ __align__(16) unsigned char ctx_smem[];
  __nv_bfloat16* sq = reinterpret_cast<__nv_bfloat16*>(ctx_smem);  // [kCtxTile][kCtxQRow]: Q rows
  __nv_bfloat16* sk = sq + kCtxTile * kCtxQRow;                    // [kCtxTile][kCtxQRow]: the tile's keys
  __nv_bfloat16* sv = sk + kCtxTile * kCtxQRow;                    // [kCtxTile][kCtxVRow]: the tile's values
  // This block's sequence and query tile.
  int64_t s = 0, base = 0, tile = blockIdx.x;
  for (;;) {
    if (s >= a.num_seqs) return;  // past the last tile
    const int64_t q_len = a.query_start[s + 1] - a.query_start[s];
    const int64_t tiles = (q_len + kCtxTile - 1) / kCtxTile;
    if (tile < tiles) break;
    tile -= tiles;
    base += a.seq_lens[s];
    ++s;
  }
  const int64_t h = blockIdx.y, row0 = a.query_start[s] + tile * kCtxTile;
  const int64_t rows = min(static_cast<int64_t>(kCtxTile), static_cast<int64_t>(a.query_start[s + 1]) - row0);
  const int64_t len = a.seq_lens[s];
  const int64_t last_pos = min(static_cast<int64_t>(a.positions[row0 + rows - 1]), len - 1);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, tq = lane % 4;
  constexpr float kLog2e = 1.4426950408889634f;
  const float qscale = a.scale * kLog2e;
  StageQ<__nv_bfloat16, kCtxTile, kCtxQK>(a.q, a.qs0, a.qs1, row0, rows, h, qscale, sq, kCtxQRow);
  __syncthreads();
  uint32_t qf[kCtxQK / 16][4];
  int64_t pos[2];  // this thread's rows' positions (g and g + 8 of the warp's 16)
  LoadQRows<__nv_bfloat16, kCtxQK / 16>(sq, kCtxQRow, a.positions, row0, rows, last_pos, warp, lane, qf, pos);
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  float o[kCtxV / 8][4] = {};
  for (int64_t kb = 0; kb <= last_pos; kb += kCtxTile) {
    __syncthreads();  // the previous tile is consumed
    for (int e = tid; e < kCtxTile * ((kCtxQK + kCtxV) / 4); e += blockDim.x) {
      const int r = e / ((kCtxQK + kCtxV) / 4), c = (e % ((kCtxQK + kCtxV) / 4)) * 4;
      const int64_t j = kb + r;
      float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      __nv_bfloat16* dst;
      if (c < kCtxNope) {
        if (j < len) v = *reinterpret_cast<const float4*>(a.k_nope + (base + j) * a.kns0 + h * a.kns1 + c);
        dst = sk + r * kCtxQRow + c;
      } else if (c < kCtxQK) {
        if (j < len) v = *reinterpret_cast<const float4*>(a.k_rope + (base + j) * a.krs0 + (c - kCtxNope));
        dst = sk + r * kCtxQRow + c;
      } else {
        if (j < len) v = *reinterpret_cast<const float4*>(a.v + (base + j) * a.vs0 + h * a.vs1 + (c - kCtxQK));
        dst = sv + r * kCtxVRow + (c - kCtxQK);
      }
      dst[0] = __float2bfloat16(v.x);
      dst[1] = __float2bfloat16(v.y);
      dst[2] = __float2bfloat16(v.z);
      dst[3] = __float2bfloat16(v.w);
    }
    __syncthreads();
    float sc[kCtxTile / 8][4] = {};  // S: rows (g, g + 8) x keys nt * 8 + 2 tq (+ 1)
    TileScores<__nv_bfloat16, kCtxQK / 16, kCtxTile>(qf, sk, kCtxQRow, lane, sc);
#pragma unroll
    for (int nt = 0; nt < kCtxTile / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t key = kb + nt * 8 + 2 * tq + (e & 1);
        if (key > pos[e / 2] || key >= len) sc[nt][e] = -INFINITY;
      }
    }
    uint32_t pa[kCtxTile / 16][4];  // P as A fragments, 16 keys each
    TileSoftmax<__nv_bfloat16, kCtxTile, kCtxV / 8>(sc, m, l, o, pa);
    TileAccumulatePv<__nv_bfloat16, kCtxTile, kCtxV / 8>(pa, sv, kCtxVRow, lane, o);
  }
  FinishRows<kCtxV / 8>(l, o, a.out + (row0 + warp * 16) * a.os0 + h * a.os1, a.os0, rows - warp * 16, lane);
}

// The wide instance (64 heads a block) where it is asked for (MlaDecodeOptions::wide), the heads come in 64s and the
// longest context is long enough (MlaDecodeOptions::wide_min_keys); it has one stage (two tiles of rows would pass
// the shared-memory limit), so it takes the place of the pipeline.
bool MlaWide(const AttentionArgs& a, const MlaDecodeOptions& o) {
  return o.wide && a.heads % kMlaWideHeads == 0 && a.max_seq_len >= o.wide_min_keys;
}
int MlaBlockHeads(const AttentionArgs& a, const MlaDecodeOptions& o) {
  return MlaWide(a, o) ? kMlaWideHeads : kMlaHeads;
}

// MLA's decode chunks aim at about two waves of blocks: 4 blocks per SM in all where two fit one (the single-stage
// 16-head instances, 96 KB of shared memory), 2 where one does (the two-stage instances, 135-175 KB, and the wide one,
// 156 KB).
int64_t MlaBlocksPerSm(const AttentionArgs& a, const MlaDecodeOptions& o) {
  constexpr int64_t kWaves = 2;
  return kWaves * (o.pipeline || MlaWide(a, o) ? 1 : 2);
}

int64_t MlaChunks(const AttentionArgs& a, int64_t chunk) {
  return (std::max<int64_t>(a.max_seq_len, 1) + chunk - 1) / chunk;
}

}  // namespace

bool MlaDecodeFits(const AttentionArgs& a, const MlaDecodeOptions& o) {
  if (a.k_dim != kMlaK || a.v_dim != kMlaV || a.kv_heads != 1 || a.heads % kMlaHeads != 0) return false;
  if (a.k.data != a.v.data || a.k.s0 != a.v.s0 || a.k.s1 != a.v.s1) return false;
  if (a.k.dtype == kF8) {  // MlaDecodeOptions::fp8: rows of 16-byte pieces, a scale per 64 values
    return o.fp8 && a.k.scale != nullptr && a.k.group == kMlaGroup && a.k.s0 % 16 == 0 && a.k.s1 % 16 == 0 &&
           reinterpret_cast<uintptr_t>(a.k.data) % 16 == 0;
  }
  if (a.k.dtype != kF16 && a.k.dtype != kBF16) return false;
  return a.k.s0 % 8 == 0 && a.k.s1 % 8 == 0 && reinterpret_cast<uintptr_t>(a.k.data) % 16 == 0;
}

int64_t MlaDecodeChunk(const AttentionArgs& a, const MlaDecodeOptions& o, int sm_count) {
  const int64_t base = std::max<int64_t>(a.n * (a.heads / MlaBlockHeads(a, o)), 1);
  const int64_t want = std::max<int64_t>(MlaBlocksPerSm(a, o) * sm_count / base, 1);
  const int64_t chunk = (std::max<int64_t>(a.max_seq_len, 1) + want - 1) / want;
  return (chunk + kMlaTile - 1) / kMlaTile * kMlaTile;
}

int64_t MlaDecodeWorkspaceBytes(const AttentionArgs& a, const MlaDecodeOptions& o, int sm_count) {
  const int64_t chunks = MlaChunks(a, MlaDecodeChunk(a, o, sm_count));
  if (chunks == 1) return 0;
  return a.n * a.heads * chunks * (2 + a.v_dim) * static_cast<int64_t>(sizeof(float));
}

int LaunchMlaDecodeSplit(const AttentionArgs& a, const MlaDecodeOptions& o, int sm_count, void* workspace, Stream s) {
  if (a.n == 0) return 0;
  if (!MlaDecodeFits(a, o)) return static_cast<int>(cudaErrorInvalidValue);
  const int64_t chunk = MlaDecodeChunk(a, o, sm_count), chunks = MlaChunks(a, chunk);
  if (chunks > 1 && workspace == nullptr) return static_cast<int>(cudaErrorInvalidValue);
  float* part_m = static_cast<float*>(workspace);
  float* part_l = part_m + a.n * a.heads * chunks;
  float* part_acc = part_l + a.n * a.heads * chunks;
  const bool f8 = a.k.dtype == kF8, wide = MlaWide(a, o);
  const int stages = o.pipeline && !wide ? 2 : 1, heads = MlaBlockHeads(a, o);
  const auto pick = [&](auto stage_tag) {
    constexpr int kS = decltype(stage_tag)::value;
    return f8 ? MlaAttentionKernel<__nv_fp8_e4m3, kS>
              : (a.k.dtype == kF16 ? MlaAttentionKernel<__half, kS> : MlaAttentionKernel<__nv_bfloat16, kS>);
  };
  const auto pick_wide = [&] {
    return f8 ? MlaAttentionKernel<__nv_fp8_e4m3, 1, 2, 4>
              : (a.k.dtype == kF16 ? MlaAttentionKernel<__half, 1, 2, 4> : MlaAttentionKernel<__nv_bfloat16, 1, 2, 4>);
  };
  const auto kernel = wide          ? pick_wide()
                      : stages == 2 ? pick(std::integral_constant<int, 2>{})
                                    : pick(std::integral_constant<int, 1>{});
  const int smem = MlaSmemBytes(f8, stages, heads);
  // The shared-memory limit on this device (a lookup after the first launch there: kernel_attr.h).
  if (const int e = EnsureDynamicSmem(reinterpret_cast<const void*>(kernel), smem); e != 0) return e;
  LaunchKernel(kernel, dim3(static_cast<unsigned>(a.n * (a.heads / heads)), static_cast<unsigned>(chunks)),
               (wide ? 2 : 1) * kMlaWarps * 32, smem, S(s), a, chunk, chunks, part_m, part_l, part_acc);
  const int err = Done();
  if (err != 0 || chunks == 1) return err;
  return LaunchMergeAttention(a, chunks, part_m, part_l, part_acc, s);
}

int LaunchMlaContextAttention(const MlaContextArgs& a, bool mma, Stream s) {
  if (a.n == 0 || a.heads == 0) return 0;
  if (a.num_seqs <= 0) return static_cast<int>(cudaErrorInvalidValue);
  // The tensor-core kernel where its tiles fit (`mma`: MlaKernelOptions::context_mma), else the plain float32 one.
  if (mma && MlaContextMmaFits(a)) {
    const int attr = EnsureDynamicSmem(reinterpret_cast<const void*>(MlaContextMmaKernel), kCtxSmemBytes);
    if (attr != 0) return attr;
    // Blocks for every query tile there can be; those past the last one return at once.
    const int64_t tiles = a.n / kCtxTile + a.num_seqs;
    LaunchKernel(MlaContextMmaKernel, dim3(static_cast<unsigned>(tiles), static_cast<unsigned>(a.heads)),
                 kCtxMmaWarps * 32, kCtxSmemBytes, S(s), a);
    return Done();
  }
  if (a.v_dim > kCtxMaxV) return static_cast<int>(cudaErrorInvalidValue);
  const dim3 grid(static_cast<unsigned>(a.n), static_cast<unsigned>((a.heads + kCtxWarps - 1) / kCtxWarps));
  LaunchKernel(MlaContextAttentionKernel, grid, kCtxWarps * 32, 0, S(s), a);
  return Done();
}

}  // namespace fathom::cuda
