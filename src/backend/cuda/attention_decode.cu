// The split-K decode attention kernels (attention.h): per (token, head) chunks, the GQA-packed kernel, the merge of
// the chunks' partial states (MLA's decode kernel, mla.cu, uses it too), and the choice and launch of the split
// kernels (the tensor-core one: attention_mma.cu).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "backend/cuda/attention.h"
#include "backend/cuda/attention_common.cuh"
#include "backend/cuda/dtype.cuh"
#include "backend/cuda/kv_cache.cuh"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/memory.cuh"
#include "backend/cuda/reduce.cuh"

namespace fathom::cuda {

namespace {

// Flash-decoding: the causal context of each (token, head) is cut into chunks of kChunk keys, one block per chunk;
// each block writes its partial softmax state (max, sum, unnormalized V sum) and a second kernel merges them.
constexpr int kChunk = 64;
template <typename T>
__global__ void SplitAttentionKernel(AttentionArgs a, int64_t chunks, float* part_m, float* part_l, float* part_acc) {
  PdlPrologue();
  __shared__ float scores[kChunk];
  extern __shared__ float q[];  // [k_dim]
  const int64_t th = blockIdx.x, c = blockIdx.y;
  const int64_t t = th / a.heads, h = th % a.heads, g = h / (a.heads / a.kv_heads);
  const int64_t slot_idx = th * chunks + c;
  const int64_t ctx = a.positions[t] + 1, j0 = c * kChunk;
  if (j0 >= ctx) {
    if (threadIdx.x == 0) {
      part_m[slot_idx] = -INFINITY;
      part_l[slot_idx] = 0.0f;
    }
    return;
  }
  const int64_t j1 = min(ctx, j0 + kChunk);
  int64_t seq = 0;
  while (seq + 1 < a.num_seqs && a.query_start[seq + 1] <= t) ++seq;
  const int32_t* table = a.block_tables + a.block_table_start[seq];
  for (int64_t i = threadIdx.x; i < a.k_dim; i += blockDim.x) q[i] = a.q[t * a.q_s0 + h * a.q_s1 + i];
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  for (int64_t j = j0 + warp; j < j1; j += warps) {
    const int64_t blk = table[j / a.block_size], off = j % a.block_size;
    const int64_t base = blk * a.k.s0 + off * a.k.s1 + g * a.k.s2;
    float d = 0.0f;
    for (int64_t i = lane; i < a.k_dim; i += 32) d += q[i] * LoadCache<T>(a.k, base, blk, off, g, i);
    d = WarpSum(d);
    if (lane == 0) scores[j - j0] = d * a.scale;
  }
  __syncthreads();
  float mx = -INFINITY;
  for (int64_t j = 0; j < j1 - j0; ++j) mx = fmaxf(mx, scores[j]);
  float l = 0.0f;
  for (int64_t j = 0; j < j1 - j0; ++j) l += expf(scores[j] - mx);
  __syncthreads();
  for (int64_t j = threadIdx.x; j < j1 - j0; j += blockDim.x) scores[j] = expf(scores[j] - mx);
  __syncthreads();
  for (int64_t i = threadIdx.x; i < a.v_dim; i += blockDim.x) {
    float acc = 0.0f;
    for (int64_t j = j0; j < j1; ++j) {
      const int64_t blk = table[j / a.block_size], off = j % a.block_size;
      const int64_t base = blk * a.v.s0 + off * a.v.s1 + g * a.v.s2;
      acc += scores[j - j0] * LoadCache<T>(a.v, base, blk, off, g, i);
    }
    part_acc[slot_idx * a.v_dim + i] = acc;
  }
  if (threadIdx.x == 0) {
    part_m[slot_idx] = mx;
    part_l[slot_idx] = l;
  }
}

// One block per (token, head): the chunks' weights exp(m_c - m) go to shared memory once, then each thread sums its
// output dims over the chunks (independent loads, unrolled). Empty chunks (m_c = -inf) weigh 0 and are skipped, so
// their unwritten partial sums are never read.
__global__ void MergeAttentionKernel(AttentionArgs a, int64_t chunks, const float* part_m, const float* part_l,
                                     const float* part_acc) {
  PdlPrologue();
  extern __shared__ float weight[];  // [chunks]
  const int64_t th = blockIdx.x, t = th / a.heads, h = th % a.heads;
  const float* pm = part_m + th * chunks;
  const float* pl = part_l + th * chunks;
  float m = -INFINITY;
  for (int64_t c = threadIdx.x; c < chunks; c += blockDim.x) m = fmaxf(m, pm[c]);
  m = BlockMax(m);
  float l = 0.0f;
  for (int64_t c = threadIdx.x; c < chunks; c += blockDim.x) {
    const float w = pm[c] == -INFINITY ? 0.0f : expf(pm[c] - m);
    weight[c] = w;
    l += pl[c] * w;
  }
  l = BlockSum(l);  // also makes `weight` visible to every thread
  const float inv = 1.0f / l;
  const float* acc_base = part_acc + th * chunks * a.v_dim;
  // Loads of 8 chunks in flight before they are summed (chunks past a token's context have weight 0 and partial
  // sums that were never written: selected away, never multiplied).
  for (int64_t i = threadIdx.x; i < a.v_dim; i += blockDim.x) {
    float acc = 0.0f;
    int64_t c = 0;
    for (; c + 8 <= chunks; c += 8) {
      float v[8];
#pragma unroll
      for (int u = 0; u < 8; ++u) v[u] = acc_base[(c + u) * a.v_dim + i];
#pragma unroll
      for (int u = 0; u < 8; ++u) acc += weight[c + u] != 0.0f ? v[u] * weight[c + u] : 0.0f;
    }
    for (; c < chunks; ++c) {
      const float w = weight[c];
      if (w != 0.0f) acc += acc_base[c * a.v_dim + i] * w;
    }
    a.out[t * a.o_s0 + h * a.o_s1 + i] = acc * inv;
  }
}

// GQA-packed flash-decoding. A block of kAttnWarps warps takes one (token, KV head, chunk of keys) and serves all
// query heads of that KV head, so each K/V row is read once per group. Lane l owns dims [l * kPer, (l + 1) * kPer)
// of every head; each warp walks its keys kKeysPerStep at a time (all loads issued before use) with an online
// softmax per head, then the warps' states are merged through shared memory. With one chunk the block writes the
// normalized output; otherwise it writes the chunk's partial state for MergeAttentionKernel.
// Measured and dropped on the H200: one thread per key for the scores (no shuffles) and P.V over dims, 1.4-1.5x
// slower at batch 1 and 64 (its per-thread K rows make uncoalesced loads); prefetching the next step's K/V into
// registers, 1.25x slower at batch 64 and 256 (fewer blocks fit an SM).
template <typename T, int kD>
__global__ void __launch_bounds__(kAttnWarps * 32)
    GqaAttentionKernel(AttentionArgs a, int64_t chunk, int64_t chunks, float* part_m, float* part_l, float* part_acc) {
  PdlPrologue();
  constexpr int kPer = kD / 32;
  __shared__ float sm_m[kAttnWarps][kMaxGroup], sm_l[kAttnWarps][kMaxGroup];
  __shared__ float sm_acc[kAttnWarps][kMaxGroup][kD];
  GroupBlock b;
  if (!StartGroupBlock(a, chunk, chunks, part_m, part_l, &b)) return;
  const int64_t t = b.t, kvh = b.kvh, c = b.c, j0 = b.j0, j1 = b.j1;
  const int group = b.group;
  const int32_t* table = b.table;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float q[kMaxGroup][kPer], m[kMaxGroup], l[kMaxGroup], acc[kMaxGroup][kPer];
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.0f;
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      acc[g][i] = 0.0f;
      q[g][i] = g < group ? a.q[t * a.q_s0 + (kvh * group + g) * a.q_s1 + lane * kPer + i] : 0.0f;
    }
  }
  const T* kc = static_cast<const T*>(a.k.data) + kvh * a.k.s2 + lane * kPer;
  const T* vc = static_cast<const T*>(a.v.data) + kvh * a.v.s2 + lane * kPer;
  // A step's keys share one KV block when the block size is a multiple of the step (steps start at multiples of
  // kKeysPerStep): one block-table read per step then.
  const bool one_block = a.block_size % kKeysPerStep == 0;
  auto load_step = [&](int64_t jb, float(&kr)[kKeysPerStep][kPer], float(&vr)[kKeysPerStep][kPer]) {
    const int64_t first_blk = table[jb / a.block_size];
#pragma unroll
    for (int u = 0; u < kKeysPerStep; ++u) {
      const int64_t j = jb + u;
      if (j < j1) {
        const int64_t blk = one_block ? first_blk : table[j / a.block_size], off = j % a.block_size;
        LoadVec<T, kPer>(kc + blk * a.k.s0 + off * a.k.s1, kr[u]);
        LoadVec<T, kPer>(vc + blk * a.v.s0 + off * a.v.s1, vr[u]);
        if constexpr (kIsF8<T>) {  // a lane's kPer values share one scale (GqaFits)
          const float ks = CacheScale(a.k, blk, off, kvh, lane * kPer),
                      vs = CacheScale(a.v, blk, off, kvh, lane * kPer);
#pragma unroll
          for (int i = 0; i < kPer; ++i) {
            kr[u][i] *= ks;
            vr[u][i] *= vs;
          }
        }
      } else {
#pragma unroll
        for (int i = 0; i < kPer; ++i) kr[u][i] = vr[u][i] = 0.0f;
      }
    }
  };
  for (int64_t jb = j0 + warp * kKeysPerStep; jb < j1; jb += kAttnWarps * kKeysPerStep) {
    float kr[kKeysPerStep][kPer], vr[kKeysPerStep][kPer];
    load_step(jb, kr, vr);
#pragma unroll
    for (int g = 0; g < kMaxGroup; ++g) {
      if (g < group) {
        float sc[kKeysPerStep], smax = -INFINITY;
#pragma unroll
        for (int u = 0; u < kKeysPerStep; ++u) {
          float d = 0.0f;
#pragma unroll
          for (int i = 0; i < kPer; ++i) d += q[g][i] * kr[u][i];
          d = WarpSum(d) * a.scale;
          sc[u] = jb + u < j1 ? d : -INFINITY;
          smax = fmaxf(smax, sc[u]);
        }
        const float mn = fmaxf(m[g], smax);
        const float corr = expf(m[g] - mn);
        float psum = 0.0f;
#pragma unroll
        for (int u = 0; u < kKeysPerStep; ++u) {
          sc[u] = expf(sc[u] - mn);
          psum += sc[u];
        }
        l[g] = l[g] * corr + psum;
#pragma unroll
        for (int i = 0; i < kPer; ++i) {
          float v = acc[g][i] * corr;
#pragma unroll
          for (int u = 0; u < kKeysPerStep; ++u) v += sc[u] * vr[u][i];
          acc[g][i] = v;
        }
        m[g] = mn;
      }
    }
  }
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) {
    if (g < group) {
      if (lane == 0) {
        sm_m[warp][g] = m[g];
        sm_l[warp][g] = l[g];
      }
#pragma unroll
      for (int i = 0; i < kPer; ++i) sm_acc[warp][g][lane * kPer + i] = acc[g][i];
    }
  }
  __syncthreads();
  FinishGroupChunk<kAttnWarps, false>(a, t, kvh, group, c, chunks, kD, sm_m, sm_l, &sm_acc[0][0][0], part_m, part_l,
                                      part_acc);
}

bool GqaFits(const AttentionArgs& a) {
  if (a.k_dim != a.v_dim || (a.k_dim != 64 && a.k_dim != 128)) return false;
  if (a.kv_heads <= 0 || a.heads % a.kv_heads != 0 || a.heads / a.kv_heads > kMaxGroup) return false;
  if (a.k.dtype != a.v.dtype) return false;
  if (a.k.dtype != kF32 && a.k.dtype != kF16 && a.k.dtype != kBF16 && a.k.dtype != kF8) return false;
  // Each lane reads k_dim / 32 consecutive values of a K or V row in one vector load (f8: under one scale).
  const int64_t per = a.k_dim / 32;
  const int64_t bytes = a.k.dtype == kF32 ? 4 : a.k.dtype == kF8 ? 1 : 2;
  if (a.k.dtype == kF8 && (!CacheScalesFit(a.k, a.k_dim) || !CacheScalesFit(a.v, a.v_dim) || a.k.group % per != 0 ||
                           a.v.group % per != 0)) {
    return false;
  }
  for (const CacheView* c : {&a.k, &a.v}) {
    if (c->s0 % per != 0 || c->s1 % per != 0 || c->s2 % per != 0) return false;
    if (reinterpret_cast<uintptr_t>(c->data) % static_cast<uintptr_t>(per * bytes) != 0) return false;
  }
  return true;
}

template <typename T>
void LaunchGqa(const AttentionArgs& a, int64_t chunk, int64_t chunks, float* pm, float* pl, float* pa, cudaStream_t s) {
  LaunchGroup(GqaAttentionKernel<T, 64>, GqaAttentionKernel<T, 128>, kAttnWarps, a, chunk, chunks, pm, pl, pa, s);
}

}  // namespace

namespace {

int64_t Chunks(const AttentionArgs& a, int64_t chunk) {
  return (std::max<int64_t>(a.max_seq_len, 1) + chunk - 1) / chunk;
}

}  // namespace

bool SplitAttentionFits(const AttentionArgs& a, SplitAttentionKind kind) {
  switch (kind) {
    case SplitAttentionKind::kMma:
      return MmaAttentionFits(a);
    case SplitAttentionKind::kGqa:
      return GqaFits(a);
    case SplitAttentionKind::kPerHead:
      return true;
  }
  return false;
}

namespace {

int64_t SplitChunk(const AttentionArgs& a, SplitAttentionKind kind, int sm_count) {
  if (kind == SplitAttentionKind::kMma) return MmaAttentionChunk(a, sm_count);
  return kind == SplitAttentionKind::kGqa ? GroupChunk(a, 2 * kAttnWarps * kKeysPerStep) : kChunk;
}

}  // namespace

SplitAttentionKind ChooseSplitAttention(const AttentionArgs& a, const SplitAttentionKernels& allowed) {
  if (allowed.mma && MmaAttentionFits(a)) return SplitAttentionKind::kMma;
  if (allowed.gqa && GqaFits(a)) return SplitAttentionKind::kGqa;
  return SplitAttentionKind::kPerHead;
}

int64_t SplitAttentionWorkspaceBytes(const AttentionArgs& a, SplitAttentionKind kind, int sm_count) {
  const int64_t chunks = Chunks(a, SplitChunk(a, kind, sm_count));
  if (kind != SplitAttentionKind::kPerHead && chunks == 1) return 0;
  return a.n * a.heads * chunks * (2 + a.v_dim) * static_cast<int64_t>(sizeof(float));
}

int LaunchSplitAttention(const AttentionArgs& a, SplitAttentionKind kind, int sm_count, void* workspace, Stream s) {
  if (a.n == 0) return 0;
  if (!SplitAttentionFits(a, kind)) return static_cast<int>(cudaErrorInvalidValue);
  const bool gqa = kind != SplitAttentionKind::kPerHead;
  const int64_t chunk = SplitChunk(a, kind, sm_count);
  const int64_t chunks = Chunks(a, chunk);
  float* part_m = static_cast<float*>(workspace);
  float* part_l = part_m + a.n * a.heads * chunks;
  float* part_acc = part_l + a.n * a.heads * chunks;
  if (gqa) {
    if (chunks > 1 && workspace == nullptr) return static_cast<int>(cudaErrorInvalidValue);
    if (kind == SplitAttentionKind::kMma) {
      const int err = LaunchMmaAttention(a, chunk, chunks, part_m, part_l, part_acc, S(s));
      if (err != 0) return err;
    } else if (a.k.dtype == kF32) {
      LaunchGqa<float>(a, chunk, chunks, part_m, part_l, part_acc, S(s));
    } else if (a.k.dtype == kF16) {
      LaunchGqa<__half>(a, chunk, chunks, part_m, part_l, part_acc, S(s));
    } else if (a.k.dtype == kF8) {
      LaunchGqa<__nv_fp8_e4m3>(a, chunk, chunks, part_m, part_l, part_acc, S(s));
    } else {
      LaunchGqa<__nv_bfloat16>(a, chunk, chunks, part_m, part_l, part_acc, S(s));
    }
    const int err = Done();
    if (err != 0 || chunks == 1) return err;
    return LaunchMergeAttention(a, chunks, part_m, part_l, part_acc, s);
  }
  if (a.k.dtype != a.v.dtype || !CacheScalesFit(a.k, a.k_dim) || !CacheScalesFit(a.v, a.v_dim)) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  const int err = DispatchFloatOrF8(a.k.dtype, [&](auto tag) {
    using T = decltype(tag);
    const size_t smem = static_cast<size_t>(a.k_dim) * sizeof(float);
    LaunchKernel(SplitAttentionKernel<T>, dim3(static_cast<unsigned>(a.n * a.heads), static_cast<unsigned>(chunks)),
                 128, smem, S(s), a, chunks, part_m, part_l, part_acc);
    return Done();
  });
  if (err != 0) return err;
  return LaunchMergeAttention(a, chunks, part_m, part_l, part_acc, s);
}

int LaunchMergeAttention(const AttentionArgs& a, int64_t chunks, const float* part_m, const float* part_l,
                         const float* part_acc, Stream s) {
  if (a.n == 0) return 0;
  LaunchKernel(MergeAttentionKernel, static_cast<unsigned>(a.n * a.heads), 128,
               static_cast<size_t>(chunks) * sizeof(float), S(s), a, chunks, part_m, part_l, part_acc);
  return Done();
}

}  // namespace fathom::cuda
