// MLA's latent cache on the GPU (attention_mla.h).
#include "backend/cuda/attention_mla.h"

#include <fmt/format.h>

#include <optional>

#include "backend/cuda/gather.h"
#include "core/env.h"
#include "model/backend.h"

namespace fathom::cuda {

namespace {

// AttentionPlan::kernel for MLA's decode kernel; the paged kernels' values (attention_gqa.cc) are small.
constexpr int32_t kMlaDecode = 100;
// Its partial states beyond this take the paged kernels instead.
constexpr int64_t kMaxWorkspace = 256ll << 20;

}  // namespace

StatusOr<MlaKernelOptions> MlaKernelOptions::FromEnvironment() {
  MlaKernelOptions o;
  const auto flag = [](const char* name, bool& field, bool invert = false) -> Status {
    FATHOM_ASSIGN_OR_RETURN(const std::optional<bool> v, EnvSwitch(name));
    if (v) field = invert ? !*v : *v;
    return OkStatus();
  };
  FATHOM_RETURN_IF_ERROR(flag("FATHOM_CUDA_NO_MLA_ATTENTION", o.decode_kernel, /*invert=*/true));
  FATHOM_RETURN_IF_ERROR(flag("FATHOM_CUDA_MLA_CONTEXT_MMA", o.context_mma));
  FATHOM_RETURN_IF_ERROR(flag("FATHOM_CUDA_MLA_FP8", o.decode.fp8));
  FATHOM_RETURN_IF_ERROR(flag("FATHOM_CUDA_MLA_PIPELINE", o.decode.pipeline));
  FATHOM_RETURN_IF_ERROR(flag("FATHOM_CUDA_MLA_WIDE", o.decode.wide));
  return o;
}

Status MlaLatentKernels::ReadEnvironment() {
  FATHOM_ASSIGN_OR_RETURN(options_, MlaKernelOptions::FromEnvironment());
  return OkStatus();
}

Status MlaLatentKernels::ServesCacheDtype(DType dtype) const {
  if (dtype != DType::kF8E4M3 || (options_.decode.fp8 && options_.decode_kernel)) return OkStatus();
  // With the decode kernel's f8 form off, an FP8 latent cache would take the per-head paged kernel, which reads the
  // latent row once per head and, past its workspace, falls to a kernel that cannot hold long contexts.
  return InvalidArgumentError(
      "an FP8 cache is not served for MLA models (DeepSeek-V2/V3) on the cuda backend with the MLA kernel's FP8 form "
      "off (FATHOM_CUDA_MLA_FP8=0, or FATHOM_CUDA_NO_MLA_ATTENTION=1): use auto or bfloat16");
}

AttentionPlan MlaLatentKernels::PlanFor(const AttentionArgs& a, AttentionPlan plan) const {
  if (options_.decode_kernel && ctx_.kernel_options().split_attention && MlaDecodeFits(a, options_.decode)) {
    const int64_t ws = MlaDecodeWorkspaceBytes(a, options_.decode, ctx_.sm_count());
    if (ws <= kMaxWorkspace) {
      plan.kernel = kMlaDecode;
      plan.chunk = MlaDecodeChunk(a, options_.decode, ctx_.sm_count());
      plan.workspace_bytes = ws;
      return plan;
    }
  }
  return PlanPagedKernels(ctx_, a, plan);
}

AttentionPlan MlaLatentKernels::Plan(const AttentionMetadata& meta, const AttentionShape& shape,
                                     const KvLayerView& first_layer) {
  const AttentionArgs a = PagedAttentionArgs(TensorView(), first_layer, meta, 1.0f, TensorView(), shape);
  return PlanFor(a, AttentionPlan{.layout = kLayout, .shape = shape});
}

void MlaLatentKernels::Absorbed(const AttentionPlan& step_plan, const TensorView& q, const KvLayerView& cache,
                                const AttentionMetadata& meta, float scale, const TensorView& out) {
  const AttentionShape shape{.heads = q.dim(1), .k_dim = q.dim(2), .v_dim = out.dim(2)};
  AbsorbedOn(step_plan, PagedAttentionArgs(q, cache, meta, scale, out, shape));
}

void MlaLatentKernels::AbsorbedOn(const AttentionPlan& step_plan, const AttentionArgs& a) {
  const AttentionShape shape{.heads = a.heads, .k_dim = a.k_dim, .v_dim = a.v_dim};
  AttentionPlan plan = step_plan;
  if (plan.kernel == kMlaDecode) {
    // The step's plan holds for this layer when its shape and views meet the kernel with the same workspace.
    const bool fits = plan.shape.heads == shape.heads && plan.shape.k_dim == shape.k_dim &&
                      plan.shape.v_dim == shape.v_dim && MlaDecodeFits(a, options_.decode) &&
                      MlaDecodeWorkspaceBytes(a, options_.decode, ctx_.sm_count()) == plan.workspace_bytes;
    if (!fits) {
      ++replans_;
      plan = PlanFor(a, plan);
    }
  }
  if (plan.kernel != kMlaDecode) {
    RunPagedKernels(ctx_, plan, a, &replans_);
    return;
  }
  void* w = plan.workspace_bytes > 0 ? ctx_.Workspace(static_cast<size_t>(plan.workspace_bytes)) : nullptr;
  if (plan.workspace_bytes > 0 && w == nullptr) return;
  const Stream s = ctx_.cuda_stream();
  ctx_.Launch("SplitAttention", [&] { return LaunchMlaDecodeSplit(a, options_.decode, ctx_.sm_count(), w, s); });
}

void MlaLatentKernels::GatherContext(const KvLayerView& kv, const AttentionMetadata& meta, const TensorView& out) {
  const TensorView& cache = kv.k;
  FATHOM_CHECK(out.dim(0) == meta.total_seq_len && out.dim(1) == cache.dim(3) && out.stride(1) == 1);
  const Stream s = ctx_.cuda_stream();
  ctx_.Launch("GatherContext", [&] {
    return LaunchGatherContext(CacheOf(cache, kv.k_scale), cache.dim(3), meta.seq_lens.data<int32_t>(),
                               meta.block_table_start.data<int32_t>(), meta.block_tables.data<int32_t>(), meta.num_seqs,
                               meta.block_size, meta.total_seq_len, out.data<float>(), out.stride(0), s);
  });
}

void MlaLatentKernels::ContextAttention(const TensorView& q, const TensorView& k_nope, const TensorView& k_rope,
                                        const TensorView& v, const AttentionMetadata& meta, float scale,
                                        const TensorView& out) {
  FATHOM_CHECK(q.stride(2) == 1 && k_nope.stride(2) == 1 && k_rope.stride(1) == 1 && v.stride(2) == 1 &&
               out.stride(2) == 1);
  FATHOM_CHECK_EQ(q.dim(2), k_nope.dim(2) + k_rope.dim(1));
  MlaContextArgs a{};
  a.q = q.data<float>();
  a.qs0 = q.stride(0);
  a.qs1 = q.stride(1);
  a.k_nope = k_nope.data<float>();
  a.kns0 = k_nope.stride(0);
  a.kns1 = k_nope.stride(1);
  a.k_rope = k_rope.data<float>();
  a.krs0 = k_rope.stride(0);
  a.v = v.data<float>();
  a.vs0 = v.stride(0);
  a.vs1 = v.stride(1);
  a.out = out.data<float>();
  a.os0 = out.stride(0);
  a.os1 = out.stride(1);
  a.n = q.dim(0);
  a.heads = q.dim(1);
  a.nope = k_nope.dim(2);
  a.rope = k_rope.dim(1);
  a.v_dim = v.dim(2);
  a.num_seqs = meta.num_seqs;
  a.query_start = meta.query_start.data<int32_t>();
  a.seq_lens = meta.seq_lens.data<int32_t>();
  a.positions = meta.positions.data<int32_t>();
  a.scale = scale;
  const Stream s = ctx_.cuda_stream();
  const bool mma = options_.context_mma;
  ctx_.Launch("MlaContextAttention", [&] { return LaunchMlaContextAttention(a, mma, s); });
}

MlaLatentKernels& MlaKernelsOf(Backend& gpu) {
  auto* mla = dynamic_cast<MlaLatentKernels*>(gpu.attention_ops(AttentionLayout::kMlaLatent));
  FATHOM_CHECK(mla != nullptr, "{} has no CUDA MLA provider", gpu.name());
  return *mla;
}

std::unique_ptr<AttentionLayoutKernels> MakeMlaLatentKernels(OpContext& ctx) {
  return std::make_unique<MlaLatentKernels>(ctx);
}

}  // namespace fathom::cuda
