// DeepSeek-V3.2's sparse attention kernels (mla_sparse.h): the indexer's scores and top-k, and the per-token lists.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "backend/cuda/dtype.cuh"
#include "backend/cuda/kv_cache.cuh"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/mla_sparse.h"

namespace fathom::cuda {

namespace {

// The scores: a block takes one token and kScoreKeys of its keys, a thread one key. The token's q [heads, d] and
// weights sit in shared memory; a thread reads its key row kDChunk values at a time into registers and accumulates
// all heads' dot products (unrolled to kMaxIndexerHeads, so they stay in registers), then sums the ReLU'd products
// with the weights in head order, as the CPU does. On CUDA cores in float32.
constexpr int kScoreKeys = 128, kDChunk = 32;
constexpr int64_t kScoreBytes = 256ll << 20;

__device__ __forceinline__ int64_t SeqOf(const int32_t* query_start, int64_t num_seqs, int64_t t) {
  int64_t lo = 0, hi = num_seqs - 1;
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (query_start[mid] <= t) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

template <typename T>
__global__ void __launch_bounds__(kScoreKeys)
    IndexerScoreKernel(IndexerArgs a, int64_t t0, float* scores, int64_t ld, int tiles) {
  PdlPrologue();
  extern __shared__ __align__(16) float score_smem[];
  const int64_t r = blockIdx.x, t = t0 + r;
  const int64_t ctx = static_cast<int64_t>(a.positions[t]) + 1;
  const int64_t first = static_cast<int64_t>(blockIdx.y) * kScoreKeys * tiles;
  if (first >= ctx) return;
  const int heads = static_cast<int>(a.heads), d = static_cast<int>(a.d);
  float* sq = score_smem;      // [heads][d]
  float* sw = sq + heads * d;  // [heads]
  for (int i = threadIdx.x; i < heads * d; i += blockDim.x) sq[i] = a.q[t * a.q_s0 + (i / d) * a.q_s1 + i % d];
  for (int h = threadIdx.x; h < heads; h += blockDim.x) sw[h] = a.w[t * a.w_s0 + h];
  __syncthreads();
  const int32_t* table = a.block_tables + a.block_table_start[SeqOf(a.query_start, a.num_seqs, t)];
  // `tiles` tiles of keys a block, so that q's load is shared by that many (prefill's long grids).
  for (int tile = 0; tile < tiles; ++tile) {
    const int64_t j = first + static_cast<int64_t>(tile) * kScoreKeys + threadIdx.x;
    if (j >= ctx) return;
    const int32_t bs = static_cast<int32_t>(a.block_size), jj = static_cast<int32_t>(j);
    const int64_t blk = table[jj / bs], off = jj % bs;
    const int64_t base = blk * a.side.s0 + off * a.side.s1;
    float acc[kMaxIndexerHeads];
#pragma unroll
    for (int h = 0; h < kMaxIndexerHeads; ++h) acc[h] = 0.0f;
    for (int c = 0; c < d; c += kDChunk) {
      float k[kDChunk];
#pragma unroll
      for (int i = 0; i < kDChunk; ++i) k[i] = LoadCache<T>(a.side, base, blk, off, 0, c + i);
#pragma unroll
      for (int h = 0; h < kMaxIndexerHeads; ++h) {
        if (h < heads) {
          const float4* qh = reinterpret_cast<const float4*>(sq + h * d + c);
          float s = acc[h];
#pragma unroll
          for (int i = 0; i < kDChunk / 4; ++i) {
            const float4 qv = qh[i];
            s = fmaf(qv.x, k[4 * i], s);
            s = fmaf(qv.y, k[4 * i + 1], s);
            s = fmaf(qv.z, k[4 * i + 2], s);
            s = fmaf(qv.w, k[4 * i + 3], s);
          }
          acc[h] = s;
        }
      }
    }
    float sum = 0.0f;
#pragma unroll
    for (int h = 0; h < kMaxIndexerHeads; ++h) {
      if (h < heads) sum += sw[h] * (acc[h] < 0.0f ? 0.0f : acc[h]);  // ReLU keeping a NaN, as std::max does
    }
    scores[r * ld + j] = isnan(sum) ? -INFINITY : sum * a.scale;
  }
}

// The top-k of a token's scores: a radix select finds the k-th largest key (the scores as order-preserving 32-bit
// keys, 11 + 11 + 10 bits a pass, each pass a histogram of the keys that match the digits found so far), then an
// ordered pass keeps the keys above it and, of the keys equal to it, the lowest positions that complete k.
constexpr int kTopKThreads = 512, kTopKWarps = kTopKThreads / 32;

__device__ __forceinline__ uint32_t OrderKey(float f) {
  const uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) != 0 ? ~u : (u | 0x80000000u);
}

// Exclusive prefix sum of v over the block's threads in order; `part` shared [kTopKWarps].
__device__ __forceinline__ int BlockExclusiveSum(int v, int* part) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  int x = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int y = __shfl_up_sync(0xffffffffu, x, o);
    if (lane >= o) x += y;
  }
  if (lane == 31) part[warp] = x;
  __syncthreads();
  int off = 0;
  for (int w = 0; w < warp; ++w) off += part[w];
  __syncthreads();
  return off + x - v;
}

// Of the block's flags in thread order: how many are set before this thread's, and in all.
__device__ __forceinline__ void BlockFlagCount(bool flag, int* part, int* before, int* total) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const unsigned m = __ballot_sync(0xffffffffu, flag);
  if (lane == 0) part[warp] = __popc(m);
  __syncthreads();
  int off = 0, tot = 0;
  for (int w = 0; w < kTopKWarps; ++w) {
    off += w < warp ? part[w] : 0;
    tot += part[w];
  }
  __syncthreads();
  *before = off + __popc(m & ((1u << lane) - 1u));
  *total = tot;
}

__global__ void __launch_bounds__(kTopKThreads)
    TopKKernel(const float* scores, int64_t ld, const int32_t* positions, int64_t t0, int32_t* selected, int64_t topk) {
  PdlPrologue();
  __shared__ int hist[2048];
  __shared__ int part[kTopKWarps];
  __shared__ uint32_t found_prefix;
  __shared__ int found_remaining;
  const int64_t r = blockIdx.x, t = t0 + r;
  const int64_t ctx = static_cast<int64_t>(positions[t]) + 1;
  int32_t* out = selected + t * topk;
  const float* row = scores + r * ld;
  if (ctx <= topk) {
    for (int64_t j = threadIdx.x; j < topk; j += blockDim.x) out[j] = j < ctx ? static_cast<int32_t>(j) : -1;
    return;
  }
  uint32_t prefix = 0, mask = 0;
  int remaining = static_cast<int>(topk);
  constexpr int kShift[3] = {21, 10, 0}, kBits[3] = {11, 11, 10};
#pragma unroll
  for (int pass = 0; pass < 3; ++pass) {
    const int shift = kShift[pass], nbins = 1 << kBits[pass];
    const uint32_t dmask = static_cast<uint32_t>(nbins - 1);
    for (int i = threadIdx.x; i < nbins; i += blockDim.x) hist[i] = 0;
    __syncthreads();
    for (int64_t j = threadIdx.x; j < ctx; j += blockDim.x) {
      const uint32_t u = OrderKey(row[j]);
      if ((u & mask) == prefix) atomicAdd(&hist[(u >> shift) & dmask], 1);
    }
    __syncthreads();
    // Thread i holds `per` bins from the top down: the counts above its bins are the prefix sum of the threads before.
    const int per = nbins / kTopKThreads, top = nbins - 1 - static_cast<int>(threadIdx.x) * per;
    int local = 0;
    for (int b = 0; b < per; ++b) local += hist[top - b];
    int cum = BlockExclusiveSum(local, part);
    for (int b = 0; b < per; ++b) {
      const int c = hist[top - b];
      if (cum < remaining && remaining <= cum + c) {
        found_prefix = prefix | (static_cast<uint32_t>(top - b) << shift);
        found_remaining = remaining - cum;
      }
      cum += c;
    }
    __syncthreads();
    prefix = found_prefix;
    remaining = found_remaining;
    mask |= dmask << shift;
    __syncthreads();
  }
  // prefix is the k-th largest key; `remaining` of the keys equal to it are kept, the lowest positions first.
  int taken = 0, equal_seen = 0;
  for (int64_t base = 0; base < ctx; base += blockDim.x) {
    const int64_t j = base + threadIdx.x;
    const uint32_t u = j < ctx ? OrderKey(row[j]) : 0u;
    const bool gt = j < ctx && u > prefix, eq = j < ctx && u == prefix;
    int eq_before, eq_total, take_before, take_total;
    BlockFlagCount(eq, part, &eq_before, &eq_total);
    const bool take = gt || (eq && equal_seen + eq_before < remaining);
    BlockFlagCount(take, part, &take_before, &take_total);
    if (take) out[taken + take_before] = static_cast<int32_t>(j);
    taken += take_total;
    equal_seen += eq_total;
  }
}

// One block a token: its selected positions as cache slots, and its list's metadata.
__global__ void SparseListsKernel(SparseLists out, const int32_t* selected, int64_t n, int64_t topk,
                                  const int32_t* positions, const int32_t* query_start,
                                  const int32_t* block_table_start, const int32_t* block_tables, int64_t num_seqs,
                                  int64_t block_size) {
  PdlPrologue();
  __shared__ int count;
  const int64_t t = blockIdx.x;
  if (threadIdx.x == 0) count = 0;
  __syncthreads();
  const int32_t* table = block_tables + block_table_start[SeqOf(query_start, num_seqs, t)];
  const int64_t ctx = static_cast<int64_t>(positions[t]) + 1;
  const int32_t bs = static_cast<int32_t>(block_size);
  int mine = 0;
  for (int64_t i = threadIdx.x; i < topk; i += blockDim.x) {
    const int32_t p = selected[t * topk + i];
    const bool valid = p >= 0 && p < ctx;  // the list ends at the first -1 (Select's rows)
    out.block_tables[t * topk + i] = valid ? table[p / bs] * bs + p % bs : 0;
    mine += valid ? 1 : 0;
  }
  atomicAdd(&count, mine);
  __syncthreads();
  if (threadIdx.x == 0) {
    out.block_table_start[t] = static_cast<int32_t>(t * topk);
    out.query_start[t] = static_cast<int32_t>(t);
    out.seq_lens[t] = count;
    out.positions[t] = count - 1;
    if (t == n - 1) {
      out.block_table_start[n] = static_cast<int32_t>(n * topk);
      out.query_start[n] = static_cast<int32_t>(n);
    }
  }
}

int64_t ScoreGroup(const IndexerArgs& a) {
  const int64_t ld = std::max<int64_t>(a.max_seq_len, 1);
  return std::clamp<int64_t>(kScoreBytes / (4 * ld), 1, std::max<int64_t>(a.n, 1));
}

}  // namespace

bool IndexerShapeFits(int64_t heads, int64_t d) {
  return heads >= 1 && heads <= kMaxIndexerHeads && d >= kDChunk && d % kDChunk == 0 &&
         (heads * d + heads) * 4 <= 48 * 1024;
}

bool IndexerFits(const IndexerArgs& a) {
  return IndexerShapeFits(a.heads, a.d) && a.q_s1 % 4 == 0 && a.q_s0 % 4 == 0 && CacheScalesFit(a.side, a.d);
}

int64_t IndexerWorkspaceBytes(const IndexerArgs& a) {
  return ScoreGroup(a) * std::max<int64_t>(a.max_seq_len, 1) * 4;
}

int LaunchIndexerSelect(const IndexerArgs& a, int32_t* selected, int64_t topk, void* workspace, int64_t workspace_bytes,
                        Stream s) {
  if (a.n == 0) return 0;
  if (!IndexerFits(a) || topk <= 0 || topk > (1ll << 30) || a.max_seq_len <= 0 ||
      workspace_bytes < IndexerWorkspaceBytes(a) || reinterpret_cast<uintptr_t>(a.q) % 16 != 0) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  const int64_t ld = a.max_seq_len, group = ScoreGroup(a);
  float* scores = static_cast<float*>(workspace);
  const size_t smem = static_cast<size_t>((a.heads * a.d + a.heads) * 4);
  const int64_t key_tiles = (a.max_seq_len + kScoreKeys - 1) / kScoreKeys;
  for (int64_t t0 = 0; t0 < a.n; t0 += group) {
    const unsigned g = static_cast<unsigned>(std::min(group, a.n - t0));
    // Up to 16 tiles a block while that leaves some 2048 blocks (about 16 a multiprocessor).
    const int tiles = static_cast<int>(std::clamp<int64_t>(key_tiles * g / 2048, 1, 16));
    const unsigned key_blocks = static_cast<unsigned>((key_tiles + tiles - 1) / tiles);
    const int err = DispatchFloatOrF8(a.side.dtype, [&](auto tag) {
      using T = decltype(tag);
      LaunchKernel(IndexerScoreKernel<T>, dim3(g, key_blocks), kScoreKeys, smem, S(s), a, t0, scores, ld, tiles);
      return Done();
    });
    if (err != 0) return err;
    LaunchKernel(TopKKernel, g, kTopKThreads, 0, S(s), static_cast<const float*>(scores), ld, a.positions, t0, selected,
                 topk);
    if (const int e = Done(); e != 0) return e;
  }
  return 0;
}

SparseLists SparseListsIn(int32_t* lists, int64_t n, int64_t topk) {
  SparseLists l{};
  l.block_tables = lists;
  l.block_table_start = l.block_tables + n * topk;
  l.query_start = l.block_table_start + n + 1;
  l.seq_lens = l.query_start + n + 1;
  l.positions = l.seq_lens + n;
  return l;
}

int LaunchSparseLists(const SparseLists& out, const int32_t* selected, int64_t n, int64_t topk,
                      const int32_t* positions, const int32_t* query_start, const int32_t* block_table_start,
                      const int32_t* block_tables, int64_t num_seqs, int64_t block_size, Stream s) {
  if (n == 0) return 0;
  if (topk <= 0 || num_seqs <= 0 || block_size <= 0) return static_cast<int>(cudaErrorInvalidValue);
  LaunchKernel(SparseListsKernel, static_cast<unsigned>(n), 256, 0, S(s), out, selected, n, topk, positions,
               query_start, block_table_start, block_tables, num_seqs, block_size);
  return Done();
}

}  // namespace fathom::cuda
