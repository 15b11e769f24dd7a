// The linear-layer kernels (linear.h).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/dtype.cuh"
#include "backend/cuda/fp8.cuh"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/linear.h"
#include "backend/cuda/memory.cuh"
#include "backend/cuda/reduce.cuh"

namespace fathom::cuda {

namespace {

// One warp per output row r and a tile of up to kTok tokens: the weight row is read once per tile. blockIdx.z picks
// a head of HeadLinear: x, w and out move by their head strides (0 for a plain Linear). TW: the weight's element type
// (f8 e4m3 weights are scaled by their block's scale_inv); TB: the bias's.
constexpr int kTok = 8;
template <typename TW, typename TB>
__global__ void LinearKernel(const float* x, int64_t xs, int64_t n, int64_t in, const TW* w, int64_t ws, int64_t m,
                             const float* scale, int64_t ss, int64_t bn, int64_t bk, const TB* bias, float* out,
                             int64_t os, int64_t x_hs, int64_t w_hs, int64_t o_hs) {
  PdlPrologue();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  x += blockIdx.z * x_hs;
  out += blockIdx.z * o_hs;
  w += blockIdx.z * w_hs;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + warp;
  const int64_t t0 = static_cast<int64_t>(blockIdx.y) * kTok;
  if (r >= m) return;
  float acc[kTok];
#pragma unroll
  for (int j = 0; j < kTok; ++j) acc[j] = 0.0f;
  const int64_t tn = min(static_cast<int64_t>(kTok), n - t0);
  for (int64_t c = lane; c < in; c += 32) {
    float wv = Load(w, r * ws + c);
    if constexpr (kIsF8<TW>) wv *= scale[(r / bn) * ss + c / bk];
#pragma unroll
    for (int j = 0; j < kTok; ++j) {
      if (j < tn) acc[j] += x[(t0 + j) * xs + c] * wv;
    }
  }
  const float b = bias != nullptr ? Load(bias, r) : 0.0f;
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
  int prefetch_lines;  // 128-byte lines of each weight row taken into L2 before the kernel waits on the one before
};
constexpr int kGemvWarps = 8;
// Blocks per SM that keep every SM busy twice over: below kGemvFillPerSm * sm_count blocks, the GEMV takes one token
// per warp (each token's sum runs in the same order whatever the tokens per warp, so results do not depend on it).
constexpr int64_t kGemvFillPerSm = 2;

template <int kT, bool kF16 = false>
__device__ __forceinline__ void GemvAccumulate(const uint4& raw, const float* x, int64_t xs, int64_t k, int64_t tn,
                                               float* acc) {
  float wf[8];
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const float2 f = kF16 ? __half22float2(reinterpret_cast<const __half2*>(&raw)[e])
                          : __bfloat1622float2(reinterpret_cast<const __nv_bfloat162*>(&raw)[e]);
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

// TB: the element type of the parts' biases.
template <int kT, typename TB>
__global__ void __launch_bounds__(kGemvWarps * 32)
    GemvFanOutKernel(const float* x, int64_t xs, int64_t n, int64_t in, GemvParts parts) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  int pi = 0;
  while (pi + 1 < parts.count && static_cast<int64_t>(blockIdx.x) >= parts.first_block[pi + 1]) ++pi;
  const GemvPart& p = parts.p[pi];
  const int64_t r = (static_cast<int64_t>(blockIdx.x) - parts.first_block[pi]) * kGemvWarps + warp;
  const int64_t t0 = static_cast<int64_t>(blockIdx.y) * kT;
  if (r < p.m && parts.prefetch_lines > 0 && blockIdx.y == 0) {  // while the kernel before still runs (PDL)
    const int64_t bytes = p.scale != nullptr ? 1 : 2;
    const char* row = static_cast<const char*>(p.w) + r * p.w_stride * bytes;
    const int64_t lines = min(static_cast<int64_t>(parts.prefetch_lines), (in * bytes + 127) / 128);
    for (int64_t l = lane; l < lines; l += 32) PrefetchL2(row + l * 128);
  }
  PdlPrologue();
  if (r >= p.m) return;
  const int64_t tn = min(static_cast<int64_t>(kT), n - t0);
  const float* xt = x + t0 * xs;
  float acc[kT];
#pragma unroll
  for (int j = 0; j < kT; ++j) acc[j] = 0.0f;
  int64_t k = lane;
  if (p.scale == nullptr && p.f16) {  // f16: 8 values a piece
    const uint4* wr = reinterpret_cast<const uint4*>(static_cast<const __half*>(p.w) + r * p.w_stride);
    const int64_t chunks = in / 8;
    for (; k + 96 < chunks; k += 128) {
      const uint4 r0 = LoadStreaming(wr + k), r1 = LoadStreaming(wr + k + 32), r2 = LoadStreaming(wr + k + 64),
                  r3 = LoadStreaming(wr + k + 96);
      GemvAccumulate<kT, true>(r0, xt, xs, k, tn, acc);
      GemvAccumulate<kT, true>(r1, xt, xs, k + 32, tn, acc);
      GemvAccumulate<kT, true>(r2, xt, xs, k + 64, tn, acc);
      GemvAccumulate<kT, true>(r3, xt, xs, k + 96, tn, acc);
    }
    for (; k < chunks; k += 32) GemvAccumulate<kT, true>(LoadStreaming(wr + k), xt, xs, k, tn, acc);
  } else if (p.scale == nullptr) {  // bf16: 8 values a piece
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
  const float bv = p.bias != nullptr ? Load(static_cast<const TB*>(p.bias), r) : 0.0f;
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
  PdlPrologue();
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

template <int kT, typename TB>
void LaunchFanOut(const float* x, int64_t xs, int64_t n, int64_t in, const GemvParts& g, cudaStream_t s) {
  dim3 grid(static_cast<unsigned>(g.first_block[g.count]), static_cast<unsigned>((n + kT - 1) / kT));
  LaunchKernel(GemvFanOutKernel<kT, TB>, grid, kGemvWarps * 32, 0, s, x, xs, n, in, g);
}

__global__ void ToBf16Kernel(const float* x, int64_t xs, int64_t cols, __nv_bfloat16* out) {
  PdlPrologue();
  const int64_t cb = (cols + blockDim.x - 1) / blockDim.x, r = blockIdx.x / cb;
  const int64_t i = static_cast<int64_t>(blockIdx.x % cb) * blockDim.x + threadIdx.x;
  if (i < cols) out[r * cols + i] = __float2bfloat16_rn(x[r * xs + i]);
}

template <typename TB>
__global__ void AddBiasKernel(float* out, int64_t os, const TB* bias, int64_t cols) {
  PdlPrologue();
  const int64_t cb = (cols + blockDim.x - 1) / blockDim.x, r = blockIdx.x / cb;
  const int64_t i = static_cast<int64_t>(blockIdx.x % cb) * blockDim.x + threadIdx.x;
  if (i < cols) out[r * os + i] += Load(bias, i);
}

// The generic kernel on `grid`: W of dtype wd, a bias (or none) of dtype bd.
int LaunchLinearKernel(dim3 grid, int warps, const float* x, int64_t xs, int64_t n, int64_t in, const void* w, int wd,
                       int64_t ws, int64_t m, const float* scale, int64_t ss, int64_t bn, int64_t bk, const void* bias,
                       int bd, float* out, int64_t os, int64_t x_hs, int64_t w_hs, int64_t o_hs, cudaStream_t s) {
  return DispatchFloatOrF8(wd, [&](auto w_tag) {
    using TW = decltype(w_tag);
    return DispatchFloat(bias != nullptr ? bd : kF32, [&](auto b_tag) {
      using TB = decltype(b_tag);
      LaunchKernel(LinearKernel<TW, TB>, grid, warps * 32, 0, s, x, xs, n, in, static_cast<const TW*>(w), ws, m, scale,
                   ss, bn, bk, static_cast<const TB*>(bias), out, os, x_hs, w_hs, o_hs);
      return Done();
    });
  });
}

}  // namespace

int LaunchLinear(const float* x, int64_t xs, int64_t n, int64_t in, const void* w, int wd, int64_t ws, int64_t m,
                 const float* scale, int64_t ss, int64_t bn, int64_t bk, const void* bias, int bd, float* out,
                 int64_t os, bool generic, int sm_count, Stream s, int prefetch_bytes) {
  if (n == 0 || m == 0) return 0;
  constexpr int kWarps = 8;
  dim3 grid(Blocks(m, kWarps), static_cast<unsigned>((n + kTok - 1) / kTok));
  const bool aligned = reinterpret_cast<uintptr_t>(w) % 16 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
                       in % 8 == 0 && ws % 8 == 0 && xs % 4 == 0;
  if ((wd == kBF16 || wd == kF16 || wd == kF8) && aligned && !generic) {
    GemvPart part{w, ws, m, bias, bd, out, os};
    part.f16 = wd == kF16;
    if (wd == kF8) {
      part.scale = scale;
      part.scale_stride = ss;
      part.block_n = bn;
      part.block_k = bk;
    }
    if (GemvFanOutFits(x, xs, n, in, part)) {
      return LaunchGemvFanOut(x, xs, n, in, &part, 1, sm_count, s, prefetch_bytes);
    }
  }
  return LaunchLinearKernel(grid, kWarps, x, xs, n, in, w, wd, ws, m, scale, ss, bn, bk, bias, bd, out, os, 0, 0, 0,
                            S(s));
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
      LaunchKernel(HeadGemvBf16Kernel<1>, grid, kGemvWarps * 32, 0, S(s), x, xs0, xs1, n, in, w, m, out, os0, os1);
    } else {
      LaunchKernel(HeadGemvBf16Kernel<8>, grid, kGemvWarps * 32, 0, S(s), x, xs0, xs1, n, in, w, m, out, os0, os1);
    }
    return Done();
  }
  constexpr int kWarps = 8;
  dim3 grid(Blocks(m, kWarps), static_cast<unsigned>((n + kTok - 1) / kTok), static_cast<unsigned>(heads));
  return LaunchLinearKernel(grid, kWarps, x, xs0, n, in, w, wd, in, m, nullptr, 0, 1, 1, nullptr, 0, out, os0, xs1,
                            m * in, os1, S(s));
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
                     Stream s, int prefetch_bytes) {
  if (n == 0 || count <= 0) return 0;
  if (count > kMaxGemvParts) return static_cast<int>(cudaErrorInvalidValue);
  GemvParts g{};
  g.count = count;
  g.prefetch_lines = prefetch_bytes > 0 ? (prefetch_bytes + 127) / 128 : 0;
  int64_t blocks = 0;
  int bias_dtype = -1;  // the parts' biases share one dtype
  for (int i = 0; i < count; ++i) {
    g.p[i] = parts[i];
    g.first_block[i] = blocks;
    blocks += (parts[i].m + kGemvWarps - 1) / kGemvWarps;
    if (parts[i].bias != nullptr) {
      if (bias_dtype >= 0 && parts[i].bias_dtype != bias_dtype) return static_cast<int>(cudaErrorInvalidValue);
      bias_dtype = parts[i].bias_dtype;
    }
  }
  g.first_block[count] = blocks;
  if (blocks == 0) return 0;
  const int64_t fill = kGemvFillPerSm * sm_count;
  return DispatchFloat(bias_dtype >= 0 ? bias_dtype : kF32, [&](auto tag) {
    using TB = decltype(tag);
    if (n == 1) {
      LaunchFanOut<1, TB>(x, xs, n, in, g, S(s));
    } else if (n == 2) {
      LaunchFanOut<2, TB>(x, xs, n, in, g, S(s));
    } else if (n <= 4) {
      LaunchFanOut<4, TB>(x, xs, n, in, g, S(s));
    } else if (n <= 8 || blocks * ((n + 7) / 8) >= fill) {
      LaunchFanOut<8, TB>(x, xs, n, in, g, S(s));
    } else {  // few rows (DeepSeek's float32 router) for many tokens: fewer tokens per warp, more blocks
      LaunchFanOut<1, TB>(x, xs, n, in, g, S(s));
    }
    return Done();
  });
}

int LaunchToBf16(const float* x, int64_t xs, int64_t rows, int64_t cols, void* out, Stream s) {
  if (rows == 0) return 0;
  LaunchKernel(ToBf16Kernel, RowBlocks(rows, cols), 256, 0, S(s), x, xs, cols, static_cast<__nv_bfloat16*>(out));
  return Done();
}

int LaunchAddBias(float* out, int64_t os, const void* bias, int bd, int64_t rows, int64_t cols, Stream s) {
  if (rows == 0) return 0;
  return DispatchFloat(bd, [&](auto tag) {
    using TB = decltype(tag);
    LaunchKernel(AddBiasKernel<TB>, RowBlocks(rows, cols), 256, 0, S(s), out, os, static_cast<const TB*>(bias), cols);
    return Done();
  });
}

}  // namespace fathom::cuda
