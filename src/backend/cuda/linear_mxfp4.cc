// The MXFP4 format's CUDA provider (format/mxfp4.h: DeepSeek-V4's routed experts): no kernels yet, so a model with
// MXFP4 weights is refused when they are prepared at load, naming the format, instead of running wrong or slowly.
#include <fmt/format.h>

#include "backend/cuda/linear_format.h"

namespace fathom::cuda {

namespace {

Status NoKernels() {
  return UnimplementedError(
      "mxfp4 weights (DeepSeek-V4's routed experts under expert_dtype fp4) have no CUDA kernels yet; run this model "
      "with --device cpu");
}

class Mxfp4Kernels final : public LinearFormatKernels {
 public:
  explicit Mxfp4Kernels(OpContext& ctx) : ctx_(ctx) {}
  Status Prepare(LinearWeight& /*w*/) override { return NoKernels(); }
  void Linear(const TensorView& /*x*/, const LinearWeight& /*w*/, const TensorView& /*out*/) override {
    ctx_.RecordError(NoKernels());
  }
  Status PrepareExperts(ExpertSet& /*experts*/) override { return NoKernels(); }

 private:
  OpContext& ctx_;
};

}  // namespace

std::unique_ptr<LinearFormatKernels> MakeMxfp4Kernels(OpContext& ctx) {
  return std::make_unique<Mxfp4Kernels>(ctx);
}

}  // namespace fathom::cuda
