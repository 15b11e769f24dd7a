// First, correctness-first CUDA kernels for the Backend ops (float32 activations). They follow the launcher pattern
// (pointers, strides, stream in; an error code out; no allocation) so that faster kernels can replace them one by
// one behind the same launchers.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

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
// contiguous bytes of the row per step; several steps stay in flight (unrolled). kT tokens share each weight load;
// the token count is a template parameter so that batch-1 decode keeps one accumulator (and full occupancy).
template <int kT>
__global__ void LinearBf16VecKernel(const float* x, int64_t xs, int64_t n, int64_t in, const __nv_bfloat16* w,
                                    int64_t ws, int64_t m, const void* bias, int bd, float* out, int64_t os) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + warp;
  const int64_t t0 = static_cast<int64_t>(blockIdx.y) * kT;
  if (r >= m) return;
  float acc[kT];
#pragma unroll
  for (int j = 0; j < kT; ++j) acc[j] = 0.0f;
  const int64_t tn = min(static_cast<int64_t>(kT), n - t0);
  const uint4* wr = reinterpret_cast<const uint4*>(w + r * ws);
  const int64_t chunks = in / 8;
#pragma unroll 4
  for (int64_t k = lane; k < chunks; k += 32) {
    const uint4 raw = __ldg(wr + k);
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
        const float4* xv = reinterpret_cast<const float4*>(x + (t0 + j) * xs + k * 8);
        const float4 a = __ldg(xv), b = __ldg(xv + 1);
        acc[j] += a.x * wf[0] + a.y * wf[1] + a.z * wf[2] + a.w * wf[3] + b.x * wf[4] + b.y * wf[5] + b.z * wf[6] +
                  b.w * wf[7];
      }
    }
  }
  const float bv = bias != nullptr ? Load(bias, bd, r) : 0.0f;
#pragma unroll
  for (int j = 0; j < kT; ++j) {
    const float v = WarpSum(acc[j]);
    if (lane == 0 && j < tn) out[(t0 + j) * os + r] = v + bv;
  }
}

template <int kT>
void LaunchBf16Vec(const float* x, int64_t xs, int64_t n, int64_t in, const void* w, int64_t ws, int64_t m,
                   const void* bias, int bd, float* out, int64_t os, cudaStream_t s) {
  constexpr int kWarps = 8;
  dim3 grid(static_cast<unsigned>((m + kWarps - 1) / kWarps), static_cast<unsigned>((n + kT - 1) / kT));
  LinearBf16VecKernel<kT>
      <<<grid, kWarps * 32, 0, s>>>(x, xs, n, in, static_cast<const __nv_bfloat16*>(w), ws, m, bias, bd, out, os);
}

// Elementwise kernels run on a 2-d grid: blockIdx.y is the row, blockIdx.x a chunk of 256 columns, so that a
// single decode row still spreads over many SMs.
__global__ void AddKernel(float* a, int64_t as, const float* b, int64_t bs, int64_t cols) {
  const int64_t r = blockIdx.y, i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < cols) a[r * as + i] += b[r * bs + i];
}

__global__ void SiluMulKernel(const float* g, int64_t gs, const float* u, int64_t us, float* o, int64_t os,
                              int64_t cols) {
  const int64_t r = blockIdx.y, i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
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

__global__ void MergeAttentionKernel(AttentionArgs a, int64_t chunks, const float* part_m, const float* part_l,
                                     const float* part_acc) {
  const int64_t th = blockIdx.x, t = th / a.heads, h = th % a.heads;
  float m = -INFINITY;
  for (int64_t c = 0; c < chunks; ++c) m = fmaxf(m, part_m[th * chunks + c]);
  float l = 0.0f;
  for (int64_t c = 0; c < chunks; ++c) {
    const float pm = part_m[th * chunks + c];
    if (pm != -INFINITY) l += part_l[th * chunks + c] * expf(pm - m);
  }
  const float inv = 1.0f / l;
  for (int64_t i = threadIdx.x; i < a.v_dim; i += blockDim.x) {
    float acc = 0.0f;
    for (int64_t c = 0; c < chunks; ++c) {
      const float pm = part_m[th * chunks + c];
      if (pm != -INFINITY) acc += part_acc[(th * chunks + c) * a.v_dim + i] * expf(pm - m);
    }
    a.out[t * a.o_s0 + h * a.o_s1 + i] = acc * inv;
  }
}

__global__ void ToBf16Kernel(const float* x, int64_t xs, int64_t cols, __nv_bfloat16* out) {
  const int64_t r = blockIdx.y, i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < cols) out[r * cols + i] = __float2bfloat16_rn(x[r * xs + i]);
}

__global__ void AddBiasKernel(float* out, int64_t os, const void* bias, int bd, int64_t cols) {
  const int64_t r = blockIdx.y, i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
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
    if (n == 1) {
      LaunchBf16Vec<1>(x, xs, n, in, w, ws, m, bias, bd, out, os, S(s));
    } else if (n == 2) {
      LaunchBf16Vec<2>(x, xs, n, in, w, ws, m, bias, bd, out, os, S(s));
    } else if (n <= 4) {
      LaunchBf16Vec<4>(x, xs, n, in, w, ws, m, bias, bd, out, os, S(s));
    } else {
      LaunchBf16Vec<kTok>(x, xs, n, in, w, ws, m, bias, bd, out, os, S(s));
    }
  } else {
    LinearKernel<<<grid, kWarps * 32, 0, S(s)>>>(x, xs, n, in, w, wd, ws, m, scale, ss, bn, bk, bias, bd, out, os);
  }
  return Done();
}

int LaunchAddInPlace(float* a, int64_t as, const float* b, int64_t bs, int64_t rows, int64_t cols, Stream s) {
  if (rows == 0) return 0;
  AddKernel<<<dim3(Blocks(cols, 256), static_cast<unsigned>(rows)), 256, 0, S(s)>>>(a, as, b, bs, cols);
  return Done();
}

int LaunchSiluMul(const float* g, int64_t gs, const float* u, int64_t us, float* o, int64_t os, int64_t rows,
                  int64_t cols, Stream s) {
  if (rows == 0) return 0;
  SiluMulKernel<<<dim3(Blocks(cols, 256), static_cast<unsigned>(rows)), 256, 0, S(s)>>>(g, gs, u, us, o, os, cols);
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

int64_t SplitAttentionWorkspaceBytes(const AttentionArgs& a) {
  const int64_t chunks = (a.max_seq_len + kChunk - 1) / kChunk;
  return a.n * a.heads * chunks * (2 + a.v_dim) * static_cast<int64_t>(sizeof(float));
}

int LaunchSplitAttention(const AttentionArgs& a, void* workspace, Stream s) {
  if (a.n == 0) return 0;
  const int64_t chunks = (a.max_seq_len + kChunk - 1) / kChunk;
  float* part_m = static_cast<float*>(workspace);
  float* part_l = part_m + a.n * a.heads * chunks;
  float* part_acc = part_l + a.n * a.heads * chunks;
  const size_t smem = static_cast<size_t>(a.k_dim) * sizeof(float);
  SplitAttentionKernel<<<dim3(static_cast<unsigned>(a.n * a.heads), static_cast<unsigned>(chunks)), 128, smem, S(s)>>>(
      a, chunks, part_m, part_l, part_acc);
  const int err = Done();
  if (err != 0) return err;
  MergeAttentionKernel<<<static_cast<unsigned>(a.n * a.heads), 128, 0, S(s)>>>(a, chunks, part_m, part_l, part_acc);
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
  ToBf16Kernel<<<dim3(Blocks(cols, 256), static_cast<unsigned>(rows)), 256, 0, S(s)>>>(
      x, xs, cols, static_cast<__nv_bfloat16*>(out));
  return Done();
}

int LaunchAddBias(float* out, int64_t os, const void* bias, int bd, int64_t rows, int64_t cols, Stream s) {
  if (rows == 0) return 0;
  AddBiasKernel<<<dim3(Blocks(cols, 256), static_cast<unsigned>(rows)), 256, 0, S(s)>>>(out, os, bias, bd, cols);
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

int LaunchCopy(const float* src, int64_t s0, int64_t s1, float* dst, int64_t d0s, int64_t d1s, int64_t d0, int64_t d1,
               int64_t inner, Stream s) {
  if (d0 * d1 == 0) return 0;
  CopyKernel<<<static_cast<unsigned>(d0 * d1), 128, 0, S(s)>>>(src, s0, s1, dst, d0s, d1s, d1, inner);
  return Done();
}

}  // namespace fathom::cuda
