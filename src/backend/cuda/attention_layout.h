// Attention layouts on the GPU as providers (model/attention.h): one AttentionLayoutKernels per layout owns that
// layout's kernels, its switches and its per-step plan (which kernel, how many keys a split block takes, how much
// workspace), made once a step by the model's block and run by every layer. GQA's paged K and V: attention_gqa.cc;
// MLA's latent rows: attention_mla.cc (its switches: attention_mla.h). CudaBackend owns them, lends them its
// OpContext (linear_format.h), and answers Backend::attention_ops with them. Adding a layout: docs/ARCHITECTURE.md,
// "Attention layouts".
//
//   cuda::AttentionLayoutTable layouts = cuda::MakeAttentionLayouts(ctx);     // CudaBackend::Create
//   FATHOM_RETURN_IF_ERROR(layouts[i]->ReadEnvironment());                    // its FATHOM_CUDA_* switches
//   AttentionOps& ops = layouts[static_cast<size_t>(AttentionLayout::kMlaLatent)]->ops();
#pragma once

#include <array>
#include <cstdint>
#include <memory>

#include "backend/cuda/attention.h"
#include "backend/cuda/linear_format.h"
#include "model/attention.h"

namespace fathom::cuda {

class AttentionLayoutKernels {
 public:
  virtual ~AttentionLayoutKernels() = default;
  // The layout's ops (the provider itself).
  virtual AttentionOps& ops() = 0;
  // Its switches from the FATHOM_CUDA_* environment (core/env.h's rules), once, when CudaBackend::Create reads the
  // environment; a value that is not a switch is INVALID_ARGUMENT naming the variable.
  virtual Status ReadEnvironment() { return OkStatus(); }
};

// Every layout's provider, by AttentionLayout (attention_layouts.cc, the registry): made by CudaBackend::Create and
// owned by it.
using AttentionLayoutTable = std::array<std::unique_ptr<AttentionLayoutKernels>, kNumAttentionLayouts>;
AttentionLayoutTable MakeAttentionLayouts(OpContext& ctx);

// A cache view as kernels take it; an f8 cache's `scale` view [blocks, block_size, heads, dim / group] rides along.
CacheView CacheOf(const TensorView& c, const TensorView& scale = TensorView());

// The paged kernels every layout with per-head K/V rows may run (attention_gqa.cc): GQA's own, and MLA's latent
// cache where MLA's kernel does not fit it.
// The kernel arguments for q [n, heads, k_dim] over `cache` into out [n, heads, v_dim] (null pointers and contiguous
// strides where q or out is empty: a plan's prototype).
AttentionArgs PagedAttentionArgs(const TensorView& q, const KvLayerView& cache, const AttentionMetadata& meta,
                                 float scale, const TensorView& out, const AttentionShape& shape);
// The paged kernels' choice for `a` under ctx's KernelOptions: the prefill tensor-core kernel, a split kernel with
// its workspace, or one block per (token, head). `plan` carries the layout and shape.
AttentionPlan PlanPagedKernels(const OpContext& ctx, const AttentionArgs& a, AttentionPlan plan);
// Runs `plan` on `a`; a plan whose kernel does not fit `a` is made again for it (++*replans).
void RunPagedKernels(OpContext& ctx, const AttentionPlan& plan, const AttentionArgs& a, int64_t* replans);

}  // namespace fathom::cuda
