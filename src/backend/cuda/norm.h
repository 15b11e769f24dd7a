// RMSNorm kernels (Backend::RmsNorm and AddRmsNorm): one block per row, the row held in registers where it fits; and
// LayerNorm (torch.nn.LayerNorm's: biased variance, eps inside the root) for DeepSeek-V3.2's indexer keys.
// Launchers follow launcher.h.
//
//   // out = x / rms(x) * w; with add non-null first x += add (AddRmsNorm, x is the residual)
//   int err = cuda::LaunchRmsNorm(x, x_stride, add, add_stride, w, w_dtype, eps, out, out_stride, rows, cols, stream);
#pragma once

#include <cstdint>

#include "backend/cuda/launcher.h"

namespace fathom::cuda {

// x [rows, cols] float32 (rows x_stride apart); add (optional, may be null): x += add first, then out = rmsnorm(x);
// w [cols] f32, f16 or bf16.
int LaunchRmsNorm(float* x, int64_t x_stride, const float* add, int64_t add_stride, const void* w, int w_dtype,
                  float eps, float* out, int64_t out_stride, int64_t rows, int64_t cols, Stream s);
// x [rows, cols] float32 in place: x = (x - mean) / sqrt(var + eps) * w + b, w and b f32 [cols]; two passes over the
// row (mean, then the variance of x - mean), one block a row.
int LaunchLayerNorm(float* x, int64_t x_stride, const float* w, const float* b, float eps, int64_t rows, int64_t cols,
                    Stream s);

}  // namespace fathom::cuda
