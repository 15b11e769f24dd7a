// The gather, scatter and copy kernels (gather.h).
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/dtype.cuh"
#include "backend/cuda/gather.h"
#include "backend/cuda/kv_cache.cuh"
#include "backend/cuda/launch.cuh"

namespace fathom::cuda {

namespace {

template <typename T>
__global__ void EmbeddingKernel(const int32_t* ids, const T* table, int64_t stride, int64_t hidden, float* out,
                                int64_t out_stride) {
  PdlPrologue();
  const int64_t t = blockIdx.x;
  const int64_t row = ids[t];
  for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x) out[t * out_stride + i] = Load(table, row * stride + i);
}

__global__ void GatherKernel(const float* x, int64_t xs, const int32_t* idx, int64_t d, float* out, int64_t os) {
  PdlPrologue();
  const int64_t r = blockIdx.x;
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) out[r * os + i] = x[idx[r] * xs + i];
}

// One warp per output row r: the warp finds the rows i with idx[i] == r in increasing order (32 at a time, by ballot),
// lists them in shared memory, then adds w[i] * x[i] to out[r] in that order: the CPU's accumulation order, with
// rows in parallel.
constexpr int kScatterWarps = 8, kScatterList = 64;
__global__ void __launch_bounds__(kScatterWarps * 32)
    ScatterAddKernel(const float* x, int64_t xs, const int32_t* idx, const float* w, int64_t m, int64_t d, float* out,
                     int64_t os, int64_t rows) {
  PdlPrologue();
  __shared__ int32_t list[kScatterWarps][kScatterList];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kScatterWarps + warp;
  if (r >= rows) return;
  int32_t* mine = list[warp];
  int cnt = 0;
  const auto apply = [&] {
    __syncwarp();
    for (int64_t c = lane; c < d; c += 32) {
      float acc = out[r * os + c];
      for (int q = 0; q < cnt; ++q) {
        const int64_t i = mine[q];
        acc += w[i] * x[i * xs + c];
      }
      out[r * os + c] = acc;
    }
    __syncwarp();
    cnt = 0;
  };
  for (int64_t base = 0; base < m; base += 32) {
    const int64_t i = base + lane;
    unsigned hits = __ballot_sync(0xffffffffu, i < m && idx[i] == r);
    while (hits != 0) {
      const int b = __ffs(hits) - 1;
      hits &= hits - 1;
      if (lane == 0) mine[cnt] = static_cast<int32_t>(base + b);
      if (++cnt == kScatterList) apply();
    }
  }
  if (cnt > 0) apply();
}

// Block per output row: the row's sequence and position from a scan of seq_lens (sequences are few), then its slot.
template <typename T>
__global__ void GatherContextKernel(CacheView cache, int64_t d, const int32_t* seq_lens, const int32_t* bts,
                                    const int32_t* bt, int64_t num_seqs, int64_t bs, float* out, int64_t os) {
  PdlPrologue();
  const int64_t row = blockIdx.x;
  int64_t s = 0, start = 0;
  while (s + 1 < num_seqs && start + seq_lens[s] <= row) start += seq_lens[s++];
  const int64_t j = row - start;
  const int64_t block = bt[bts[s] + j / bs], off = j % bs;
  const int64_t base = block * cache.s0 + off * cache.s1;
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) out[row * os + i] = LoadCache<T>(cache, base, block, off, 0, i);
}

__global__ void CopyKernel(const float* src, int64_t s0, int64_t s1, float* dst, int64_t d0s, int64_t d1s, int64_t d1,
                           int64_t inner) {
  PdlPrologue();
  const int64_t a = blockIdx.x / d1, b = blockIdx.x % d1;
  for (int64_t i = threadIdx.x; i < inner; i += blockDim.x) dst[a * d0s + b * d1s + i] = src[a * s0 + b * s1 + i];
}

}  // namespace

int LaunchEmbedding(const int32_t* ids, int64_t n, const void* table, int td, int64_t ts, int64_t hidden, float* out,
                    int64_t os, Stream s) {
  if (n == 0) return 0;
  return DispatchFloat(td, [&](auto tag) {
    using T = decltype(tag);
    LaunchKernel(EmbeddingKernel<T>, static_cast<unsigned>(n), 256, 0, S(s), ids, static_cast<const T*>(table), ts,
                 hidden, out, os);
    return Done();
  });
}

int LaunchGatherRows(const float* x, int64_t xs, const int32_t* idx, int64_t m, int64_t d, float* out, int64_t os,
                     Stream s) {
  if (m == 0) return 0;
  LaunchKernel(GatherKernel, static_cast<unsigned>(m), 256, 0, S(s), x, xs, idx, d, out, os);
  return Done();
}

int LaunchScatterAddRows(const float* x, int64_t xs, const int32_t* idx, const float* w, int64_t m, int64_t d,
                         float* out, int64_t os, int64_t rows, Stream s) {
  if (m == 0 || d == 0 || rows == 0) return 0;
  LaunchKernel(ScatterAddKernel, Blocks(rows, kScatterWarps), kScatterWarps * 32, 0, S(s), x, xs, idx, w, m, d, out, os,
               rows);
  return Done();
}

int LaunchGatherContext(CacheView cache, int64_t d, const int32_t* seq_lens, const int32_t* block_table_start,
                        const int32_t* block_tables, int64_t num_seqs, int64_t block_size, int64_t total_rows,
                        float* out, int64_t os, Stream s) {
  if (total_rows == 0) return 0;
  if (num_seqs <= 0 || !CacheScalesFit(cache, d)) return static_cast<int>(cudaErrorInvalidValue);
  return DispatchFloatOrF8(cache.dtype, [&](auto tag) {
    using T = decltype(tag);
    LaunchKernel(GatherContextKernel<T>, static_cast<unsigned>(total_rows), 128, 0, S(s), cache, d, seq_lens,
                 block_table_start, block_tables, num_seqs, block_size, out, os);
    return Done();
  });
}

int LaunchCopy(const float* src, int64_t s0, int64_t s1, float* dst, int64_t d0s, int64_t d1s, int64_t d0, int64_t d1,
               int64_t inner, Stream s) {
  if (d0 * d1 == 0) return 0;
  LaunchKernel(CopyKernel, static_cast<unsigned>(d0 * d1), 128, 0, S(s), src, s0, s1, dst, d0s, d1s, d1, inner);
  return Done();
}

}  // namespace fathom::cuda
