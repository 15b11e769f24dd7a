// The prefill-sized paged attention kernel (attention.h's LaunchPagedAttention).
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "backend/cuda/attention.h"
#include "backend/cuda/dtype.cuh"
#include "backend/cuda/kv_cache.cuh"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/reduce.cuh"

namespace fathom::cuda {

namespace {

// One block per (token, head). Scores for the whole causal context sit in dynamic shared memory.
template <typename T>
__global__ void PagedAttentionKernel(AttentionArgs a) {
  PdlPrologue();
  extern __shared__ float smem[];
  const int64_t t = blockIdx.x / a.heads, h = blockIdx.x % a.heads;
  const int64_t g = h / (a.heads / a.kv_heads);
  int64_t seq = 0;
  while (seq + 1 < a.num_seqs && a.query_start[seq + 1] <= t) ++seq;
  const int64_t ctx = a.positions[t] + 1;
  const int32_t* table = a.block_tables + a.block_table_start[seq];
  float* q = smem;                 // [k_dim]
  float* scores = smem + a.k_dim;  // [ctx]
  for (int64_t i = threadIdx.x; i < a.k_dim; i += blockDim.x) q[i] = a.q[t * a.q_s0 + h * a.q_s1 + i];
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  for (int64_t j = warp; j < ctx; j += warps) {
    const int64_t blk = table[j / a.block_size], off = j % a.block_size;
    const int64_t base = blk * a.k.s0 + off * a.k.s1 + g * a.k.s2;
    float d = 0.0f;
    for (int64_t i = lane; i < a.k_dim; i += 32) d += q[i] * LoadCache<T>(a.k, base, blk, off, g, i);
    d = WarpSum(d);
    if (lane == 0) scores[j] = d * a.scale;
  }
  __syncthreads();
  float mx = -INFINITY;
  for (int64_t j = threadIdx.x; j < ctx; j += blockDim.x) mx = fmaxf(mx, scores[j]);
  mx = BlockMax(mx);
  float sum = 0.0f;
  for (int64_t j = threadIdx.x; j < ctx; j += blockDim.x) {
    const float e = expf(scores[j] - mx);
    scores[j] = e;
    sum += e;
  }
  sum = BlockSum(sum);
  const float inv = 1.0f / sum;
  for (int64_t i = threadIdx.x; i < a.v_dim; i += blockDim.x) {
    float acc = 0.0f;
    for (int64_t j = 0; j < ctx; ++j) {
      const int64_t blk = table[j / a.block_size], off = j % a.block_size;
      const int64_t base = blk * a.v.s0 + off * a.v.s1 + g * a.v.s2;
      acc += scores[j] * LoadCache<T>(a.v, base, blk, off, g, i);
    }
    a.out[t * a.o_s0 + h * a.o_s1 + i] = acc * inv;
  }
}

}  // namespace

int LaunchPagedAttention(const AttentionArgs& a, Stream s) {
  if (a.n == 0) return 0;
  if (a.k.dtype != a.v.dtype || !CacheScalesFit(a.k, a.k_dim) || !CacheScalesFit(a.v, a.v_dim)) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  const size_t smem = static_cast<size_t>(a.k_dim + a.max_seq_len) * sizeof(float);
  return DispatchFloatOrF8(a.k.dtype, [&](auto tag) {
    using T = decltype(tag);
    if (smem > 48 * 1024) {
      const int e = EnsureDynamicSmem(reinterpret_cast<const void*>(PagedAttentionKernel<T>), static_cast<int>(smem));
      if (e != 0) return e;
    }
    LaunchKernel(PagedAttentionKernel<T>, static_cast<unsigned>(a.n * a.heads), 128, smem, S(s), a);
    return Done();
  });
}

}  // namespace fathom::cuda
