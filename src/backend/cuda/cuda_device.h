// CUDA device discovery. Without a CUDA build (FATHOM_HAVE_CUDA unset) every call returns Unimplemented.
//
//   FATHOM_ASSIGN_OR_RETURN(std::vector<CudaDeviceInfo> devs, ListCudaDevices());
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace fathom {

struct CudaDeviceInfo {
  int index = 0;
  std::string name;
  int sm_major = 0;
  int sm_minor = 0;
  int64_t total_memory_bytes = 0;
};

StatusOr<std::vector<CudaDeviceInfo>> ListCudaDevices();

}  // namespace fathom
