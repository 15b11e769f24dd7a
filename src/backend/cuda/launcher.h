// What every kernel launcher shares (norm.h, linear.h, attention.h, ... ): each takes device pointers, element strides
// and a Stream, never allocates, and returns the launch's cudaError_t as int (0 on success), so that these headers
// need no CUDA include and .cc files compile them as plain C++20. Activations are float32; weights, tables, biases and
// caches name their element type by fathom::DType's integer value. CacheView is a paged KV cache as kernels see it.
//
//   const cuda::CacheView k{t.raw(), static_cast<int>(t.dtype()), t.stride(0), t.stride(1), t.stride(2)};
//   int err = cuda::LaunchWriteCache(src, n, heads, dim, s0, s1, slot_mapping, block_size, k, stream);
//   if (err != 0) ...  // a cudaError_t
#pragma once

#include <cstdint>

namespace fathom::cuda {

using Stream = void*;  // cudaStream_t

// Whether kernels launched on `stream` use programmatic dependent launch (launch.cuh). Each CudaBackend sets its own
// stream's from its KernelOptions::pdl and forgets it when destroyed, so backends with other options never see each
// other's; a stream no backend set (a test's or a benchmark's direct launches) has it on.
void SetProgrammaticLaunch(Stream stream, bool on);
void ForgetProgrammaticLaunch(Stream stream);
bool ProgrammaticLaunch(Stream stream);

// One layer's K or V cache: [blocks, block_size, heads, dim] of f32, f16, bf16 or f8 e4m3, with these strides. An f8
// cache has float32 scales [blocks, block_size, heads, dim / group] (model/backend.h's KvLayerView): value i of a row
// is e4m3 * scale[i / group].
struct CacheView {
  void* data;
  int dtype;
  int64_t s0, s1, s2;  // block, offset, head strides (elements)
  float* scale = nullptr;
  int64_t ss0 = 0, ss1 = 0, ss2 = 0, group = 0;  // the scales' strides and the values per scale
};

}  // namespace fathom::cuda
