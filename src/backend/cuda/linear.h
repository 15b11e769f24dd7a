// Linear-layer kernels on float32 activations: the generic kernel (any weight dtype, f8 with its block scales), the
// fan-out GEMV that streams bf16 or f8 weights in 16-byte pieces for decode batches (several weights sharing x in one
// launch), the per-head form of MLA's absorbed projections, and the helpers of the cuBLASLt path (x rounded to bf16,
// a bias added after the GEMM). Launchers follow launcher.h.
//
//   cuda::GemvPart q{wq, in, m_q, bias_q, bias_dtype, out_q, m_q}, k{...}, v{...};
//   const cuda::GemvPart parts[] = {q, k, v};   // each GemvFanOutFits
//   int err = cuda::LaunchGemvFanOut(x, in, n, in, parts, 3, sm_count, stream);
#pragma once

#include <cstdint>

#include "backend/cuda/launcher.h"

namespace fathom::cuda {

// out[t, r] = sum_c x[t, c] * W[r, c] (* scale_inv[r / bn, c / bk] for f8) + bias[r]. W f32, f16, bf16 or f8 e4m3
// (w_dtype); bias (or null) f32, f16 or bf16. bf16 and f8 weights with 16-byte aligned rows take the GEMV
// (LaunchGemvFanOut, whose grid is sized by sm_count; prefetch_bytes as there) unless `generic` forces the generic
// kernel.
int LaunchLinear(const float* x, int64_t x_stride, int64_t n, int64_t in, const void* w, int w_dtype, int64_t w_stride,
                 int64_t m, const float* scale_inv, int64_t scale_stride, int64_t bn, int64_t bk, const void* bias,
                 int bias_dtype, float* out, int64_t out_stride, bool generic, int sm_count, Stream s,
                 int prefetch_bytes = 0);

// out[t, h, r] = sum_c x[t, h, c] * W[h, r, c] for every head h: x [n, heads, in] strides (xs0, xs1, 1); W f32, f16
// or bf16 [heads, m, in] contiguous; out [n, heads, m] strides (os0, os1, 1).
int LaunchHeadLinear(const float* x, int64_t xs0, int64_t xs1, int64_t n, int64_t heads, int64_t in, const void* w,
                     int wd, int64_t m, float* out, int64_t os0, int64_t os1, Stream s);

// Several weights that share the input x [n, in] (q/k/v, gate/up): one launch, one warp per output row, weights
// streamed once per tile of up to 8 tokens (decode-sized batches). Each part's weight is bf16, or f8 e4m3 with its
// float32 block scales (`scale` non-null). Needs GemvFanOutFits for every part, and one bias dtype for the parts that
// have a bias.
struct GemvPart {
  const void* w;  // bf16, f16 (f16 set) or f8 (scale set) [m, in], rows w_stride elements apart
  int64_t w_stride;
  int64_t m;
  const void* bias;  // [m] or null
  int bias_dtype;    // f32, f16 or bf16
  float* out;        // [n, m], rows out_stride apart
  int64_t out_stride;
  // f8 only: [ceil(m / block_n), ceil(in / block_k)], rows scale_stride apart; block_k / 16 a power of two.
  const float* scale = nullptr;
  int64_t scale_stride = 0;
  int64_t block_n = 128, block_k = 128;
  bool f16 = false;  // w is f16 (the unquantized tensors of AWQ/GPTQ checkpoints), not bf16
};
constexpr int kMaxGemvParts = 4;
bool GemvFanOutFits(const float* x, int64_t xs, int64_t n, int64_t in, const GemvPart& part);
// sm_count: the GPU's multiprocessors. Batches of more than 8 tokens take one token per warp where fewer than two
// blocks per SM would run otherwise (a token's result is the same either way). prefetch_bytes > 0 (KernelOptions::
// gemv_prefetch_bytes): each warp first takes that many bytes of its weight row into L2, before it waits on the
// kernel before (launch.cuh), so the weight stream starts while that kernel finishes; results are the same.
int LaunchGemvFanOut(const float* x, int64_t xs, int64_t n, int64_t in, const GemvPart* parts, int count, int sm_count,
                     Stream s, int prefetch_bytes = 0);

// out (contiguous bf16 [rows, cols]) = x (float32, row stride xs), rounded to nearest even.
int LaunchToBf16(const float* x, int64_t xs, int64_t rows, int64_t cols, void* out, Stream s);
// out[r, :] += bias (f32, f16 or bf16).
int LaunchAddBias(float* out, int64_t os, const void* bias, int bias_dtype, int64_t rows, int64_t cols, Stream s);

}  // namespace fathom::cuda
