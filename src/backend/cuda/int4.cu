// The 4-bit weight kernels (int4.h): the repack into the tile layout, the W4A16 tensor-core kernel for decode
// batches, the dequantization for the prefill GEMM, and the generic float32 kernel on the checkpoint's layout.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "backend/cuda/dtype.cuh"
#include "backend/cuda/int4.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/mma.cuh"

namespace fathom::cuda {

namespace {

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
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t h = idx % 2, g = (idx / 2) % w.groups, rb = idx / (2 * w.groups);
    uint32_t word = 0;
    for (int i = 0; i < 8; ++i) word |= SourceZero(w, 16 * rb + 8 * h + i, g) << (4 * i);
    dst[idx] = word;
  }
}

// (a & b) | c.
__device__ __forceinline__ uint32_t Lop3AndOr(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t d;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

// Two codes (bits 0..3 and 16..19 of `word`) minus their zero, as bf16x2: 0x4300 | q is the bf16 128 + q, and
// zz holds 128 + z twice; the difference, an integer in [-16, 15], is exact.
__device__ __forceinline__ uint32_t CodesMinusZero(uint32_t word, uint32_t zz) {
  const uint32_t v = Lop3AndOr(word, 0x000F000Fu, 0x43004300u);
  const __nv_bfloat162 d =
      __hsub2(reinterpret_cast<const __nv_bfloat162&>(v), reinterpret_cast<const __nv_bfloat162&>(zz));
  return reinterpret_cast<const uint32_t&>(d);
}

__device__ __forceinline__ uint32_t PackBf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return reinterpret_cast<const uint32_t&>(v);
}

template <typename TS>
__device__ __forceinline__ float TiledScale(const TS* s, int64_t i) {
  return ToF(s[i]);
}

// acc += s * tmp (rows r0: s0, r0 + 8: s1), then tmp = 0: one group's sums, scaled, into the totals.
template <int NT>
__device__ __forceinline__ void AddScaled(float (&acc)[NT][4], float (&tmp)[NT][4], float s0, float s1) {
#pragma unroll
  for (int tt = 0; tt < NT; ++tt) {
    acc[tt][0] += s0 * tmp[tt][0];
    acc[tt][1] += s0 * tmp[tt][1];
    acc[tt][2] += s1 * tmp[tt][2];
    acc[tt][3] += s1 * tmp[tt][3];
    tmp[tt][0] = tmp[tt][1] = tmp[tt][2] = tmp[tt][3] = 0.0f;
  }
}

constexpr int kMmaWarps = 4;

// One block: a 16-row block (blockIdx.x), a slice of K (blockIdx.y), 8 * NT tokens (blockIdx.z); its 4 warps take
// the slice's 64-input chunks in turn and add their sums at the end. kChunkGroup: a chunk lies in one group.
template <typename TS, bool kChunkGroup, int NT>
__global__ void __launch_bounds__(kMmaWarps * 32)
    Int4MmaKernel(const float* __restrict__ x, int64_t xs, int64_t n, Int4Tiled w, const void* bias, int bias_dtype,
                  float* out, int64_t os, float* partial, int* counters, int splits) {
  const int lane = static_cast<int>(threadIdx.x & 31), warp = static_cast<int>(threadIdx.x >> 5);
  const int64_t rb = blockIdx.x, split = blockIdx.y, tg = blockIdx.z;
  const int64_t chunks = w.k / 64, rbs = w.m / 16;
  const int64_t c_begin = split * chunks / splits, c_end = (split + 1) * chunks / splits;
  const int64_t t0 = tg * 8 * NT;
  const uint4* wp = reinterpret_cast<const uint4*>(w.weights) + rb * chunks * 32 + lane;
  const TS* sp = static_cast<const TS*>(w.scales) + rb * w.groups * 16 + lane / 4;
  const uint32_t* zp = w.zeros + rb * w.groups * 2;
  const int zshift = 4 * (lane / 4);
  const int kl = 4 * (lane % 4);
  const float* xrow[NT];
  bool has[NT];
#pragma unroll
  for (int tt = 0; tt < NT; ++tt) {
    const int64_t t = t0 + 8 * tt + lane / 4;
    has[tt] = t < n;
    xrow[tt] = x + (has[tt] ? t : 0) * xs;
  }
  float acc[NT][4];
#pragma unroll
  for (int tt = 0; tt < NT; ++tt) acc[tt][0] = acc[tt][1] = acc[tt][2] = acc[tt][3] = 0.0f;

  int64_t ch = c_begin + warp;
  uint4 next = ch < c_end ? __ldg(wp + ch * 32) : make_uint4(0, 0, 0, 0);
  for (; ch < c_end; ch += kMmaWarps) {
    const uint4 cur = next;
    if (ch + kMmaWarps < c_end) next = __ldg(wp + (ch + kMmaWarps) * 32);
    const uint32_t words[4] = {cur.x, cur.y, cur.z, cur.w};
    float tmp[NT][4];
#pragma unroll
    for (int tt = 0; tt < NT; ++tt) tmp[tt][0] = tmp[tt][1] = tmp[tt][2] = tmp[tt][3] = 0.0f;
    int64_t g = (ch * 64) / w.group;
    uint32_t zz0 = 0, zz1 = 0;
    if constexpr (kChunkGroup) {
      zz0 = 0x43004300u + (((zp[2 * g] >> zshift) & 0xFu) + w.zero_offset) * 0x00010001u;
      zz1 = 0x43004300u + (((zp[2 * g + 1] >> zshift) & 0xFu) + w.zero_offset) * 0x00010001u;
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t kk = ch * 64 + 16 * j + kl;
      if constexpr (!kChunkGroup) {
        g = (ch * 64 + 16 * j) / w.group;
        zz0 = 0x43004300u + (((zp[2 * g] >> zshift) & 0xFu) + w.zero_offset) * 0x00010001u;
        zz1 = 0x43004300u + (((zp[2 * g + 1] >> zshift) & 0xFu) + w.zero_offset) * 0x00010001u;
      }
      const uint32_t word = words[j];
      const uint32_t a[4] = {CodesMinusZero(word, zz0), CodesMinusZero(word >> 4, zz1), CodesMinusZero(word >> 8, zz0),
                             CodesMinusZero(word >> 12, zz1)};
      int4 pk = make_int4(0, 0, 0, 0);
      if (w.perm != nullptr) pk = *reinterpret_cast<const int4*>(w.perm + kk);
#pragma unroll
      for (int tt = 0; tt < NT; ++tt) {
        float4 xv = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (has[tt]) {
          if (w.perm == nullptr) {
            xv = *reinterpret_cast<const float4*>(xrow[tt] + kk);
          } else {
            xv = make_float4(xrow[tt][pk.x], xrow[tt][pk.y], xrow[tt][pk.z], xrow[tt][pk.w]);
          }
        }
        Mma16816<__nv_bfloat16>(tmp[tt], a, PackBf16(xv.x, xv.y), PackBf16(xv.z, xv.w));
      }
      if constexpr (!kChunkGroup) AddScaled(acc, tmp, TiledScale(sp, g * 16), TiledScale(sp, g * 16 + 8));
    }
    if constexpr (kChunkGroup) AddScaled(acc, tmp, TiledScale(sp, g * 16), TiledScale(sp, g * 16 + 8));
  }

  // The block's sum, in warp order.
  __shared__ float red[kMmaWarps - 1][NT][4][32];
  if (warp > 0) {
#pragma unroll
    for (int tt = 0; tt < NT; ++tt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) red[warp - 1][tt][e][lane] = acc[tt][e];
    }
  }
  __syncthreads();
  if (warp != 0) return;
#pragma unroll
  for (int tt = 0; tt < NT; ++tt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      for (int v = 0; v < kMmaWarps - 1; ++v) acc[tt][e] += red[v][tt][e][lane];
    }
  }
  const int64_t r0 = 16 * rb + lane / 4;
  // Output (token, row) of accumulator e of token tile tt.
  const auto token = [&](int tt, int e) { return t0 + 8 * tt + 2 * (lane % 4) + (e & 1); };
  const auto row = [&](int e) { return r0 + 8 * (e >> 1); };
  if (splits == 1) {
#pragma unroll
    for (int tt = 0; tt < NT; ++tt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t t = token(tt, e);
        if (t < n) out[t * os + row(e)] = acc[tt][e] + BiasAt(bias, bias_dtype, row(e));
      }
    }
    return;
  }
#pragma unroll
  for (int tt = 0; tt < NT; ++tt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int64_t t = token(tt, e);
      if (t < n) partial[(split * n + t) * w.m + row(e)] = acc[tt][e];
    }
  }
  __threadfence();
  __syncwarp();
  int* counter = counters + tg * rbs + rb;
  int prev = 0;
  if (lane == 0) prev = atomicAdd(counter, 1);
  prev = __shfl_sync(0xffffffffu, prev, 0);
  if (prev != splits - 1) return;
  // The last slice of this row block: the slices' sums in slice order (the same result whatever order they ended).
  __threadfence();
#pragma unroll
  for (int tt = 0; tt < NT; ++tt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int64_t t = token(tt, e);
      if (t >= n) continue;
      float sum = 0.0f;
      for (int sl = 0; sl < splits; ++sl) sum += __ldcg(partial + (sl * n + t) * w.m + row(e));
      out[t * os + row(e)] = sum + BiasAt(bias, bias_dtype, row(e));
    }
  }
  if (lane == 0) *counter = 0;
}

template <typename TS>
__global__ void DequantInt4Kernel(Int4Tiled w, __nv_bfloat16* dst, int64_t words) {
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
  Int4GenericKernel<View><<<grid, 256, 0, S(s)>>>(x, xs, n, v, bias, bias_dtype, out, os);
  return Done();
}

unsigned GridFor(int64_t n) {
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>((n + 255) / 256, 1 << 16)));
}

template <typename TS, bool kChunkGroup>
int LaunchMma(const float* x, int64_t xs, int64_t n, const Int4Tiled& w, const void* bias, int bias_dtype, float* out,
              int64_t os, float* partial, int* counters, int splits, Stream s) {
  const unsigned rbs = static_cast<unsigned>(w.m / 16);
  const auto go = [&](auto nt) {
    constexpr int NT = decltype(nt)::value;
    const dim3 grid(rbs, static_cast<unsigned>(splits), static_cast<unsigned>((n + 8 * NT - 1) / (8 * NT)));
    Int4MmaKernel<TS, kChunkGroup, NT>
        <<<grid, kMmaWarps * 32, 0, S(s)>>>(x, xs, n, w, bias, bias_dtype, out, os, partial, counters, splits);
    return Done();
  };
  if (n <= 8) return go(std::integral_constant<int, 1>{});
  if (n <= 16) return go(std::integral_constant<int, 2>{});
  if (n <= 32) return go(std::integral_constant<int, 4>{});
  return go(std::integral_constant<int, 8>{});
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
  RepackWeightsKernel<<<GridFor(words), 256, 0, S(s)>>>(src, perm, dst_weights, words);
  if (const int e = Done(); e != 0) return e;
  const int64_t scales = src.m * src.groups;
  RepackScalesKernel<<<GridFor(scales), 256, 0, S(s)>>>(src, dst_scales, scales);
  if (const int e = Done(); e != 0) return e;
  const int64_t zeros = src.m / 8 * src.groups;
  RepackZerosKernel<<<GridFor(zeros), 256, 0, S(s)>>>(src, dst_zeros, zeros);
  return Done();
}

int Int4MmaSplits(int64_t m, int64_t k, int64_t n, int sm_count) {
  const int64_t rbs = m / 16, chunks = k / 64, tgs = (n + 63) / 64;
  const int64_t blocks = rbs * tgs, target = 8 * static_cast<int64_t>(std::max(sm_count, 1));
  if (blocks * 2 >= target || blocks > kInt4MaxCounters) return 1;
  const int64_t want = (target + blocks - 1) / blocks;
  return static_cast<int>(std::max<int64_t>(1, std::min({want, chunks / 8, int64_t{64}})));
}

int LaunchInt4Mma(const float* x, int64_t xs, int64_t n, const Int4Tiled& w, const void* bias, int bias_dtype,
                  float* out, int64_t os, float* partial, int* counters, int splits, Stream s) {
  if (n == 0) return 0;
  if (!Int4TileFits(w.m, w.k, w.groups, w.group) || splits < 1 ||
      (splits > 1 && (partial == nullptr || counters == nullptr))) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  const bool chunk_group = w.group % 64 == 0 || w.groups == 1;
  if (w.scales_dtype == kF16) {
    return chunk_group ? LaunchMma<__half, true>(x, xs, n, w, bias, bias_dtype, out, os, partial, counters, splits, s)
                       : LaunchMma<__half, false>(x, xs, n, w, bias, bias_dtype, out, os, partial, counters, splits, s);
  }
  if (w.scales_dtype == kF32) {
    return chunk_group ? LaunchMma<float, true>(x, xs, n, w, bias, bias_dtype, out, os, partial, counters, splits, s)
                       : LaunchMma<float, false>(x, xs, n, w, bias, bias_dtype, out, os, partial, counters, splits, s);
  }
  return static_cast<int>(cudaErrorInvalidValue);
}

int LaunchDequantInt4(const Int4Tiled& w, void* dst, Stream s) {
  const int64_t words = w.m * w.k / 8;
  if (words == 0) return 0;
  auto* d = static_cast<__nv_bfloat16*>(dst);
  if (w.scales_dtype == kF16) {
    DequantInt4Kernel<__half><<<GridFor(words), 256, 0, S(s)>>>(w, d, words);
  } else if (w.scales_dtype == kF32) {
    DequantInt4Kernel<float><<<GridFor(words), 256, 0, S(s)>>>(w, d, words);
  } else {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  return Done();
}

int LaunchGatherToBf16(const float* x, int64_t xs, int64_t rows, int64_t k, const int32_t* perm, void* dst, Stream s) {
  if (rows * k == 0) return 0;
  GatherToBf16Kernel<<<GridFor(rows * k), 256, 0, S(s)>>>(x, xs, rows, k, perm, static_cast<__nv_bfloat16*>(dst));
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
