// The registry of the GPU's attention layouts (attention_layout.h): the one file that names every provider.
#include "backend/cuda/attention_layout.h"

namespace fathom::cuda {

std::unique_ptr<AttentionLayoutKernels> MakeGqaPagedKernels(OpContext& ctx);   // attention_gqa.cc
std::unique_ptr<AttentionLayoutKernels> MakeMlaLatentKernels(OpContext& ctx);  // attention_mla.cc
std::unique_ptr<AttentionLayoutKernels> MakeMlaSparseKernels(OpContext& ctx);  // attention_mla_sparse.cc

AttentionLayoutTable MakeAttentionLayouts(OpContext& ctx) {
  AttentionLayoutTable t;
  t[static_cast<size_t>(AttentionLayout::kGqaPaged)] = MakeGqaPagedKernels(ctx);
  t[static_cast<size_t>(AttentionLayout::kMlaLatent)] = MakeMlaLatentKernels(ctx);
  t[static_cast<size_t>(AttentionLayout::kMlaSparse)] = MakeMlaSparseKernels(ctx);
  return t;
}

}  // namespace fathom::cuda
