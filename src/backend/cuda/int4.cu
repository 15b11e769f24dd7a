// The 4-bit weight kernels (int4.h): the repack into the tile layout, the W4A16 tensor-core kernel for decode
// batches, the dequantization for the prefill GEMM, and the generic float32 kernel on the checkpoint's layout.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "backend/cuda/dtype.cuh"
#include "backend/cuda/int4.cuh"
#include "backend/cuda/int4.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/memory.cuh"
#include "backend/cuda/mma.cuh"

namespace fathom::cuda {

namespace {

using int4::AddScaled;
using int4::GroupMeta;
using int4::MakeMeta;

__device__ __forceinline__ uint32_t Nib(uint32_t word, int i) {
  return (word >> (4 * i)) & 0xFu;
}

// AWQ packs column offset j of a word at nibble [0, 4, 1, 5, 2, 6, 3, 7][j].
__device__ __forceinline__ int AwqNib(int j) {
  return (j >> 1) | ((j & 1) << 2);
}

__device__ __forceinline__ uint32_t SourceCode(const Int4Source& w, int64_t n, int64_t k) {
  if (w.awq) return Nib(static_cast<uint32_t>(w.qweight[k * (w.m / 8) + n / 8]), AwqNib(static_cast<int>(n % 8)));
  return Nib(static_cast<uint32_t>(w.qweight[(k / 8) * w.m + n]), static_cast<int>(k % 8));
}

__device__ __forceinline__ uint32_t SourceZero(const Int4Source& w, int64_t n, int64_t g) {
  const uint32_t word = static_cast<uint32_t>(w.qzeros[g * (w.m / 8) + n / 8]);
  return Nib(word, w.awq ? AwqNib(static_cast<int>(n % 8)) : static_cast<int>(n % 8));
}

__device__ __forceinline__ float ScaleOf(const void* s, int dtype, int64_t i) {
  if (dtype == kF16) return __half2float(static_cast<const __half*>(s)[i]);
  if (dtype == kBF16) return __bfloat162float(static_cast<const __nv_bfloat16*>(s)[i]);
  return static_cast<const float*>(s)[i];
}

__device__ __forceinline__ float BiasAt(const void* b, int dtype, int64_t i) {
  return b == nullptr ? 0.0f : ScaleOf(b, dtype, i);
}

// Tiled word index -> (r0, kk): r0 = 16 * rb + lane / 4, kk = 64 * chunk + 16 * tile + 4 * (lane % 4).
struct WordPos {
  int64_t r0, kk;
};
__device__ __forceinline__ WordPos PosOf(int64_t idx, int64_t chunks) {
  const int64_t tile = idx % 4, lane = (idx / 4) % 32, chunk = (idx / 128) % chunks, rb = idx / (128 * chunks);
  return {16 * rb + lane / 4, 64 * chunk + 16 * tile + 4 * (lane % 4)};
}

// Nibble i of a tiled word: (row r0 + 8 * (i % 2), input kk + [0, 2, 1, 3][i / 2]).
__device__ __forceinline__ int RowOff(int i) {
  return 8 * (i & 1);
}
__device__ __forceinline__ int ColOff(int i) {
  return ((i >> 1) & 1) * 2 + (i >> 2);
}

__global__ void RepackWeightsKernel(Int4Source w, const int32_t* perm, uint32_t* dst, int64_t words) {
  PdlPrologue();
  const int64_t chunks = w.k / 64;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < words;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const WordPos p = PosOf(idx, chunks);
    uint32_t word = 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int64_t k = p.kk + ColOff(i);
      word |= SourceCode(w, p.r0 + RowOff(i), perm != nullptr ? perm[k] : k) << (4 * i);
    }
    dst[idx] = word;
  }
}

__global__ void RepackScalesKernel(Int4Source w, void* dst, int64_t total) {
  PdlPrologue();
  const bool f16 = w.scales_dtype == kF16;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = idx % 16, g = (idx / 16) % w.groups, rb = idx / (16 * w.groups);
    const int64_t src = g * w.m + 16 * rb + i;
    if (f16) {
      static_cast<uint16_t*>(dst)[idx] = static_cast<const uint16_t*>(w.scales)[src];
    } else {
      static_cast<uint32_t*>(dst)[idx] = static_cast<const uint32_t*>(w.scales)[src];
    }
  }
}

__global__ void RepackZerosKernel(Int4Source w, uint32_t* dst, int64_t total) {
  PdlPrologue();
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t h = idx % 2, g = (idx / 2) % w.groups, rb = idx / (2 * w.groups);
    uint32_t word = 0;
    for (int i = 0; i < 8; ++i) word |= SourceZero(w, 16 * rb + 8 * h + i, g) << (4 * i);
    dst[idx] = word;
  }
}

__device__ __forceinline__ uint32_t PackBf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return reinterpret_cast<const uint32_t&>(v);
}

// The W4A16 kernel. A block's 8 warps each own one 16-row block of a 128-row group, so x, staged in shared memory as
// bf16, serves 8 row blocks at once. Up to kInt4MaxParts weights that share x and K (q/k/v, gate/up) run in one
// launch: their row groups are numbered one after another. The work of one token group is its (row group, 64-input
// chunk) units in that order, cut into `blocks` contiguous ranges, one a block (stream-K: every block gets the same
// number of chunks whatever the shapes, so there is no tail of idle multiprocessors). A row group whose chunks fall to
// several blocks is summed through scratch: each writes its partial sums, and the one that arrives last adds them in
// block order (the same result whatever order they finish in). Each warp streams its weights (with their group's
// scales and zeros) through its own ring of kSteps two-chunk steps in shared memory with cp.async, so that 4 KiB a
// warp are always in flight; the loop's bookkeeping (32-bit, incremental, once a step) is kept small, since at batch
// 1 the kernel is bound by instruction issue as much as by memory.
constexpr int kMmaWarps = 8;
constexpr int kMmaRows = 16 * kMmaWarps;
constexpr int kMmaStageElems = 16384;     // bf16 elements of x a stage holds: [8 * NT tokens][inputs]
constexpr int kSteps = 4;                 // steps of two chunks a warp has in flight
constexpr int kRingSlot = 512 + 64 + 16;  // a chunk's weights (32 lanes x 16 bytes), its group's 16 scales, 2 zeros
constexpr int kStepSlot = 2 * kRingSlot;

template <int NT>
struct MmaStage {
  static constexpr int kTokens = 8 * NT;
  static constexpr int kInputs = kMmaStageElems / kTokens;  // 2048 (NT 1) .. 256 (NT 8)
  static constexpr int kChunks = kInputs / 64;
  // A token row's pitch: 32 bytes past a multiple of 128, so that the 8-byte B-fragment loads of a half-warp (4 rows,
  // 32 bytes each) fall on distinct banks.
  static constexpr int kPitch = kInputs + 16;
  static constexpr int kXBytes = kTokens * kPitch * 2;
  static constexpr int kSmemBytes = kXBytes + kMmaWarps * kSteps * kStepSlot;
  static constexpr int kMinBlocks = 2;  // per multiprocessor (registers: 128 a thread)
};

// The kernel's view of its parts (all with the K, groups, scale dtype, zero offset and permutation of part 0).
struct MmaParts {
  const uint32_t* weights[kInt4MaxParts];
  const void* scales[kInt4MaxParts];
  const uint32_t* zeros[kInt4MaxParts];
  const void* bias[kInt4MaxParts];
  int bias_dtype[kInt4MaxParts];
  float* out[kInt4MaxParts];
  int64_t os[kInt4MaxParts];
  int rbs[kInt4MaxParts];           // 16-row blocks of each part
  int rg_begin[kInt4MaxParts + 1];  // the first row group of each part; rg_begin[count]: all of them
  int count;
  const int32_t* perm;
  int chunks, groups, group, zero_offset;
};

// 8 bytes global -> shared (cp.async.ca: the 16-byte .cg form is memory.cuh's CpAsync16).
__device__ __forceinline__ void CpAsync8(void* smem, const void* src) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(addr), "l"(src) : "memory");
}

// x[t0 .. t0 + rows, k0 .. k0 + inputs] into the stage, as bf16 (rows past n stay the zeros they were set to), four
// loads in flight a thread. XT float: rounded here, read through perm if it is set; XT bf16: x already rounded and
// in tiled order.
template <int NT, typename XT>
__device__ __forceinline__ void StageX(const XT* __restrict__ x, int64_t xs, int rows, int64_t t0, const int32_t* perm,
                                       int k0, int inputs, __nv_bfloat16* __restrict__ xsm) {
  using St = MmaStage<NT>;
  constexpr int kThreads = kMmaWarps * 32, kBatch = 4;
  if constexpr (std::is_same_v<XT, float>) {
    if (perm == nullptr) {
      const int per_row = inputs / 4, total = rows * per_row;
      for (int i0 = static_cast<int>(threadIdx.x); i0 < total; i0 += kBatch * kThreads) {
        float4 v[kBatch];
#pragma unroll
        for (int b = 0; b < kBatch; ++b) {
          const int i = i0 + b * kThreads, r = i / per_row, q = i - r * per_row;
          if (i < total) v[b] = __ldg(reinterpret_cast<const float4*>(x + (t0 + r) * xs + k0) + q);
        }
#pragma unroll
        for (int b = 0; b < kBatch; ++b) {
          const int i = i0 + b * kThreads, r = i / per_row, q = i - r * per_row;
          if (i < total) {
            *reinterpret_cast<uint2*>(xsm + r * St::kPitch + 4 * q) =
                make_uint2(PackBf16(v[b].x, v[b].y), PackBf16(v[b].z, v[b].w));
          }
        }
      }
    } else {
      for (int i = static_cast<int>(threadIdx.x); i < rows * inputs; i += kThreads) {
        const int r = i / inputs, q = i - r * inputs;
        xsm[r * St::kPitch + q] = __float2bfloat16_rn(__ldg(x + (t0 + r) * xs + perm[k0 + q]));
      }
    }
  } else {
    const int per_row = inputs / 8, total = rows * per_row;
    for (int i0 = static_cast<int>(threadIdx.x); i0 < total; i0 += kBatch * kThreads) {
      uint4 v[kBatch];
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        const int i = i0 + b * kThreads, r = i / per_row, q = i - r * per_row;
        if (i < total) v[b] = __ldg(reinterpret_cast<const uint4*>(x + (t0 + r) * xs + k0) + q);
      }
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        const int i = i0 + b * kThreads, r = i / per_row, q = i - r * per_row;
        if (i < total) *reinterpret_cast<uint4*>(xsm + r * St::kPitch + 8 * q) = v[b];
      }
    }
  }
}

// The first unit of block b of `blocks` over `units`, and the block that holds unit u.
__device__ __forceinline__ int64_t UnitBegin(int64_t b, int64_t units, int64_t blocks) {
  return b * units / blocks;
}
__device__ __forceinline__ int64_t BlockOfUnit(int64_t u, int64_t units, int64_t blocks) {
  return ((u + 1) * blocks - 1) / units;
}

// grid (token groups, blocks), MmaStage<NT>::kSmemBytes of dynamic shared memory. scratch: per token group
// 2 * blocks slots of kMmaRows x 8 * NT floats (slot 2b: the row group block b starts in, 2b + 1: the one it ends
// in); counters: [token groups][row groups], zeroed, left zeroed.
template <typename TS, bool kChunkGroup, int NT, typename XT>
__global__ void __launch_bounds__(kMmaWarps * 32, MmaStage<NT>::kMinBlocks)
    Int4MmaKernel(const XT* __restrict__ x, int64_t xs, int64_t n, MmaParts P, float* scratch, int* counters,
                  int blocks) {
  PdlPrologue();
  using St = MmaStage<NT>;
  constexpr int kScaleLanes = static_cast<int>(sizeof(TS));  // 16-byte copies of a group's 16 scales: 2 (f16), 4
  extern __shared__ __align__(16) unsigned char smem[];
  __nv_bfloat16* xsm = reinterpret_cast<__nv_bfloat16*>(smem);
  __shared__ int last_flag;
  const int lane = static_cast<int>(threadIdx.x & 31), warp = static_cast<int>(threadIdx.x >> 5);
  unsigned char* ring = smem + St::kXBytes + warp * kSteps * kStepSlot;
  const int64_t tg = blockIdx.x, b = blockIdx.y;
  const int chunks = P.chunks, rgs = P.rg_begin[P.count];
  const int64_t units = static_cast<int64_t>(rgs) * chunks;
  // kChunkGroup: chunks a group spans (groups == 1: all of them); otherwise unused (groups inside a chunk).
  const int group_chunks = !kChunkGroup ? 1 : P.groups == 1 ? chunks : P.group / 64;
  const int64_t t0 = tg * St::kTokens;
  const int rows = static_cast<int>(std::min<int64_t>(St::kTokens, n - t0));
  const int zshift = 4 * (lane / 4);
  const __nv_bfloat16* xlane = xsm + (lane / 4) * St::kPitch + 4 * (lane % 4);
  for (int i = static_cast<int>(threadIdx.x); i < St::kXBytes / 16; i += kMmaWarps * 32) {
    reinterpret_cast<uint4*>(smem)[i] = make_uint4(0, 0, 0, 0);
  }
  const int64_t u_begin = UnitBegin(b, units, blocks), u_end = UnitBegin(b + 1, units, blocks);
  for (int64_t u = u_begin; u < u_end;) {
    const int rg = static_cast<int>(u / chunks);
    const int c_lo = static_cast<int>(u - static_cast<int64_t>(rg) * chunks);
    const int c_hi = static_cast<int>(std::min<int64_t>(chunks, c_lo + (u_end - u)));
    u += c_hi - c_lo;
    int p = 0;
    while (p + 1 < P.count && rg >= P.rg_begin[p + 1]) ++p;
    const int rb = (rg - P.rg_begin[p]) * kMmaWarps + warp;  // this warp's row block in part p
    const bool active = rb < P.rbs[p];
    const int64_t rbo = active ? rb : 0;
    const uint4* wsrc = reinterpret_cast<const uint4*>(P.weights[p]) + (rbo * chunks + c_lo) * 32 + lane;
    const TS* sbase = static_cast<const TS*>(P.scales[p]) + rbo * P.groups * 16;
    const uint32_t* zbase = P.zeros[p] + rbo * P.groups * 2;
    // Steps of two chunks. The next step to copy: its first chunk, its ring slot, that chunk's group and the chunks
    // left in the group from it.
    int issue_c = c_lo, issue_slot = 0, issue_g = c_lo / group_chunks, issue_left = group_chunks - c_lo % group_chunks;
    const auto issue = [&] {
      unsigned char* slot = ring + issue_slot * kStepSlot;
      const int pair = min(2, c_hi - issue_c);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if (h < pair) CpAsync16(slot + h * kRingSlot + 16 * lane, wsrc + h * 32, 16);
      }
      if constexpr (kChunkGroup) {
        // Lanes 0.. and 8.. copy the scales and zeros of the step's first and second chunk.
        const int h = lane >> 3, l = lane & 7;
        if (h < pair) {
          const int g = h == 0 || issue_left > 1 ? issue_g : issue_g + 1;
          if (l < kScaleLanes) {
            CpAsync16(slot + h * kRingSlot + 512 + 16 * l,
                      reinterpret_cast<const unsigned char*>(sbase + g * 16) + 16 * l, 16);
          } else if (l == kScaleLanes) {
            CpAsync8(slot + h * kRingSlot + 576, zbase + 2 * g);
          }
        }
      }
      wsrc += 64;
      issue_c += 2;
      issue_slot = (issue_slot + 1) % kSteps;
      if constexpr (kChunkGroup) {
        issue_left -= 2;
        while (issue_left <= 0) {  // group_chunks >= 1: at most two turns
          ++issue_g;
          issue_left += group_chunks;
        }
      }
    };
#pragma unroll
    for (int i = 0; i < kSteps; ++i) {
      if (active && issue_c < c_hi) issue();
      CpAsyncCommit();
    }
    float acc[NT][4];
#pragma unroll
    for (int tt = 0; tt < NT; ++tt) acc[tt][0] = acc[tt][1] = acc[tt][2] = acc[tt][3] = 0.0f;
    // acc += the chunk's products (weights wv, group gm, x from xb), scaled per group.
    const auto chunk_mma = [&](const uint4& wv, GroupMeta gm, const __nv_bfloat16* xb, int c) {
      const uint32_t words[4] = {wv.x, wv.y, wv.z, wv.w};
      float tmp[NT][4];
#pragma unroll
      for (int tt = 0; tt < NT; ++tt) tmp[tt][0] = tmp[tt][1] = tmp[tt][2] = tmp[tt][3] = 0.0f;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        if constexpr (!kChunkGroup) {
          const int g = (c * 64 + 16 * j) / P.group;
          gm = MakeMeta(*reinterpret_cast<const uint2*>(zbase + 2 * g), ToF(sbase[g * 16 + lane / 4]),
                        ToF(sbase[g * 16 + lane / 4 + 8]), zshift, P.zero_offset);
        }
        const uint32_t word = words[j];
        uint32_t a[4];
        int4::Fragment(word, gm.zz0, gm.zz1, a);
#pragma unroll
        for (int tt = 0; tt < NT; ++tt) {
          const uint2 bv = *reinterpret_cast<const uint2*>(xb + tt * 8 * St::kPitch + 16 * j);
          Mma16816<__nv_bfloat16>(tmp[tt], a, bv.x, bv.y);
        }
        if constexpr (!kChunkGroup) AddScaled(acc, tmp, gm.s0, gm.s1);
      }
      if constexpr (kChunkGroup) AddScaled(acc, tmp, gm.s0, gm.s1);
    };
    int read_slot = 0, in_stage = 0;
    for (int c = c_lo; c < c_hi; c += 2) {
      if (in_stage == 0) {
        __syncthreads();  // every warp is done with the last stage
        const int stage_end = min(c_hi, c + St::kChunks);
        StageX<NT, XT>(x, xs, rows, t0, P.perm, c * 64, (stage_end - c) * 64, xsm);
        __syncthreads();
      }
      CpAsyncWait<kSteps - 1>();  // this step's copies (the oldest of kSteps groups) have landed
      __syncwarp();
      const unsigned char* slot = ring + read_slot * kStepSlot;
      const int pair = min(2, c_hi - c);
      uint4 wv[2];
      GroupMeta gm[2] = {};
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if (h < pair) {
          wv[h] = *reinterpret_cast<const uint4*>(slot + h * kRingSlot + 16 * lane);
          if constexpr (kChunkGroup) {
            const TS* ss = reinterpret_cast<const TS*>(slot + h * kRingSlot + 512);
            gm[h] = MakeMeta(*reinterpret_cast<const uint2*>(slot + h * kRingSlot + 576), ToF(ss[lane / 4]),
                             ToF(ss[lane / 4 + 8]), zshift, P.zero_offset);
          }
        }
      }
      __syncwarp();  // every lane has read the slot before it is refilled
      if (active && issue_c < c_hi) issue();
      CpAsyncCommit();
      const __nv_bfloat16* xb = xlane + in_stage * 64;
      read_slot = (read_slot + 1) % kSteps;
      in_stage += 2;
      if (in_stage == St::kChunks) in_stage = 0;
      if (!active) continue;
      chunk_mma(wv[0], gm[0], xb, c);
      if (pair == 2) chunk_mma(wv[1], gm[1], xb + 64, c + 1);
    }

    const int r0 = 16 * rb + lane / 4;
    float* out = P.out[p];
    const int64_t os = P.os[p];
    const void* bias = P.bias[p];
    const int bias_dtype = P.bias_dtype[p];
    // Output (token, row) of accumulator e of token tile tt.
    const auto token = [&](int tt, int e) { return t0 + 8 * tt + 2 * (lane % 4) + (e & 1); };
    const auto row = [&](int e) { return r0 + 8 * (e >> 1); };
    if (c_lo == 0 && c_hi == chunks) {  // the whole row group: straight to the output
      if (active) {
#pragma unroll
        for (int tt = 0; tt < NT; ++tt) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int64_t t = token(tt, e);
            if (t < n) out[t * os + row(e)] = acc[tt][e] + BiasAt(bias, bias_dtype, row(e));
          }
        }
      }
      continue;
    }
    constexpr int kSlot = kMmaRows * St::kTokens;
    float* slots = scratch + tg * 2 * blocks * kSlot;
    const int64_t rg_first_unit = static_cast<int64_t>(rg) * chunks;
    const auto slot_of = [&](int64_t bb) { return 2 * bb + (UnitBegin(bb, units, blocks) < rg_first_unit ? 1 : 0); };
    const int at = (warp * NT * 4) * 32 + lane;  // this lane's accumulators in a slot: [warp][tt][e][lane]
    if (active) {
      float* mine = slots + slot_of(b) * kSlot + at;
#pragma unroll
      for (int tt = 0; tt < NT; ++tt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) mine[(tt * 4 + e) * 32] = acc[tt][e];
      }
    }
    __threadfence();
    __syncthreads();
    const int64_t first = BlockOfUnit(rg_first_unit, units, blocks);
    const int64_t last = BlockOfUnit(rg_first_unit + chunks - 1, units, blocks);
    if (threadIdx.x == 0) {
      int* counter = counters + tg * rgs + rg;
      const int prev = atomicAdd(counter, 1);
      last_flag = prev == static_cast<int>(last - first);
      if (last_flag) *counter = 0;
    }
    __syncthreads();
    if (!last_flag || !active) continue;
    __threadfence();
    // The contributions in block order, each block's NT x 4 values loaded together.
#pragma unroll
    for (int tt = 0; tt < NT; ++tt) acc[tt][0] = acc[tt][1] = acc[tt][2] = acc[tt][3] = 0.0f;
    for (int64_t bb = first; bb <= last; ++bb) {
      const float* theirs = slots + slot_of(bb) * kSlot + at;
#pragma unroll
      for (int tt = 0; tt < NT; ++tt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[tt][e] += __ldcg(theirs + (tt * 4 + e) * 32);
      }
    }
#pragma unroll
    for (int tt = 0; tt < NT; ++tt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t t = token(tt, e);
        if (t < n) out[t * os + row(e)] = acc[tt][e] + BiasAt(bias, bias_dtype, row(e));
      }
    }
  }
  CpAsyncWait<0>();
}

// The decode kernel for up to kInt4GemvTokens tokens (float32 x): a block's kGemvRowWarps row blocks of 16 rows,
// each shared by kGemvSplit warps that take every kGemvSplit-th 64-input chunk with kGemvUnroll chunks in flight a
// lane (int4.cuh's WarpRowBlock) and add their sums in split order at the end: no partial sums between blocks, no
// cp.async ring, x staged once for K inputs where it fits (its n rows only; a tile's other token rows read as zeros).
// At this size the kernel is bound by loads in flight and by latency, which the stream-K kernel's staging, ring and
// cross-block sums added to; parts (q/k/v, gate/up) number their row blocks one after another.
constexpr int kGemvRowWarps = 2, kGemvSplit = 4, kGemvUnroll = 8;
constexpr int kGemvThreads = 32 * kGemvRowWarps * kGemvSplit;
constexpr int kGemvStageElems = 16384;  // bf16 elements of x a stage holds: [n tokens][inputs + 8]

template <typename TS, bool kChunkGroup>
__global__ void __launch_bounds__(kGemvThreads, 2)
    Int4GemvKernel(const float* __restrict__ x, int64_t xs, int n, MmaParts P) {
  PdlPrologue();
  __shared__ __align__(16) __nv_bfloat16 xsm[kGemvStageElems + 8 * kInt4GemvTokens];
  const int lane = static_cast<int>(threadIdx.x & 31), warp = static_cast<int>(threadIdx.x >> 5);
  const int rw = warp % kGemvRowWarps, split = warp / kGemvRowWarps;
  int64_t rb = static_cast<int64_t>(blockIdx.x) * kGemvRowWarps + rw;  // over the parts, then within part p
  int p = 0;
  while (p + 1 < P.count && rb >= P.rbs[p]) rb -= P.rbs[p++];
  const bool active = rb < P.rbs[p];
  const int64_t rbo = active ? rb : 0, chunks = P.chunks, k = chunks * 64;
  int4::WarpRowBlock<1, 1, TS, kChunkGroup> r;
  r.w[0] = reinterpret_cast<const uint4*>(P.weights[p]) + rbo * chunks * 32 + lane;
  r.s[0] = static_cast<const TS*>(P.scales[p]) + rbo * P.groups * 16;
  r.z[0] = P.zeros[p] + rbo * P.groups * 2;
  r.group = P.group;
  r.zero_offset = P.zero_offset;
  r.lane = lane;
  r.Zero();
  const int inputs = static_cast<int>(std::min<int64_t>(k, (kGemvStageElems / n) / 64 * 64));
  const int pitch = inputs + 8;  // 16-byte rows; at most 8 rows, so never more than kGemvStageElems + 64 elements
  const __nv_bfloat16* xlane = xsm + (lane / 4) * pitch + 4 * (lane % 4);
  for (int64_t k0 = 0; k0 < k; k0 += inputs) {
    const int len = static_cast<int>(std::min<int64_t>(inputs, k - k0));
    __syncthreads();  // every warp is done with the last stage
    if (P.perm == nullptr) {
      const int per_row = len / 4;
      for (int i = static_cast<int>(threadIdx.x); i < n * per_row; i += kGemvThreads) {
        const int t = i / per_row, q = i - t * per_row;
        const float4 v = __ldg(reinterpret_cast<const float4*>(x + t * xs + k0) + q);
        *reinterpret_cast<uint2*>(xsm + t * pitch + 4 * q) = make_uint2(PackBf16(v.x, v.y), PackBf16(v.z, v.w));
      }
    } else {
      for (int i = static_cast<int>(threadIdx.x); i < n * len; i += kGemvThreads) {
        const int t = i / len, q = i - t * len;
        xsm[t * pitch + q] = __float2bfloat16_rn(__ldg(x + t * xs + P.perm[k0 + q]));
      }
    }
    __syncthreads();
    const int64_t c_lo = k0 / 64;
    if (active) r.template Stream<kGemvUnroll>(c_lo + split, c_lo + len / 64, kGemvSplit, c_lo, xlane, pitch, n);
  }
  static_assert((kGemvSplit - 1) * kGemvRowWarps * 128 * 4 <= sizeof(xsm), "the sums fit the stage");
  r.AddSplits(reinterpret_cast<float*>(xsm), split, kGemvSplit, rw, kGemvRowWarps, active);
  if (split > 0 || !active) return;
  const int64_t r0 = 16 * rb + lane / 4;
  float* out = P.out[p];
#pragma unroll
  for (int v = 0; v < 4; ++v) {
    const int t = 2 * (lane % 4) + (v & 1);
    const int64_t row = r0 + 8 * (v >> 1);
    if (t < n) out[t * P.os[p] + row] = r.acc[0][0][v] + BiasAt(P.bias[p], P.bias_dtype[p], row);
  }
}

template <typename TS, bool kChunkGroup>
int LaunchGemv(const float* x, int64_t xs, int64_t n, const MmaParts& parts, Stream s) {
  int64_t rbs = 0;
  for (int i = 0; i < parts.count; ++i) rbs += parts.rbs[i];
  const unsigned blocks = static_cast<unsigned>((rbs + kGemvRowWarps - 1) / kGemvRowWarps);
  LaunchKernel(Int4GemvKernel<TS, kChunkGroup>, blocks, kGemvThreads, 0, S(s), x, xs, static_cast<int>(n), parts);
  return Done();
}

template <typename TS>
__global__ void DequantInt4Kernel(Int4Tiled w, __nv_bfloat16* dst, int64_t words) {
  PdlPrologue();
  const int64_t chunks = w.k / 64;
  const TS* scales = static_cast<const TS*>(w.scales);
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < words;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const WordPos p = PosOf(idx, chunks);
    const uint32_t word = w.weights[idx];
    const int64_t rb = p.r0 / 16, g = p.kk / w.group;
    float v[2][4];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int h = i & 1;  // row r0 or r0 + 8
      const int64_t r = p.r0 + 8 * h;
      const int z =
          static_cast<int>(Nib(w.zeros[(rb * w.groups + g) * 2 + h], static_cast<int>(r % 8))) + w.zero_offset;
      const float s = ToF(scales[(rb * w.groups + g) * 16 + r % 16]);
      v[h][ColOff(i)] = static_cast<float>(static_cast<int>(Nib(word, i)) - z) * s;
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      uint2 packed;
      packed.x = PackBf16(v[h][0], v[h][1]);
      packed.y = PackBf16(v[h][2], v[h][3]);
      *reinterpret_cast<uint2*>(dst + (p.r0 + 8 * h) * w.k + p.kk) = packed;
    }
  }
}

__global__ void GatherToBf16Kernel(const float* x, int64_t xs, int64_t rows, int64_t k, const int32_t* perm,
                                   __nv_bfloat16* dst) {
  PdlPrologue();
  const int64_t total = rows * k;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = idx / k, c = idx % k;
    dst[idx] = __float2bfloat16_rn(x[r * xs + (perm != nullptr ? perm[c] : c)]);
  }
}

// W[r, k] in float32 and the input of x it multiplies, from the checkpoint's layout or from the tile layout.
struct SourceView {
  Int4Source w;
  __device__ float W(int64_t r, int64_t k) const {
    const int64_t g = w.g_idx != nullptr ? w.g_idx[k] : k / w.group;
    const int z = static_cast<int>(SourceZero(w, r, g)) + w.zero_offset;
    return static_cast<float>(static_cast<int>(SourceCode(w, r, k)) - z) *
           ScaleOf(w.scales, w.scales_dtype, g * w.m + r);
  }
  __device__ int64_t XCol(int64_t k) const { return k; }
  __device__ int64_t m() const { return w.m; }
  __device__ int64_t k() const { return w.k; }
};

struct TiledView {
  Int4Tiled w;
  __device__ float W(int64_t r, int64_t k) const {
    const int64_t rb = r / 16, h = (r % 16) / 8, g = k / w.group;
    const int64_t lane = (r % 8) * 4 + (k % 16) / 4, tile = (k % 64) / 16;
    const int64_t idx = ((rb * (w.k / 64) + k / 64) * 32 + lane) * 4 + tile;
    const int col = static_cast<int>(k % 4);
    const int nib = 2 * (((col & 1) << 1) | (col >> 1)) + static_cast<int>(h);  // ColOff's inverse, then the row
    const int z = static_cast<int>(Nib(w.zeros[(rb * w.groups + g) * 2 + h], static_cast<int>(r % 8))) + w.zero_offset;
    return static_cast<float>(static_cast<int>(Nib(w.weights[idx], nib)) - z) *
           ScaleOf(w.scales, w.scales_dtype, (rb * w.groups + g) * 16 + r % 16);
  }
  __device__ int64_t XCol(int64_t k) const { return w.perm != nullptr ? w.perm[k] : k; }
  __device__ int64_t m() const { return w.m; }
  __device__ int64_t k() const { return w.k; }
};

// One warp per output row, 8 tokens per block row; float32 throughout.
template <typename View>
__global__ void Int4GenericKernel(const float* x, int64_t xs, int64_t n, View v, const void* bias, int bias_dtype,
                                  float* out, int64_t os) {
  PdlPrologue();
  const int lane = static_cast<int>(threadIdx.x & 31);
  const int64_t r = blockIdx.x * 8 + (threadIdx.x >> 5), t0 = blockIdx.y * 8;
  if (r >= v.m()) return;
  float acc[8] = {};
  for (int64_t k = lane; k < v.k(); k += 32) {
    const float wv = v.W(r, k);
    const int64_t c = v.XCol(k);
#pragma unroll
    for (int tt = 0; tt < 8; ++tt) {
      if (t0 + tt < n) acc[tt] = fmaf(wv, x[(t0 + tt) * xs + c], acc[tt]);
    }
  }
#pragma unroll
  for (int tt = 0; tt < 8; ++tt) {
    float sum = acc[tt];
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (lane == 0 && t0 + tt < n) out[(t0 + tt) * os + r] = sum + BiasAt(bias, bias_dtype, r);
  }
}

template <typename View>
int LaunchGeneric(const float* x, int64_t xs, int64_t n, const View& v, int64_t m, const void* bias, int bias_dtype,
                  float* out, int64_t os, Stream s) {
  if (n == 0 || m == 0) return 0;
  const dim3 grid(static_cast<unsigned>((m + 7) / 8), static_cast<unsigned>((n + 7) / 8));
  LaunchKernel(Int4GenericKernel<View>, grid, 256, 0, S(s), x, xs, n, v, bias, bias_dtype, out, os);
  return Done();
}

unsigned GridFor(int64_t n) {
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>((n + 255) / 256, 1 << 16)));
}

// Blocks of one kernel instantiation that fit on a multiprocessor with its shared memory: the attribute for more than
// 48 KiB is set on each device (kernel_attr.h), the occupancy query, which costs more than a launch, runs once (the
// GPUs of one process are the same model). 0: the attribute was refused.
template <typename TS, bool kChunkGroup, int NT, typename XT>
int MmaBlocksPerSm() {
  const auto kernel = Int4MmaKernel<TS, kChunkGroup, NT, XT>;
  constexpr int kBytes = MmaStage<NT>::kSmemBytes;
  if (EnsureDynamicSmem(reinterpret_cast<const void*>(kernel), kBytes) != 0) return 0;
  static const int per_sm = [&] {
    int blocks = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, kMmaWarps * 32, kBytes) != cudaSuccess) {
      cudaGetLastError();
      return 0;
    }
    return blocks;
  }();
  return per_sm;
}

// The blocks of one token group: one wave of what fits on the GPU, shared by the token groups, each with at least
// two steps of chunks and 1/16 of a row group at one token tile (1/8 at two, 1/4 at four or eight: a row group is
// summed from at most about 17, 9 or 5 blocks' partial sums, so that the last block's sum stays short), and as
// many as the scratch and counters hold (1 block a row group without scratch: no partial sums).
int64_t MmaBlocks(int per_sm, int sm_count, int nt, int64_t rgs, int64_t chunks, int64_t tgs, int64_t slot_floats,
                  int64_t scratch_floats) {
  const int64_t units = rgs * chunks;
  if (scratch_floats <= 0 || tgs * rgs > kInt4MaxCounters) return rgs;
  const int64_t wave = static_cast<int64_t>(std::max(per_sm, 1)) * std::max(sm_count, 1);
  int64_t blocks = std::max<int64_t>(1, wave / tgs);
  blocks = std::min(blocks, scratch_floats / (tgs * 2 * slot_floats));
  const int64_t parts = std::max(4, 16 / nt);
  blocks = std::min(blocks, units / std::max<int64_t>(2 * kSteps, (chunks + parts - 1) / parts));
  return std::max<int64_t>(blocks, 1);
}

template <typename TS, bool kChunkGroup, typename XT>
int LaunchMma(const XT* x, int64_t xs, int64_t n, const MmaParts& parts, float* scratch, int64_t scratch_floats,
              int* counters, int sm_count, Stream s) {
  const auto go = [&](auto nt) {
    constexpr int NT = decltype(nt)::value;
    constexpr int64_t kTokens = 8 * NT;
    const int per_sm = MmaBlocksPerSm<TS, kChunkGroup, NT, XT>();
    if (per_sm == 0) return static_cast<int>(cudaErrorInvalidConfiguration);
    const int64_t tgs = (n + kTokens - 1) / kTokens;
    const int64_t blocks = MmaBlocks(per_sm, sm_count, NT, parts.rg_begin[parts.count], parts.chunks, tgs,
                                     kMmaRows * kTokens, counters == nullptr ? 0 : scratch_floats);
    const dim3 grid(static_cast<unsigned>(tgs), static_cast<unsigned>(blocks));
    LaunchKernel(Int4MmaKernel<TS, kChunkGroup, NT, XT>, grid, kMmaWarps * 32, MmaStage<NT>::kSmemBytes, S(s), x, xs, n,
                 parts, scratch, counters, static_cast<int>(blocks));
    return Done();
  };
  if (n <= 8) return go(std::integral_constant<int, 1>{});
  if (n <= 16) return go(std::integral_constant<int, 2>{});
  if (n <= 32) return go(std::integral_constant<int, 4>{});
  return go(std::integral_constant<int, 8>{});
}

template <typename XT>
int LaunchMmaFor(const XT* x, int64_t xs, int64_t n, const MmaParts& parts, int scales_dtype, bool chunk_group,
                 float* scratch, int64_t scratch_floats, int* counters, int sm_count, Stream s) {
  if (scales_dtype == kF16) {
    return chunk_group ? LaunchMma<__half, true>(x, xs, n, parts, scratch, scratch_floats, counters, sm_count, s)
                       : LaunchMma<__half, false>(x, xs, n, parts, scratch, scratch_floats, counters, sm_count, s);
  }
  if (scales_dtype == kF32) {
    return chunk_group ? LaunchMma<float, true>(x, xs, n, parts, scratch, scratch_floats, counters, sm_count, s)
                       : LaunchMma<float, false>(x, xs, n, parts, scratch, scratch_floats, counters, sm_count, s);
  }
  return static_cast<int>(cudaErrorInvalidValue);
}

}  // namespace

bool Int4TileFits(int64_t m, int64_t k, int64_t groups, int64_t group) {
  return m > 0 && k > 0 && m % 16 == 0 && k % 64 == 0 && group > 0 && (group % 16 == 0 || groups == 1) &&
         groups == (k + group - 1) / group;
}

int LaunchRepackInt4(const Int4Source& src, const int32_t* perm, uint32_t* dst_weights, void* dst_scales,
                     uint32_t* dst_zeros, Stream s) {
  if (!Int4TileFits(src.m, src.k, src.groups, src.group) || (src.scales_dtype != kF16 && src.scales_dtype != kF32)) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  const int64_t words = src.m * src.k / 8;
  LaunchKernel(RepackWeightsKernel, GridFor(words), 256, 0, S(s), src, perm, dst_weights, words);
  if (const int e = Done(); e != 0) return e;
  const int64_t scales = src.m * src.groups;
  LaunchKernel(RepackScalesKernel, GridFor(scales), 256, 0, S(s), src, dst_scales, scales);
  if (const int e = Done(); e != 0) return e;
  const int64_t zeros = src.m / 8 * src.groups;
  LaunchKernel(RepackZerosKernel, GridFor(zeros), 256, 0, S(s), src, dst_zeros, zeros);
  return Done();
}

int LaunchInt4MmaParts(const void* x, bool x_bf16, int64_t xs, int64_t n, const Int4MmaPart* parts, int count,
                       float* scratch, int64_t scratch_floats, int* counters, int sm_count, Stream s) {
  if (n == 0) return 0;
  if (count < 1 || count > kInt4MaxParts || (x_bf16 ? xs % 8 != 0 : xs % 4 != 0) ||
      reinterpret_cast<uintptr_t>(x) % 16 != 0) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  const Int4Tiled& w0 = parts[0].w;
  MmaParts p{};
  p.count = count;
  p.perm = x_bf16 ? nullptr : w0.perm;  // bf16 x is in tiled order already
  p.chunks = static_cast<int>(w0.k / 64);
  p.groups = static_cast<int>(w0.groups);
  p.group = static_cast<int>(w0.group);
  p.zero_offset = w0.zero_offset;
  int64_t rgs = 0, weights = 0;
  for (int i = 0; i < count; ++i) {
    const Int4Tiled& w = parts[i].w;
    weights += w.k * w.m;
    if (!Int4TileFits(w.m, w.k, w.groups, w.group) || w.k != w0.k || w.group != w0.group ||
        w.scales_dtype != w0.scales_dtype || w.zero_offset != w0.zero_offset || w.perm != w0.perm ||
        w.k / 64 > (1 << 30) || w.m / 16 > (1 << 30)) {
      return static_cast<int>(cudaErrorInvalidValue);
    }
    p.weights[i] = w.weights;
    p.scales[i] = w.scales;
    p.zeros[i] = w.zeros;
    p.bias[i] = parts[i].bias;
    p.bias_dtype[i] = parts[i].bias_dtype;
    p.out[i] = parts[i].out;
    p.os[i] = parts[i].os;
    p.rbs[i] = static_cast<int>(w.m / 16);
    p.rg_begin[i] = static_cast<int>(rgs);
    rgs += (w.m / 16 + kMmaWarps - 1) / kMmaWarps;
  }
  if (rgs * p.chunks > (int64_t{1} << 40)) return static_cast<int>(cudaErrorInvalidValue);
  p.rg_begin[count] = static_cast<int>(rgs);
  if (scratch == nullptr) scratch_floats = 0;
  const bool chunk_group = w0.group % 64 == 0 || w0.groups == 1;
  if (!x_bf16 && n <= kInt4GemvTokens && weights <= kInt4GemvMaxWeights) {
    const float* xf = static_cast<const float*>(x);
    if (w0.scales_dtype == kF16) {
      return chunk_group ? LaunchGemv<__half, true>(xf, xs, n, p, s) : LaunchGemv<__half, false>(xf, xs, n, p, s);
    }
    if (w0.scales_dtype == kF32) {
      return chunk_group ? LaunchGemv<float, true>(xf, xs, n, p, s) : LaunchGemv<float, false>(xf, xs, n, p, s);
    }
    return static_cast<int>(cudaErrorInvalidValue);
  }
  if (x_bf16) {
    return LaunchMmaFor(static_cast<const __nv_bfloat16*>(x), xs, n, p, w0.scales_dtype, chunk_group, scratch,
                        scratch_floats, counters, sm_count, s);
  }
  return LaunchMmaFor(static_cast<const float*>(x), xs, n, p, w0.scales_dtype, chunk_group, scratch, scratch_floats,
                      counters, sm_count, s);
}

int LaunchInt4Mma(const void* x, bool x_bf16, int64_t xs, int64_t n, const Int4Tiled& w, const void* bias,
                  int bias_dtype, float* out, int64_t os, float* scratch, int64_t scratch_floats, int* counters,
                  int sm_count, Stream s) {
  const Int4MmaPart part{w, bias, bias_dtype, out, os};
  return LaunchInt4MmaParts(x, x_bf16, xs, n, &part, 1, scratch, scratch_floats, counters, sm_count, s);
}

int LaunchDequantInt4(const Int4Tiled& w, void* dst, Stream s) {
  const int64_t words = w.m * w.k / 8;
  if (words == 0) return 0;
  auto* d = static_cast<__nv_bfloat16*>(dst);
  if (w.scales_dtype == kF16) {
    LaunchKernel(DequantInt4Kernel<__half>, GridFor(words), 256, 0, S(s), w, d, words);
  } else if (w.scales_dtype == kF32) {
    LaunchKernel(DequantInt4Kernel<float>, GridFor(words), 256, 0, S(s), w, d, words);
  } else {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  return Done();
}

int LaunchGatherToBf16(const float* x, int64_t xs, int64_t rows, int64_t k, const int32_t* perm, void* dst, Stream s) {
  if (rows * k == 0) return 0;
  LaunchKernel(GatherToBf16Kernel, GridFor(rows * k), 256, 0, S(s), x, xs, rows, k, perm,
               static_cast<__nv_bfloat16*>(dst));
  return Done();
}

int LaunchInt4Generic(const float* x, int64_t xs, int64_t n, const Int4Source& w, const void* bias, int bias_dtype,
                      float* out, int64_t os, Stream s) {
  return LaunchGeneric(x, xs, n, SourceView{w}, w.m, bias, bias_dtype, out, os, s);
}

int LaunchInt4GenericTiled(const float* x, int64_t xs, int64_t n, const Int4Tiled& w, const void* bias, int bias_dtype,
                           float* out, int64_t os, Stream s) {
  if (!Int4TileFits(w.m, w.k, w.groups, w.group)) return static_cast<int>(cudaErrorInvalidValue);
  return LaunchGeneric(x, xs, n, TiledView{w}, w.m, bias, bias_dtype, out, os, s);
}

}  // namespace fathom::cuda
