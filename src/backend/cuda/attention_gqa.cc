// GQA's paged K and V on the GPU (model/attention.h's PagedAttentionOps), and the paged kernels' plan and run that
// other layouts fall back to (attention_layout.h). Once a step the plan picks the kernel (attention.h): the
// tensor-core prefill kernel for batches of 16 or more query rows a sequence where it fits
// (KernelOptions::prefill_mma_attention), else a split kernel (ChooseSplitAttention) while its partial states fit
// kMaxWorkspace (KernelOptions::split_attention), else one block per (token, head). Every layer runs that choice.
#include <cuda_runtime.h>

#include "backend/cuda/attention_layout.h"

namespace fathom::cuda {

namespace {

// The plan's kernel (AttentionPlan::kernel) for the paged kernels.
enum PagedKernel : int32_t { kPrefillMma = 0, kSplitMma = 1, kSplitGqa = 2, kSplitPerHead = 3, kWholeContext = 4 };

// The split kernels' partial states beyond this take the one-block-per-(token, head) kernel instead.
constexpr int64_t kMaxWorkspace = 256ll << 20;

SplitAttentionKind SplitKind(int32_t kernel) {
  return kernel == kSplitMma ? SplitAttentionKind::kMma
                             : (kernel == kSplitGqa ? SplitAttentionKind::kGqa : SplitAttentionKind::kPerHead);
}

int32_t KernelOfSplit(SplitAttentionKind kind) {
  switch (kind) {
    case SplitAttentionKind::kMma:
      return kSplitMma;
    case SplitAttentionKind::kGqa:
      return kSplitGqa;
    case SplitAttentionKind::kPerHead:
      return kSplitPerHead;
  }
  return kSplitPerHead;
}

bool PrefillSized(const AttentionArgs& a) {
  return a.n >= 16 * a.num_seqs;
}

// Whether `plan` (made for another layer of the step) serves `a` as it is.
bool PlanFits(const OpContext& ctx, const AttentionPlan& plan, const AttentionArgs& a) {
  if (plan.shape.heads != a.heads || plan.shape.k_dim != a.k_dim || plan.shape.v_dim != a.v_dim) return false;
  switch (plan.kernel) {
    case kPrefillMma:
      return PrefillSized(a) && PrefillMmaAttentionFits(a);
    case kSplitMma:
    case kSplitGqa:
    case kSplitPerHead:
      return SplitAttentionFits(a, SplitKind(plan.kernel)) &&
             SplitAttentionWorkspaceBytes(a, SplitKind(plan.kernel), ctx.sm_count()) == plan.workspace_bytes;
    case kWholeContext:
      return true;
    default:
      return false;
  }
}

class GqaPagedKernels final : public PagedAttentionOps, public AttentionLayoutKernels {
 public:
  explicit GqaPagedKernels(OpContext& ctx) : ctx_(ctx) {}
  AttentionOps& ops() override { return *this; }

  AttentionPlan Plan(const AttentionMetadata& meta, const AttentionShape& shape,
                     const KvLayerView& first_layer) override {
    const AttentionArgs a = PagedAttentionArgs(TensorView(), first_layer, meta, 1.0f, TensorView(), shape);
    return PlanPagedKernels(ctx_, a, AttentionPlan{.layout = kLayout, .shape = shape});
  }
  void Run(const AttentionPlan& plan, const TensorView& q, const KvLayerView& cache, const AttentionMetadata& meta,
           float scale, const TensorView& out) override {
    const AttentionShape shape{.heads = q.dim(1), .k_dim = q.dim(2), .v_dim = out.dim(2)};
    RunPagedKernels(ctx_, plan, PagedAttentionArgs(q, cache, meta, scale, out, shape), &replans_);
  }

 private:
  OpContext& ctx_;
};

}  // namespace

CacheView CacheOf(const TensorView& c, const TensorView& scale) {
  CacheView v{c.raw(), static_cast<int>(c.dtype()), c.stride(0), c.stride(1), c.stride(2)};
  if (!scale.empty()) {
    FATHOM_CHECK(scale.dim(0) == c.dim(0) && scale.dim(1) == c.dim(1) && scale.dim(2) == c.dim(2) && scale.dim(3) > 0 &&
                 c.dim(3) % scale.dim(3) == 0 && scale.stride(3) == 1);
    v.scale = scale.data<float>();
    v.ss0 = scale.stride(0);
    v.ss1 = scale.stride(1);
    v.ss2 = scale.stride(2);
    v.group = c.dim(3) / scale.dim(3);
  }
  return v;
}

AttentionArgs PagedAttentionArgs(const TensorView& q, const KvLayerView& cache, const AttentionMetadata& meta,
                                 float scale, const TensorView& out, const AttentionShape& shape) {
  AttentionArgs a{};
  a.n = meta.num_tokens;
  a.heads = shape.heads;
  a.k_dim = shape.k_dim;
  a.v_dim = shape.v_dim;
  if (q.empty()) {  // a plan's prototype: contiguous q and out
    a.q_s1 = shape.k_dim;
    a.q_s0 = shape.heads * shape.k_dim;
    a.o_s1 = shape.v_dim;
    a.o_s0 = shape.heads * shape.v_dim;
  } else {
    FATHOM_CHECK(q.dim(0) == meta.num_tokens && out.dim(0) == q.dim(0) && out.dim(1) == q.dim(1));
    a.q = q.data<float>();
    a.q_s0 = q.stride(0);
    a.q_s1 = q.stride(1);
    a.out = out.data<float>();
    a.o_s0 = out.stride(0);
    a.o_s1 = out.stride(1);
  }
  a.kv_heads = cache.k.dim(2);
  a.k = CacheOf(cache.k, cache.k_scale);
  a.v = CacheOf(cache.v, cache.v_scale);
  a.positions = meta.positions.data<int32_t>();
  a.query_start = meta.query_start.data<int32_t>();
  a.block_table_start = meta.block_table_start.data<int32_t>();
  a.block_tables = meta.block_tables.data<int32_t>();
  a.num_seqs = meta.num_seqs;
  a.block_size = meta.block_size;
  a.max_seq_len = meta.max_seq_len;
  a.scale = scale;
  return a;
}

AttentionPlan PlanPagedKernels(const OpContext& ctx, const AttentionArgs& args, AttentionPlan plan) {
  const KernelOptions& o = ctx.kernel_options();
  AttentionArgs a = args;
  a.one_chunk_waves = o.attention_one_chunk_waves;
  plan.chunk = 0;
  plan.workspace_bytes = 0;
  // Prefill batches on the tensor-core prefill kernel where it fits: each K/V tile read once for 64 query rows.
  if (o.prefill_mma_attention && PrefillSized(a) && PrefillMmaAttentionFits(a)) {
    plan.kernel = kPrefillMma;
    return plan;
  }
  // Split-K when the partial states fit a modest workspace (decode and small batches); otherwise one block per
  // (token, head).
  const SplitAttentionKind kind = ChooseSplitAttention(a, SplitAttentionKernels{o.mma_attention, o.gqa_attention});
  const int64_t ws = SplitAttentionWorkspaceBytes(a, kind, ctx.sm_count());
  if (ws <= kMaxWorkspace && o.split_attention) {
    plan.kernel = KernelOfSplit(kind);
    plan.workspace_bytes = ws;
  } else {
    plan.kernel = kWholeContext;
  }
  return plan;
}

void RunPagedKernels(OpContext& ctx, const AttentionPlan& step_plan, const AttentionArgs& args, int64_t* replans) {
  AttentionArgs a = args;
  a.one_chunk_waves = ctx.kernel_options().attention_one_chunk_waves;
  AttentionPlan plan = step_plan;
  if (!PlanFits(ctx, plan, a)) {
    ++*replans;
    plan = PlanPagedKernels(ctx, a, plan);
  }
  const Stream s = ctx.cuda_stream();
  switch (plan.kernel) {
    case kPrefillMma:
      ctx.Launch("PrefillMmaAttention", [&] { return LaunchPrefillMmaAttention(a, s); });
      return;
    case kWholeContext:
      ctx.Launch("PagedAttention", [&] { return LaunchPagedAttention(a, s); });
      return;
    default: {
      void* w = plan.workspace_bytes > 0 ? ctx.Workspace(static_cast<size_t>(plan.workspace_bytes)) : nullptr;
      if (plan.workspace_bytes > 0 && w == nullptr) return;
      const SplitAttentionKind kind = SplitKind(plan.kernel);
      ctx.Launch("SplitAttention", [&] { return LaunchSplitAttention(a, kind, ctx.sm_count(), w, s); });
      return;
    }
  }
}

std::unique_ptr<AttentionLayoutKernels> MakeGqaPagedKernels(OpContext& ctx) {
  return std::make_unique<GqaPagedKernels>(ctx);
}

}  // namespace fathom::cuda
