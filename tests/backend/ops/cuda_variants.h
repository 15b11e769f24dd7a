// The CUDA backend's kernel variants under the op table's names (op_cases.h, KnownVariants): the one mapping from a
// row's variant to the switches that select it (the backend's KernelOptions and the MLA provider's
// MlaKernelOptions), shared by backend_ops_test and bench/cuda_kernel_bench --ops 1. Built only with the CUDA backend.
//
//   StatusOr<ops::VariantOptions> o = ops::OptionsForVariant(row.variant);   // the defaults, changed
//   if (o.ok()) o->ApplyTo(*gpu);
#pragma once

#include <string_view>

#include "backend/cuda/attention_mla.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/kernel_options.h"
#include "core/status.h"

namespace fathom::ops {

struct VariantOptions {
  cuda::KernelOptions kernel;
  cuda::MlaKernelOptions mla;
  // Sets both on `gpu` (before a row's inputs: PrepareLinear depends on them).
  void ApplyTo(CudaBackend& gpu) const;
};

// The defaults (whatever the FATHOM_CUDA_* environment says) with the variant's switch set; InvalidArgument for a name
// it does not know.
StatusOr<VariantOptions> OptionsForVariant(std::string_view variant);

}  // namespace fathom::ops
