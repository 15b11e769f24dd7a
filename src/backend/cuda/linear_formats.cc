// The registry of the weight formats' CUDA providers (linear_format.h): the one place that names them all. Each
// provider's file defines its factory; adding a format adds its declaration and its row here.
#include "backend/cuda/linear_format.h"

namespace fathom::cuda {

std::unique_ptr<LinearFormatKernels> MakeDenseKernels(OpContext& ctx);     // linear_dense.cc
std::unique_ptr<LinearFormatKernels> MakeFp8BlockKernels(OpContext& ctx);  // linear_fp8.cc
std::unique_ptr<LinearFormatKernels> MakeInt4Kernels(OpContext& ctx);      // linear_int4.cc

LinearFormatTable MakeLinearFormatKernels(OpContext& ctx) {
  LinearFormatTable t;
  const auto set = [&](LinearFormat f, std::shared_ptr<LinearFormatKernels> k) { t[static_cast<size_t>(f)] = k; };
  set(LinearFormat::kDense, MakeDenseKernels(ctx));
  set(LinearFormat::kFp8Block, MakeFp8BlockKernels(ctx));
  std::shared_ptr<LinearFormatKernels> int4 = MakeInt4Kernels(ctx);  // AWQ and GPTQ: one kernel state
  set(LinearFormat::kAwq, int4);
  set(LinearFormat::kGptq, int4);
  return t;
}

}  // namespace fathom::cuda
