#include "backend/cuda/kernel_attr.h"

#include <cuda_runtime.h>

namespace fathom::cuda {

int KernelAttrCache::Ensure(int device, const void* kernel, int bytes, const Setter& set) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto key = std::make_pair(device, kernel);
  const auto it = limit_.find(key);
  if (it != limit_.end() && it->second >= bytes) return 0;
  const int err = set(bytes);
  if (err == 0) limit_[key] = bytes;
  return err;
}

int EnsureDynamicSmem(const void* kernel, int bytes, bool max_carveout) {
  static KernelAttrCache cache;
  int device = 0;
  if (const cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return static_cast<int>(e);
  return cache.Ensure(device, kernel, bytes, [&](int b) {
    cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, b);
    if (e == cudaSuccess && max_carveout) {
      e = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared);
    }
    if (e != cudaSuccess) cudaGetLastError();  // not sticky: the caller returns it, the next launch starts clean
    return static_cast<int>(e);
  });
}

}  // namespace fathom::cuda
