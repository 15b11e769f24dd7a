// The prefill-sized paged attention kernels (attention.h): LaunchPagedAttention's one block per (token, head), and
// LaunchPrefillMmaAttention's flash-attention tiles on tensor cores.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "backend/cuda/attention.h"
#include "backend/cuda/dtype.cuh"
#include "backend/cuda/flash_tile.cuh"
#include "backend/cuda/kv_cache.cuh"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/memory.cuh"
#include "backend/cuda/mma.cuh"
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

// Prefill attention on tensor cores, flash-attention style (MlaContextMmaKernel's scheme, on the paged cache): a block
// takes 64 consecutive query rows of one sequence and one query head (4 warps x 16 rows) and walks the keys of that
// head's KV head in tiles of 64, from key 0 to its last row's position, so each K/V tile is read once for 64 rows
// (the split kernels read a token's keys once per token). Q, pre-scaled by scale * log2 e and rounded to the cache's
// 16-bit type, stays in registers as mma A fragments; each tile's K and V rows land in shared memory by cp.async
// straight from the cache blocks; S = Q K^T and O += P V by mma.m16n8k16 (P from S's accumulators, V's fragments by
// ldmatrix.trans), with an online softmax per row and the causal mask at each row's position.
constexpr int kPfRows = 64, kPfKeys = 64, kPfWarps = 4;
template <int kD>
struct PfSmem {
  static constexpr int kRow = kD + 8;  // shared row stride (elements): 16 bytes of padding against bank conflicts
  static constexpr int kBytes = (kPfRows + 2 * kPfKeys) * kRow * 2;  // Q, K and V tiles of 16-bit values
};

template <typename T, int kD>
__global__ void __launch_bounds__(kPfWarps * 32) PrefillMmaAttentionKernel(AttentionArgs a) {
  PdlPrologue();
  constexpr int kRow = PfSmem<kD>::kRow;
  extern __shared__ __align__(16) unsigned char pf_smem[];
  T* sq = reinterpret_cast<T*>(pf_smem);  // [kPfRows][kRow]: Q rows
  T* sk = sq + kPfRows * kRow;            // [kPfKeys][kRow]: the tile's keys
  T* sv = sk + kPfKeys * kRow;            // [kPfKeys][kRow]: the tile's values
  // This block's sequence and query tile; blocks past the last tile return.
  int64_t s = 0, tile = blockIdx.x;
  for (;;) {
    if (s >= a.num_seqs) return;
    const int64_t q_len = a.query_start[s + 1] - a.query_start[s];
    const int64_t tiles = (q_len + kPfRows - 1) / kPfRows;
    if (tile < tiles) break;
    tile -= tiles;
    ++s;
  }
  const int64_t h = blockIdx.y, kvh = h / (a.heads / a.kv_heads);
  const int64_t row0 = a.query_start[s] + tile * kPfRows;
  const int64_t rows = min(static_cast<int64_t>(kPfRows), static_cast<int64_t>(a.query_start[s + 1]) - row0);
  // The tile's largest position (its last row's: a sequence's positions rise), taken as the maximum for safety.
  int64_t last_pos = 0;
  for (int64_t r = 0; r < rows; ++r) last_pos = max(last_pos, static_cast<int64_t>(a.positions[row0 + r]));
  const int32_t* table = a.block_tables + a.block_table_start[s];
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, tq = lane % 4;
  constexpr float kLog2e = 1.4426950408889634f;
  const float qscale = a.scale * kLog2e;
  StageQ<T, kPfRows, kD>(a.q, a.q_s0, a.q_s1, row0, rows, h, qscale, sq, kRow);
  __syncthreads();
  uint32_t qf[kD / 16][4];
  int64_t pos[2];  // this thread's rows' positions (g and g + 8 of the warp's 16)
  LoadQRows<T, kD / 16>(sq, kRow, a.positions, row0, rows, last_pos, warp, lane, qf, pos);
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  float o[kD / 8][4] = {};
  const T* kc = static_cast<const T*>(a.k.data);
  const T* vc = static_cast<const T*>(a.v.data);
  constexpr int kPieces = kD / 8;            // 16-byte pieces of a row
  constexpr int kRowsAtOnce = 32 / kPieces;  // rows whose pieces a warp issues in one pass
  static_assert(kRowsAtOnce >= 1 && 32 % kPieces == 0 && 16 % kRowsAtOnce == 0, "a row's pieces fill whole lanes");
  const int32_t bs = static_cast<int32_t>(a.block_size);
  // The 16 rows of each tile that this warp loads (keys 16 warp .. 16 warp + 15 of the tile): lane i % 16 finds row
  // i % 16's K and V offsets in the cache (one block-table load and one 32-bit division a row, where every 16-byte
  // piece used to compute its own), and the lanes then take each row's pieces, its offset passed by a shuffle.
  const int sub = lane / kPieces, col = (lane % kPieces) * 8;
  int64_t k_off = -1, v_off = 0;  // lane i % 16's row at the next tile: -1 past the last position
  const auto find_rows = [&](int64_t kb) {
    const int64_t j = kb + warp * 16 + (lane & 15);
    k_off = -1;
    if (j <= last_pos) {
      const int32_t jj = static_cast<int32_t>(j);
      const int64_t blk = table[jj / bs], in_blk = jj % bs;
      k_off = blk * a.k.s0 + in_blk * a.k.s1 + kvh * a.k.s2;
      v_off = blk * a.v.s0 + in_blk * a.v.s1 + kvh * a.v.s2;
    }
  };
  // This warp's rows of K (is_v false) or V into the tile (cp.async, rows past the last position zero-filled).
  const auto issue = [&](bool is_v) {
#pragma unroll
    for (int rr = 0; rr < 16; rr += kRowsAtOnce) {
      const int rl = rr + sub;
      const int64_t ko = __shfl_sync(0xffffffffu, k_off, rl);
      const int64_t vo = is_v ? __shfl_sync(0xffffffffu, v_off, rl) : 0;
      const bool in = ko >= 0;
      const T* src = in ? (is_v ? vc + vo : kc + ko) + col : kc;
      CpAsync16((is_v ? sv : sk) + (warp * 16 + rl) * kRow + col, src, in ? 16 : 0);
    }
  };
  // Two commit groups a tile, K's and V's: the next tile's K loads while this tile's P V runs, and its V while its
  // scores do. Groups in flight at the top of a pass: K(kb), V(kb).
  find_rows(0);
  issue(false);
  CpAsyncCommit();
  issue(true);
  CpAsyncCommit();
  for (int64_t kb = 0; kb <= last_pos; kb += kPfKeys) {
    const bool more = kb + kPfKeys <= last_pos;
    CpAsyncWait<1>();  // K(kb) has landed; V(kb) may be in flight
    __syncthreads();
    float sc[kPfKeys / 8][4] = {};  // S: rows (g, g + 8) x keys nt * 8 + 2 tq (+ 1)
    TileScores<T, kD / 16, kPfKeys>(qf, sk, kRow, lane, sc);
#pragma unroll
    for (int nt = 0; nt < kPfKeys / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        if (kb + nt * 8 + 2 * tq + (e & 1) > pos[e / 2]) sc[nt][e] = -INFINITY;  // causal
      }
    }
    uint32_t pa[kPfKeys / 16][4];  // P as A fragments, 16 keys each
    TileSoftmax<T, kPfKeys, kD / 8>(sc, m, l, o, pa);
    if (more) find_rows(kb + kPfKeys);
    __syncthreads();  // every warp is done with sk
    if (more) issue(false);
    CpAsyncCommit();   // possibly empty: the waits count groups
    CpAsyncWait<1>();  // V(kb) has landed; K(kb + kPfKeys) may be in flight
    __syncthreads();
    TileAccumulatePv<T, kPfKeys, kD / 8>(pa, sv, kRow, lane, o);
    __syncthreads();  // every warp is done with sv
    if (more) issue(true);
    CpAsyncCommit();
  }
  FinishRows<kD / 8>(l, o, a.out + (row0 + warp * 16) * a.o_s0 + h * a.o_s1, a.o_s0, rows - warp * 16, lane);
}

template <typename T, int kD>
int LaunchPrefillMma(const AttentionArgs& a, cudaStream_t s) {
  const auto kernel = PrefillMmaAttentionKernel<T, kD>;
  constexpr int kBytes = PfSmem<kD>::kBytes;
  if (const int e = EnsureDynamicSmem(reinterpret_cast<const void*>(kernel), kBytes); e != 0) return e;
  // Blocks for every query tile there can be (a sequence's last tile may be partial); those past the last return.
  const int64_t tiles = a.n / kPfRows + a.num_seqs;
  LaunchKernel(kernel, dim3(static_cast<unsigned>(tiles), static_cast<unsigned>(a.heads)), kPfWarps * 32, kBytes, s, a);
  return Done();
}

}  // namespace

bool PrefillMmaAttentionFits(const AttentionArgs& a) {
  if (a.k_dim != a.v_dim || (a.k_dim != 64 && a.k_dim != 128)) return false;
  if (a.kv_heads <= 0 || a.heads % a.kv_heads != 0) return false;
  if (a.k.dtype != a.v.dtype || (a.k.dtype != kF16 && a.k.dtype != kBF16)) return false;
  for (const CacheView* c : {&a.k, &a.v}) {
    if (c->s0 % 8 != 0 || c->s1 % 8 != 0 || c->s2 % 8 != 0) return false;
    if (reinterpret_cast<uintptr_t>(c->data) % 16 != 0) return false;
  }
  return a.q_s0 % 4 == 0 && a.q_s1 % 4 == 0 && reinterpret_cast<uintptr_t>(a.q) % 16 == 0;
}

int LaunchPrefillMmaAttention(const AttentionArgs& a, Stream s) {
  if (a.n == 0) return 0;
  if (!PrefillMmaAttentionFits(a) || a.num_seqs <= 0) return static_cast<int>(cudaErrorInvalidValue);
  const bool f16 = a.k.dtype == kF16;
  if (a.k_dim == 64) return f16 ? LaunchPrefillMma<__half, 64>(a, S(s)) : LaunchPrefillMma<__nv_bfloat16, 64>(a, S(s));
  return f16 ? LaunchPrefillMma<__half, 128>(a, S(s)) : LaunchPrefillMma<__nv_bfloat16, 128>(a, S(s));
}

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
