// The registry of the CPU's attention layouts (attention_layouts.h): the one file that names every provider.
#include "backend/cpu/attention_layouts.h"

namespace fathom::cpu {

std::unique_ptr<AttentionOps> MakeGqaPaged(CpuBackend& be);   // attention_gqa.cc: PagedAttentionOps
std::unique_ptr<AttentionOps> MakeMlaLatent(CpuBackend& be);  // attention_mla.cc: MlaLatentOps (model/mla.h)
std::unique_ptr<AttentionOps> MakeMlaSparse(CpuBackend& be);  // attention_mla_sparse.cc: MlaSparseOps
std::unique_ptr<AttentionOps> MakeV4Hybrid(CpuBackend& be);   // attention_v4.cc: V4HybridOps (model/v4_hybrid.h)

AttentionLayoutTable MakeAttentionLayouts(CpuBackend& be) {
  AttentionLayoutTable t;
  t[static_cast<size_t>(AttentionLayout::kGqaPaged)] = MakeGqaPaged(be);
  t[static_cast<size_t>(AttentionLayout::kMlaLatent)] = MakeMlaLatent(be);
  t[static_cast<size_t>(AttentionLayout::kMlaSparse)] = MakeMlaSparse(be);
  t[static_cast<size_t>(AttentionLayout::kV4Hybrid)] = MakeV4Hybrid(be);
  return t;
}

}  // namespace fathom::cpu
