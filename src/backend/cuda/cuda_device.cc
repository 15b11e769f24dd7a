#include "backend/cuda/cuda_device.h"

#include <cuda_runtime.h>

#include <string>

namespace fathom {

StatusOr<std::vector<CudaDeviceInfo>> ListCudaDevices() {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    return UnavailableError(std::string("no usable CUDA device: ") + cudaGetErrorString(err));
  }
  std::vector<CudaDeviceInfo> out;
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    err = cudaGetDeviceProperties(&prop, i);
    if (err != cudaSuccess) return InternalError(std::string("cudaGetDeviceProperties: ") + cudaGetErrorString(err));
    CudaDeviceInfo d;
    d.index = i;
    d.name = prop.name;
    d.sm_major = prop.major;
    d.sm_minor = prop.minor;
    d.total_memory_bytes = static_cast<int64_t>(prop.totalGlobalMem);
    out.push_back(d);
  }
  return out;
}

}  // namespace fathom
