// The MoE kernels (moe.h).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "backend/cuda/dtype.cuh"
#include "backend/cuda/fp8.cuh"
#include "backend/cuda/int4.cuh"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/memory.cuh"
#include "backend/cuda/mma.cuh"
#include "backend/cuda/moe.h"
#include "backend/cuda/reduce.cuh"

namespace fathom::cuda {

namespace {

constexpr int kRouteWarps = 4;  // tokens per block of the router

// RanksAbove's best of two candidates (index -1: none).
__device__ __forceinline__ void Better(float v, int32_t i, float* bv, int32_t* bi) {
  if (i >= 0 && (*bi < 0 || moe_route::RanksAbove(v, i, *bv, *bi))) {
    *bv = v;
    *bi = i;
  }
}

// moe_route::TopK over v[0, n) in shared memory by one warp. Each pick is the best (a strict total order: the higher
// value, then the lower index) of those ranking below the previous pick, so the lanes' partial bests reduce to the
// same element the serial loop finds. out: shared or global [k].
__device__ void WarpTopK(const float* v, int32_t n, int32_t k, int32_t* out, int lane) {
  float pv = 0.0f;
  int32_t pi = -1;  // the previous pick
  for (int32_t j = 0; j < k; ++j) {
    float bv = 0.0f;
    int32_t bi = -1;
    for (int32_t i = lane; i < n; i += 32) {
      if (pi >= 0 && !moe_route::RanksAbove(pv, pi, v[i], i)) continue;
      Better(v[i], i, &bv, &bi);
    }
    for (int off = 16; off > 0; off >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, bv, off);
      const int32_t oi = __shfl_xor_sync(0xffffffffu, bi, off);
      Better(ov, oi, &bv, &bi);
    }
    if (lane == 0) out[j] = bi;
    pv = bv;
    pi = bi;
  }
}

// One warp per token: moe_route::RouteToken's float operations, each order-dependent one in RouteToken's order on one
// lane (the softmax sum, a group's value: GroupValue, the weights: ChosenWeights), the rest spread over the lanes, so
// the choices and weights are bit-identical to the host's. Scratch in shared memory: [warps][2][n_experts] floats.
__global__ void __launch_bounds__(kRouteWarps * 32)
    MoeRouteKernel(const float* logits, int64_t ls, int64_t n, const float* bias, moe_route::Params p, int32_t* ids,
                   float* weights) {
  PdlPrologue();
  extern __shared__ float scratch[];
  __shared__ float group_value[kRouteWarps][moe_route::kMaxGroups];
  __shared__ int32_t
      picks[kRouteWarps][moe_route::kMaxGroups > moe_route::kMaxTopK ? moe_route::kMaxGroups : moe_route::kMaxTopK];
  const int warp = static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x % 32);
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kRouteWarps + warp;
  if (t >= n) return;  // whole warps leave together
  const int32_t e = p.n_experts, k = p.top_k;
  float* scores = scratch + static_cast<int64_t>(warp) * 2 * e;
  float* choice = scores + e;
  const float* row = logits + t * ls;
  if (p.sigmoid) {
    for (int32_t i = lane; i < e; i += 32) scores[i] = 1.0f / (1.0f + moe_route::Exp(-row[i]));
  } else {
    float mx = -INFINITY;
    for (int32_t i = lane; i < e; i += 32) mx = fmaxf(mx, row[i]);
    for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
    if (!(mx == mx)) mx = row[0];  // NaN logits: whatever the host computes, never a crash
    for (int32_t i = lane; i < e; i += 32) scores[i] = moe_route::Exp(row[i] - mx);
    __syncwarp();
    float sum = 0.0f;
    if (lane == 0) {
      for (int32_t i = 0; i < e; ++i) sum += scores[i];
    }
    sum = __shfl_sync(0xffffffffu, sum, 0);
    for (int32_t i = lane; i < e; i += 32) scores[i] /= sum;
  }
  __syncwarp();
  for (int32_t i = lane; i < e; i += 32) choice[i] = bias != nullptr ? scores[i] + bias[i] : scores[i];
  __syncwarp();
  if (p.method != moe_route::kGreedy && p.n_group > 1) {
    const int32_t per = e / p.n_group;
    for (int32_t g = lane; g < p.n_group; g += 32)
      group_value[warp][g] = moe_route::GroupValue(p, choice + g * per, per);
    __syncwarp();
    WarpTopK(group_value[warp], p.n_group, p.topk_group, picks[warp], lane);
    __syncwarp();
    for (int32_t g = 0; g < p.n_group; ++g) {
      bool keep = false;
      for (int32_t j = 0; j < p.topk_group; ++j) keep = keep || picks[warp][j] == g;
      if (!keep) {
        for (int32_t i = g * per + lane; i < (g + 1) * per; i += 32) choice[i] = -INFINITY;
      }
    }
    __syncwarp();
  }
  int32_t* id = ids + t * k;
  WarpTopK(choice, e, k, picks[warp], lane);
  __syncwarp();
  if (lane == 0) {
    for (int32_t j = 0; j < k; ++j) id[j] = picks[warp][j];
    moe_route::ChosenWeights(p, scores, picks[warp], weights + t * k);
  }
}

// The workspace: per-expert pair ranges, the active experts, each pair's sorted position, and the intermediate
// activations of every pair.
struct MoeWorkspace {
  int32_t* start;        // [n_experts + 1]: expert e's pairs are sorted positions [start[e], start[e + 1])
  int32_t* active;       // [n_experts]: the experts with pairs, in index order
  int32_t* num_active;   // [1]
  int32_t* sorted_pair;  // [pairs]: the pair (t * top_k + j) at each sorted position
  int32_t* pair_pos;     // [pairs]: the sorted position of each pair
  float* h;  // [pairs, inter]: silu(gate) * up (float32 for the GEMVs, bf16 for the tensor-core and 4-bit paths)
  float* y;  // [pairs, hidden]: the expert outputs
  // The tensor-core and 4-bit paths only (null otherwise):
  __nv_bfloat16* xs;   // [pairs, hidden]: each pair's input row in sorted order, rounded to bf16
  int32_t tile_rows;   // the rows of a tile: kMmaSmallM or kMmaM (4-bit: 8, 32 or 64)
  int32_t* tile_e;     // [max tiles]: the expert of each tile_rows-row tile of sorted positions
  int32_t* tile_m0;    // [max tiles]: its first sorted position
  int32_t* num_tiles;  // [1]
};

// The grouped GEMM's tiles: kMmaM (or, when experts have few pairs each, kMmaSmallM) rows of pairs x kMmaN output
// columns, K in steps of kMmaK through a kMmaStages-deep pipeline. Measured on the H200 (V2-Lite's experts,
// bench/results/2026-12-01-cuda-deepseek-v2.json): steps of 32 were 1.2-1.5x slower, and a fourth stage gained nothing.
constexpr int kMmaM = 64, kMmaSmallM = 16, kMmaN = 64, kMmaK = 64, kMmaStages = 3;

// The tile height: 16 rows while the experts average at most kMmaSmallPairs pairs (decode batches, where a taller
// tile would mostly multiply zero rows), else 64 (each weight tile then serves more pairs).
constexpr int64_t kMmaSmallPairs = 16;
// 4-bit experts: 8, 32 or 64 rows (MoeInt4Kernel's NT = 1, 4, 8) by the pairs per active expert.
int32_t TileRows(const MoeExpertsArgs& a) {
  if (a.int4) {
    if (a.mma_rows == 8 || a.mma_rows == 32 || a.mma_rows == 64) return a.mma_rows;
    const int64_t pairs = a.n * a.top_k, per = pairs / std::max<int64_t>(1, std::min(pairs, a.n_experts));
    return per <= 8 ? 8 : per <= 32 ? 32 : 64;
  }
  if (a.mma_rows == kMmaSmallM || a.mma_rows == kMmaM) return a.mma_rows;
  return a.n * a.top_k <= kMmaSmallPairs * a.n_experts ? kMmaSmallM : kMmaM;
}

// Tiles of TileRows sorted positions: at most one partial tile per active expert.
int64_t MaxTiles(const MoeExpertsArgs& a) {
  const int64_t pairs = a.n * a.top_k;
  return pairs / TileRows(a) + std::min(pairs, a.n_experts);
}

int64_t Align(int64_t bytes) {
  return (bytes + 255) / 256 * 256;
}

MoeWorkspace Carve(const MoeExpertsArgs& a, void* base, int64_t* total) {
  const int64_t pairs = a.n * a.top_k;
  char* p = static_cast<char*>(base);
  int64_t off = 0;
  auto take = [&](int64_t bytes) {
    char* r = p == nullptr ? nullptr : p + off;
    off += Align(bytes);
    return r;
  };
  MoeWorkspace w{};
  w.start = reinterpret_cast<int32_t*>(take(4 * (a.n_experts + 1)));
  w.active = reinterpret_cast<int32_t*>(take(4 * a.n_experts));
  w.num_active = reinterpret_cast<int32_t*>(take(4));
  w.sorted_pair = reinterpret_cast<int32_t*>(take(4 * pairs));
  w.pair_pos = reinterpret_cast<int32_t*>(take(4 * pairs));
  w.h = reinterpret_cast<float*>(take(4 * pairs * a.inter));
  w.y = reinterpret_cast<float*>(take(4 * pairs * a.hidden));
  if (a.tensor_cores || a.int4) {
    w.tile_rows = TileRows(a);
    w.xs = reinterpret_cast<__nv_bfloat16*>(take(2 * pairs * a.hidden));
    w.tile_e = reinterpret_cast<int32_t*>(take(4 * MaxTiles(a)));
    w.tile_m0 = reinterpret_cast<int32_t*>(take(4 * MaxTiles(a)));
    w.num_tiles = reinterpret_cast<int32_t*>(take(4));
  }
  *total = off;
  return w;
}

// Exclusive prefix sum of one value per thread over the block (blockDim.x a multiple of 32); *total gets the sum.
__device__ int32_t BlockExclusiveScan(int32_t v, int32_t* total) {
  __shared__ int32_t warp_sums[32];
  const int lane = static_cast<int>(threadIdx.x % 32), warp = static_cast<int>(threadIdx.x / 32);
  const int warps = static_cast<int>(blockDim.x / 32);
  int32_t incl = v;
  for (int off = 1; off < 32; off *= 2) {
    const int32_t o = __shfl_up_sync(0xffffffffu, incl, off);
    if (lane >= off) incl += o;
  }
  if (lane == 31) warp_sums[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    int32_t ws = lane < warps ? warp_sums[lane] : 0;
    for (int off = 1; off < 32; off *= 2) {
      const int32_t o = __shfl_up_sync(0xffffffffu, ws, off);
      if (lane >= off) ws += o;
    }
    warp_sums[lane] = ws;
  }
  __syncthreads();
  const int32_t out = (warp > 0 ? warp_sums[warp - 1] : 0) + incl - v;
  *total = warp_sums[warps - 1];
  __syncthreads();  // warp_sums is reused by the next scan
  return out;
}

// A counting sort of the pairs by expert in one block: each pair takes a rank within its expert (shared atomics, so
// the order within an expert varies from run to run; every pair's result is computed on its own, so no value
// depends on it), the experts' counts are scanned into ranges, and each pair lands at range start + rank. Also lists
// the active experts in index order and, for the tensor-core path, the tile_rows-row tiles of each expert's range.
// Needs experts <= blockDim.x.
__global__ void __launch_bounds__(1024)
    MoeSortKernel(const int32_t* ids, int32_t pairs, int32_t experts, MoeWorkspace w) {
  PdlPrologue();
  __shared__ int32_t count[moe_route::kMaxExperts];
  const int32_t tid = static_cast<int32_t>(threadIdx.x);
  for (int32_t e = tid; e < experts; e += blockDim.x) count[e] = 0;
  __syncthreads();
  for (int32_t p = tid; p < pairs; p += blockDim.x) {
    const int32_t e = min(max(ids[p], 0), experts - 1);  // a router never gives others; never index out of range
    w.pair_pos[p] = atomicAdd(&count[e], 1);
  }
  __syncthreads();
  const int32_t c = tid < experts ? count[tid] : 0;
  int32_t sum = 0, na = 0, nt = 0;
  const int32_t start = BlockExclusiveScan(c, &sum);
  const int32_t slot = BlockExclusiveScan(c > 0 ? 1 : 0, &na);
  const int32_t tiles = w.tile_e != nullptr ? (c + w.tile_rows - 1) / w.tile_rows : 0;
  const int32_t tile0 = BlockExclusiveScan(tiles, &nt);
  if (tid < experts) {
    w.start[tid] = start;
    if (c > 0) w.active[slot] = tid;
    if (w.tile_e != nullptr) {
      for (int32_t i = 0; i < tiles; ++i) {
        w.tile_e[tile0 + i] = tid;
        w.tile_m0[tile0 + i] = start + i * w.tile_rows;
      }
    }
  }
  if (tid == 0) {
    w.start[experts] = sum;
    *w.num_active = na;
    if (w.num_tiles != nullptr) *w.num_tiles = nt;
  }
  __syncthreads();
  for (int32_t p = tid; p < pairs; p += blockDim.x) {
    const int32_t e = min(max(ids[p], 0), experts - 1);
    const int32_t pos = w.start[e] + w.pair_pos[p];
    w.pair_pos[p] = pos;
    w.sorted_pair[pos] = p;
  }
}

constexpr int kMoeWarps = 8;  // one output row per warp

__device__ __forceinline__ float Dot8(const float* wf, const float* x) {
  const float4 a = *reinterpret_cast<const float4*>(x), b = *reinterpret_cast<const float4*>(x + 4);
  return a.x * wf[0] + a.y * wf[1] + a.z * wf[2] + a.w * wf[3] + b.x * wf[4] + b.y * wf[5] + b.z * wf[6] + b.w * wf[7];
}

// A 16-byte piece of a weight row as floats: 8 bf16 values, or 16 f8 e4m3 values (unscaled: the callers multiply a
// piece's dot products by its block's scale).
template <bool kF8>
constexpr int kPieceValues = kF8 ? 16 : 8;
template <bool kF8>
__device__ __forceinline__ void Unpack(const uint4& raw, float* f) {
  if constexpr (kF8) {
    F8x16Raw(raw, f);
  } else {
    Bf16x8(raw, f);
  }
}

// acc_g[j] += gate piece . x_j, acc_u[j] += up piece . x_j over one 16-byte piece (values at k * kPieceValues) of the
// rows.
template <int kT, bool kF8>
__device__ __forceinline__ void GateUpAccumulate(const uint4& g, float gs, const uint4& u, float us,
                                                 const float* const* xr, int64_t k, int32_t tn, float* ag, float* au) {
  constexpr int kV = kPieceValues<kF8>;
  float gf[kV], uf[kV];
  Unpack<kF8>(g, gf);
  Unpack<kF8>(u, uf);
#pragma unroll
  for (int j = 0; j < kT; ++j) {
    if (j < tn) {
      if constexpr (kF8) {
        ag[j] += gs * (Dot8(gf, xr[j] + k * kV) + Dot8(gf + 8, xr[j] + k * kV + 8));
        au[j] += us * (Dot8(uf, xr[j] + k * kV) + Dot8(uf + 8, xr[j] + k * kV + 8));
      } else {
        ag[j] += Dot8(gf, xr[j] + k * kV);
        au[j] += Dot8(uf, xr[j] + k * kV);
      }
    }
  }
}

// acc[j] += down piece . h_j, h_j the j-th of consecutive rows `len` apart.
template <int kT, bool kF8>
__device__ __forceinline__ void DownAccumulate(const uint4& d, float ds, const float* h, int64_t len, int64_t k,
                                               int32_t tn, float* acc) {
  constexpr int kV = kPieceValues<kF8>;
  float df[kV];
  Unpack<kF8>(d, df);
#pragma unroll
  for (int j = 0; j < kT; ++j) {
    if (j < tn) {
      if constexpr (kF8) {
        acc[j] += ds * (Dot8(df, h + j * len + k * kV) + Dot8(df + 8, h + j * len + k * kV + 8));
      } else {
        acc[j] += Dot8(df, h + j * len + k * kV);
      }
    }
  }
}

// What a warp of a grouped kernel works on: block (active expert slot, tile of kMoeWarps weight rows), one row per
// warp. False when the slot has no expert or the row is past `rows`.
struct ExpertRow {
  int32_t e, s0, cnt;  // the expert and its pairs' sorted positions [s0, s0 + cnt)
  int64_t r;           // the weight row
  int32_t lane;
};
__device__ __forceinline__ bool FindExpertRow(const MoeWorkspace& w, int64_t rows, ExpertRow* out) {
  if (static_cast<int32_t>(blockIdx.x) >= *w.num_active) return false;
  out->e = w.active[blockIdx.x];
  out->lane = static_cast<int32_t>(threadIdx.x % 32);
  out->r = static_cast<int64_t>(blockIdx.y) * kMoeWarps + threadIdx.x / 32;
  out->s0 = w.start[out->e];
  out->cnt = w.start[out->e + 1] - out->s0;
  return out->r < rows;
}

// Row x.r (of `len` bf16 or f8 values) of part 0 (gate), 1 (up) or 2 (down) of expert x.e, as 16-byte pieces.
template <bool kF8>
__device__ __forceinline__ const uint4* WeightRow(const MoeExpertsArgs& a, int part, const ExpertRow& x, int64_t len) {
  return reinterpret_cast<const uint4*>(static_cast<const uint8_t*>(a.table[part * a.n_experts + x.e]) +
                                        x.r * len * (kF8 ? 1 : 2));
}

// The f8 block scales of that row's 128-row block: [ceil(len / 128)] floats (null for bf16 experts).
template <bool kF8>
__device__ __forceinline__ const float* ScaleRow(const MoeExpertsArgs& a, int part, const ExpertRow& x, int64_t len) {
  if constexpr (!kF8) return nullptr;
  return static_cast<const float*>(a.table[(3 + part) * a.n_experts + x.e]) + (x.r / 128) * ((len + 127) / 128);
}
// The scale of piece k of a row (kPieceValues values a piece, 128 a block).
template <bool kF8>
__device__ __forceinline__ float PieceScale(const float* row, int64_t k) {
  if constexpr (!kF8) return 1.0f;
  return row[k / (128 / kPieceValues<kF8>)];
}

// Block (active expert slot, tile of kMoeWarps rows of gate and up): each warp streams its gate and up rows once per
// kT pairs of the expert and writes h = silu(gate . x) * (up . x) for them.
template <int kT, bool kF8>
__global__ void __launch_bounds__(kMoeWarps * 32) MoeGateUpKernel(MoeExpertsArgs a, MoeWorkspace w) {
  PdlPrologue();
  ExpertRow x;
  if (!FindExpertRow(w, a.inter, &x)) return;
  const uint4 *gw = WeightRow<kF8>(a, 0, x, a.hidden), *uw = WeightRow<kF8>(a, 1, x, a.hidden);
  const float *gs = ScaleRow<kF8>(a, 0, x, a.hidden), *us = ScaleRow<kF8>(a, 1, x, a.hidden);
  const int32_t s0 = x.s0, cnt = x.cnt, lane = x.lane;
  const int64_t r = x.r;
  const int64_t chunks = a.hidden / kPieceValues<kF8>;
  for (int32_t c0 = 0; c0 < cnt; c0 += kT) {
    const int32_t tn = min(kT, cnt - c0);
    const float* xr[kT];
    float ag[kT], au[kT];
#pragma unroll
    for (int j = 0; j < kT; ++j) {
      const int32_t pair = w.sorted_pair[s0 + c0 + min(j, tn - 1)];
      xr[j] = a.x + static_cast<int64_t>(pair / a.top_k) * a.xs;
      ag[j] = au[j] = 0.0f;
    }
    // Four 16-byte pieces of each row in flight per lane before any is used. (Every piece of a row in flight at
    // once measured slower on the H200: twice the registers, half the resident warps.)
    int64_t k = lane;
    for (; k + 96 < chunks; k += 128) {
      uint4 g4[4], u4[4];
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        g4[q] = LoadStreaming(gw + k + 32 * q);
        u4[q] = LoadStreaming(uw + k + 32 * q);
      }
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int64_t kq = k + 32 * q;
        GateUpAccumulate<kT, kF8>(g4[q], PieceScale<kF8>(gs, kq), u4[q], PieceScale<kF8>(us, kq), xr, kq, tn, ag, au);
      }
    }
    for (; k < chunks; k += 32) {
      GateUpAccumulate<kT, kF8>(LoadStreaming(gw + k), PieceScale<kF8>(gs, k), LoadStreaming(uw + k),
                                PieceScale<kF8>(us, k), xr, k, tn, ag, au);
    }
#pragma unroll
    for (int j = 0; j < kT; ++j) {
      const float g = WarpSum(ag[j]), u = WarpSum(au[j]);
      if (lane == 0 && j < tn) w.h[static_cast<int64_t>(s0 + c0 + j) * a.inter + r] = g / (1.0f + expf(-g)) * u;
    }
  }
}

// Block (active expert slot, tile of kMoeWarps rows of down): y = down . h for the expert's pairs.
template <int kT, bool kF8>
__global__ void __launch_bounds__(kMoeWarps * 32) MoeDownKernel(MoeExpertsArgs a, MoeWorkspace w) {
  PdlPrologue();
  ExpertRow x;
  if (!FindExpertRow(w, a.hidden, &x)) return;
  const uint4* dw = WeightRow<kF8>(a, 2, x, a.inter);
  const float* ds = ScaleRow<kF8>(a, 2, x, a.inter);
  const int32_t s0 = x.s0, cnt = x.cnt, lane = x.lane;
  const int64_t r = x.r;
  const int64_t chunks = a.inter / kPieceValues<kF8>;
  for (int32_t c0 = 0; c0 < cnt; c0 += kT) {
    const int32_t tn = min(kT, cnt - c0);
    float acc[kT];
#pragma unroll
    for (int j = 0; j < kT; ++j) acc[j] = 0.0f;
    const float* hr = w.h + static_cast<int64_t>(s0 + c0) * a.inter;
    int64_t k = lane;
    for (; k + 96 < chunks; k += 128) {
      uint4 d4[4];
#pragma unroll
      for (int q = 0; q < 4; ++q) d4[q] = LoadStreaming(dw + k + 32 * q);
#pragma unroll
      for (int q = 0; q < 4; ++q)
        DownAccumulate<kT, kF8>(d4[q], PieceScale<kF8>(ds, k + 32 * q), hr, a.inter, k + 32 * q, tn, acc);
    }
    for (; k < chunks; k += 32)
      DownAccumulate<kT, kF8>(LoadStreaming(dw + k), PieceScale<kF8>(ds, k), hr, a.inter, k, tn, acc);
#pragma unroll
    for (int j = 0; j < kT; ++j) {
      const float v = WarpSum(acc[j]);
      if (lane == 0 && j < tn) w.y[static_cast<int64_t>(s0 + c0 + j) * a.hidden + r] = v;
    }
  }
}

// The tensor-core path (prefill-sized batches): each pair's input row gathered in sorted order and rounded to bf16,
// then two grouped GEMMs over tiles of one expert's pairs (TileRows rows): H = silu(Xs Wg^T) * (Xs Wu^T) (bf16), then
// Y = H Wd^T (float32), and the same combine as the GEMV path.
__global__ void MoeGatherBf16Kernel(MoeExpertsArgs a, MoeWorkspace w) {
  PdlPrologue();
  const int64_t pos = blockIdx.x;
  const float* x = a.x + static_cast<int64_t>(w.sorted_pair[pos] / a.top_k) * a.xs;
  __nv_bfloat162* d = reinterpret_cast<__nv_bfloat162*>(w.xs + pos * a.hidden);
  for (int64_t c = threadIdx.x; c < a.hidden / 4; c += blockDim.x) {
    const float4 v = reinterpret_cast<const float4*>(x)[c];
    d[2 * c] = __floats2bfloat162_rn(v.x, v.y);
    d[2 * c + 1] = __floats2bfloat162_rn(v.z, v.w);
  }
}

constexpr int kMmaThreads = 128;  // four warps

// Shared memory of MoeMmaKernel<kGateUp, kBM, kF8>: MmaStages(kF8) stages of kBM rows of A and kMmaN rows of each
// weight matrix, kMmaK values each, bf16 rows padded by 16 bytes (a stride of 144 bytes puts ldmatrix's 8 rows in 8
// different bank groups). f8 weight rows are kMmaK bytes padded by 16 (a stride of 80 bytes puts the 8 rows one
// fragment load reads in 8 different banks), and one more stage is in flight (their stages are half the size).
constexpr int kF8Row = kMmaK + 16;
constexpr int MmaStages(bool f8) {
  return f8 ? kMmaStages + 1 : kMmaStages;
}
constexpr int MmaSmemBytes(bool gate_up, int bm, bool f8) {
  const int mats = gate_up ? 2 : 1;
  return MmaStages(f8) * (bm * (kMmaK + 8) * 2 + mats * kMmaN * (f8 ? kF8Row : (kMmaK + 8) * 2));
}

// Block (tile, kMmaN output columns): the tile's kBM rows of A (Xs for gate/up, H for down; K = a.hidden or
// a.inter) against kMmaN rows of one (gate/up: two) of its expert's weight matrices, K in steps of kMmaK through a
// kMmaStages-deep cp.async pipeline; per warp mma.m16n8k16 on 32 x 32 (kBM 64: 2 x 2 warps) or 16 x 16 (kBM 16:
// 1 x 4 warps) outputs per matrix. f8 weights: a K step of 64 and 64 output columns lie in one 128 x 128 scale block,
// so each stage's weight tile is one scale times its e4m3 values; each warp converts the values its B fragments hold
// straight from shared memory (F8PairToBf16), rounded to bf16.
template <bool kGateUp, int kBM, bool kF8>
__global__ void __launch_bounds__(kMmaThreads) MoeMmaKernel(MoeExpertsArgs a, MoeWorkspace w) {
  PdlPrologue();
  constexpr int kMmaRow = kMmaK + 8;
  constexpr int kMats = kGateUp ? 2 : 1;
  constexpr int kMT = kBM == kMmaM ? 2 : 1;      // m16 tiles per warp
  constexpr int kWarpsM = kBM / (16 * kMT);      // 2 or 1
  constexpr int kWarpN = kMmaN / (4 / kWarpsM);  // 32 or 16 columns per warp
  constexpr int kNT = kWarpN / 8;                // n8 tiles per warp (even: two per ldmatrix.x4)
  static_assert(kWarpsM * (kMmaN / kWarpN) == kMmaThreads / 32 && kNT % 2 == 0, "four warps cover the tile");
  constexpr int kStages = MmaStages(kF8);
  extern __shared__ __align__(16) unsigned char moe_smem[];
  auto sa = reinterpret_cast<__nv_bfloat16(*)[kBM * kMmaRow]>(moe_smem);  // [kStages][kBM * kMmaRow]
  auto sb = reinterpret_cast<__nv_bfloat16(*)[kMats][kMmaN * kMmaRow]>(moe_smem + kStages * kBM * kMmaRow * 2);
  auto sb8 = reinterpret_cast<uint8_t(*)[kMats][kMmaN * kF8Row]>(moe_smem + kStages * kBM * kMmaRow * 2);
  const int32_t tile = static_cast<int32_t>(blockIdx.x);
  if (tile >= *w.num_tiles) return;
  const int32_t e = w.tile_e[tile], m0 = w.tile_m0[tile];
  const int32_t rows = min(kBM, w.start[e + 1] - m0);
  const int64_t k_len = kGateUp ? a.hidden : a.inter, n_len = kGateUp ? a.inter : a.hidden;
  const int64_t n0 = static_cast<int64_t>(blockIdx.y) * kMmaN;
  const __nv_bfloat16* A = kGateUp ? w.xs : reinterpret_cast<const __nv_bfloat16*>(w.h);
  constexpr int kElem = kF8 ? 1 : 2;  // bytes per weight
  const uint8_t* B[kMats];
  const float* S[kMats];  // f8: the scales of the tile's 128-row block, [ceil(k_len / 128)]
#pragma unroll
  for (int m = 0; m < kMats; ++m) {
    const int part = kGateUp ? m : 2;
    B[m] = static_cast<const uint8_t*>(a.table[part * a.n_experts + e]) + n0 * k_len * kElem;
    S[m] = kF8 ? static_cast<const float*>(a.table[(3 + part) * a.n_experts + e]) + (n0 / 128) * ((k_len + 127) / 128)
               : nullptr;
  }
  const int tid = static_cast<int>(threadIdx.x), lane = tid % 32, warp = tid / 32;
  const int wm = (warp % kWarpsM) * 16 * kMT, wn = (warp / kWarpsM) * kWarpN;  // the warp's outputs in the tile
  // Each stage: kBM (and kMmaN per matrix) rows of kMmaK values, kPieces pieces of 16 bytes a row.
  constexpr int kPieces = kMmaK / 8;
  auto load = [&](int stage, int64_t k0) {
#pragma unroll
    for (int i = tid; i < kBM * kPieces; i += kMmaThreads) {
      const int r = i / kPieces, c = (i % kPieces) * 8;
      const bool ok = r < rows;
      CpAsync16(&sa[stage][r * kMmaRow + c], A + (ok ? static_cast<int64_t>(m0 + r) * k_len + k0 + c : 0), ok ? 16 : 0);
    }
    constexpr int kPiecesB = kMmaK * kElem / 16;
#pragma unroll
    for (int m = 0; m < kMats; ++m) {
#pragma unroll
      for (int i = tid; i < kMmaN * kPiecesB; i += kMmaThreads) {
        const int r = i / kPiecesB, c = i % kPiecesB;
        void* dst = kF8 ? static_cast<void*>(&sb8[stage][m][r * kF8Row + c * 16])
                        : static_cast<void*>(&sb[stage][m][r * kMmaRow + c * 8]);
        CpAsync16(dst, B[m] + (static_cast<int64_t>(r) * k_len + k0) * kElem + c * 16, 16);
      }
    }
  };
  float acc[kMats][kMT][kNT][4];  // [matrix][m16 tile][n8 tile][fragment]
#pragma unroll
  for (int m = 0; m < kMats; ++m)
#pragma unroll
    for (int i = 0; i < kMT; ++i)
#pragma unroll
      for (int j = 0; j < kNT; ++j) acc[m][i][j][0] = acc[m][i][j][1] = acc[m][i][j][2] = acc[m][i][j][3] = 0.0f;
  const int64_t steps = k_len / kMmaK;
#pragma unroll
  for (int st = 0; st < kStages - 1; ++st) {
    if (st < steps) load(st, st * kMmaK);
    CpAsyncCommit();
  }
  const int g = lane / 4, tq = lane % 4;
  for (int64_t kb = 0; kb < steps; ++kb) {
    CpAsyncWait<kStages - 2>();
    __syncthreads();  // stage kb is in place; the stage loaded next was consumed at step kb - 1
    const int64_t next = kb + kStages - 1;
    if (next < steps) load(static_cast<int>(next % kStages), next * kMmaK);
    CpAsyncCommit();
    const int stage = static_cast<int>(kb % kStages);
    float scale[kMats];
#pragma unroll
    for (int m = 0; m < kMats; ++m) scale[m] = kF8 ? S[m][(kb * kMmaK) / 128] : 1.0f;
#pragma unroll
    for (int kk = 0; kk < kMmaK; kk += 16) {
      uint32_t af[kMT][4];
#pragma unroll
      for (int i = 0; i < kMT; ++i) {
        LdMatrixX4(af[i], &sa[stage][(wm + i * 16 + (lane & 15)) * kMmaRow + kk + (lane >> 4) * 8], false);
      }
#pragma unroll
      for (int m = 0; m < kMats; ++m) {
#pragma unroll
        for (int j = 0; j < kNT; j += 2) {  // two n8 tiles per ldmatrix.x4
          uint32_t bf[4];
          if constexpr (kF8) {  // mma's B fragment: (k 2tq and 2tq + 1, then + 8; column g) of each n8 tile
#pragma unroll
            for (int q = 0; q < 4; ++q) {
              const uint8_t* row = &sb8[stage][m][(wn + (j + q / 2) * 8 + g) * kF8Row + kk + 2 * tq + (q % 2) * 8];
              bf[q] = F8PairToBf16(*reinterpret_cast<const uint16_t*>(row), scale[m]);
            }
          } else {
            LdMatrixX4(
                bf,
                &sb[stage][m][(wn + j * 8 + (lane & 7) + ((lane >> 4) << 3)) * kMmaRow + kk + ((lane >> 3) & 1) * 8],
                false);
          }
#pragma unroll
          for (int i = 0; i < kMT; ++i) {
            Mma16816<__nv_bfloat16>(acc[m][i][j], af[i], bf[0], bf[1]);
            Mma16816<__nv_bfloat16>(acc[m][i][j + 1], af[i], bf[2], bf[3]);
          }
        }
      }
    }
  }
  CpAsyncWait<0>();
#pragma unroll
  for (int i = 0; i < kMT; ++i) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = wm + i * 16 + g + half * 8;
      if (r >= rows) continue;
      const int64_t pos = m0 + r;
#pragma unroll
      for (int j = 0; j < kNT; ++j) {
        const int64_t col = n0 + wn + j * 8 + 2 * tq;
        const float v0 = acc[0][i][j][2 * half], v1 = acc[0][i][j][2 * half + 1];
        if constexpr (kGateUp) {
          const float u0 = acc[kMats - 1][i][j][2 * half], u1 = acc[kMats - 1][i][j][2 * half + 1];
          reinterpret_cast<__nv_bfloat162*>(reinterpret_cast<__nv_bfloat16*>(w.h) + pos * n_len + col)[0] =
              __floats2bfloat162_rn(v0 / (1.0f + expf(-v0)) * u0, v1 / (1.0f + expf(-v1)) * u1);
        } else {
          *reinterpret_cast<float2*>(w.y + pos * n_len + col) = make_float2(v0, v1);
        }
      }
    }
  }
}

// The two grouped GEMMs of the tensor-core path (the shared-memory limit raised once per kernel and device).
template <int kBM, bool kF8>
int LaunchMmaAs(const MoeExpertsArgs& a, const MoeWorkspace& w, dim3 gate_up, dim3 down, cudaStream_t st) {
  constexpr int kGateUpSmem = MmaSmemBytes(true, kBM, kF8);
  constexpr int kDownSmem = MmaSmemBytes(false, kBM, kF8);
  int attr = EnsureDynamicSmem(reinterpret_cast<const void*>(MoeMmaKernel<true, kBM, kF8>), kGateUpSmem);
  if (attr == 0) attr = EnsureDynamicSmem(reinterpret_cast<const void*>(MoeMmaKernel<false, kBM, kF8>), kDownSmem);
  if (attr != 0) return attr;
  LaunchKernel(MoeMmaKernel<true, kBM, kF8>, gate_up, kMmaThreads, kGateUpSmem, st, a, w);
  LaunchKernel(MoeMmaKernel<false, kBM, kF8>, down, kMmaThreads, kDownSmem, st, a, w);
  return 0;
}
template <int kBM>
int LaunchMma(const MoeExpertsArgs& a, const MoeWorkspace& w, dim3 gate_up, dim3 down, cudaStream_t st) {
  return a.fp8 ? LaunchMmaAs<kBM, true>(a, w, gate_up, down, st) : LaunchMmaAs<kBM, false>(a, w, gate_up, down, st);
}

// The 4-bit path (a.int4): each pair's input row gathered in sorted order and rounded to bf16 (MoeGatherBf16Kernel),
// then two grouped W4A16 GEMMs over tiles of one expert's pairs (TileRows: 8, 32 or 64 of them), H = silu(Xs Wg^T) *
// (Xs Wu^T) (bf16) and Y = H Wd^T (float32), and the same combine. A block's warps each own 16 weight rows, as
// in int4.cu's kernel: a lane's tiled word is its mma A fragment of a 16 x 16 tile, turned into bf16 codes minus zeros
// in registers, and the float32 sums are scaled per group. The tile's inputs (bf16) are staged in shared memory,
// kI4StageElems at a time, and read as B fragments; each lane streams its weights from global memory with kUnroll
// 64-input chunks in flight. No partial sums between blocks: the grid is (tiles, row blocks), enough blocks even at
// batch 1 (V2-Lite: 6 experts x 44 gate/up blocks of 32 rows).
// At NT 1 (decode: about one pair an expert) the kernel is bound by the weight loads in flight, so kSplit warps share
// each row block's chunks (interleaved) with kUnroll 8 chunks each in flight, and add their sums in warp order through
// shared memory at the end; taller tiles do enough arithmetic a load to run one warp a row block.
constexpr int kI4StageElems = 16384;

template <int NT>
struct I4Stage {
  static constexpr int kTok = 8 * NT;
  static constexpr int kInputs = kI4StageElems / kTok;  // 2048 (NT 1), 512 (NT 4), 256 (NT 8)
  static constexpr int kPitch = kInputs + 16;           // int4.cu's: a half-warp's 8-byte loads on distinct banks
  static constexpr int kRowWarps = NT == 1 ? 2 : 4;     // row blocks of 16 a block
  static constexpr int kSplit = NT == 1 ? 4 : 1;        // warps a row block
  static constexpr int kThreads = 32 * kRowWarps * kSplit;
  static constexpr int kUnroll = NT == 1 ? 8 : NT >= 8 ? 2 : 4;
  static constexpr int kMinBlocks = NT == 1 ? 2 : 1;  // a multiprocessor: 128 registers a thread at NT 1
};

// Block (tile, kRowWarps row blocks of 16): kGateUp: h[pos, r] = silu(gate_r . x_pos) * (up_r . x_pos) (bf16) for the
// tile's sorted positions pos; else y[pos, r] = down_r . h_pos. kChunkGroup: groups of a multiple of 64 inputs (or the
// whole row), so a chunk lies in one group; else groups of 16 or 32 inputs, looked up per 16-input tile.
template <bool kGateUp, int NT, typename TS, bool kChunkGroup>
__global__ void __launch_bounds__(I4Stage<NT>::kThreads, I4Stage<NT>::kMinBlocks)
    MoeInt4Kernel(MoeExpertsArgs a, MoeWorkspace w) {
  PdlPrologue();
  using St = I4Stage<NT>;
  constexpr int kMats = kGateUp ? 2 : 1;
  __shared__ __align__(16) __nv_bfloat16 xsm[St::kTok * St::kPitch];
  const int32_t tile = static_cast<int32_t>(blockIdx.x);
  if (tile >= *w.num_tiles) return;
  const int32_t expert = w.tile_e[tile], m0 = w.tile_m0[tile];
  const int rows = min(St::kTok, w.start[expert + 1] - m0);
  const int64_t k_len = kGateUp ? a.hidden : a.inter, m_len = kGateUp ? a.inter : a.hidden;
  const int64_t chunks = k_len / 64;
  const int64_t group = a.int4_group > 0 ? a.int4_group : k_len;
  const int64_t groups = (k_len + group - 1) / group;
  const int lane = static_cast<int>(threadIdx.x & 31), warp = static_cast<int>(threadIdx.x >> 5);
  const int rw = warp % St::kRowWarps, split = warp / St::kRowWarps;  // the warp's row block and share of its chunks
  const int64_t rb = static_cast<int64_t>(blockIdx.y) * St::kRowWarps + rw;
  const bool active = rb < m_len / 16;
  const int64_t rbo = active ? rb : 0;
  int4::WarpRowBlock<NT, kMats, TS, kChunkGroup> r;
#pragma unroll
  for (int m = 0; m < kMats; ++m) {
    const int64_t part = kGateUp ? m : 2;
    r.w[m] = static_cast<const uint4*>(a.table[part * a.n_experts + expert]) + rbo * chunks * 32 + lane;
    r.s[m] = static_cast<const TS*>(a.table[(3 + part) * a.n_experts + expert]) + rbo * groups * 16;
    r.z[m] = static_cast<const uint32_t*>(a.table[(6 + part) * a.n_experts + expert]) + rbo * groups * 2;
  }
  r.group = group;
  r.zero_offset = a.int4_zero_offset;
  r.lane = lane;
  r.Zero();
  const __nv_bfloat16* in = kGateUp ? w.xs : reinterpret_cast<const __nv_bfloat16*>(w.h);
  const __nv_bfloat16* xlane = xsm + (lane / 4) * St::kPitch + 4 * (lane % 4);
  for (int64_t k0 = 0; k0 < k_len; k0 += St::kInputs) {
    const int len = static_cast<int>(std::min<int64_t>(St::kInputs, k_len - k0));
    __syncthreads();  // every warp is done with the last stage
    const int per_row = len / 8, total = rows * per_row;
    for (int i = static_cast<int>(threadIdx.x); i < total; i += St::kThreads) {
      const int row = i / per_row, q = i - row * per_row;
      *reinterpret_cast<uint4*>(xsm + row * St::kPitch + 8 * q) =
          __ldg(reinterpret_cast<const uint4*>(in + static_cast<int64_t>(m0 + row) * k_len + k0) + q);
    }
    __syncthreads();
    // This warp's chunks of the stage: its split's first, then every kSplit-th.
    const int64_t c_lo = k0 / 64;
    // (Gate and up at NT 1: 4 chunks of each in flight, 8 loads as down has, in 128 registers; 6 or 8 spilled.)
    constexpr int kUnroll = kGateUp && NT == 1 ? 4 : St::kUnroll;
    if (active) r.template Stream<kUnroll>(c_lo + split, c_lo + len / 64, St::kSplit, c_lo, xlane, St::kPitch, rows);
  }
  if constexpr (St::kSplit > 1) {
    static_assert((St::kSplit - 1) * St::kRowWarps * kMats * NT * 128 * 4 <= sizeof(xsm), "the sums fit the stage");
    r.AddSplits(reinterpret_cast<float*>(xsm), split, St::kSplit, rw, St::kRowWarps, active);
    if (split > 0) return;
  }
  const auto& acc = r.acc;
  if (!active) return;
  const int64_t r0 = 16 * rb + lane / 4;
#pragma unroll
  for (int tt = 0; tt < NT; ++tt) {
#pragma unroll
    for (int v = 0; v < 4; ++v) {
      const int pr = 8 * tt + 2 * (lane % 4) + (v & 1);
      if (pr >= rows) continue;
      const int64_t row = r0 + 8 * (v >> 1), pos = m0 + pr;
      if constexpr (kGateUp) {
        const float g = acc[0][tt][v], u = acc[kMats - 1][tt][v];
        reinterpret_cast<__nv_bfloat16*>(w.h)[pos * m_len + row] = __float2bfloat16_rn(g / (1.0f + expf(-g)) * u);
      } else {
        w.y[pos * m_len + row] = acc[0][tt][v];
      }
    }
  }
}

template <int NT, typename TS, bool kChunkGroup>
void LaunchInt4As(const MoeExpertsArgs& a, const MoeWorkspace& w, unsigned tiles, cudaStream_t st) {
  using St = I4Stage<NT>;
  constexpr int64_t kRows = 16 * St::kRowWarps;
  LaunchKernel(MoeInt4Kernel<true, NT, TS, kChunkGroup>,
               dim3(tiles, static_cast<unsigned>((a.inter + kRows - 1) / kRows)), St::kThreads, 0, st, a, w);
  LaunchKernel(MoeInt4Kernel<false, NT, TS, kChunkGroup>,
               dim3(tiles, static_cast<unsigned>((a.hidden + kRows - 1) / kRows)), St::kThreads, 0, st, a, w);
}
template <int NT>
void LaunchInt4Scales(const MoeExpertsArgs& a, const MoeWorkspace& w, unsigned tiles, cudaStream_t st) {
  const bool chunk_group = a.int4_group == 0 || a.int4_group % 64 == 0;
  if (a.int4_scales_dtype == kF16) {
    chunk_group ? LaunchInt4As<NT, __half, true>(a, w, tiles, st) : LaunchInt4As<NT, __half, false>(a, w, tiles, st);
  } else {
    chunk_group ? LaunchInt4As<NT, float, true>(a, w, tiles, st) : LaunchInt4As<NT, float, false>(a, w, tiles, st);
  }
}
void LaunchInt4(const MoeExpertsArgs& a, const MoeWorkspace& w, unsigned tiles, cudaStream_t st) {
  if (w.tile_rows == 8) {
    LaunchInt4Scales<1>(a, w, tiles, st);
  } else if (w.tile_rows == 32) {
    LaunchInt4Scales<4>(a, w, tiles, st);
  } else {
    LaunchInt4Scales<8>(a, w, tiles, st);
  }
}

// Block (token, kCombineThreads columns): out[t, c] += sum_j weights[t, j] * y[pair_pos[t * top_k + j], c], j in
// order. The token's positions and weights are read once into shared memory, so each thread's loads of y are
// independent of one another (a serial chain of dependent loads per column took 19 us at batch 1).
constexpr int kCombineThreads = 256;
__global__ void __launch_bounds__(kCombineThreads) MoeCombineKernel(MoeExpertsArgs a, MoeWorkspace w) {
  PdlPrologue();
  __shared__ int64_t row[moe_route::kMaxTopK];
  __shared__ float weight[moe_route::kMaxTopK];
  const int64_t t = blockIdx.x, k = a.top_k;
  if (threadIdx.x < k) {
    row[threadIdx.x] = static_cast<int64_t>(w.pair_pos[t * k + threadIdx.x]) * a.hidden;
    weight[threadIdx.x] = a.weights[t * k + threadIdx.x];
  }
  __syncthreads();
  const int64_t c = static_cast<int64_t>(blockIdx.y) * kCombineThreads + threadIdx.x;
  if (c >= a.hidden) return;
  float acc = 0.0f;
#pragma unroll 8
  for (int64_t j = 0; j < k; ++j) acc += weight[j] * w.y[row[j] + c];
  a.out[t * a.os + c] += acc;
}

template <int kT, bool kF8>
void LaunchGroupedAs(const MoeExpertsArgs& a, const MoeWorkspace& w, unsigned slots, cudaStream_t s) {
  LaunchKernel(MoeGateUpKernel<kT, kF8>, dim3(slots, static_cast<unsigned>((a.inter + kMoeWarps - 1) / kMoeWarps)),
               kMoeWarps * 32, 0, s, a, w);
  LaunchKernel(MoeDownKernel<kT, kF8>, dim3(slots, static_cast<unsigned>((a.hidden + kMoeWarps - 1) / kMoeWarps)),
               kMoeWarps * 32, 0, s, a, w);
}
template <int kT>
void LaunchGrouped(const MoeExpertsArgs& a, const MoeWorkspace& w, unsigned slots, cudaStream_t s) {
  if (a.fp8) {
    LaunchGroupedAs<kT, true>(a, w, slots, s);
  } else {
    LaunchGroupedAs<kT, false>(a, w, slots, s);
  }
}

}  // namespace

int LaunchMoeRoute(const float* logits, int64_t ls, int64_t n, const float* bias, const moe_route::Params& p,
                   int32_t* ids, float* weights, Stream s) {
  if (n == 0) return 0;
  if (p.n_experts > moe_route::kMaxExperts || p.n_group > moe_route::kMaxGroups) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  const size_t smem = static_cast<size_t>(kRouteWarps) * 2 * static_cast<size_t>(p.n_experts) * sizeof(float);
  LaunchKernel(MoeRouteKernel, static_cast<unsigned>((n + kRouteWarps - 1) / kRouteWarps), kRouteWarps * 32, smem,
               static_cast<cudaStream_t>(s), logits, ls, n, bias, p, ids, weights);
  return static_cast<int>(cudaGetLastError());
}

bool MoeInt4Fits(int64_t hidden, int64_t inter, int64_t group) {
  return hidden % 64 == 0 && inter % 64 == 0 && group >= 0 && group % 16 == 0;
}

bool MoeTensorCoresFit(const MoeExpertsArgs& a) {
  static_assert(kMmaN % kMmaK == 0, "K steps divide the multiples of kMmaN");
  return a.hidden % kMmaN == 0 && a.inter % kMmaN == 0;
}

int64_t MoeExpertsWorkspaceBytes(const MoeExpertsArgs& a) {
  int64_t total = 0;
  Carve(a, nullptr, &total);
  return total;
}

int LaunchMoeExperts(const MoeExpertsArgs& a, void* workspace, Stream s) {
  const int64_t pairs = a.n * a.top_k;
  if (pairs == 0) return 0;
  if (pairs > kMaxMoePairs || a.n_experts > moe_route::kMaxExperts || a.top_k > moe_route::kMaxTopK ||
      a.hidden % (a.fp8 ? kPieceValues<true> : kPieceValues<false>) != 0 ||
      a.inter % (a.fp8 ? kPieceValues<true> : kPieceValues<false>) != 0 || a.xs % 4 != 0 ||
      reinterpret_cast<uintptr_t>(a.x) % 16 != 0 || (a.tensor_cores && !MoeTensorCoresFit(a)) ||
      (a.int4 && (!MoeInt4Fits(a.hidden, a.inter, a.int4_group) ||
                  (a.int4_scales_dtype != kF16 && a.int4_scales_dtype != kF32)))) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  int64_t total = 0;
  const MoeWorkspace w = Carve(a, workspace, &total);
  cudaStream_t st = static_cast<cudaStream_t>(s);
  LaunchKernel(MoeSortKernel, 1, 1024, 0, st, a.ids, static_cast<int32_t>(pairs), static_cast<int32_t>(a.n_experts), w);
  if (a.int4) {
    LaunchKernel(MoeGatherBf16Kernel, static_cast<unsigned>(pairs), 128, 0, st, a, w);
    LaunchInt4(a, w, static_cast<unsigned>(MaxTiles(a)), st);  // blocks past num_tiles return at once
  } else if (a.tensor_cores) {
    LaunchKernel(MoeGatherBf16Kernel, static_cast<unsigned>(pairs), 128, 0, st, a, w);
    // Blocks for every tile there can be; those past num_tiles return at once.
    const unsigned tiles = static_cast<unsigned>(MaxTiles(a));
    const dim3 gate_up(tiles, static_cast<unsigned>(a.inter / kMmaN)),
        down(tiles, static_cast<unsigned>(a.hidden / kMmaN));
    const int err = w.tile_rows == kMmaSmallM ? LaunchMma<kMmaSmallM>(a, w, gate_up, down, st)
                                              : LaunchMma<kMmaM>(a, w, gate_up, down, st);
    if (err != 0) return err;
  } else {
    // Blocks for every expert that can be active; those past num_active return at once. Pairs per weight read: one
    // at batch 1, more when experts share tokens.
    const unsigned slots = static_cast<unsigned>(std::min(a.n_experts, pairs));
    if (pairs <= a.n_experts) {
      LaunchGrouped<1>(a, w, slots, st);
    } else if (pairs <= 4 * a.n_experts) {
      LaunchGrouped<4>(a, w, slots, st);
    } else {
      LaunchGrouped<8>(a, w, slots, st);
    }
  }
  LaunchKernel(
      MoeCombineKernel,
      dim3(static_cast<unsigned>(a.n), static_cast<unsigned>((a.hidden + kCombineThreads - 1) / kCombineThreads)),
      kCombineThreads, 0, st, a, w);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace fathom::cuda
