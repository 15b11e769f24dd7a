// MLA's latent cache on the GPU (model/mla.h's MlaLatentOps), a provider of attention_layout.h: the absorbed form on
// MLA's decode kernel (mla.h) where it fits and is on, else on the paged kernels (attention_gqa.cc); the
// up-projected form's context gather (gather.h) and context attention (mla.h). Its switches are its own,
// MlaKernelOptions, read from the environment once by CudaBackend::Create and changeable by tests and benchmarks:
//
//   cuda::MlaLatentKernels& mla = cuda::MlaKernelsOf(*gpu);
//   cuda::MlaKernelOptions o = mla.options();
//   o.decode.wide = false;                                   // 16 heads a block at every head count
//   mla.set_options(o);
//
// Variable                           Field                  Default  What it does
// FATHOM_CUDA_NO_MLA_ATTENTION       decode_kernel          true     false: no MLA decode kernel (the paged kernels
//                                                                    serve the latent cache)
// FATHOM_CUDA_MLA_CONTEXT_MMA=0      context_mma            true     false: the context attention on the plain
//                                                                    float32 kernel instead of the tensor-core one
// FATHOM_CUDA_MLA_FP8=0              decode.fp8             true     the decode kernel reads an f8 latent cache
//                                                                    (codes widened to bf16 in shared memory), and
//                                                                    the engine serves --kv-cache-dtype fp8 for MLA
//                                                                    models; off: the engine refuses fp8 for MLA
// FATHOM_CUDA_MLA_PIPELINE=1         decode.pipeline        false    the decode kernel loads the next 64-key tile
//                                                                    while it computes on this one (two buffers, one
//                                                                    block a multiprocessor)
// FATHOM_CUDA_MLA_WIDE=0             decode.wide            true     the decode kernel takes 64 heads a block (8
//                                                                    warps) where the heads come in 64s (V3's 128:
//                                                                    the latent cache read twice a token, not eight
//                                                                    times) and the longest context has
//                                                                    decode.wide_min_keys (256) or more; one stage,
//                                                                    so it overrides the pipeline there; off: 16
//                                                                    heads a block
// Switches are read as core/env.h reads them (1/true/on/yes, 0/false/off/no); any other value is refused by name.
#pragma once

#include "backend/cuda/attention_layout.h"
#include "backend/cuda/mla.h"
#include "model/mla.h"

namespace fathom {
class Backend;
}  // namespace fathom

namespace fathom::cuda {

struct MlaKernelOptions {
  bool decode_kernel = true;
  bool context_mma = true;
  MlaDecodeOptions decode;

  // The defaults, changed by the variables above that are set.
  static StatusOr<MlaKernelOptions> FromEnvironment();
};

class MlaLatentKernels final : public MlaLatentOps, public AttentionLayoutKernels {
 public:
  explicit MlaLatentKernels(OpContext& ctx) : ctx_(ctx) {}
  AttentionOps& ops() override { return *this; }
  Status ReadEnvironment() override;
  const MlaKernelOptions& options() const { return options_; }
  void set_options(const MlaKernelOptions& o) { options_ = o; }

  // An f8 latent cache only with the decode kernel's f8 form (on by default) and the decode kernel on: the paged
  // kernels read the latent row once per head, and past their workspace cannot hold long contexts.
  Status ServesCacheDtype(DType dtype) const override;
  AttentionPlan Plan(const AttentionMetadata& meta, const AttentionShape& shape,
                     const KvLayerView& first_layer) override;
  void Absorbed(const AttentionPlan& plan, const TensorView& q, const KvLayerView& cache, const AttentionMetadata& meta,
                float scale, const TensorView& out) override;
  void GatherContext(const KvLayerView& cache, const AttentionMetadata& meta, const TensorView& out) override;
  void ContextAttention(const TensorView& q, const TensorView& k_nope, const TensorView& k_rope, const TensorView& v,
                        const AttentionMetadata& meta, float scale, const TensorView& out) override;

  // Plan and Absorbed on kernel arguments that another provider made (mla_sparse's: each token's selected rows as a
  // sequence of its own, block_size 1): the plan's layout is the caller's.
  AttentionPlan PlanFor(const AttentionArgs& a, AttentionPlan plan) const;
  void AbsorbedOn(const AttentionPlan& plan, const AttentionArgs& a);

 private:
  OpContext& ctx_;
  MlaKernelOptions options_;
};

// The MLA provider of a CUDA backend (a FATHOM_CHECK for any other backend).
MlaLatentKernels& MlaKernelsOf(Backend& gpu);

}  // namespace fathom::cuda
