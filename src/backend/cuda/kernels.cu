// First, correctness-first CUDA kernels for the Backend ops (float32 activations). They follow the launcher pattern
// (pointers, strides, stream in; an error code out; no allocation) so that faster kernels can replace them one by
// one behind the same launchers.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>

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

// One warp per output row r and a tile of up to kTok tokens: the weight row is read once per tile.
constexpr int kTok = 8;
__global__ void LinearKernel(const float* x, int64_t xs, int64_t n, int64_t in, const void* w, int wd, int64_t ws,
                             int64_t m, const float* scale, int64_t ss, int64_t bn, int64_t bk, const void* bias,
                             int bd, float* out, int64_t os) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
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

// bf16 weights with 16-byte aligned rows: each lane loads 8 weights (16 bytes) at a time, so a warp streams 512
// contiguous bytes of a row per load; four loads per lane are issued before any is used, and weights bypass L1
// (they are read once) so that x stays there. kT tokens share each weight load; the token count is a template
// parameter so that batch-1 decode keeps one accumulator. One launch covers several weights that share x (q/k/v,
// gate/up): blocks are numbered across the parts.
struct GemvParts {
  GemvPart p[kMaxGemvParts];
  int64_t first_block[kMaxGemvParts + 1];
  int count;
};
constexpr int kGemvWarps = 8;

__device__ __forceinline__ uint4 LoadStreaming(const uint4* p) {
  uint4 r;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(p));
  return r;
}

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

template <int kT>
__global__ void __launch_bounds__(kGemvWarps * 32)
    LinearBf16FanOutKernel(const float* x, int64_t xs, int64_t n, int64_t in, GemvParts parts) {
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
  const uint4* wr = reinterpret_cast<const uint4*>(static_cast<const __nv_bfloat16*>(p.w) + r * p.w_stride);
  const int64_t chunks = in / 8;
  int64_t k = lane;
  for (; k + 96 < chunks; k += 128) {
    const uint4 r0 = LoadStreaming(wr + k), r1 = LoadStreaming(wr + k + 32), r2 = LoadStreaming(wr + k + 64),
                r3 = LoadStreaming(wr + k + 96);
    GemvAccumulate<kT>(r0, xt, xs, k, tn, acc);
    GemvAccumulate<kT>(r1, xt, xs, k + 32, tn, acc);
    GemvAccumulate<kT>(r2, xt, xs, k + 64, tn, acc);
    GemvAccumulate<kT>(r3, xt, xs, k + 96, tn, acc);
  }
  for (; k < chunks; k += 32) GemvAccumulate<kT>(LoadStreaming(wr + k), xt, xs, k, tn, acc);
  const float bv = p.bias != nullptr ? Load(p.bias, p.bias_dtype, r) : 0.0f;
#pragma unroll
  for (int j = 0; j < kT; ++j) {
    const float v = WarpSum(acc[j]);
    if (lane == 0 && j < tn) p.out[(t0 + j) * p.out_stride + r] = v + bv;
  }
}

template <int kT>
void LaunchFanOut(const float* x, int64_t xs, int64_t n, int64_t in, const GemvParts& g, cudaStream_t s) {
  dim3 grid(static_cast<unsigned>(g.first_block[g.count]), static_cast<unsigned>((n + kT - 1) / kT));
  LinearBf16FanOutKernel<kT><<<grid, kGemvWarps * 32, 0, s>>>(x, xs, n, in, g);
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
  float* x = is_q ? a.q + t * a.q_s0 + h * a.q_s1 : a.k + t * a.k_s0 + g * a.k_s1;
  int64_t kbase = 0;
  if (!is_q) {
    const int64_t slot = a.slot_mapping[t];
    kbase = (slot / a.block_size) * a.k_cache.s0 + (slot % a.block_size) * a.k_cache.s1 + g * a.k_cache.s2;
  }
  for (int64_t i = threadIdx.x; i < a.half; i += blockDim.x) {
    const int64_t ia = a.interleaved ? 2 * i : i, ib = a.interleaved ? 2 * i + 1 : i + a.half;
    const float x1 = x[ia], x2 = x[ib], cc = c[i], ss = sn[i];
    const float y1 = x1 * cc - x2 * ss, y2 = x2 * cc + x1 * ss;
    x[ia] = y1;
    x[ib] = y2;
    if (!is_q) {
      Store(a.k_cache.data, a.k_cache.dtype, kbase + ia, y1);
      Store(a.k_cache.data, a.k_cache.dtype, kbase + ib, y2);
    }
  }
  if (is_q) return;
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
  for (int64_t i = threadIdx.x; i < a.v_dim; i += blockDim.x) {
    float acc = 0.0f;
#pragma unroll 4
    for (int64_t c = 0; c < chunks; ++c) {
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

template <typename T, int kD>
__global__ void __launch_bounds__(kAttnWarps * 32)
    GqaAttentionKernel(AttentionArgs a, int64_t chunk, int64_t chunks, float* part_m, float* part_l, float* part_acc) {
  constexpr int kPer = kD / 32;
  __shared__ float sm_m[kAttnWarps][kMaxGroup], sm_l[kAttnWarps][kMaxGroup];
  __shared__ float sm_acc[kAttnWarps][kMaxGroup][kD];
  const int64_t t = blockIdx.x / a.kv_heads, kvh = blockIdx.x % a.kv_heads, c = blockIdx.y;
  const int group = static_cast<int>(a.heads / a.kv_heads);
  const int64_t ctx = a.positions[t] + 1, j0 = c * chunk;
  if (j0 >= ctx) {  // past this token's causal context: an empty partial state
    if (threadIdx.x < group) {
      const int64_t idx = (t * a.heads + kvh * group + threadIdx.x) * chunks + c;
      part_m[idx] = -INFINITY;
      part_l[idx] = 0.0f;
    }
    return;
  }
  const int64_t j1 = min(ctx, j0 + chunk);
  int64_t lo = 0, hi = a.num_seqs - 1;  // the sequence of token t: the last one starting at or before t
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (a.query_start[mid] <= t) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  const int32_t* table = a.block_tables + a.block_table_start[lo];
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
  for (int e = threadIdx.x; e < group * kD; e += blockDim.x) {
    const int g = e / kD, d = e % kD;
    float mx = -INFINITY;
#pragma unroll
    for (int w = 0; w < kAttnWarps; ++w) mx = fmaxf(mx, sm_m[w][g]);
    float sum = 0.0f, val = 0.0f;
#pragma unroll
    for (int w = 0; w < kAttnWarps; ++w) {
      const float mw = sm_m[w][g];
      if (mw != -INFINITY) {
        const float f = expf(mw - mx);
        sum += sm_l[w][g] * f;
        val += sm_acc[w][g][d] * f;
      }
    }
    const int64_t h = kvh * group + g;
    if (chunks == 1) {
      a.out[t * a.o_s0 + h * a.o_s1 + d] = val / sum;
    } else {
      const int64_t idx = (t * a.heads + h) * chunks + c;
      part_acc[idx * a.v_dim + d] = val;
      if (d == 0) {
        part_m[idx] = mx;
        part_l[idx] = sum;
      }
    }
  }
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

// Keys per block: enough blocks (n * kv_heads * chunks) to fill the GPU, multiples of the keys a block walks per step.
int64_t GqaChunk(const AttentionArgs& a) {
  const int64_t base = std::max<int64_t>(a.n * a.kv_heads, 1);
  const int64_t want = std::max<int64_t>(kAttnBlocksWanted / base, 1);
  constexpr int64_t kStep = 2 * kAttnWarps * kKeysPerStep;
  int64_t chunk = (std::max<int64_t>(a.max_seq_len, 1) + want - 1) / want;
  chunk = (chunk + kStep - 1) / kStep * kStep;
  return chunk;
}

template <typename T>
void LaunchGqa(const AttentionArgs& a, int64_t chunk, int64_t chunks, float* pm, float* pl, float* pa, cudaStream_t s) {
  const dim3 grid(static_cast<unsigned>(a.n * a.kv_heads), static_cast<unsigned>(chunks));
  if (a.k_dim == 64) {
    GqaAttentionKernel<T, 64><<<grid, kAttnWarps * 32, 0, s>>>(a, chunk, chunks, pm, pl, pa);
  } else {
    GqaAttentionKernel<T, 128><<<grid, kAttnWarps * 32, 0, s>>>(a, chunk, chunks, pm, pl, pa);
  }
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

// Serial over rows, parallel over columns: a fixed accumulation order, as on the CPU.
__global__ void ScatterAddKernel(const float* x, int64_t xs, const int32_t* idx, const float* w, int64_t m, int64_t d,
                                 float* out, int64_t os) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= d) return;
  for (int64_t i = 0; i < m; ++i) out[idx[i] * os + c] += w[i] * x[i * xs + c];
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
                 int64_t os, Stream s) {
  if (n == 0 || m == 0) return 0;
  constexpr int kWarps = 8;
  dim3 grid(Blocks(m, kWarps), static_cast<unsigned>((n + kTok - 1) / kTok));
  const bool aligned = reinterpret_cast<uintptr_t>(w) % 16 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
                       in % 8 == 0 && ws % 8 == 0 && xs % 4 == 0;
  // FATHOM_CUDA_GENERIC_LINEAR=1 forces the generic kernel, to measure one against the other.
  static const bool force_generic = std::getenv("FATHOM_CUDA_GENERIC_LINEAR") != nullptr;
  if (wd == kBF16 && aligned && !force_generic) {
    const GemvPart part{w, ws, m, bias, bd, out, os};
    return LaunchLinearBf16FanOut(x, xs, n, in, &part, 1, s);
  } else {
    LinearKernel<<<grid, kWarps * 32, 0, S(s)>>>(x, xs, n, in, w, wd, ws, m, scale, ss, bn, bk, bias, bd, out, os);
  }
  return Done();
}

bool LinearBf16FanOutFits(const float* x, int64_t xs, int64_t n, int64_t in, const GemvPart& p) {
  (void)n;
  return in % 8 == 0 && p.w_stride % 8 == 0 && xs % 4 == 0 && reinterpret_cast<uintptr_t>(p.w) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(x) % 16 == 0;
}

int LaunchLinearBf16FanOut(const float* x, int64_t xs, int64_t n, int64_t in, const GemvPart* parts, int count,
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
  } else {
    LaunchFanOut<8>(x, xs, n, in, g, S(s));
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
}  // namespace

int64_t SplitAttentionWorkspaceBytes(const AttentionArgs& a) {
  const int64_t chunks = GqaFits(a) ? Chunks(a, GqaChunk(a)) : Chunks(a, kChunk);
  if (GqaFits(a) && chunks == 1) return 0;
  return a.n * a.heads * chunks * (2 + a.v_dim) * static_cast<int64_t>(sizeof(float));
}

int LaunchSplitAttention(const AttentionArgs& a, void* workspace, Stream s) {
  if (a.n == 0) return 0;
  static const bool no_gqa = std::getenv("FATHOM_CUDA_NO_GQA_ATTENTION") != nullptr;
  const bool gqa = GqaFits(a) && !no_gqa;
  const int64_t chunk = gqa ? GqaChunk(a) : kChunk;
  const int64_t chunks = Chunks(a, chunk);
  float* part_m = static_cast<float*>(workspace);
  float* part_l = part_m + a.n * a.heads * chunks;
  float* part_acc = part_l + a.n * a.heads * chunks;
  if (gqa) {
    if (chunks > 1 && workspace == nullptr) return static_cast<int>(cudaErrorInvalidValue);
    if (a.k.dtype == kF32) {
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
                         float* out, int64_t os, Stream s) {
  if (m == 0 || d == 0) return 0;
  ScatterAddKernel<<<Blocks(d, 256), 256, 0, S(s)>>>(x, xs, idx, w, m, d, out, os);
  return Done();
}

int LaunchArgMax(const float* x, int64_t xs, int64_t rows, int64_t cols, int32_t* ids, Stream s) {
  if (rows == 0) return 0;
  ArgMaxKernel<<<static_cast<unsigned>(rows), 1024, 0, S(s)>>>(x, xs, cols, ids);
  return Done();
}

int LaunchCopy(const float* src, int64_t s0, int64_t s1, float* dst, int64_t d0s, int64_t d1s, int64_t d0, int64_t d1,
               int64_t inner, Stream s) {
  if (d0 * d1 == 0) return 0;
  CopyKernel<<<static_cast<unsigned>(d0 * d1), 128, 0, S(s)>>>(src, s0, s1, dst, d0s, d1s, d1, inner);
  return Done();
}

}  // namespace fathom::cuda
