// The GPU tests' device: a CudaBackend on device 0, or a skipped test (with a message) where there is none.
//
//   TEST(CudaFooTest, Bar) {
//     REQUIRE_GPU(gpu);   // std::unique_ptr<CudaBackend> gpu
//     ...
//   }
#pragma once

#include <gtest/gtest.h>

#include <memory>

#include "backend/cuda/attention_mla.h"
#include "backend/cuda/cuda_backend.h"

namespace fathom::testing {

inline std::unique_ptr<CudaBackend> MakeGpu() {
  auto gpu = CudaBackend::Create(0);
  return gpu.ok() ? std::move(gpu).value() : nullptr;
}

// Changes gpu's kernel options (the tests select the kernel variants they compare this way):
//   SetKernelOptions(*gpu, [](cuda::KernelOptions& o) { o.f32_gemm = true; });
template <typename F>
void SetKernelOptions(CudaBackend& gpu, F&& change) {
  cuda::KernelOptions o = gpu.kernel_options();
  change(o);
  gpu.set_kernel_options(o);
}

// Changes the MLA provider's switches on gpu (attention_mla.h):
//   SetMlaOptions(*gpu, [](cuda::MlaKernelOptions& o) { o.decode_kernel = false; });
template <typename F>
void SetMlaOptions(CudaBackend& gpu, F&& change) {
  cuda::MlaLatentKernels& mla = cuda::MlaKernelsOf(gpu);
  cuda::MlaKernelOptions o = mla.options();
  change(o);
  mla.set_options(o);
}

}  // namespace fathom::testing

#define REQUIRE_GPU(gpu)                   \
  auto gpu = ::fathom::testing::MakeGpu(); \
  if (!gpu) GTEST_SKIP() << "no CUDA device on this machine"
