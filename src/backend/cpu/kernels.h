// Scalar CPU kernels shared by CpuBackend's ops: dtype-converting row loads and a vectorizable dot product.
//
//   LoadRowF32(w_view, row, buf);        // any float dtype -> float32 [cols]
//   float d = DotF32(a, b, n);
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace fathom::cpu {

// Converts `count` elements of `src` (dtype `dtype`) starting at element `offset` into float32.
void ConvertToF32(const void* src, DType dtype, int64_t offset, int64_t count, float* dst);
// Converts float32 into `dtype` (f32, f16 or bf16).
void ConvertFromF32(const float* src, int64_t count, DType dtype, void* dst, int64_t offset);

float DotF32(const float* a, const float* b, int64_t n);

}  // namespace fathom::cpu
