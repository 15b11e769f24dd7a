// The block-scaled FP8 format's own kernels (DeepSeek-V3's f8 e4m3 weights with float32 scale_inv per 128 x 128
// block): the weight dequantized to bf16 for a bf16 GEMM (W8A16 prefill), and the activations quantized per token and
// 128 columns for cuBLASLt's block-scaled FP8 GEMM (W8A8, gemm.h's RunFp8). The f8 GEMV is linear.h's; the host side
// of both paths is CudaBackend's linear_fp8.cc. Launchers follow launcher.h.
//
//   cuda::LaunchQuantizeF8(x, xs, n, n_pad, k, xq, x_scales, stream);
//   gemm.RunFp8(xq, x_scales, n_pad, k, w, w_stride, w_scales, m, out, out_stride);
#pragma once

#include <cstdint>

#include "backend/cuda/launcher.h"

namespace fathom::cuda {

// out (contiguous bf16 [m, k]) = W (f8 e4m3 [m, k], rows ws apart) times its block scales [ceil(m / bn),
// ceil(k / bk)] (rows ss apart), each product rounded to bf16: the f8 weight for a bf16 GEMM (W8A16 prefill).
int LaunchDequantF8ToBf16(const void* w, int64_t ws, int64_t m, int64_t k, const float* scale, int64_t ss, int64_t bn,
                          int64_t bk, void* out, Stream s);
// DeepSeek-V3's activation quantization for the block-scaled FP8 GEMM: x f32 [n, k] (rows xs apart, k % 128 == 0,
// xs % 4 == 0, 16-byte aligned) -> xq e4m3 [n_pad, k] contiguous and scales f32 [k / 128][n_pad]. Per token and group
// of 128 columns: scale = amax / 448 (1 for an all-zero group), xq = x / scale rounded to nearest, saturated. Rows n to
// n_pad - 1 are zeros with scale 1.
int LaunchQuantizeF8(const float* x, int64_t xs, int64_t n, int64_t n_pad, int64_t k, void* xq, float* scales,
                     Stream s);

}  // namespace fathom::cuda
