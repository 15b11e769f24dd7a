// Scalar CPU kernels shared by CpuBackend's ops: a vectorized dot product. (Dtype conversion of whole rows is
// core's ConvertToF32 / ConvertFromF32.)
//
//   float d = DotF32(a, b, n);
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace fathom::cpu {

float DotF32(const float* a, const float* b, int64_t n);

}  // namespace fathom::cpu
