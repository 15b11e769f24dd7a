// The launch of every kernel and its kernel-side counterpart, with the helpers of the launchers in the .cu files: the
// stream cast, grid sizes, and the launch's error code. Include from .cu files only (launcher.h is the host-facing
// side).
//
//   __global__ void FooKernel(const float* x, int64_t cols, float* out) {
//     PdlPrologue();                      // first, in every kernel
//     ...
//   }
//   int LaunchFoo(const float* x, int64_t rows, int64_t cols, float* out, Stream s) {
//     if (rows == 0) return 0;
//     LaunchKernel(FooKernel, RowBlocks(rows, cols), 256, 0, S(s), x, cols, out);
//     return Done();
//   }
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <utility>

#include "backend/cuda/kernel_attr.h"
#include "backend/cuda/launcher.h"

namespace fathom::cuda {

// Programmatic dependent launch (Hopper). LaunchKernel gives every kernel the launch attribute that lets it be
// scheduled while the kernel before it in the stream is still running (unless the stream's backend turned it off:
// KernelOptions::pdl, SetProgrammaticLaunch), and every kernel starts with PdlPrologue(). Its griddepcontrol.wait
// returns once the kernels before are complete and their writes visible (at once for a launch without the
// attribute), so nothing of a kernel runs early but its launch and block scheduling; then launch_dependents lets the
// next kernel's blocks be scheduled in turn. So the gap between two kernels of a step, a few microseconds of launch
// latency, overlaps the first one's run. A kernel without the prologue must not be launched through LaunchKernel.
// A kernel may do work before the prologue that reads nothing an earlier kernel writes (addresses from its
// parameters, L2 prefetches of weights: the GEMV's `prefetch_bytes`).
__device__ __forceinline__ void PdlPrologue() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// kernel<<<grid, block, smem, s>>>(args...) with the programmatic-launch attribute (above). Errors as a launch's:
// Done() reads them.
template <typename... P, typename... A>
void LaunchKernel(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t s, A&&... args) {
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cfg.attrs = attr;
  cfg.numAttrs = ProgrammaticLaunch(static_cast<Stream>(s)) ? 1 : 0;
  cudaLaunchKernelEx(&cfg, kernel, std::forward<A>(args)...);
}

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
