// Host-side helpers of the launchers in the .cu files: the stream cast, grid sizes, and the launch's error code.
// Include from .cu files only (launcher.h is the host-facing side).
//
//   int LaunchFoo(const float* x, int64_t rows, int64_t cols, float* out, Stream s) {
//     if (rows == 0) return 0;
//     FooKernel<<<RowBlocks(rows, cols), 256, 0, S(s)>>>(x, cols, out);
//     return Done();
//   }
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/launcher.h"

namespace fathom::cuda {

// The last launch's error (cudaSuccess: 0).
inline int Done() {
  return static_cast<int>(cudaGetLastError());
}
inline cudaStream_t S(Stream s) {
  return static_cast<cudaStream_t>(s);
}
inline unsigned Blocks(int64_t n, int threads) {
  return static_cast<unsigned>((n + threads - 1) / threads);
}
// Blocks of 256 threads for the row-major (row, column chunk) numbering of the elementwise kernels.
inline unsigned RowBlocks(int64_t rows, int64_t cols) {
  return static_cast<unsigned>(rows * ((cols + 255) / 256));
}

}  // namespace fathom::cuda
