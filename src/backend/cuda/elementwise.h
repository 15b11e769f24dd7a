// Elementwise kernels on float32 rows (the residual add, SwiGLU's silu(gate) * up) and the device fill of dummy
// weights. Launchers follow launcher.h.
//
//   cuda::LaunchAddInPlace(a, a_stride, b, b_stride, rows, cols, stream);                  // a += b
//   cuda::LaunchFillDummy(out, dtype, n, key, 0.02f, false, 0, sm_count, stream);          // model/weights.cc's fill
#pragma once

#include <cstdint>

#include "backend/cuda/launcher.h"

namespace fathom::cuda {

int LaunchAddInPlace(float* a, int64_t a_stride, const float* b, int64_t b_stride, int64_t rows, int64_t cols,
                     Stream s);

int LaunchSiluMul(const float* gate, int64_t g_stride, const float* up, int64_t u_stride, float* out, int64_t o_stride,
                  int64_t rows, int64_t cols, Stream s);
// out (contiguous bf16 [rows, cols]) = LaunchSiluMul's float product rounded to nearest even: the down projection's
// cuBLASLt input without the float32 product in between (CudaBackend::SiluMulLinear).
int LaunchSiluMulToBf16(const float* gate, int64_t g_stride, const float* up, int64_t u_stride, int64_t rows,
                        int64_t cols, void* out, Stream s);

// Dummy weights (model/weights.cc, FillDummy): element i of `out` (dtype f32, f16, bf16, f8 e4m3 or i32; n elements)
// is `constant_bits` when has_constant, else from r = SplitMix64(key + i): (2u - 1) * scale with u = (r >> 40) / 2^24,
// rounded to nearest even for f16 and bf16; for f8 the code r & 0xbf; for i32 (packed 4-bit codes) r's low 32 bits.
// Bit-identical to the host fill. A grid-stride loop over at most 64 blocks per SM (sm_count: the GPU's
// multiprocessors).
int LaunchFillDummy(void* out, int dtype, int64_t n, uint64_t key, float scale, bool has_constant,
                    uint32_t constant_bits, int sm_count, Stream s);

}  // namespace fathom::cuda
