// Device code shared by the split-K attention kernels (attention_decode.cu, attention_mma.cu, mla.cu): the sequence of
// a token, where a block of a group kernel (GQA-packed or tensor-core: one block per token, KV head and chunk of keys)
// works, the merge of its warps' softmax states into the output or a partial state for the merge kernel, and the
// chunk sizes and launch of the group kernels. Include from .cu files only.
//
//   GroupBlock b;
//   if (!StartGroupBlock(a, chunk, chunks, part_m, part_l, &b)) return;   // a chunk past the token's context
//   ... each warp's online softmax over its keys, states to shared memory ...
//   FinishGroupChunk<kWarps, false>(a, b.t, b.kvh, b.group, b.c, chunks, kD, sm_m, sm_l, sm_acc, part_m, part_l, pa);
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "backend/cuda/attention.h"
#include "backend/cuda/launch.cuh"

namespace fathom::cuda {

// GQA-packed flash-decoding (GqaAttentionKernel): a block of kAttnWarps warps per (token, KV head, chunk of keys),
// each warp walking its keys kKeysPerStep at a time, for groups of up to kMaxGroup query heads. The group kernels
// size their chunks for about kAttnBlocksWanted blocks in all.
constexpr int kAttnWarps = 4, kKeysPerStep = 4, kMaxGroup = 8, kAttnBlocksWanted = 1024;
static_assert(kMaxGroup == 8, "FinishGroupChunk takes [warps][8] states");
// The tensor-core form (MmaAttentionKernel): kMmaWarps warps, each taking tiles of kMmaTile keys.
constexpr int kMmaWarps = 4, kMmaTile = 16;

// The sequence of token t: the last one starting at or before t.
__device__ __forceinline__ int64_t SeqOfToken(const AttentionArgs& a, int64_t t) {
  int64_t lo = 0, hi = a.num_seqs - 1;
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (a.query_start[mid] <= t) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

// Helpers of the group kernels (GqaAttentionKernel, MmaAttentionKernel): one block per (token, KV head, chunk).

// A chunk past the token's causal context: an empty partial state for each head of the group.
__device__ __forceinline__ void WriteEmptyGroupChunk(const AttentionArgs& a, int64_t t, int64_t kvh, int group,
                                                     int64_t c, int64_t chunks, float* part_m, float* part_l) {
  if (threadIdx.x < group) {
    const int64_t idx = (t * a.heads + kvh * group + threadIdx.x) * chunks + c;
    part_m[idx] = -INFINITY;
    part_l[idx] = 0.0f;
  }
}

// Where a group kernel's block works: token t, KV head kvh, chunk c of keys [j0, j1) of the token's sequence.
struct GroupBlock {
  int64_t t, kvh, c, j0, j1;
  int group;
  const int32_t* table;
};

// Fills `b` from the block index; false (with the empty partial state written) for a chunk past the context.
__device__ __forceinline__ bool StartGroupBlock(const AttentionArgs& a, int64_t chunk, int64_t chunks, float* part_m,
                                                float* part_l, GroupBlock* b) {
  b->t = blockIdx.x / a.kv_heads;
  b->kvh = blockIdx.x % a.kv_heads;
  b->c = blockIdx.y;
  b->group = static_cast<int>(a.heads / a.kv_heads);
  const int64_t ctx = a.positions[b->t] + 1;
  b->j0 = b->c * chunk;
  if (b->j0 >= ctx) {
    WriteEmptyGroupChunk(a, b->t, b->kvh, b->group, b->c, chunks, part_m, part_l);
    return false;
  }
  b->j1 = min(ctx, b->j0 + chunk);
  b->table = a.block_tables + a.block_table_start[SeqOfToken(a, b->t)];
  return true;
}

// Combines the kWarps warps' softmax states of each head of the group (sm_m, sm_l [kWarps][8]; sm_acc
// [kWarps][8][kD] flat) and writes the normalized output (one chunk) or the chunk's partial state for
// MergeAttentionKernel. kBase2: the states' maxima are in log2 units (scores pre-scaled by log2 e).
template <int kWarps, bool kBase2>
__device__ void FinishGroupChunk(const AttentionArgs& a, int64_t t, int64_t kvh, int group, int64_t c, int64_t chunks,
                                 int kD, const float (*sm_m)[8], const float (*sm_l)[8], const float* sm_acc,
                                 float* part_m, float* part_l, float* part_acc) {
  for (int e = threadIdx.x; e < group * kD; e += blockDim.x) {
    const int g = e / kD, d = e % kD;
    float mx = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, sm_m[w][g]);
    float sum = 0.0f, val = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float mw = sm_m[w][g];
      if (mw != -INFINITY) {
        const float f = kBase2 ? exp2f(mw - mx) : expf(mw - mx);
        sum += sm_l[w][g] * f;
        val += sm_acc[(w * 8 + g) * kD + d] * f;
      }
    }
    const int64_t h = kvh * group + g;
    if (chunks == 1) {
      a.out[t * a.o_s0 + h * a.o_s1 + d] = val / sum;
    } else {
      const int64_t idx = (t * a.heads + h) * chunks + c;
      part_acc[idx * a.v_dim + d] = val;
      if (d == 0) {
        part_m[idx] = kBase2 ? mx * 0.6931471805599453f : mx;  // the merge kernel works in natural-log units
        part_l[idx] = sum;
      }
    }
  }
}

// Keys per block of a group kernel: enough blocks (n * kv_heads * chunks) to fill the GPU, in multiples of `step`,
// the keys its warps walk per pass.
inline int64_t GroupChunk(const AttentionArgs& a, int64_t step) {
  const int64_t base = std::max<int64_t>(a.n * a.kv_heads, 1);
  const int64_t want = std::max<int64_t>(kAttnBlocksWanted / base, 1);
  const int64_t chunk = (std::max<int64_t>(a.max_seq_len, 1) + want - 1) / want;
  return (chunk + step - 1) / step * step;
}

using GroupKernel = void (*)(AttentionArgs, int64_t, int64_t, float*, float*, float*);

// Launches a group kernel (its head-dim-64 or -128 instance) on the (token x KV head, chunk) grid.
inline void LaunchGroup(GroupKernel k64, GroupKernel k128, int warps, const AttentionArgs& a, int64_t chunk,
                        int64_t chunks, float* pm, float* pl, float* pa, cudaStream_t s) {
  const dim3 grid(static_cast<unsigned>(a.n * a.kv_heads), static_cast<unsigned>(chunks));
  LaunchKernel((a.k_dim == 64 ? k64 : k128), grid, warps * 32, 0, s, a, chunk, chunks, pm, pl, pa);
}

// The tensor-core kernel (attention_mma.cu): its conditions (16-bit caches with rows 16-byte aligned or f8 caches with
// a scale per row, head dim 64 or 128, groups of up to 8), its chunk size, and its launch (the partial states as
// GqaAttentionKernel's; non-zero: the cudaError_t of raising the shared-memory limit, and nothing launched).
bool MmaAttentionFits(const AttentionArgs& a);
// Keys per block, a multiple of kMmaWarps * kMmaTile, chosen for whole waves of sm_count multiprocessors.
int64_t MmaAttentionChunk(const AttentionArgs& a, int sm_count);
int LaunchMmaAttention(const AttentionArgs& a, int64_t chunk, int64_t chunks, float* pm, float* pl, float* pa,
                       cudaStream_t s);

}  // namespace fathom::cuda
