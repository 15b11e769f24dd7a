// The CUDA backend's kernel variants under the op table's names (op_cases.h, KnownVariants): the one mapping from a
// row's variant to the KernelOptions that select it, shared by backend_ops_test and bench/cuda_kernel_bench --ops 1.
// Built only with the CUDA backend.
//
//   StatusOr<cuda::KernelOptions> o = ops::KernelOptionsForVariant(row.variant);   // the defaults, changed
//   if (o.ok()) gpu->set_kernel_options(*o);
#pragma once

#include <string_view>

#include "backend/cuda/kernel_options.h"
#include "core/status.h"

namespace fathom::ops {

// KernelOptions{} (the backend's defaults, whatever the FATHOM_CUDA_* environment says) with the variant's switch
// set; InvalidArgument for a name it does not know.
StatusOr<cuda::KernelOptions> KernelOptionsForVariant(std::string_view variant);

}  // namespace fathom::ops
