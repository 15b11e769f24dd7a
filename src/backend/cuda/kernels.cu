// First, correctness-first CUDA kernels for the Backend ops (float32 activations). They follow the launcher pattern
// (pointers, strides, stream in; an error code out; no allocation) so that faster kernels can replace them one by
// one behind the same launchers.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "backend/cuda/device_util.cuh"
#include "backend/cuda/kernels.h"

namespace fathom::cuda {

namespace {

// fathom::DType values (core/dtype.h).
constexpr int kF32 = 0, kF16 = 1, kBF16 = 2, kF8 = 3;

__device__ __forceinline__ float Load(const void* p, int dtype, int64_t i) {
  switch (dtype) {
    case kF32:
      return static_cast<const float*>(p)[i];
    case kF16:
      return __half2float(static_cast<const __half*>(p)[i]);
    case kBF16:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    default: {
      __nv_fp8_e4m3 v;
      v.__x = static_cast<const __nv_fp8_storage_t*>(p)[i];
      return static_cast<float>(v);
    }
  }
}

__device__ __forceinline__ void Store(void* p, int dtype, int64_t i, float v) {
  switch (dtype) {
    case kF32:
      static_cast<float*>(p)[i] = v;
      break;
    case kF16:
      static_cast<__half*>(p)[i] = __float2half_rn(v);
      break;
    default:
      static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v);
      break;
  }
}

__host__ __device__ constexpr int DTypeBytes(int dtype) {
  return dtype == kF32 ? 4 : dtype == kF8 ? 1 : 2;
}

__device__ __forceinline__ float WarpSum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float WarpMax(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Block-wide sum for blockDim.x a multiple of 32, up to 1024.
__device__ float BlockSum(float v) {
  __shared__ float part[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  v = WarpSum(v);
  __syncthreads();
  if (lane == 0) part[warp] = v;
  __syncthreads();
  const int warps = blockDim.x / 32;
  v = threadIdx.x < warps ? part[threadIdx.x] : 0.0f;
  if (warp == 0) v = WarpSum(v);
  if (threadIdx.x == 0) part[0] = v;
  __syncthreads();
  return part[0];
}

__device__ float BlockMax(float v) {
  __shared__ float part[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  v = WarpMax(v);
  __syncthreads();
  if (lane == 0) part[warp] = v;
  __syncthreads();
  const int warps = blockDim.x / 32;
  v = threadIdx.x < warps ? part[threadIdx.x] : -INFINITY;
  if (warp == 0) v = WarpMax(v);
  if (threadIdx.x == 0) part[0] = v;
  __syncthreads();
  return part[0];
}

int Done() {
  return static_cast<int>(cudaGetLastError());
}
cudaStream_t S(Stream s) {
  return static_cast<cudaStream_t>(s);
}
unsigned Blocks(int64_t n, int threads) {
  return static_cast<unsigned>((n + threads - 1) / threads);
}
// Blocks of 256 threads for the row-major (row, column chunk) numbering of the elementwise kernels.
unsigned RowBlocks(int64_t rows, int64_t cols) {
  return static_cast<unsigned>(rows * ((cols + 255) / 256));
}

__global__ void EmbeddingKernel(const int32_t* ids, const void* table, int dtype, int64_t stride, int64_t hidden,
                                float* out, int64_t out_stride) {
  const int64_t t = blockIdx.x;
  const int64_t row = ids[t];
  for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x)
    out[t * out_stride + i] = Load(table, dtype, row * stride + i);
}

__global__ void RmsNormKernel(float* x, int64_t xs, const float* add, int64_t as, const void* w, int wd, float eps,
                              float* out, int64_t os, int64_t cols) {
  const int64_t r = blockIdx.x;
  float* xr = x + r * xs;
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) {
    float v = xr[i];
    if (add != nullptr) {
      v += add[r * as + i];
      xr[i] = v;
    }
    ss += v * v;
  }
  ss = BlockSum(ss);
  const float inv = rsqrtf(ss / static_cast<float>(cols) + eps);
  for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) out[r * os + i] = Load(w, wd, i) * (xr[i] * inv);
}

// One warp per output row r and a tile of up to kTok tokens: the weight row is read once per tile. blockIdx.z picks
// a head of HeadLinear: x, w and out move by their head strides (0 for a plain Linear).
constexpr int kTok = 8;
__global__ void LinearKernel(const float* x, int64_t xs, int64_t n, int64_t in, const void* w, int wd, int64_t ws,
                             int64_t m, const float* scale, int64_t ss, int64_t bn, int64_t bk, const void* bias,
                             int bd, float* out, int64_t os, int64_t x_hs, int64_t w_hs, int64_t o_hs) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  x += blockIdx.z * x_hs;
  out += blockIdx.z * o_hs;
  w = static_cast<const char*>(w) + blockIdx.z * w_hs * DTypeBytes(wd);
  const int64_t r = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + warp;
  const int64_t t0 = static_cast<int64_t>(blockIdx.y) * kTok;
  if (r >= m) return;
  float acc[kTok];
#pragma unroll
  for (int j = 0; j < kTok; ++j) acc[j] = 0.0f;
  const int64_t tn = min(static_cast<int64_t>(kTok), n - t0);
  for (int64_t c = lane; c < in; c += 32) {
    float wv = Load(w, wd, r * ws + c);
    if (wd == kF8) wv *= scale[(r / bn) * ss + c / bk];
#pragma unroll
    for (int j = 0; j < kTok; ++j) {
      if (j < tn) acc[j] += x[(t0 + j) * xs + c] * wv;
    }
  }
  const float b = bias != nullptr ? Load(bias, bd, r) : 0.0f;
#pragma unroll
  for (int j = 0; j < kTok; ++j) {
    const float v = WarpSum(acc[j]);
    if (lane == 0 && j < tn) out[(t0 + j) * os + r] = v + b;
  }
}

// bf16 (or f8) weights with 16-byte aligned rows: each lane loads 8 (16) weights, 16 bytes, at a time, so a warp
// streams 512 contiguous bytes of a row per load; four loads per lane are issued before any is used, and weights bypass
// L1 (they are read once) so that x stays there. kT tokens share each weight load; the token count is a template
// parameter so that batch-1 decode keeps one accumulator. One launch covers several weights that share x (q/k/v,
// gate/up): blocks are numbered across the parts.
struct GemvParts {
  GemvPart p[kMaxGemvParts];
  int64_t first_block[kMaxGemvParts + 1];
  int count;
};
constexpr int kGemvWarps = 8;
// Blocks per SM that keep every SM busy twice over: below kGemvFillPerSm * sm_count blocks, the GEMV takes one token
// per warp (each token's sum runs in the same order whatever the tokens per warp, so results do not depend on it).
constexpr int64_t kGemvFillPerSm = 2;

template <int kT>
__device__ __forceinline__ void GemvAccumulate(const uint4& raw, const float* x, int64_t xs, int64_t k, int64_t tn,
                                               float* acc) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
  float wf[8];
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const float2 f = __bfloat1622float2(h[e]);
    wf[2 * e] = f.x;
    wf[2 * e + 1] = f.y;
  }
#pragma unroll
  for (int j = 0; j < kT; ++j) {
    if (kT == 1 || j < tn) {
      const float4* xv = reinterpret_cast<const float4*>(x + j * xs + k * 8);
      const float4 a = __ldg(xv), b = __ldg(xv + 1);
      acc[j] +=
          a.x * wf[0] + a.y * wf[1] + a.z * wf[2] + a.w * wf[3] + b.x * wf[4] + b.y * wf[5] + b.z * wf[6] + b.w * wf[7];
    }
  }
}

// f8 weights: 16 values per 16-byte piece, x read at k * 16; the piece's dot product with x times its block's scale
// (`scale`), one multiply per token instead of one per weight.
template <int kT>
__device__ __forceinline__ void GemvAccumulateF8(const uint4& raw, float scale, const float* x, int64_t xs, int64_t k,
                                                 int64_t tn, float* acc) {
  float wf[16];
  F8x16Raw(raw, wf);
#pragma unroll
  for (int j = 0; j < kT; ++j) {
    if (kT == 1 || j < tn) {
      const float4* xv = reinterpret_cast<const float4*>(x + j * xs + k * 16);
      float s = 0.0f;
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const float4 a = __ldg(xv + q);
        s += a.x * wf[4 * q] + a.y * wf[4 * q + 1] + a.z * wf[4 * q + 2] + a.w * wf[4 * q + 3];
      }
      acc[j] += s * scale;
    }
  }
}

template <int kT>
__global__ void __launch_bounds__(kGemvWarps * 32)
    GemvFanOutKernel(const float* x, int64_t xs, int64_t n, int64_t in, GemvParts parts) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  int pi = 0;
  while (pi + 1 < parts.count && static_cast<int64_t>(blockIdx.x) >= parts.first_block[pi + 1]) ++pi;
  const GemvPart& p = parts.p[pi];
  const int64_t r = (static_cast<int64_t>(blockIdx.x) - parts.first_block[pi]) * kGemvWarps + warp;
  const int64_t t0 = static_cast<int64_t>(blockIdx.y) * kT;
  if (r >= p.m) return;
  const int64_t tn = min(static_cast<int64_t>(kT), n - t0);
  const float* xt = x + t0 * xs;
  float acc[kT];
#pragma unroll
  for (int j = 0; j < kT; ++j) acc[j] = 0.0f;
  int64_t k = lane;
  if (p.scale == nullptr) {  // bf16: 8 values a piece
    const uint4* wr = reinterpret_cast<const uint4*>(static_cast<const __nv_bfloat16*>(p.w) + r * p.w_stride);
    const int64_t chunks = in / 8;
    for (; k + 96 < chunks; k += 128) {
      const uint4 r0 = LoadStreaming(wr + k), r1 = LoadStreaming(wr + k + 32), r2 = LoadStreaming(wr + k + 64),
                  r3 = LoadStreaming(wr + k + 96);
      GemvAccumulate<kT>(r0, xt, xs, k, tn, acc);
      GemvAccumulate<kT>(r1, xt, xs, k + 32, tn, acc);
      GemvAccumulate<kT>(r2, xt, xs, k + 64, tn, acc);
      GemvAccumulate<kT>(r3, xt, xs, k + 96, tn, acc);
    }
    for (; k < chunks; k += 32) GemvAccumulate<kT>(LoadStreaming(wr + k), xt, xs, k, tn, acc);
  } else {  // f8 e4m3: 16 values a piece, all in one block of scale_inv's row for this weight row
    const uint4* wr = reinterpret_cast<const uint4*>(static_cast<const uint8_t*>(p.w) + r * p.w_stride);
    const float* sr = p.scale + (r / p.block_n) * p.scale_stride;
    const int64_t chunks = in / 16;
    const int shift = __ffsll(p.block_k / 16) - 1;  // pieces per scale block: a power of two (GemvFanOutFits)
    for (; k + 96 < chunks; k += 128) {
      const uint4 r0 = LoadStreaming(wr + k), r1 = LoadStreaming(wr + k + 32), r2 = LoadStreaming(wr + k + 64),
                  r3 = LoadStreaming(wr + k + 96);
      GemvAccumulateF8<kT>(r0, sr[k >> shift], xt, xs, k, tn, acc);
      GemvAccumulateF8<kT>(r1, sr[(k + 32) >> shift], xt, xs, k + 32, tn, acc);
      GemvAccumulateF8<kT>(r2, sr[(k + 64) >> shift], xt, xs, k + 64, tn, acc);
      GemvAccumulateF8<kT>(r3, sr[(k + 96) >> shift], xt, xs, k + 96, tn, acc);
    }
    for (; k < chunks; k += 32) GemvAccumulateF8<kT>(LoadStreaming(wr + k), sr[k >> shift], xt, xs, k, tn, acc);
  }
  const float bv = p.bias != nullptr ? Load(p.bias, p.bias_dtype, r) : 0.0f;
#pragma unroll
  for (int j = 0; j < kT; ++j) {
    const float v = WarpSum(acc[j]);
    if (lane == 0 && j < tn) p.out[(t0 + j) * p.out_stride + r] = v + bv;
  }
}

// HeadLinear on bf16 weights for decode-sized batches: block (tile of kGemvWarps rows, head, kT tokens), one warp
// per output row streaming it in 16-byte pieces (GemvAccumulate), the head's x rows xs0 apart.
template <int kT>
__global__ void __launch_bounds__(kGemvWarps * 32)
    HeadGemvBf16Kernel(const float* x, int64_t xs0, int64_t xs1, int64_t n, int64_t in, const void* w, int64_t m,
                       float* out, int64_t os0, int64_t os1) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kGemvWarps + warp, h = blockIdx.y;
  const int64_t t0 = static_cast<int64_t>(blockIdx.z) * kT;
  if (r >= m) return;
  const int64_t tn = min(static_cast<int64_t>(kT), n - t0);
  const float* xt = x + t0 * xs0 + h * xs1;
  const uint4* wr = reinterpret_cast<const uint4*>(static_cast<const __nv_bfloat16*>(w) + (h * m + r) * in);
  float acc[kT];
#pragma unroll
  for (int j = 0; j < kT; ++j) acc[j] = 0.0f;
  const int64_t chunks = in / 8;
  int64_t k = lane;
  for (; k + 32 < chunks; k += 64) {
    const uint4 r0 = LoadStreaming(wr + k), r1 = LoadStreaming(wr + k + 32);
    GemvAccumulate<kT>(r0, xt, xs0, k, tn, acc);
    GemvAccumulate<kT>(r1, xt, xs0, k + 32, tn, acc);
  }
  for (; k < chunks; k += 32) GemvAccumulate<kT>(LoadStreaming(wr + k), xt, xs0, k, tn, acc);
#pragma unroll
  for (int j = 0; j < kT; ++j) {
    const float v = WarpSum(acc[j]);
    if (lane == 0 && j < tn) out[(t0 + j) * os0 + h * os1 + r] = v;
  }
}

template <int kT>
void LaunchFanOut(const float* x, int64_t xs, int64_t n, int64_t in, const GemvParts& g, cudaStream_t s) {
  dim3 grid(static_cast<unsigned>(g.first_block[g.count]), static_cast<unsigned>((n + kT - 1) / kT));
  GemvFanOutKernel<kT><<<grid, kGemvWarps * 32, 0, s>>>(x, xs, n, in, g);
}

// RMSNorm with the row held in registers (float4 per thread, kPer of them): one read and one write of x.
template <int kPer>
__global__ void __launch_bounds__(512)
    RmsNormVecKernel(float* x, int64_t xs, const float* add, int64_t as, const void* w, int wd, float eps, float* out,
                     int64_t os, int64_t cols) {
  const int64_t r = blockIdx.x, nv = cols / 4;
  float4* xr = reinterpret_cast<float4*>(x + r * xs);
  const float4* ar = add != nullptr ? reinterpret_cast<const float4*>(add + r * as) : nullptr;
  float4 v[kPer];
  float ss = 0.0f;
#pragma unroll
  for (int p = 0; p < kPer; ++p) {
    const int64_t i = threadIdx.x + static_cast<int64_t>(p) * blockDim.x;
    if (i < nv) {
      float4 a = xr[i];
      if (ar != nullptr) {
        const float4 b = ar[i];
        a.x += b.x;
        a.y += b.y;
        a.z += b.z;
        a.w += b.w;
        xr[i] = a;
      }
      v[p] = a;
      ss += a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w;
    }
  }
  ss = BlockSum(ss);
  const float inv = rsqrtf(ss / static_cast<float>(cols) + eps);
  float4* orow = reinterpret_cast<float4*>(out + r * os);
#pragma unroll
  for (int p = 0; p < kPer; ++p) {
    const int64_t i = threadIdx.x + static_cast<int64_t>(p) * blockDim.x;
    if (i < nv) {
      float4 o;
      o.x = Load(w, wd, 4 * i) * (v[p].x * inv);
      o.y = Load(w, wd, 4 * i + 1) * (v[p].y * inv);
      o.z = Load(w, wd, 4 * i + 2) * (v[p].z * inv);
      o.w = Load(w, wd, 4 * i + 3) * (v[p].w * inv);
      orow[i] = o;
    }
  }
}

__global__ void RopeWriteCacheKernel(RopeWriteArgs a) {
  const int64_t t = blockIdx.x, h = blockIdx.y;
  const float* c = a.cos + t * a.half;
  const float* sn = a.sin + t * a.half;
  const bool is_q = h < a.heads;
  const int64_t g = is_q ? 0 : h - a.heads;
  // Slot -1: a padding row of a captured graph's batch; it writes no cache.
  const bool write = !is_q && a.slot_mapping[t] >= 0;
  float* x = is_q ? a.q + t * a.q_s0 + h * a.q_s1 : a.k + t * a.k_s0 + g * a.k_s1;
  int64_t kbase = 0;
  if (write) {
    const int64_t slot = a.slot_mapping[t];
    kbase = (slot / a.block_size) * a.k_cache.s0 + (slot % a.block_size) * a.k_cache.s1 + g * a.k_cache.s2;
  }
  for (int64_t i = threadIdx.x; i < a.half; i += blockDim.x) {
    const int64_t ia = a.interleaved ? 2 * i : i, ib = a.interleaved ? 2 * i + 1 : i + a.half;
    const float x1 = x[ia], x2 = x[ib], cc = c[i], ss = sn[i];
    const float y1 = x1 * cc - x2 * ss, y2 = x2 * cc + x1 * ss;
    x[ia] = y1;
    x[ib] = y2;
    if (write) {
      Store(a.k_cache.data, a.k_cache.dtype, kbase + ia, y1);
      Store(a.k_cache.data, a.k_cache.dtype, kbase + ib, y2);
    }
  }
  if (!write) return;
  for (int64_t i = 2 * a.half + threadIdx.x; i < a.k_dim; i += blockDim.x) {
    Store(a.k_cache.data, a.k_cache.dtype, kbase + i, x[i]);
  }
  if (a.v == nullptr) return;
  const int64_t slot = a.slot_mapping[t];
  const int64_t vbase = (slot / a.block_size) * a.v_cache.s0 + (slot % a.block_size) * a.v_cache.s1 + g * a.v_cache.s2;
  const float* vr = a.v + t * a.v_s0 + g * a.v_s1;
  for (int64_t i = threadIdx.x; i < a.v_dim; i += blockDim.x) Store(a.v_cache.data, a.v_cache.dtype, vbase + i, vr[i]);
}

// Elementwise kernels: one block per (row, chunk of 256 columns), numbered row-major on a 1-d grid (a 2-d grid
// would cap rows at 65535), so that a single decode row still spreads over many SMs.
__global__ void AddKernel(float* a, int64_t as, const float* b, int64_t bs, int64_t cols) {
  const int64_t cb = (cols + blockDim.x - 1) / blockDim.x, r = blockIdx.x / cb;
  const int64_t i = static_cast<int64_t>(blockIdx.x % cb) * blockDim.x + threadIdx.x;
  if (i < cols) a[r * as + i] += b[r * bs + i];
}

__global__ void SiluMulKernel(const float* g, int64_t gs, const float* u, int64_t us, float* o, int64_t os,
                              int64_t cols) {
  const int64_t cb = (cols + blockDim.x - 1) / blockDim.x, r = blockIdx.x / cb;
  const int64_t i = static_cast<int64_t>(blockIdx.x % cb) * blockDim.x + threadIdx.x;
  if (i < cols) {
    const float gv = g[r * gs + i];
    o[r * os + i] = gv / (1.0f + expf(-gv)) * u[r * us + i];
  }
}

__global__ void RopeCosSinKernel(const int32_t* pos, const float* inv, int64_t half, float scale, float* c, float* s) {
  const int64_t t = blockIdx.x;
  for (int64_t i = threadIdx.x; i < half; i += blockDim.x) {
    const float angle = static_cast<float>(pos[t]) * inv[i];
    // Double precision sin/cos of the float angle, as the CPU reference and transformers do.
    c[t * half + i] = static_cast<float>(cos(static_cast<double>(angle))) * scale;
    s[t * half + i] = static_cast<float>(sin(static_cast<double>(angle))) * scale;
  }
}

__global__ void ApplyRopeKernel(float* x, int64_t heads, int64_t s0, int64_t s1, const float* c, const float* s,
                                int64_t half, bool interleaved) {
  const int64_t t = blockIdx.x;
  for (int64_t k = threadIdx.x; k < heads * half; k += blockDim.x) {
    const int64_t h = k / half, i = k % half;
    float* v = x + t * s0 + h * s1;
    const int64_t ia = interleaved ? 2 * i : i, ib = interleaved ? 2 * i + 1 : i + half;
    const float x1 = v[ia], x2 = v[ib], cc = c[t * half + i], sn = s[t * half + i];
    v[ia] = x1 * cc - x2 * sn;
    v[ib] = x2 * cc + x1 * sn;
  }
}

__global__ void WriteCacheKernel(const float* src, int64_t heads, int64_t dim, int64_t s0, int64_t s1,
                                 const int32_t* slots, int64_t bs, CacheView c) {
  const int64_t t = blockIdx.x;
  const int64_t slot = slots[t];
  if (slot < 0) return;  // a padding row: no cache write
  const int64_t base = (slot / bs) * c.s0 + (slot % bs) * c.s1;
  for (int64_t k = threadIdx.x; k < heads * dim; k += blockDim.x) {
    const int64_t h = k / dim, i = k % dim;
    Store(c.data, c.dtype, base + h * c.s2 + i, src[t * s0 + h * s1 + i]);
  }
}

// One block per (token, head). Scores for the whole causal context sit in dynamic shared memory.
__global__ void PagedAttentionKernel(AttentionArgs a) {
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
    const int64_t slot = static_cast<int64_t>(table[j / a.block_size]) * a.block_size + j % a.block_size;
    const int64_t base = (slot / a.block_size) * a.k.s0 + (slot % a.block_size) * a.k.s1 + g * a.k.s2;
    float d = 0.0f;
    for (int64_t i = lane; i < a.k_dim; i += 32) d += q[i] * Load(a.k.data, a.k.dtype, base + i);
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
      const int64_t slot = static_cast<int64_t>(table[j / a.block_size]) * a.block_size + j % a.block_size;
      const int64_t base = (slot / a.block_size) * a.v.s0 + (slot % a.block_size) * a.v.s1 + g * a.v.s2;
      acc += scores[j] * Load(a.v.data, a.v.dtype, base + i);
    }
    a.out[t * a.o_s0 + h * a.o_s1 + i] = acc * inv;
  }
}

// Flash-decoding: the causal context of each (token, head) is cut into chunks of kChunk keys, one block per chunk;
// each block writes its partial softmax state (max, sum, unnormalized V sum) and a second kernel merges them.
constexpr int kChunk = 64;
__global__ void SplitAttentionKernel(AttentionArgs a, int64_t chunks, float* part_m, float* part_l, float* part_acc) {
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
    const int64_t slot = static_cast<int64_t>(table[j / a.block_size]) * a.block_size + j % a.block_size;
    const int64_t base = (slot / a.block_size) * a.k.s0 + (slot % a.block_size) * a.k.s1 + g * a.k.s2;
    float d = 0.0f;
    for (int64_t i = lane; i < a.k_dim; i += 32) d += q[i] * Load(a.k.data, a.k.dtype, base + i);
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
      const int64_t slot = static_cast<int64_t>(table[j / a.block_size]) * a.block_size + j % a.block_size;
      const int64_t base = (slot / a.block_size) * a.v.s0 + (slot % a.block_size) * a.v.s1 + g * a.v.s2;
      acc += scores[j - j0] * Load(a.v.data, a.v.dtype, base + i);
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
constexpr int kAttnWarps = 4, kKeysPerStep = 4, kMaxGroup = 8, kAttnBlocksWanted = 1024;
static_assert(kMaxGroup == 8, "FinishGroupChunk takes [warps][8] states");

__device__ __forceinline__ float ToF(float v) {
  return v;
}
__device__ __forceinline__ float ToF(__half v) {
  return __half2float(v);
}
__device__ __forceinline__ float ToF(__nv_bfloat16 v) {
  return __bfloat162float(v);
}

template <typename T, int kPer>
__device__ __forceinline__ void LoadVec(const T* p, float* out) {
  constexpr int kBytes = kPer * static_cast<int>(sizeof(T));
  static_assert(kBytes == 4 || kBytes == 8 || kBytes == 16, "vector width");
  if constexpr (kBytes == 16) {
    const uint4 r = *reinterpret_cast<const uint4*>(p);
    const T* e = reinterpret_cast<const T*>(&r);
#pragma unroll
    for (int i = 0; i < kPer; ++i) out[i] = ToF(e[i]);
  } else if constexpr (kBytes == 8) {
    const uint2 r = *reinterpret_cast<const uint2*>(p);
    const T* e = reinterpret_cast<const T*>(&r);
#pragma unroll
    for (int i = 0; i < kPer; ++i) out[i] = ToF(e[i]);
  } else {
    const uint32_t r = *reinterpret_cast<const uint32_t*>(p);
    const T* e = reinterpret_cast<const T*>(&r);
#pragma unroll
    for (int i = 0; i < kPer; ++i) out[i] = ToF(e[i]);
  }
}

// Helpers of the group kernels (GqaAttentionKernel, MmaAttentionKernel): one block per (token, KV head, chunk).

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

template <typename T, int kD>
__global__ void __launch_bounds__(kAttnWarps * 32)
    GqaAttentionKernel(AttentionArgs a, int64_t chunk, int64_t chunks, float* part_m, float* part_l, float* part_acc) {
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

// Tensor-core flash-decoding for bf16/f16 caches, with the same grid, chunks and partial states as
// GqaAttentionKernel. Each warp takes tiles of 16 keys (its K and V rows staged in shared memory with 16-byte
// loads) and runs mma.m16n8k16 twice: S^T = K Q^T (16 keys x 8 query heads, the group padded to 8) and
// O^T += V^T P^T (head dims x 8 heads, V^T through ldmatrix.trans), with an online softmax in base 2 per head.
// Q (pre-scaled by scale * log2 e) and P are rounded to the cache dtype, as FlashAttention does; accumulation is
// float32. The fragment layouts are PTX's for m16n8k16: g = lane / 4, t = lane % 4.
constexpr int kMmaWarps = 4, kMmaTile = 16;

template <typename T, int kD>
__global__ void __launch_bounds__(kMmaWarps * 32)
    MmaAttentionKernel(AttentionArgs a, int64_t chunk, int64_t chunks, float* part_m, float* part_l, float* part_acc) {
  constexpr int kRow = kD + 8;  // shared row stride in elements: 16 bytes of padding against bank conflicts
  constexpr int kDT = kD / 16;
  constexpr int kTileBytes = kMmaTile * kRow * static_cast<int>(sizeof(T));
  constexpr int kLoopBytes = kMmaWarps * (2 * kTileBytes + kMmaTile * 8 * static_cast<int>(sizeof(T)));
  constexpr int kMergeBytes = kMmaWarps * 8 * kD * static_cast<int>(sizeof(float));
  // The tiles of the key loop and the warps' output states of the merge share one buffer.
  __shared__ __align__(16) unsigned char raw[kLoopBytes > kMergeBytes ? kLoopBytes : kMergeBytes];
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
  __syncthreads();
  uint32_t qb[kDT][2];
#pragma unroll
  for (int dt = 0; dt < kDT; ++dt) {
    qb[dt][0] = *reinterpret_cast<const uint32_t*>(&sq[g][dt * 16 + 2 * tq]);
    qb[dt][1] = *reinterpret_cast<const uint32_t*>(&sq[g][dt * 16 + 8 + 2 * tq]);
  }
  T* sk = reinterpret_cast<T*>(raw) + warp * 2 * kMmaTile * kRow;                        // [16][kRow]
  T* sv = sk + kMmaTile * kRow;                                                          // [16][kRow]
  T* sp = reinterpret_cast<T*>(raw + kMmaWarps * 2 * kTileBytes) + warp * kMmaTile * 8;  // P^T [16 keys][8 heads]
  const T* kc = static_cast<const T*>(a.k.data) + kvh * a.k.s2;
  const T* vc = static_cast<const T*>(a.v.data) + kvh * a.v.s2;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;  // heads 2tq and 2tq + 1
  float o[kDT][4];
#pragma unroll
  for (int dt = 0; dt < kDT; ++dt) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.0f;
  constexpr int kChunksPerRow = kD / 8;  // 16-byte pieces of a row
  for (int64_t jb = j0 + warp * kMmaTile; jb < j1; jb += kMmaWarps * kMmaTile) {
#pragma unroll
    for (int i = lane; i < kMmaTile * kChunksPerRow; i += 32) {
      const int r = i / kChunksPerRow, col = (i % kChunksPerRow) * 8;
      const int64_t j = jb + r;
      uint4 kv4 = make_uint4(0, 0, 0, 0), vv4 = make_uint4(0, 0, 0, 0);
      if (j < j1) {
        const int32_t jj = static_cast<int32_t>(j), bs = static_cast<int32_t>(a.block_size);
        const int64_t blk = table[jj / bs], off = jj % bs;
        kv4 = *reinterpret_cast<const uint4*>(kc + blk * a.k.s0 + off * a.k.s1 + col);
        vv4 = *reinterpret_cast<const uint4*>(vc + blk * a.v.s0 + off * a.v.s1 + col);
      }
      *reinterpret_cast<uint4*>(sk + r * kRow + col) = kv4;
      *reinterpret_cast<uint4*>(sv + r * kRow + col) = vv4;
    }
    __syncwarp();
    float s[4] = {0.0f, 0.0f, 0.0f, 0.0f};  // S^T: (key g, heads 2tq, 2tq+1), (key g + 8, same heads)
#pragma unroll
    for (int dt = 0; dt < kDT; ++dt) {
      uint32_t af[4];
      LdMatrixX4(af, sk + ((lane & 7) + ((lane >> 3) & 1) * 8) * kRow + dt * 16 + ((lane >> 4) & 1) * 8, false);
      Mma16816<T>(s, af, qb[dt][0], qb[dt][1]);
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
    sp[g * 8 + 2 * tq] = FromF<T>(p0);
    sp[g * 8 + 2 * tq + 1] = FromF<T>(p1);
    sp[(g + 8) * 8 + 2 * tq] = FromF<T>(p2);
    sp[(g + 8) * 8 + 2 * tq + 1] = FromF<T>(p3);
    __syncwarp();
    const uint32_t pb0 = Pack2<T>(sp[(2 * tq) * 8 + g], sp[(2 * tq + 1) * 8 + g]);
    const uint32_t pb1 = Pack2<T>(sp[(2 * tq + 8) * 8 + g], sp[(2 * tq + 9) * 8 + g]);
#pragma unroll
    for (int dt = 0; dt < kDT; ++dt) {
      uint32_t af[4];
      LdMatrixX4(af, sv + ((lane & 7) + ((lane >> 4) & 1) * 8) * kRow + dt * 16 + ((lane >> 3) & 1) * 8, true);
      Mma16816<T>(o[dt], af, pb0, pb1);
    }
    __syncwarp();
  }
#pragma unroll
  for (int off = 4; off < 32; off *= 2) {
    l0 += __shfl_xor_sync(0xffffffffu, l0, off);
    l1 += __shfl_xor_sync(0xffffffffu, l1, off);
  }
  __syncthreads();  // every warp is done with its tiles: the buffer now holds the warps' states
  float* sm_acc = reinterpret_cast<float*>(raw);  // [kMmaWarps][8][kD]
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

// MLA attention over the latent cache (the absorbed form: K is a token's 576-value latent row, V its first 512
// values, one KV head for every query head). A block takes one token, kMlaHeads query heads and a chunk of keys, in
// tiles of kMlaTile keys staged in shared memory once for all its heads (the generic kernel reads them once per
// head). Per tile, each warp computes S^T = K Q^T for its 16 keys x 16 heads (mma.m16n8k16; Q pre-scaled by
// scale * log2 e and rounded to the cache dtype), the warps share each head's tile maximum through shared memory so
// that they keep one running maximum, each writes P^T (rounded) for its keys, and then each warp accumulates
// O^T += V^T P^T over the whole tile for its 128 of the 512 value dims. Chunks and partial states are those of the
// other split kernels (MergeAttentionKernel combines them).
// KernelOptions::mla_attention = false (FATHOM_CUDA_NO_MLA_ATTENTION=1) turns it off: the generic kernels then
// serve MLA.
constexpr int kMlaK = 576, kMlaV = 512, kMlaHeads = 16, kMlaTile = 64, kMlaWarps = 4;
constexpr int kMlaRow = kMlaK + 8;  // shared row stride in elements: 16 bytes of padding against bank conflicts
constexpr int kMlaSmemBytes = (kMlaTile + kMlaHeads) * kMlaRow * 2 + kMlaTile * kMlaHeads * 2 +
                              2 * kMlaWarps * kMlaHeads * static_cast<int>(sizeof(float));
static_assert(kMlaWarps * 128 == kMlaV && kMlaWarps * 16 == kMlaTile, "one warp per 16 keys and per 128 value dims");

template <typename T>
__global__ void __launch_bounds__(kMlaWarps * 32)
    MlaAttentionKernel(AttentionArgs a, int64_t chunk, int64_t chunks, float* part_m, float* part_l, float* part_acc) {
  extern __shared__ __align__(16) unsigned char mla_smem[];
  T* sk = reinterpret_cast<T*>(mla_smem);                               // [kMlaTile][kMlaRow]: the tile's latent rows
  T* sq = sk + kMlaTile * kMlaRow;                                      // [kMlaHeads][kMlaRow]
  T* sp = sq + kMlaHeads * kMlaRow;                                     // P^T [kMlaTile][kMlaHeads]
  float* sm_max = reinterpret_cast<float*>(sp + kMlaTile * kMlaHeads);  // [kMlaWarps][kMlaHeads]
  float* sm_l = sm_max + kMlaWarps * kMlaHeads;                         // [kMlaWarps][kMlaHeads]
  const int64_t groups = a.heads / kMlaHeads;
  const int64_t t = blockIdx.x / groups, h0 = (blockIdx.x % groups) * kMlaHeads, c = blockIdx.y;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, tq = lane % 4;
  const int64_t j0 = c * chunk, j1 = min(static_cast<int64_t>(a.positions[t]) + 1, j0 + chunk);
  if (j0 >= j1) {  // past this token's context: weight 0 in the merge
    for (int h = threadIdx.x; h < kMlaHeads; h += blockDim.x) {
      const int64_t idx = (t * a.heads + h0 + h) * chunks + c;
      part_m[idx] = -INFINITY;
      part_l[idx] = 0.0f;
    }
    return;
  }
  const int32_t* table = a.block_tables + a.block_table_start[SeqOfToken(a, t)];
  constexpr float kLog2e = 1.4426950408889634f;
  const float qscale = a.scale * kLog2e;
  if (a.q_s1 % 4 == 0 && a.q_s0 % 4 == 0 && reinterpret_cast<uintptr_t>(a.q) % 16 == 0) {
#pragma unroll 6
    for (int e = threadIdx.x; e < kMlaHeads * kMlaK / 4; e += blockDim.x) {
      const int h = e / (kMlaK / 4), d = (e % (kMlaK / 4)) * 4;
      const float4 v = *reinterpret_cast<const float4*>(a.q + t * a.q_s0 + (h0 + h) * a.q_s1 + d);
      T* dst = sq + h * kMlaRow + d;
      dst[0] = FromF<T>(v.x * qscale);
      dst[1] = FromF<T>(v.y * qscale);
      dst[2] = FromF<T>(v.z * qscale);
      dst[3] = FromF<T>(v.w * qscale);
    }
  } else {
    for (int e = threadIdx.x; e < kMlaHeads * kMlaK; e += blockDim.x) {
      const int h = e / kMlaK, d = e % kMlaK;
      sq[h * kMlaRow + d] = FromF<T>(a.q[t * a.q_s0 + (h0 + h) * a.q_s1 + d] * qscale);
    }
  }
  const T* kc = static_cast<const T*>(a.k.data);
  float m[2][2], l[2][2];  // [n-tile][i]: head nt * 8 + 2 tq + i; the running max (log2 units), this warp's sum
  float o[8][2][4];        // O^T: dims warp * 128 + dt * 16 + (g, g + 8) x heads nt * 8 + 2 tq (+ 1)
#pragma unroll
  for (int nt = 0; nt < 2; ++nt) {
    m[nt][0] = m[nt][1] = -INFINITY;
    l[nt][0] = l[nt][1] = 0.0f;
#pragma unroll
    for (int dt = 0; dt < 8; ++dt) o[dt][nt][0] = o[dt][nt][1] = o[dt][nt][2] = o[dt][nt][3] = 0.0f;
  }
  constexpr int kPieces = kMlaK / 8;  // 16-byte pieces of a latent row
  for (int64_t jb = j0; jb < j1; jb += kMlaTile) {
    __syncthreads();  // the previous tile is consumed (and, on the first pass, Q is in place)
    // All of the tile's 16-byte pieces in flight at once (cp.async; rows past the context filled with zeros).
    for (int i = threadIdx.x; i < kMlaTile * kPieces; i += blockDim.x) {
      const int r = i / kPieces, col = (i % kPieces) * 8;
      const int64_t j = jb + r;
      const T* src = kc;
      if (j < j1) {  // 32-bit division: the 64-bit one is a long emulated sequence, once per 16-byte piece
        const int32_t jj = static_cast<int32_t>(j), bs = static_cast<int32_t>(a.block_size);
        src = kc + static_cast<int64_t>(table[jj / bs]) * a.k.s0 + static_cast<int64_t>(jj % bs) * a.k.s1 + col;
      }
      CpAsync16(sk + r * kMlaRow + col, src, j < j1 ? 16 : 0);
    }
    CpAsyncCommit();
    CpAsyncWait<0>();
    __syncthreads();
    float s[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};  // (key g | g + 8) x (head 2tq, 2tq + 1)
    const T* kw = sk + warp * 16 * kMlaRow;
#pragma unroll 4
    for (int dt = 0; dt < kMlaK / 16; ++dt) {
      uint32_t af[4];
      LdMatrixX4(af, kw + ((lane & 7) + ((lane >> 3) & 1) * 8) * kMlaRow + dt * 16 + ((lane >> 4) & 1) * 8, false);
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        const T* qr = sq + (nt * 8 + g) * kMlaRow + dt * 16 + 2 * tq;
        Mma16816<T>(s[nt], af, *reinterpret_cast<const uint32_t*>(qr), *reinterpret_cast<const uint32_t*>(qr + 8));
      }
    }
    const int64_t key0 = jb + warp * 16;
    float x[2][2];
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      if (key0 + g >= j1) s[nt][0] = s[nt][1] = -INFINITY;
      if (key0 + g + 8 >= j1) s[nt][2] = s[nt][3] = -INFINITY;
      x[nt][0] = fmaxf(s[nt][0], s[nt][2]);
      x[nt][1] = fmaxf(s[nt][1], s[nt][3]);
#pragma unroll
      for (int off = 4; off < 32; off *= 2) {
        x[nt][0] = fmaxf(x[nt][0], __shfl_xor_sync(0xffffffffu, x[nt][0], off));
        x[nt][1] = fmaxf(x[nt][1], __shfl_xor_sync(0xffffffffu, x[nt][1], off));
      }
      if (g == 0) {
        sm_max[warp * kMlaHeads + nt * 8 + 2 * tq] = x[nt][0];
        sm_max[warp * kMlaHeads + nt * 8 + 2 * tq + 1] = x[nt][1];
      }
    }
    __syncthreads();
    float cf[2][2];
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int h = nt * 8 + 2 * tq + i;
        float tile_max = sm_max[h];
#pragma unroll
        for (int w = 1; w < kMlaWarps; ++w) tile_max = fmaxf(tile_max, sm_max[w * kMlaHeads + h]);
        const float nm = fmaxf(m[nt][i], tile_max);  // finite: key jb is in range
        cf[nt][i] = exp2f(m[nt][i] - nm);
        m[nt][i] = nm;
      }
      const float p0 = exp2f(s[nt][0] - m[nt][0]), p1 = exp2f(s[nt][1] - m[nt][1]);
      const float p2 = exp2f(s[nt][2] - m[nt][0]), p3 = exp2f(s[nt][3] - m[nt][1]);
      l[nt][0] = l[nt][0] * cf[nt][0] + p0 + p2;
      l[nt][1] = l[nt][1] * cf[nt][1] + p1 + p3;
      T* pr = sp + (warp * 16 + g) * kMlaHeads + nt * 8 + 2 * tq;
      pr[0] = FromF<T>(p0);
      pr[1] = FromF<T>(p1);
      pr[8 * kMlaHeads] = FromF<T>(p2);
      pr[8 * kMlaHeads + 1] = FromF<T>(p3);
#pragma unroll
      for (int dt = 0; dt < 8; ++dt) {
        o[dt][nt][0] *= cf[nt][0];
        o[dt][nt][1] *= cf[nt][1];
        o[dt][nt][2] *= cf[nt][0];
        o[dt][nt][3] *= cf[nt][1];
      }
    }
    __syncthreads();  // every warp's P^T is in place
#pragma unroll
    for (int kt = 0; kt < kMlaTile / 16; ++kt) {
      uint32_t pb[2][2];
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        const T* pc = sp + (kt * 16 + 2 * tq) * kMlaHeads + nt * 8 + g;  // keys 2tq, 2tq + 1 (+ 8, + 9), head g
        pb[nt][0] = Pack2<T>(pc[0], pc[kMlaHeads]);
        pb[nt][1] = Pack2<T>(pc[8 * kMlaHeads], pc[9 * kMlaHeads]);
      }
#pragma unroll
      for (int dt = 0; dt < 8; ++dt) {
        uint32_t af[4];
        LdMatrixX4(af,
                   sk + (kt * 16 + (lane & 7) + ((lane >> 4) & 1) * 8) * kMlaRow + warp * 128 + dt * 16 +
                       ((lane >> 3) & 1) * 8,
                   true);
        Mma16816<T>(o[dt][0], af, pb[0][0], pb[0][1]);
        Mma16816<T>(o[dt][1], af, pb[1][0], pb[1][1]);
      }
    }
  }
  // Each head's sum over the block's keys: over the lanes that share tq, then over the warps.
#pragma unroll
  for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
#pragma unroll
      for (int off = 4; off < 32; off *= 2) l[nt][i] += __shfl_xor_sync(0xffffffffu, l[nt][i], off);
      if (g == 0) sm_l[warp * kMlaHeads + nt * 8 + 2 * tq + i] = l[nt][i];
    }
  }
  __syncthreads();
  float total[2][2];
#pragma unroll
  for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int h = nt * 8 + 2 * tq + i;
      total[nt][i] = 0.0f;
#pragma unroll
      for (int w = 0; w < kMlaWarps; ++w) total[nt][i] += sm_l[w * kMlaHeads + h];
      if (chunks > 1 && warp == 0 && g == 0) {
        const int64_t idx = (t * a.heads + h0 + h) * chunks + c;
        part_m[idx] = m[nt][i] * 0.6931471805599453f;  // the merge kernel works in natural-log units
        part_l[idx] = total[nt][i];
      }
    }
  }
#pragma unroll
  for (int dt = 0; dt < 8; ++dt) {
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t d = warp * 128 + dt * 16 + g + (e >= 2 ? 8 : 0);
        const int i = e & 1;
        const int64_t h = h0 + nt * 8 + 2 * tq + i;
        if (chunks == 1) {
          a.out[t * a.o_s0 + h * a.o_s1 + d] = o[dt][nt][e] / total[nt][i];
        } else {
          part_acc[((t * a.heads + h) * chunks + c) * kMlaV + d] = o[dt][nt][e];
        }
      }
    }
  }
}

// The MLA kernel's conditions: 576/512 dims with V the first 512 values of K's rows, one KV head, a multiple of 16
// query heads, a 16-bit cache with 16-byte aligned rows.
bool MlaFits(const AttentionArgs& a) {
  if (a.k_dim != kMlaK || a.v_dim != kMlaV || a.kv_heads != 1 || a.heads % kMlaHeads != 0) return false;
  if (a.k.data != a.v.data || a.k.s0 != a.v.s0 || a.k.s1 != a.v.s1) return false;
  if (a.k.dtype != kF16 && a.k.dtype != kBF16) return false;
  return a.k.s0 % 8 == 0 && a.k.s1 % 8 == 0 && reinterpret_cast<uintptr_t>(a.k.data) % 16 == 0;
}

// The tensor-core kernel's conditions: 16-bit caches, head dim 64 or 128, groups of up to 8, rows 16-byte aligned.
bool MmaFits(const AttentionArgs& a) {
  if (a.k_dim != a.v_dim || (a.k_dim != 64 && a.k_dim != 128)) return false;
  if (a.kv_heads <= 0 || a.heads % a.kv_heads != 0 || a.heads / a.kv_heads > 8) return false;
  if (a.k.dtype != a.v.dtype || (a.k.dtype != kF16 && a.k.dtype != kBF16)) return false;
  for (const CacheView* c : {&a.k, &a.v}) {
    if (c->s0 % 8 != 0 || c->s1 % 8 != 0 || c->s2 % 8 != 0) return false;
    if (reinterpret_cast<uintptr_t>(c->data) % 16 != 0) return false;
  }
  return true;
}

bool GqaFits(const AttentionArgs& a) {
  if (a.k_dim != a.v_dim || (a.k_dim != 64 && a.k_dim != 128)) return false;
  if (a.kv_heads <= 0 || a.heads % a.kv_heads != 0 || a.heads / a.kv_heads > kMaxGroup) return false;
  if (a.k.dtype != a.v.dtype || (a.k.dtype != kF32 && a.k.dtype != kF16 && a.k.dtype != kBF16)) return false;
  // Each lane reads k_dim / 32 consecutive values of a K or V row in one vector load.
  const int64_t per = a.k_dim / 32;
  const int64_t bytes = a.k.dtype == kF32 ? 4 : 2;
  for (const CacheView* c : {&a.k, &a.v}) {
    if (c->s0 % per != 0 || c->s1 % per != 0 || c->s2 % per != 0) return false;
    if (reinterpret_cast<uintptr_t>(c->data) % static_cast<uintptr_t>(per * bytes) != 0) return false;
  }
  return true;
}

// Keys per block of a group kernel: enough blocks (n * kv_heads * chunks) to fill the GPU, in multiples of `step`,
// the keys its warps walk per pass.
int64_t GroupChunk(const AttentionArgs& a, int64_t step) {
  const int64_t base = std::max<int64_t>(a.n * a.kv_heads, 1);
  const int64_t want = std::max<int64_t>(kAttnBlocksWanted / base, 1);
  const int64_t chunk = (std::max<int64_t>(a.max_seq_len, 1) + want - 1) / want;
  return (chunk + step - 1) / step * step;
}

using GroupKernel = void (*)(AttentionArgs, int64_t, int64_t, float*, float*, float*);

// Launches a group kernel (its head-dim-64 or -128 instance) on the (token x KV head, chunk) grid.
void LaunchGroup(GroupKernel k64, GroupKernel k128, int warps, const AttentionArgs& a, int64_t chunk, int64_t chunks,
                 float* pm, float* pl, float* pa, cudaStream_t s) {
  const dim3 grid(static_cast<unsigned>(a.n * a.kv_heads), static_cast<unsigned>(chunks));
  (a.k_dim == 64 ? k64 : k128)<<<grid, warps * 32, 0, s>>>(a, chunk, chunks, pm, pl, pa);
}

template <typename T>
void LaunchGqa(const AttentionArgs& a, int64_t chunk, int64_t chunks, float* pm, float* pl, float* pa, cudaStream_t s) {
  LaunchGroup(GqaAttentionKernel<T, 64>, GqaAttentionKernel<T, 128>, kAttnWarps, a, chunk, chunks, pm, pl, pa, s);
}

__global__ void ToBf16Kernel(const float* x, int64_t xs, int64_t cols, __nv_bfloat16* out) {
  const int64_t cb = (cols + blockDim.x - 1) / blockDim.x, r = blockIdx.x / cb;
  const int64_t i = static_cast<int64_t>(blockIdx.x % cb) * blockDim.x + threadIdx.x;
  if (i < cols) out[r * cols + i] = __float2bfloat16_rn(x[r * xs + i]);
}

__global__ void AddBiasKernel(float* out, int64_t os, const void* bias, int bd, int64_t cols) {
  const int64_t cb = (cols + blockDim.x - 1) / blockDim.x, r = blockIdx.x / cb;
  const int64_t i = static_cast<int64_t>(blockIdx.x % cb) * blockDim.x + threadIdx.x;
  if (i < cols) out[r * os + i] += Load(bias, bd, i);
}

__global__ void GatherKernel(const float* x, int64_t xs, const int32_t* idx, int64_t d, float* out, int64_t os) {
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

// One block per row: each thread scans a strided slice (float4 loads when aligned), then (value, index) pairs are
// reduced with ties going to the lower index, which matches std::max_element.
__device__ __forceinline__ void ArgMaxPick(float& v, int64_t& i, float ov, int64_t oi) {
  if (ov > v || (ov == v && oi < i)) {
    v = ov;
    i = oi;
  }
}

__global__ void ArgMaxKernel(const float* x, int64_t xs, int64_t cols, int32_t* ids) {
  const float* row = x + static_cast<int64_t>(blockIdx.x) * xs;
  float best = -INFINITY;
  int64_t best_i = cols;  // loses every tie against a real index
  const bool vec = reinterpret_cast<uintptr_t>(row) % 16 == 0;
  int64_t start = 0;
  if (vec) {
    const int64_t nv = cols / 4;
    const float4* r4 = reinterpret_cast<const float4*>(row);
    for (int64_t j = threadIdx.x; j < nv; j += blockDim.x) {
      const float4 v = r4[j];
      ArgMaxPick(best, best_i, v.x, 4 * j);
      ArgMaxPick(best, best_i, v.y, 4 * j + 1);
      ArgMaxPick(best, best_i, v.z, 4 * j + 2);
      ArgMaxPick(best, best_i, v.w, 4 * j + 3);
    }
    start = nv * 4;
  }
  for (int64_t j = start + threadIdx.x; j < cols; j += blockDim.x) ArgMaxPick(best, best_i, row[j], j);
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, best, o);
    const int64_t oi = __shfl_xor_sync(0xffffffffu, best_i, o);
    ArgMaxPick(best, best_i, ov, oi);
  }
  __shared__ float sv[32];
  __shared__ int64_t si[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) {
    sv[warp] = best;
    si[warp] = best_i;
  }
  __syncthreads();
  if (warp == 0) {
    const int warps = blockDim.x / 32;
    best = lane < warps ? sv[lane] : -INFINITY;
    best_i = lane < warps ? si[lane] : cols;
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, best, o);
      const int64_t oi = __shfl_xor_sync(0xffffffffu, best_i, o);
      ArgMaxPick(best, best_i, ov, oi);
    }
    // A row of NaNs only (no value compares greater): index 0, as std::max_element returns.
    if (lane == 0) ids[blockIdx.x] = static_cast<int32_t>(best_i >= cols ? 0 : best_i);
  }
}

__global__ void CopyKernel(const float* src, int64_t s0, int64_t s1, float* dst, int64_t d0s, int64_t d1s, int64_t d1,
                           int64_t inner) {
  const int64_t a = blockIdx.x / d1, b = blockIdx.x % d1;
  for (int64_t i = threadIdx.x; i < inner; i += blockDim.x) dst[a * d0s + b * d1s + i] = src[a * s0 + b * s1 + i];
}

}  // namespace

int LaunchEmbedding(const int32_t* ids, int64_t n, const void* table, int td, int64_t ts, int64_t hidden, float* out,
                    int64_t os, Stream s) {
  if (n == 0) return 0;
  EmbeddingKernel<<<static_cast<unsigned>(n), 256, 0, S(s)>>>(ids, table, td, ts, hidden, out, os);
  return Done();
}

int LaunchRmsNorm(float* x, int64_t xs, const float* add, int64_t as, const void* w, int wd, float eps, float* out,
                  int64_t os, int64_t rows, int64_t cols, Stream s) {
  if (rows == 0) return 0;
  const auto a16 = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  const int64_t nv = cols / 4;
  if (cols % 4 == 0 && xs % 4 == 0 && os % 4 == 0 && a16(x) && a16(out) &&
      (add == nullptr || (as % 4 == 0 && a16(add))) && nv <= 8 * 512) {
    const unsigned g = static_cast<unsigned>(rows);
    if (nv <= 512) {
      RmsNormVecKernel<1><<<g, 512, 0, S(s)>>>(x, xs, add, as, w, wd, eps, out, os, cols);
    } else if (nv <= 1024) {
      RmsNormVecKernel<2><<<g, 512, 0, S(s)>>>(x, xs, add, as, w, wd, eps, out, os, cols);
    } else if (nv <= 2048) {
      RmsNormVecKernel<4><<<g, 512, 0, S(s)>>>(x, xs, add, as, w, wd, eps, out, os, cols);
    } else {
      RmsNormVecKernel<8><<<g, 512, 0, S(s)>>>(x, xs, add, as, w, wd, eps, out, os, cols);
    }
    return Done();
  }
  RmsNormKernel<<<static_cast<unsigned>(rows), 256, 0, S(s)>>>(x, xs, add, as, w, wd, eps, out, os, cols);
  return Done();
}

int LaunchLinear(const float* x, int64_t xs, int64_t n, int64_t in, const void* w, int wd, int64_t ws, int64_t m,
                 const float* scale, int64_t ss, int64_t bn, int64_t bk, const void* bias, int bd, float* out,
                 int64_t os, bool generic, int sm_count, Stream s) {
  if (n == 0 || m == 0) return 0;
  constexpr int kWarps = 8;
  dim3 grid(Blocks(m, kWarps), static_cast<unsigned>((n + kTok - 1) / kTok));
  const bool aligned = reinterpret_cast<uintptr_t>(w) % 16 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
                       in % 8 == 0 && ws % 8 == 0 && xs % 4 == 0;
  if ((wd == kBF16 || wd == kF8) && aligned && !generic) {
    GemvPart part{w, ws, m, bias, bd, out, os};
    if (wd == kF8) {
      part.scale = scale;
      part.scale_stride = ss;
      part.block_n = bn;
      part.block_k = bk;
    }
    if (GemvFanOutFits(x, xs, n, in, part)) return LaunchGemvFanOut(x, xs, n, in, &part, 1, sm_count, s);
  }
  LinearKernel<<<grid, kWarps * 32, 0, S(s)>>>(x, xs, n, in, w, wd, ws, m, scale, ss, bn, bk, bias, bd, out, os, 0, 0,
                                               0);
  return Done();
}

int LaunchHeadLinear(const float* x, int64_t xs0, int64_t xs1, int64_t n, int64_t heads, int64_t in, const void* w,
                     int wd, int64_t m, float* out, int64_t os0, int64_t os1, Stream s) {
  if (n == 0 || m == 0 || heads == 0) return 0;
  if (heads > 65535 || wd == kF8) return static_cast<int>(cudaErrorInvalidValue);
  const bool aligned = in % 8 == 0 && xs0 % 4 == 0 && xs1 % 4 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(w) % 16 == 0;
  if (wd == kBF16 && aligned && n <= 8) {  // decode: one 16-byte-load GEMV per head
    const dim3 grid(Blocks(m, kGemvWarps), static_cast<unsigned>(heads), 1);
    if (n == 1) {
      HeadGemvBf16Kernel<1><<<grid, kGemvWarps * 32, 0, S(s)>>>(x, xs0, xs1, n, in, w, m, out, os0, os1);
    } else {
      HeadGemvBf16Kernel<8><<<grid, kGemvWarps * 32, 0, S(s)>>>(x, xs0, xs1, n, in, w, m, out, os0, os1);
    }
    return Done();
  }
  constexpr int kWarps = 8;
  dim3 grid(Blocks(m, kWarps), static_cast<unsigned>((n + kTok - 1) / kTok), static_cast<unsigned>(heads));
  LinearKernel<<<grid, kWarps * 32, 0, S(s)>>>(x, xs0, n, in, w, wd, in, m, nullptr, 0, 1, 1, nullptr, 0, out, os0, xs1,
                                               m * in, os1);
  return Done();
}

bool GemvFanOutFits(const float* x, int64_t xs, int64_t n, int64_t in, const GemvPart& p) {
  (void)n;
  const int64_t piece = p.scale != nullptr ? 16 : 8;  // values per 16-byte load
  return in % piece == 0 && p.w_stride % piece == 0 && xs % 4 == 0 && reinterpret_cast<uintptr_t>(p.w) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
         (p.scale == nullptr ||
          (p.block_k >= 16 && p.block_k % 16 == 0 && ((p.block_k / 16) & (p.block_k / 16 - 1)) == 0 && p.block_n > 0));
}

int LaunchGemvFanOut(const float* x, int64_t xs, int64_t n, int64_t in, const GemvPart* parts, int count, int sm_count,
                     Stream s) {
  if (n == 0 || count <= 0) return 0;
  if (count > kMaxGemvParts) return static_cast<int>(cudaErrorInvalidValue);
  GemvParts g{};
  g.count = count;
  int64_t blocks = 0;
  for (int i = 0; i < count; ++i) {
    g.p[i] = parts[i];
    g.first_block[i] = blocks;
    blocks += (parts[i].m + kGemvWarps - 1) / kGemvWarps;
  }
  g.first_block[count] = blocks;
  if (blocks == 0) return 0;
  if (n == 1) {
    LaunchFanOut<1>(x, xs, n, in, g, S(s));
  } else if (n == 2) {
    LaunchFanOut<2>(x, xs, n, in, g, S(s));
  } else if (n <= 4) {
    LaunchFanOut<4>(x, xs, n, in, g, S(s));
  } else if (n <= 8 || blocks * ((n + 7) / 8) >= kGemvFillPerSm * sm_count) {
    LaunchFanOut<8>(x, xs, n, in, g, S(s));
  } else {  // few rows (DeepSeek's float32 router) for many tokens: fewer tokens per warp, more blocks
    LaunchFanOut<1>(x, xs, n, in, g, S(s));
  }
  return Done();
}

int LaunchRopeWriteCache(const RopeWriteArgs& a, Stream s) {
  if (a.n == 0) return 0;
  RopeWriteCacheKernel<<<dim3(static_cast<unsigned>(a.n), static_cast<unsigned>(a.heads + a.kv_heads)), 64, 0, S(s)>>>(
      a);
  return Done();
}

int LaunchAddInPlace(float* a, int64_t as, const float* b, int64_t bs, int64_t rows, int64_t cols, Stream s) {
  if (rows == 0) return 0;
  AddKernel<<<RowBlocks(rows, cols), 256, 0, S(s)>>>(a, as, b, bs, cols);
  return Done();
}

int LaunchSiluMul(const float* g, int64_t gs, const float* u, int64_t us, float* o, int64_t os, int64_t rows,
                  int64_t cols, Stream s) {
  if (rows == 0) return 0;
  SiluMulKernel<<<RowBlocks(rows, cols), 256, 0, S(s)>>>(g, gs, u, us, o, os, cols);
  return Done();
}

int LaunchRopeCosSin(const int32_t* pos, int64_t n, const float* inv, int64_t half, float scale, float* c, float* sn,
                     Stream s) {
  if (n == 0) return 0;
  RopeCosSinKernel<<<static_cast<unsigned>(n), 64, 0, S(s)>>>(pos, inv, half, scale, c, sn);
  return Done();
}

int LaunchApplyRope(float* x, int64_t n, int64_t heads, int64_t s0, int64_t s1, const float* c, const float* sn,
                    int64_t half, bool interleaved, Stream s) {
  if (n == 0) return 0;
  ApplyRopeKernel<<<static_cast<unsigned>(n), 128, 0, S(s)>>>(x, heads, s0, s1, c, sn, half, interleaved);
  return Done();
}

int LaunchWriteCache(const float* src, int64_t n, int64_t heads, int64_t dim, int64_t s0, int64_t s1,
                     const int32_t* slots, int64_t bs, CacheView c, Stream s) {
  if (n == 0) return 0;
  WriteCacheKernel<<<static_cast<unsigned>(n), 128, 0, S(s)>>>(src, heads, dim, s0, s1, slots, bs, c);
  return Done();
}

namespace {

int64_t Chunks(const AttentionArgs& a, int64_t chunk) {
  return (std::max<int64_t>(a.max_seq_len, 1) + chunk - 1) / chunk;
}

using SplitKind = SplitAttentionKind;

bool SplitFits(const AttentionArgs& a, SplitKind kind) {
  switch (kind) {
    case SplitKind::kMla:
      return MlaFits(a);
    case SplitKind::kMma:
      return MmaFits(a);
    case SplitKind::kGqa:
      return GqaFits(a);
    case SplitKind::kPerHead:
      return true;
  }
  return false;
}

// MLA's decode chunks aim at about two waves of blocks (two fit an SM): 4 blocks per SM in all.
constexpr int64_t kMlaBlocksPerSm = 4;

int64_t SplitChunk(const AttentionArgs& a, SplitKind kind, int sm_count) {
  if (kind == SplitKind::kMla) {  // about two waves of blocks (two fit an SM), in whole tiles
    const int64_t base = std::max<int64_t>(a.n * (a.heads / kMlaHeads), 1);
    const int64_t want = std::max<int64_t>(kMlaBlocksPerSm * sm_count / base, 1);
    const int64_t chunk = (std::max<int64_t>(a.max_seq_len, 1) + want - 1) / want;
    return (chunk + kMlaTile - 1) / kMlaTile * kMlaTile;
  }
  if (kind == SplitKind::kMma) return GroupChunk(a, kMmaWarps * kMmaTile);
  return kind == SplitKind::kGqa ? GroupChunk(a, 2 * kAttnWarps * kKeysPerStep) : kChunk;
}

template <typename T>
void LaunchMma(const AttentionArgs& a, int64_t chunk, int64_t chunks, float* pm, float* pl, float* pa, cudaStream_t s) {
  LaunchGroup(MmaAttentionKernel<T, 64>, MmaAttentionKernel<T, 128>, kMmaWarps, a, chunk, chunks, pm, pl, pa, s);
}

}  // namespace

SplitAttentionKind ChooseSplitAttention(const AttentionArgs& a, const SplitAttentionKernels& allowed) {
  if (allowed.mla && MlaFits(a)) return SplitKind::kMla;
  if (allowed.mma && MmaFits(a)) return SplitKind::kMma;
  if (allowed.gqa && GqaFits(a)) return SplitKind::kGqa;
  return SplitKind::kPerHead;
}

int64_t SplitAttentionWorkspaceBytes(const AttentionArgs& a, SplitAttentionKind kind, int sm_count) {
  const int64_t chunks = Chunks(a, SplitChunk(a, kind, sm_count));
  if (kind != SplitKind::kPerHead && chunks == 1) return 0;
  return a.n * a.heads * chunks * (2 + a.v_dim) * static_cast<int64_t>(sizeof(float));
}

int LaunchSplitAttention(const AttentionArgs& a, SplitAttentionKind kind, int sm_count, void* workspace, Stream s) {
  if (a.n == 0) return 0;
  if (!SplitFits(a, kind)) return static_cast<int>(cudaErrorInvalidValue);
  const bool gqa = kind != SplitKind::kPerHead;
  const int64_t chunk = SplitChunk(a, kind, sm_count);
  const int64_t chunks = Chunks(a, chunk);
  float* part_m = static_cast<float*>(workspace);
  float* part_l = part_m + a.n * a.heads * chunks;
  float* part_acc = part_l + a.n * a.heads * chunks;
  if (gqa) {
    if (chunks > 1 && workspace == nullptr) return static_cast<int>(cudaErrorInvalidValue);
    if (kind == SplitKind::kMla) {
      const bool f16 = a.k.dtype == kF16;
      const auto kernel = f16 ? MlaAttentionKernel<__half> : MlaAttentionKernel<__nv_bfloat16>;
      // Once per kernel (a call costs microseconds of host time on every decode layer otherwise).
      static const cudaError_t attr_f16 =
          cudaFuncSetAttribute(MlaAttentionKernel<__half>, cudaFuncAttributeMaxDynamicSharedMemorySize, kMlaSmemBytes);
      static const cudaError_t attr_bf16 = cudaFuncSetAttribute(
          MlaAttentionKernel<__nv_bfloat16>, cudaFuncAttributeMaxDynamicSharedMemorySize, kMlaSmemBytes);
      const cudaError_t e = f16 ? attr_f16 : attr_bf16;
      if (e != cudaSuccess) return static_cast<int>(e);
      kernel<<<dim3(static_cast<unsigned>(a.n * (a.heads / kMlaHeads)), static_cast<unsigned>(chunks)), kMlaWarps * 32,
               kMlaSmemBytes, S(s)>>>(a, chunk, chunks, part_m, part_l, part_acc);
    } else if (kind == SplitKind::kMma) {
      if (a.k.dtype == kF16) {
        LaunchMma<__half>(a, chunk, chunks, part_m, part_l, part_acc, S(s));
      } else {
        LaunchMma<__nv_bfloat16>(a, chunk, chunks, part_m, part_l, part_acc, S(s));
      }
    } else if (a.k.dtype == kF32) {
      LaunchGqa<float>(a, chunk, chunks, part_m, part_l, part_acc, S(s));
    } else if (a.k.dtype == kF16) {
      LaunchGqa<__half>(a, chunk, chunks, part_m, part_l, part_acc, S(s));
    } else {
      LaunchGqa<__nv_bfloat16>(a, chunk, chunks, part_m, part_l, part_acc, S(s));
    }
    const int err = Done();
    if (err != 0 || chunks == 1) return err;
    MergeAttentionKernel<<<static_cast<unsigned>(a.n * a.heads), 128, static_cast<size_t>(chunks) * sizeof(float),
                           S(s)>>>(a, chunks, part_m, part_l, part_acc);
    return Done();
  }
  const size_t smem = static_cast<size_t>(a.k_dim) * sizeof(float);
  SplitAttentionKernel<<<dim3(static_cast<unsigned>(a.n * a.heads), static_cast<unsigned>(chunks)), 128, smem, S(s)>>>(
      a, chunks, part_m, part_l, part_acc);
  const int err = Done();
  if (err != 0) return err;
  MergeAttentionKernel<<<static_cast<unsigned>(a.n * a.heads), 128, static_cast<size_t>(chunks) * sizeof(float),
                         S(s)>>>(a, chunks, part_m, part_l, part_acc);
  return Done();
}

int LaunchPagedAttention(const AttentionArgs& a, Stream s) {
  if (a.n == 0) return 0;
  const size_t smem = static_cast<size_t>(a.k_dim + a.max_seq_len) * sizeof(float);
  if (smem > 48 * 1024) {
    const cudaError_t e =
        cudaFuncSetAttribute(PagedAttentionKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (e != cudaSuccess) return static_cast<int>(e);
  }
  PagedAttentionKernel<<<static_cast<unsigned>(a.n * a.heads), 128, smem, S(s)>>>(a);
  return Done();
}

// One thread per 16 weights of a row (k % 16 == 0, 16-byte aligned rows), else one per weight.
__global__ void DequantF8Kernel(const uint8_t* w, int64_t ws, int64_t m, int64_t k, const float* scale, int64_t ss,
                                int64_t bn, int64_t bk, __nv_bfloat16* out, bool vec) {
  const int64_t per = vec ? 16 : 1, pieces = k / per;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= m * pieces) return;
  const int64_t r = i / pieces, c0 = (i % pieces) * per;
  const float* sr = scale + (r / bn) * ss;
  if (vec) {  // 16 values share one block scale when bk % 16 == 0
    float f[16];
    F8x16(*reinterpret_cast<const uint4*>(w + r * ws + c0), sr[c0 / bk], f);
    uint32_t packed[8];
#pragma unroll
    for (int q = 0; q < 8; ++q) packed[q] = Pack2(__float2bfloat16_rn(f[2 * q]), __float2bfloat16_rn(f[2 * q + 1]));
    uint4* d = reinterpret_cast<uint4*>(out + r * k + c0);
    d[0] = make_uint4(packed[0], packed[1], packed[2], packed[3]);
    d[1] = make_uint4(packed[4], packed[5], packed[6], packed[7]);
  } else {
    __nv_fp8_e4m3 v;
    v.__x = w[r * ws + c0];
    out[r * k + c0] = __float2bfloat16_rn(static_cast<float>(v) * sr[c0 / bk]);
  }
}

int LaunchDequantF8ToBf16(const void* w, int64_t ws, int64_t m, int64_t k, const float* scale, int64_t ss, int64_t bn,
                          int64_t bk, void* out, Stream s) {
  if (m == 0 || k == 0) return 0;
  const bool vec = k % 16 == 0 && ws % 16 == 0 && bk % 16 == 0 && reinterpret_cast<uintptr_t>(w) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(out) % 16 == 0;
  const int64_t threads = m * (vec ? k / 16 : k);
  DequantF8Kernel<<<static_cast<unsigned>((threads + 255) / 256), 256, 0, S(s)>>>(
      static_cast<const uint8_t*>(w), ws, m, k, scale, ss, bn, bk, static_cast<__nv_bfloat16*>(out), vec);
  return Done();
}

// One warp per (token, group of 128 columns), four values a lane.
constexpr int kQuantWarps = 8;
__global__ void __launch_bounds__(kQuantWarps * 32)
    QuantizeF8Kernel(const float* x, int64_t xs, int64_t n, int64_t n_pad, int64_t k, uint8_t* xq, float* scales) {
  const int64_t groups = k / 128;
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kQuantWarps + threadIdx.x / 32;
  if (item >= n_pad * groups) return;
  const int64_t t = item / groups, g = item % groups;
  const int lane = static_cast<int>(threadIdx.x % 32);
  float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  if (t < n) v = reinterpret_cast<const float4*>(x + t * xs + g * 128)[lane];
  float amax = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  const float scale = amax > 0.0f ? amax / 448.0f : 1.0f;
  const __nv_fp8x2_storage_t lo = __nv_cvt_float2_to_fp8x2(make_float2(v.x / scale, v.y / scale), __NV_SATFINITE,
                                                           __NV_E4M3),
                             hi = __nv_cvt_float2_to_fp8x2(make_float2(v.z / scale, v.w / scale), __NV_SATFINITE,
                                                           __NV_E4M3);
  reinterpret_cast<uint32_t*>(xq + t * k + g * 128)[lane] =
      static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
  if (lane == 0) scales[g * n_pad + t] = scale;
}

int LaunchQuantizeF8(const float* x, int64_t xs, int64_t n, int64_t n_pad, int64_t k, void* xq, float* scales,
                     Stream s) {
  if (n_pad == 0) return 0;
  if (k % 128 != 0 || xs % 4 != 0 || n_pad < n || reinterpret_cast<uintptr_t>(x) % 16 != 0) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  const int64_t items = n_pad * (k / 128);
  QuantizeF8Kernel<<<static_cast<unsigned>((items + kQuantWarps - 1) / kQuantWarps), kQuantWarps * 32, 0, S(s)>>>(
      x, xs, n, n_pad, k, static_cast<uint8_t*>(xq), scales);
  return Done();
}

// Block per output row: the row's sequence and position from a scan of seq_lens (sequences are few), then its slot.
__global__ void GatherContextKernel(CacheView cache, int64_t d, const int32_t* seq_lens, const int32_t* bts,
                                    const int32_t* bt, int64_t num_seqs, int64_t bs, float* out, int64_t os) {
  const int64_t row = blockIdx.x;
  int64_t s = 0, start = 0;
  while (s + 1 < num_seqs && start + seq_lens[s] <= row) start += seq_lens[s++];
  const int64_t j = row - start;
  const int64_t block = bt[bts[s] + j / bs], off = j % bs;
  const int64_t base = block * cache.s0 + off * cache.s1;
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) out[row * os + i] = Load(cache.data, cache.dtype, base + i);
}

int LaunchGatherContext(CacheView cache, int64_t d, const int32_t* seq_lens, const int32_t* block_table_start,
                        const int32_t* block_tables, int64_t num_seqs, int64_t block_size, int64_t total_rows,
                        float* out, int64_t os, Stream s) {
  if (total_rows == 0) return 0;
  if (num_seqs <= 0) return static_cast<int>(cudaErrorInvalidValue);
  GatherContextKernel<<<static_cast<unsigned>(total_rows), 128, 0, S(s)>>>(cache, d, seq_lens, block_table_start,
                                                                           block_tables, num_seqs, block_size, out, os);
  return Done();
}

constexpr int kCtxWarps = 4, kCtxMaxV = 256;
// One warp per (token, head): keys 0 .. position of the token's sequence in order, an online softmax, the values
// accumulated in registers (v_dim / 32 per lane).
__global__ void __launch_bounds__(kCtxWarps * 32) MlaContextAttentionKernel(MlaContextArgs a) {
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int64_t t = blockIdx.x, h = static_cast<int64_t>(blockIdx.y) * kCtxWarps + threadIdx.x / 32;
  if (h >= a.heads) return;
  int64_t s = 0, base = 0;
  while (s + 1 < a.num_seqs && a.query_start[s + 1] <= t) base += a.seq_lens[s++];
  const int64_t ctx = min(static_cast<int64_t>(a.positions[t]) + 1, static_cast<int64_t>(a.seq_lens[s]));
  const float* q = a.q + t * a.qs0 + h * a.qs1;
  float acc[kCtxMaxV / 32];
#pragma unroll
  for (int i = 0; i < kCtxMaxV / 32; ++i) acc[i] = 0.0f;
  float m = -INFINITY, l = 0.0f;
  for (int64_t j = 0; j < ctx; ++j) {
    const float* kn = a.k_nope + (base + j) * a.kns0 + h * a.kns1;
    const float* kr = a.k_rope + (base + j) * a.krs0;
    float dot = 0.0f;
    for (int64_t i = lane; i < a.nope; i += 32) dot += q[i] * kn[i];
    for (int64_t i = lane; i < a.rope; i += 32) dot += q[a.nope + i] * kr[i];
    dot = WarpSum(dot) * a.scale;
    const float m_new = fmaxf(m, dot), c = expf(m - m_new), p = expf(dot - m_new);
    l = l * c + p;
    const float* vr = a.v + (base + j) * a.vs0 + h * a.vs1;
#pragma unroll
    for (int i = 0; i < kCtxMaxV / 32; ++i) {
      const int64_t col = lane + 32 * i;
      if (col < a.v_dim) acc[i] = acc[i] * c + p * vr[col];
    }
    m = m_new;
  }
  float* o = a.out + t * a.os0 + h * a.os1;
  const float inv = 1.0f / l;
#pragma unroll
  for (int i = 0; i < kCtxMaxV / 32; ++i) {
    const int64_t col = lane + 32 * i;
    if (col < a.v_dim) o[col] = acc[i] * inv;
  }
}

// The tensor-core form of MlaContextAttention for DeepSeek's head sizes (nope 128, rope 64, v 128), flash-attention
// style: a block takes 64 query rows of one sequence and one head (4 warps x 16 rows) and walks the sequence's keys in
// tiles of 64 up to its last row's position. Q (pre-scaled by scale * log2 e) stays in registers as mma A fragments;
// each tile's keys [k_nope | k_rope] and values are rounded to bf16 into shared memory; S = Q K^T and O += P V by
// mma.m16n8k16 (P from S's accumulators, V's fragments by ldmatrix.trans), with an online softmax per row.
constexpr int kCtxQK = 192, kCtxNope = 128, kCtxV = 128, kCtxTile = 64, kCtxMmaWarps = 4;
constexpr int kCtxQRow = kCtxQK + 8, kCtxVRow = kCtxV + 8;  // shared row strides (elements): 16 bytes of padding
constexpr int kCtxSmemBytes = (2 * kCtxTile * kCtxQRow + kCtxTile * kCtxVRow) * 2;

bool MlaContextMmaFits(const MlaContextArgs& a) {
  if (a.nope != kCtxNope || a.nope + a.rope != kCtxQK || a.v_dim != kCtxV) return false;
  for (int64_t st : {a.qs0, a.qs1, a.kns0, a.kns1, a.krs0, a.vs0, a.vs1}) {
    if (st % 4 != 0) return false;
  }
  for (const void* p : {static_cast<const void*>(a.q), static_cast<const void*>(a.k_nope),
                        static_cast<const void*>(a.k_rope), static_cast<const void*>(a.v)}) {
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  }
  return true;
}

__global__ void __launch_bounds__(kCtxMmaWarps * 32) MlaContextMmaKernel(MlaContextArgs a) {
  extern __shared__ __align__(16) unsigned char ctx_smem[];
  __nv_bfloat16* sq = reinterpret_cast<__nv_bfloat16*>(ctx_smem);  // [kCtxTile][kCtxQRow]: Q rows
  __nv_bfloat16* sk = sq + kCtxTile * kCtxQRow;                    // [kCtxTile][kCtxQRow]: the tile's keys
  __nv_bfloat16* sv = sk + kCtxTile * kCtxQRow;                    // [kCtxTile][kCtxVRow]: the tile's values
  // This block's sequence and query tile.
  int64_t s = 0, base = 0, tile = blockIdx.x;
  for (;;) {
    if (s >= a.num_seqs) return;  // past the last tile
    const int64_t q_len = a.query_start[s + 1] - a.query_start[s];
    const int64_t tiles = (q_len + kCtxTile - 1) / kCtxTile;
    if (tile < tiles) break;
    tile -= tiles;
    base += a.seq_lens[s];
    ++s;
  }
  const int64_t h = blockIdx.y, row0 = a.query_start[s] + tile * kCtxTile;
  const int64_t rows = min(static_cast<int64_t>(kCtxTile), static_cast<int64_t>(a.query_start[s + 1]) - row0);
  const int64_t len = a.seq_lens[s];
  const int64_t last_pos = min(static_cast<int64_t>(a.positions[row0 + rows - 1]), len - 1);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, tq = lane % 4;
  constexpr float kLog2e = 1.4426950408889634f;
  const float qscale = a.scale * kLog2e;
  for (int e = tid; e < kCtxTile * (kCtxQK / 4); e += blockDim.x) {
    const int r = e / (kCtxQK / 4), d = (e % (kCtxQK / 4)) * 4;
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (r < rows) v = *reinterpret_cast<const float4*>(a.q + (row0 + r) * a.qs0 + h * a.qs1 + d);
    __nv_bfloat16* dst = sq + r * kCtxQRow + d;
    dst[0] = __float2bfloat16(v.x * qscale);
    dst[1] = __float2bfloat16(v.y * qscale);
    dst[2] = __float2bfloat16(v.z * qscale);
    dst[3] = __float2bfloat16(v.w * qscale);
  }
  __syncthreads();
  uint32_t qf[kCtxQK / 16][4];
#pragma unroll
  for (int kt = 0; kt < kCtxQK / 16; ++kt) {
    LdMatrixX4(qf[kt], sq + (warp * 16 + (lane & 15)) * kCtxQRow + kt * 16 + (lane >> 4) * 8, false);
  }
  // Positions of this thread's two rows (g and g + 8 of the warp's 16); rows past the tile take the last one's.
  int64_t pos[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int64_t r = warp * 16 + g + 8 * i;
    pos[i] = r < rows ? static_cast<int64_t>(a.positions[row0 + r]) : last_pos;
  }
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  float o[kCtxV / 8][4];
#pragma unroll
  for (int nt = 0; nt < kCtxV / 8; ++nt) o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.0f;
  for (int64_t kb = 0; kb <= last_pos; kb += kCtxTile) {
    __syncthreads();  // the previous tile is consumed
    for (int e = tid; e < kCtxTile * ((kCtxQK + kCtxV) / 4); e += blockDim.x) {
      const int r = e / ((kCtxQK + kCtxV) / 4), c = (e % ((kCtxQK + kCtxV) / 4)) * 4;
      const int64_t j = kb + r;
      float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      __nv_bfloat16* dst;
      if (c < kCtxNope) {
        if (j < len) v = *reinterpret_cast<const float4*>(a.k_nope + (base + j) * a.kns0 + h * a.kns1 + c);
        dst = sk + r * kCtxQRow + c;
      } else if (c < kCtxQK) {
        if (j < len) v = *reinterpret_cast<const float4*>(a.k_rope + (base + j) * a.krs0 + (c - kCtxNope));
        dst = sk + r * kCtxQRow + c;
      } else {
        if (j < len) v = *reinterpret_cast<const float4*>(a.v + (base + j) * a.vs0 + h * a.vs1 + (c - kCtxQK));
        dst = sv + r * kCtxVRow + (c - kCtxQK);
      }
      dst[0] = __float2bfloat16(v.x);
      dst[1] = __float2bfloat16(v.y);
      dst[2] = __float2bfloat16(v.z);
      dst[3] = __float2bfloat16(v.w);
    }
    __syncthreads();
    float sc[kCtxTile / 8][4];  // S: rows (g, g + 8) x keys nt * 8 + 2 tq (+ 1)
#pragma unroll
    for (int nt = 0; nt < kCtxTile / 8; ++nt) sc[nt][0] = sc[nt][1] = sc[nt][2] = sc[nt][3] = 0.0f;
#pragma unroll
    for (int kt = 0; kt < kCtxQK / 16; ++kt) {
#pragma unroll
      for (int nt = 0; nt < kCtxTile / 8; ++nt) {
        const __nv_bfloat16* kr = sk + (nt * 8 + g) * kCtxQRow + kt * 16 + 2 * tq;
        Mma16816<__nv_bfloat16>(sc[nt], qf[kt], *reinterpret_cast<const uint32_t*>(kr),
                                *reinterpret_cast<const uint32_t*>(kr + 8));
      }
    }
    float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nt = 0; nt < kCtxTile / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = e / 2;
        const int64_t key = kb + nt * 8 + 2 * tq + (e & 1);
        if (key > pos[i] || key >= len) sc[nt][e] = -INFINITY;
        tile_max[i] = fmaxf(tile_max[i], sc[nt][e]);
      }
    }
    float cf[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      tile_max[i] = fmaxf(tile_max[i], __shfl_xor_sync(0xffffffffu, tile_max[i], 1));
      tile_max[i] = fmaxf(tile_max[i], __shfl_xor_sync(0xffffffffu, tile_max[i], 2));
      const float nm = fmaxf(m[i], tile_max[i]);  // finite: key 0 is in every row's first tile
      cf[i] = exp2f(m[i] - nm);
      m[i] = nm;
      l[i] *= cf[i];
    }
#pragma unroll
    for (int nt = 0; nt < kCtxV / 8; ++nt) {
      o[nt][0] *= cf[0];
      o[nt][1] *= cf[0];
      o[nt][2] *= cf[1];
      o[nt][3] *= cf[1];
    }
    uint32_t pa[kCtxTile / 16][4];  // P as A fragments, 16 keys each
#pragma unroll
    for (int nt = 0; nt < kCtxTile / 8; ++nt) {
      const float p0 = exp2f(sc[nt][0] - m[0]), p1 = exp2f(sc[nt][1] - m[0]);
      const float p2 = exp2f(sc[nt][2] - m[1]), p3 = exp2f(sc[nt][3] - m[1]);
      l[0] += p0 + p1;
      l[1] += p2 + p3;
      const int kt = nt / 2, half = nt % 2;
      pa[kt][2 * half] = Pack2(__float2bfloat16(p0), __float2bfloat16(p1));
      pa[kt][2 * half + 1] = Pack2(__float2bfloat16(p2), __float2bfloat16(p3));
    }
#pragma unroll
    for (int kt = 0; kt < kCtxTile / 16; ++kt) {
#pragma unroll
      for (int nt = 0; nt < kCtxV / 8; nt += 2) {
        uint32_t vf[4];
        LdMatrixX4(vf, sv + (kt * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * kCtxVRow + nt * 8 + ((lane >> 4) & 1) * 8,
                   true);
        Mma16816<__nv_bfloat16>(o[nt], pa[kt], vf[0], vf[1]);
        Mma16816<__nv_bfloat16>(o[nt + 1], pa[kt], vf[2], vf[3]);
      }
    }
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int64_t r = warp * 16 + g + 8 * i;
    if (r >= rows) continue;
    float* out = a.out + (row0 + r) * a.os0 + h * a.os1;
    const float inv = 1.0f / l[i];
#pragma unroll
    for (int nt = 0; nt < kCtxV / 8; ++nt) {
      out[nt * 8 + 2 * tq] = o[nt][2 * i] * inv;
      out[nt * 8 + 2 * tq + 1] = o[nt][2 * i + 1] * inv;
    }
  }
}

int LaunchMlaContextAttention(const MlaContextArgs& a, bool mma, Stream s) {
  if (a.n == 0 || a.heads == 0) return 0;
  if (a.num_seqs <= 0) return static_cast<int>(cudaErrorInvalidValue);
  // The tensor-core kernel where its tiles fit (`mma`: KernelOptions::mla_context_mma), else the plain float32 one.
  if (mma && MlaContextMmaFits(a)) {
    static const cudaError_t attr =
        cudaFuncSetAttribute(MlaContextMmaKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kCtxSmemBytes);
    if (attr != cudaSuccess) return static_cast<int>(attr);
    // Blocks for every query tile there can be; those past the last one return at once.
    const int64_t tiles = a.n / kCtxTile + a.num_seqs;
    MlaContextMmaKernel<<<dim3(static_cast<unsigned>(tiles), static_cast<unsigned>(a.heads)), kCtxMmaWarps * 32,
                          kCtxSmemBytes, S(s)>>>(a);
    return Done();
  }
  if (a.v_dim > kCtxMaxV) return static_cast<int>(cudaErrorInvalidValue);
  const dim3 grid(static_cast<unsigned>(a.n), static_cast<unsigned>((a.heads + kCtxWarps - 1) / kCtxWarps));
  MlaContextAttentionKernel<<<grid, kCtxWarps * 32, 0, S(s)>>>(a);
  return Done();
}

int LaunchToBf16(const float* x, int64_t xs, int64_t rows, int64_t cols, void* out, Stream s) {
  if (rows == 0) return 0;
  ToBf16Kernel<<<RowBlocks(rows, cols), 256, 0, S(s)>>>(x, xs, cols, static_cast<__nv_bfloat16*>(out));
  return Done();
}

int LaunchAddBias(float* out, int64_t os, const void* bias, int bd, int64_t rows, int64_t cols, Stream s) {
  if (rows == 0) return 0;
  AddBiasKernel<<<RowBlocks(rows, cols), 256, 0, S(s)>>>(out, os, bias, bd, cols);
  return Done();
}

int LaunchGatherRows(const float* x, int64_t xs, const int32_t* idx, int64_t m, int64_t d, float* out, int64_t os,
                     Stream s) {
  if (m == 0) return 0;
  GatherKernel<<<static_cast<unsigned>(m), 256, 0, S(s)>>>(x, xs, idx, d, out, os);
  return Done();
}

int LaunchScatterAddRows(const float* x, int64_t xs, const int32_t* idx, const float* w, int64_t m, int64_t d,
                         float* out, int64_t os, int64_t rows, Stream s) {
  if (m == 0 || d == 0 || rows == 0) return 0;
  ScatterAddKernel<<<Blocks(rows, kScatterWarps), kScatterWarps * 32, 0, S(s)>>>(x, xs, idx, w, m, d, out, os, rows);
  return Done();
}

int LaunchArgMax(const float* x, int64_t xs, int64_t rows, int64_t cols, int32_t* ids, Stream s) {
  if (rows == 0) return 0;
  ArgMaxKernel<<<static_cast<unsigned>(rows), 1024, 0, S(s)>>>(x, xs, cols, ids);
  return Done();
}

__device__ uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// The same bits as core/dtype.h's F32ToBf16 (round to nearest even, NaN kept quiet).
__device__ uint16_t Bf16Bits(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

template <int kDtype>
__global__ void FillDummyKernel(void* out, int64_t n, uint64_t key, float scale, bool has_constant,
                                uint32_t constant_bits) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint64_t r = SplitMix64(key + static_cast<uint64_t>(i));
    const float u = static_cast<float>(r >> 40) * (1.0f / 16777216.0f);
    const float v = __fmul_rn(__fsub_rn(__fmul_rn(2.0f, u), 1.0f), scale);
    if constexpr (kDtype == kF32) {
      static_cast<uint32_t*>(out)[i] = has_constant ? constant_bits : __float_as_uint(v);
    } else if constexpr (kDtype == kBF16) {
      static_cast<uint16_t*>(out)[i] = has_constant ? static_cast<uint16_t>(constant_bits) : Bf16Bits(v);
    } else {
      static_cast<uint8_t*>(out)[i] =
          has_constant ? static_cast<uint8_t>(constant_bits) : static_cast<uint8_t>(r & 0xbf);
    }
  }
}

// The fill's grid-stride loop runs on at most this many blocks per SM.
constexpr int64_t kFillBlocksPerSm = 64;

int LaunchFillDummy(void* out, int dtype, int64_t n, uint64_t key, float scale, bool has_constant,
                    uint32_t constant_bits, int sm_count, Stream s) {
  if (n == 0) return 0;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((n + 255) / 256, kFillBlocksPerSm * sm_count));
  switch (dtype) {
    case kF32:
      FillDummyKernel<kF32><<<blocks, 256, 0, S(s)>>>(out, n, key, scale, has_constant, constant_bits);
      break;
    case kBF16:
      FillDummyKernel<kBF16><<<blocks, 256, 0, S(s)>>>(out, n, key, scale, has_constant, constant_bits);
      break;
    case kF8:
      FillDummyKernel<kF8><<<blocks, 256, 0, S(s)>>>(out, n, key, scale, has_constant, constant_bits);
      break;
    default:
      return static_cast<int>(cudaErrorInvalidValue);
  }
  return Done();
}

int LaunchCopy(const float* src, int64_t s0, int64_t s1, float* dst, int64_t d0s, int64_t d1s, int64_t d0, int64_t d1,
               int64_t inner, Stream s) {
  if (d0 * d1 == 0) return 0;
  CopyKernel<<<static_cast<unsigned>(d0 * d1), 128, 0, S(s)>>>(src, s0, s1, dst, d0s, d1s, d1, inner);
  return Done();
}

}  // namespace fathom::cuda
