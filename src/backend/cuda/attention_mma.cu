// The tensor-core decode attention kernel (attention.h's SplitAttentionKind::kMma; its launch: attention_common.cuh).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "backend/cuda/attention.h"
#include "backend/cuda/attention_common.cuh"
#include "backend/cuda/dtype.cuh"
#include "backend/cuda/fp8.cuh"
#include "backend/cuda/kv_cache.cuh"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/memory.cuh"
#include "backend/cuda/mma.cuh"

namespace fathom::cuda {

namespace {

// Shared memory of MmaAttentionKernel<TC, kD> (dynamic; bytes). Each warp has two stages of its key tiles, filled by
// cp.async while the warp computes on the other stage: 16-bit caches land straight in the mma tiles ([16 keys][kRow],
// K then V); f8 caches land as codes ([16][kD] bytes, K then V, then the keys' K and V scales), which the warp widens
// into one pair of bf16 tiles before its mmas. After the key loop, the warps' output states reuse the same bytes.
template <typename TC, int kD>
struct MmaSmem {
  static constexpr bool kF8 = kIsF8<TC>;
  static constexpr int kRow = kD + 8;  // tile row stride in elements: 16 bytes of padding against bank conflicts
  static constexpr int kTile = kMmaTile * kRow * 2;  // one 16-bit tile
  static constexpr int kCodes = kMmaTile * kD;       // f8: one tile's codes
  static constexpr int kStage = kF8 ? 2 * kCodes + 2 * kMmaTile * 4 : 2 * kTile;
  static constexpr int kWarp = 2 * kStage + (kF8 ? 2 * kTile : 0);
  static constexpr int kLoop = kMmaWarps * kWarp;
  static constexpr int kMerge = kMmaWarps * 8 * kD * 4;
  static constexpr int kRegion = kLoop > kMerge ? kLoop : kMerge;
  static constexpr int kBytes = kRegion + kMmaWarps * kMmaTile * 8 * 2;  // then each warp's P^T [16 keys][8 heads]
  static_assert(kStage % 16 == 0 && kTile % 16 == 0 && kRegion % 16 == 0, "16-byte aligned pieces");
};

// Tensor-core flash-decoding for bf16/f16 caches, with the same grid and partial states as GqaAttentionKernel. Each
// warp takes tiles of 16 keys and runs mma.m16n8k16 twice: S^T = K Q^T (16 keys x 8 query heads, the group padded to
// 8) and O^T += V^T P^T (head dims x 8 heads, V^T through ldmatrix.trans), with an online softmax in base 2 per head.
// The K/V pipeline is two stages deep per warp (MmaSmem): the cp.async copies of the next tile are in flight while the
// warp computes on this one, and the block ids of the tile after next are loaded a tile ahead, so that no load waits
// on another. Q (pre-scaled by scale * log2 e) and P are rounded to the cache dtype, as FlashAttention does;
// accumulation is float32. The fragment layouts are PTX's for m16n8k16: g = lane / 4, t = lane % 4.
// An f8 cache (TC = e4m3, one scale per key row: MmaAttentionFits) runs the bf16 form on the raw codes, which bf16
// holds exactly: each key's K scale multiplies its scores after the first mma, and its V scale its softmax weights
// before they are rounded for the second (the row sums l stay unscaled).
template <typename TC, int kD>
__global__ void __launch_bounds__(kMmaWarps * 32)
    MmaAttentionKernel(AttentionArgs a, int64_t chunk, int64_t chunks, float* part_m, float* part_l, float* part_acc) {
  PdlPrologue();
  using L = MmaSmem<TC, kD>;
  constexpr bool kF8Cache = L::kF8;
  using T = std::conditional_t<kF8Cache, __nv_bfloat16, TC>;  // the mma operands' type
  constexpr int kRow = L::kRow;
  constexpr int kDT = kD / 16;
  extern __shared__ __align__(16) unsigned char dyn[];
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
  unsigned char* wbase = dyn + warp * L::kWarp;
  T* sp = reinterpret_cast<T*>(dyn + L::kRegion) + warp * kMmaTile * 8;  // P^T [16 keys][8 heads]
  const TC* kc = static_cast<const TC*>(a.k.data) + kvh * a.k.s2;
  const TC* vc = static_cast<const TC*>(a.v.data) + kvh * a.v.s2;
  const int32_t bs = static_cast<int32_t>(a.block_size);
  constexpr int64_t kStride = kMmaWarps * kMmaTile;  // keys between a warp's tiles
  // The block of key jt + lane % 16 (0 past the chunk): a lane holds one for the tile that starts at jt.
  auto block_of = [&](int64_t jt) -> int32_t {
    const int64_t j = jt + (lane & 15);
    return j < j1 ? table[static_cast<int32_t>(j) / bs] : 0;
  };
  // The cp.async copies of the tile at jt into `stage`, rows past the chunk zero-filled; blk: block_of(jt).
  auto issue = [&](int64_t jt, int stage, int32_t blk) {
    unsigned char* st = wbase + stage * L::kStage;
    constexpr int kElems = kF8Cache ? 16 : 8;  // elements of one 16-byte piece
    constexpr int kPieces = kD / kElems;       // pieces of a row
#pragma unroll
    for (int i = lane; i < kMmaTile * kPieces; i += 32) {
      const int r = i / kPieces, col = (i % kPieces) * kElems;
      const int64_t j = jt + r;
      const int64_t rb = __shfl_sync(0xffffffffu, blk, r);
      const bool in = j < j1;
      const int64_t off = in ? static_cast<int32_t>(j) % bs : 0;
      const TC* ks = kc + (in ? rb * a.k.s0 + off * a.k.s1 + col : 0);
      const TC* vs = vc + (in ? rb * a.v.s0 + off * a.v.s1 + col : 0);
      if constexpr (kF8Cache) {
        CpAsync16(st + r * kD + col, ks, in ? 16 : 0);
        CpAsync16(st + L::kCodes + r * kD + col, vs, in ? 16 : 0);
      } else {
        CpAsync16(st + (r * kRow + col) * 2, ks, in ? 16 : 0);
        CpAsync16(st + L::kTile + (r * kRow + col) * 2, vs, in ? 16 : 0);
      }
    }
    if constexpr (kF8Cache) {  // lanes 0-15: key `lane`'s K scale; lanes 16-31: its V scale
      const int r = lane & 15, which = lane >> 4;
      const int64_t j = jt + r;
      const bool in = j < j1;
      const CacheView& cv = which == 0 ? a.k : a.v;
      const float* src = cv.scale + (in ? blk * cv.ss0 + (static_cast<int32_t>(j) % bs) * cv.ss1 + kvh * cv.ss2 : 0);
      CpAsync4(st + 2 * L::kCodes + (which * kMmaTile + r) * 4, src, in ? 4 : 0);
    }
  };
  int64_t jb = j0 + warp * kMmaTile;
  int32_t blk_next = block_of(jb);
  if (jb < j1) issue(jb, 0, blk_next);
  CpAsyncCommit();
  blk_next = block_of(jb + kStride);
  __syncthreads();  // sq
  uint32_t qb[kDT][2];
#pragma unroll
  for (int dt = 0; dt < kDT; ++dt) {
    qb[dt][0] = *reinterpret_cast<const uint32_t*>(&sq[g][dt * 16 + 2 * tq]);
    qb[dt][1] = *reinterpret_cast<const uint32_t*>(&sq[g][dt * 16 + 8 + 2 * tq]);
  }
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;  // heads 2tq and 2tq + 1
  float o[kDT][4];
#pragma unroll
  for (int dt = 0; dt < kDT; ++dt) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.0f;
  for (int stage = 0; jb < j1; jb += kStride, stage ^= 1) {
    const int64_t jn = jb + kStride;
    if (jn < j1) issue(jn, stage ^ 1, blk_next);
    CpAsyncCommit();
    blk_next = block_of(jn + kStride);
    CpAsyncWait<1>();  // this tile's copies (the next tile's may still fly)
    __syncwarp();
    const unsigned char* st = wbase + stage * L::kStage;
    const T* sk;
    const T* sv;
    float vs0 = 1.0f, vs1 = 1.0f;  // f8: the V scales of keys g and g + 8 (0 past the chunk: their weights are 0)
    float ks0 = 1.0f, ks1 = 1.0f;
    if constexpr (kF8Cache) {
      // 16 codes (one 16-byte piece) at a time, widened to 16 exact bf16 values (two 16-byte stores).
      T* tk = reinterpret_cast<T*>(wbase + 2 * L::kStage);
      T* tv = tk + kMmaTile * kRow;
      constexpr int kF8Pieces = kD / 16;
#pragma unroll
      for (int i = lane; i < kMmaTile * kF8Pieces; i += 32) {
        const int r = i / kF8Pieces, col = (i % kF8Pieces) * 16;
        const uint4 k16 = *reinterpret_cast<const uint4*>(st + r * kD + col);
        const uint4 v16 = *reinterpret_cast<const uint4*>(st + L::kCodes + r * kD + col);
        const uint32_t kw[4] = {k16.x, k16.y, k16.z, k16.w}, vw[4] = {v16.x, v16.y, v16.z, v16.w};
        uint32_t kb[8], vb[8];
#pragma unroll
        for (int w = 0; w < 4; ++w) {
          kb[2 * w] = F8PairToBf16(static_cast<uint16_t>(kw[w] & 0xffffu), 1.0f);
          kb[2 * w + 1] = F8PairToBf16(static_cast<uint16_t>(kw[w] >> 16), 1.0f);
          vb[2 * w] = F8PairToBf16(static_cast<uint16_t>(vw[w] & 0xffffu), 1.0f);
          vb[2 * w + 1] = F8PairToBf16(static_cast<uint16_t>(vw[w] >> 16), 1.0f);
        }
        *reinterpret_cast<uint4*>(tk + r * kRow + col) = make_uint4(kb[0], kb[1], kb[2], kb[3]);
        *reinterpret_cast<uint4*>(tk + r * kRow + col + 8) = make_uint4(kb[4], kb[5], kb[6], kb[7]);
        *reinterpret_cast<uint4*>(tv + r * kRow + col) = make_uint4(vb[0], vb[1], vb[2], vb[3]);
        *reinterpret_cast<uint4*>(tv + r * kRow + col + 8) = make_uint4(vb[4], vb[5], vb[6], vb[7]);
      }
      const float* sc = reinterpret_cast<const float*>(st + 2 * L::kCodes);  // [K, V][16 keys]
      ks0 = sc[g];
      ks1 = sc[g + 8];
      vs0 = sc[kMmaTile + g];
      vs1 = sc[kMmaTile + g + 8];
      sk = tk;
      sv = tv;
      __syncwarp();
    } else {
      sk = reinterpret_cast<const T*>(st);
      sv = sk + kMmaTile * kRow;
    }
    float s[4] = {0.0f, 0.0f, 0.0f, 0.0f};  // S^T: (key g, heads 2tq, 2tq+1), (key g + 8, same heads)
#pragma unroll
    for (int dt = 0; dt < kDT; ++dt) {
      uint32_t af[4];
      LdMatrixX4(af, sk + ((lane & 7) + ((lane >> 3) & 1) * 8) * kRow + dt * 16 + ((lane >> 4) & 1) * 8, false);
      Mma16816<T>(s, af, qb[dt][0], qb[dt][1]);
    }
    if constexpr (kF8Cache) {
      s[0] *= ks0;
      s[1] *= ks0;
      s[2] *= ks1;
      s[3] *= ks1;
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
    __syncwarp();  // this stage is refilled two tiles on (and the f8 tiles on the next)
  }
  CpAsyncWait<0>();  // the empty groups past the chunk: nothing in flight before the merge reuses the bytes
#pragma unroll
  for (int off = 4; off < 32; off *= 2) {
    l0 += __shfl_xor_sync(0xffffffffu, l0, off);
    l1 += __shfl_xor_sync(0xffffffffu, l1, off);
  }
  __syncthreads();  // every warp is done with its tiles: the buffer now holds the warps' states
  float* sm_acc = reinterpret_cast<float*>(dyn);  // [kMmaWarps][8][kD]
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

// The kernel instance for a cache dtype and head dim, its dynamic shared memory (over the 48 KiB default; set on each
// device by Prepare, with the carveout at its largest), and how many of its blocks a multiprocessor holds (queried
// once, on the first device that launches it: the GPUs of one process are the same model).
struct MmaInstance {
  GroupKernel kernel;
  int smem;
  int blocks_per_sm;
  int Prepare() const { return EnsureDynamicSmem(reinterpret_cast<const void*>(kernel), smem, true); }
};

template <typename TC, int kD>
const MmaInstance& Instance() {
  static const MmaInstance inst = [] {
    MmaInstance m{MmaAttentionKernel<TC, kD>, MmaSmem<TC, kD>::kBytes, 1};
    int n = 0;
    if (m.Prepare() == 0 &&
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, m.kernel, kMmaWarps * 32, m.smem) == cudaSuccess && n > 0) {
      m.blocks_per_sm = n;
    }
    cudaGetLastError();  // an attribute refused shows at the launch
    return m;
  }();
  return inst;
}

template <typename TC>
const MmaInstance& InstanceFor(int64_t k_dim) {
  return k_dim == 64 ? Instance<TC, 64>() : Instance<TC, 128>();
}

const MmaInstance& InstanceOf(const AttentionArgs& a) {
  if (a.k.dtype == kF16) return InstanceFor<__half>(a.k_dim);
  if (a.k.dtype == kF8) return InstanceFor<__nv_fp8_e4m3>(a.k_dim);
  return InstanceFor<__nv_bfloat16>(a.k_dim);
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

int LaunchMmaAttention(const AttentionArgs& a, int64_t chunk, int64_t chunks, float* pm, float* pl, float* pa,
                       cudaStream_t s) {
  const MmaInstance& m = InstanceOf(a);
  if (const int e = m.Prepare(); e != 0) return e;
  const dim3 grid(static_cast<unsigned>(a.n * a.kv_heads), static_cast<unsigned>(chunks));
  LaunchKernel(m.kernel, grid, kMmaWarps * 32, static_cast<size_t>(m.smem), s, a, chunk, chunks, pm, pl, pa);
  return 0;
}

// Keys per block: the blocks (token x KV head x chunk) should fill whole waves of the GPU's resident blocks, so that
// the last wave does not leave most multiprocessors idle. The fewest chunks whose waves are at least 90% full win;
// where even one-tile chunks make less than one wave, one-tile chunks (the most blocks). With a.one_chunk_waves = N >
// 0, a grid that fills N waves with one chunk a token keeps it (no merge, each block's fixed costs once).
int64_t MmaAttentionChunk(const AttentionArgs& a, int sm_count) {
  constexpr int64_t kStep = kMmaWarps * kMmaTile;
  const int64_t len = std::max<int64_t>(a.max_seq_len, 1);
  const int64_t most = (len + kStep - 1) / kStep;
  const int64_t base = std::max<int64_t>(a.n * a.kv_heads, 1);
  const int64_t slots = std::max<int64_t>(sm_count, 1) * InstanceOf(a).blocks_per_sm;
  if (a.one_chunk_waves > 0 && base >= a.one_chunk_waves * slots) return most * kStep;
  for (int64_t c = 1; c < most; ++c) {
    const int64_t chunk = ((len + c - 1) / c + kStep - 1) / kStep * kStep;
    const int64_t blocks = base * ((len + chunk - 1) / chunk);
    if (blocks < slots) continue;
    const int64_t waves = (blocks + slots - 1) / slots;
    if (10 * blocks >= 9 * waves * slots) return chunk;
  }
  return kStep;
}

}  // namespace fathom::cuda
