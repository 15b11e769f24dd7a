// The registry of the weight formats' CUDA providers (linear_format.h), expanded from the table of formats
// (format/linear_weight.h's FATHOM_LINEAR_FORMATS): each family's provider file defines `Make<family>Kernels`, and the
// formats of one family (AWQ and GPTQ) share one provider. A new format adds nothing here.
#include <map>
#include <string_view>

#include "backend/cuda/linear_format.h"

namespace fathom::cuda {

#define FATHOM_DECLARE_FORMAT_KERNELS(value, method, family) \
  std::unique_ptr<LinearFormatKernels> Make##family##Kernels(OpContext& ctx);
FATHOM_LINEAR_FORMATS(FATHOM_DECLARE_FORMAT_KERNELS)
#undef FATHOM_DECLARE_FORMAT_KERNELS

LinearFormatTable MakeLinearFormatKernels(OpContext& ctx) {
  LinearFormatTable t;
  std::map<std::string_view, std::shared_ptr<LinearFormatKernels>> families;
#define FATHOM_FORMAT_KERNELS_ROW(value, method, family)         \
  {                                                              \
    std::shared_ptr<LinearFormatKernels>& k = families[#family]; \
    if (k == nullptr) k = Make##family##Kernels(ctx);            \
    t[static_cast<size_t>(LinearFormat::value)] = k;             \
  }
  FATHOM_LINEAR_FORMATS(FATHOM_FORMAT_KERNELS_ROW)
#undef FATHOM_FORMAT_KERNELS_ROW
  return t;
}

}  // namespace fathom::cuda
