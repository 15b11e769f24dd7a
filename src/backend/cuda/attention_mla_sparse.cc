// DeepSeek-V3.2's sparse MLA on the GPU (model/mla_sparse.h's MlaSparseOps; the CPU reference:
// backend/cpu/attention_mla_sparse.cc):
// - WriteIndexKeys: LayerNorm of the indexer's key rows (norm.h), the rope by halves and the write into the side rows
//   of the cache (rope_kv.h), three launches;
// - Select: the indexer's scores and top-k (mla_sparse.h), the scores in the workspace;
// - SparseAbsorbed: each token's selected rows become a sequence of its own (the rows' slots as a block table of
//   block_size 1, in the step's `lists` scratch), over which MLA's own dense kernels run unchanged (attention_mla.h:
//   the MLA decode kernel where it fits, else the paged kernels), planned once a step for the longest list.
// Its switches are MLA's (attention_mla.h), read with them.
#include <fmt/format.h>

#include <memory>

#include "backend/cuda/attention_layout.h"
#include "backend/cuda/attention_mla.h"
#include "backend/cuda/mla_sparse.h"
#include "backend/cuda/norm.h"
#include "backend/cuda/rope_kv.h"
#include "model/mla_sparse.h"

namespace fathom::cuda {

namespace {

class CudaMlaSparse final : public MlaSparseOps, public AttentionLayoutKernels {
 public:
  explicit CudaMlaSparse(OpContext& ctx) : ctx_(ctx), mla_(ctx) {}
  AttentionOps& ops() override { return *this; }
  Status ReadEnvironment() override { return mla_.ReadEnvironment(); }
  Status ServesCacheDtype(DType dtype) const override { return mla_.ServesCacheDtype(dtype); }
  Status ServesIndexer(int64_t heads, int64_t dim) const override {
    if (IndexerShapeFits(heads, dim)) return OkStatus();
    return InvalidArgumentError(fmt::format(
        "the cuda backend's indexer kernel takes 1 to {} heads of a multiple of 32 values (at most 12,288 values a "
        "token); this model's indexer has {} heads of {} (index_n_heads, index_head_dim): run it with --device cpu",
        kMaxIndexerHeads, heads, dim));
  }

  AttentionPlan Plan(const AttentionMetadata& meta, const AttentionShape& shape,
                     const KvLayerView& first_layer) override {
    AttentionArgs a = PagedAttentionArgs(TensorView(), first_layer, meta, 1.0f, TensorView(), shape);
    ToLists(&a, meta.num_tokens, meta.max_seq_len, nullptr);
    return mla_.PlanFor(a, AttentionPlan{.layout = kLayout, .shape = shape});
  }

  void WriteIndexKeys(const TensorView& k, const TensorView& norm_weight, const TensorView& norm_bias, float eps,
                      const TensorView& cos, const TensorView& sin, const AttentionMetadata& meta,
                      const KvLayerView& cache) override {
    const int64_t n = k.dim(0), d = k.dim(1);
    FATHOM_CHECK(!cache.side.empty() && cache.side.dim(3) == d, "the cache has no side row of {} values", d);
    FATHOM_CHECK(norm_weight.dtype() == DType::kF32 && norm_bias.dtype() == DType::kF32 && norm_weight.numel() == d &&
                 norm_bias.numel() == d && k.stride(1) == 1);
    const Stream s = ctx_.cuda_stream();
    float* x = k.data<float>();
    ctx_.Launch("IndexKeyNorm", [&] {
      return LaunchLayerNorm(x, k.stride(0), norm_weight.data<float>(), norm_bias.data<float>(), eps, n, d, s);
    });
    ctx_.Launch("ApplyRope", [&] {
      return LaunchApplyRope(x, n, 1, k.stride(0), d, cos.data<float>(), sin.data<float>(), cos.dim(1),
                             /*interleaved=*/false, s);
    });
    ctx_.Launch("WriteKv(index keys)", [&] {
      return LaunchWriteCache(x, n, 1, d, k.stride(0), d, meta.slot_mapping.data<int32_t>(), meta.block_size,
                              CacheOf(cache.side, cache.side_scale), s);
    });
  }

  void Select(const AttentionPlan& /*plan*/, const TensorView& q, const TensorView& weights, const KvLayerView& cache,
              const AttentionMetadata& meta, float scale, const TensorView& selected) override {
    const int64_t n = q.dim(0), topk = selected.dim(1);
    FATHOM_CHECK(cache.side.dim(3) == q.dim(2) && weights.dim(0) == n && weights.dim(1) == q.dim(1) &&
                 selected.dim(0) == n && selected.dtype() == DType::kI32 && selected.is_contiguous() &&
                 q.stride(2) == 1 && weights.stride(1) == 1);
    IndexerArgs a{};
    a.q = q.data<float>();
    a.q_s0 = q.stride(0);
    a.q_s1 = q.stride(1);
    a.w = weights.data<float>();
    a.w_s0 = weights.stride(0);
    a.side = CacheOf(cache.side, cache.side_scale);
    a.n = n;
    a.heads = q.dim(1);
    a.d = q.dim(2);
    a.positions = meta.positions.data<int32_t>();
    a.query_start = meta.query_start.data<int32_t>();
    a.block_table_start = meta.block_table_start.data<int32_t>();
    a.block_tables = meta.block_tables.data<int32_t>();
    a.num_seqs = meta.num_seqs;
    a.block_size = meta.block_size;
    a.max_seq_len = meta.max_seq_len;
    a.scale = scale;
    FATHOM_CHECK(IndexerFits(a), "the indexer's {} heads of {} values do not fit its kernel", a.heads, a.d);
    const int64_t bytes = IndexerWorkspaceBytes(a);
    void* w = ctx_.Workspace(static_cast<size_t>(bytes));
    if (w == nullptr) return;
    const Stream s = ctx_.cuda_stream();
    ctx_.Launch("IndexerSelect", [&] { return LaunchIndexerSelect(a, selected.data<int32_t>(), topk, w, bytes, s); });
  }

  void SparseAbsorbed(const AttentionPlan& plan, const TensorView& q, const KvLayerView& cache,
                      const AttentionMetadata& meta, const TensorView& selected, const TensorView& lists, float scale,
                      const TensorView& out) override {
    const int64_t n = q.dim(0), topk = selected.dim(1);
    FATHOM_CHECK(selected.dim(0) == n && selected.dtype() == DType::kI32 && selected.is_contiguous() &&
                 lists.dtype() == DType::kI32 && lists.numel() >= ListInts(n, topk));
    const SparseLists l = SparseListsIn(lists.data<int32_t>(), n, topk);
    const Stream s = ctx_.cuda_stream();
    ctx_.Launch("SparseLists", [&] {
      return LaunchSparseLists(l, selected.data<int32_t>(), n, topk, meta.positions.data<int32_t>(),
                               meta.query_start.data<int32_t>(), meta.block_table_start.data<int32_t>(),
                               meta.block_tables.data<int32_t>(), meta.num_seqs, meta.block_size, s);
    });
    const AttentionShape shape{.heads = q.dim(1), .k_dim = q.dim(2), .v_dim = out.dim(2)};
    AttentionArgs a = PagedAttentionArgs(q, cache, meta, scale, out, shape);
    ToLists(&a, n, std::min(meta.max_seq_len, topk), &l);
    mla_.AbsorbedOn(plan, a);
  }

 private:
  // `a` over the lists: n sequences of one token each, the cache's rows one a block (its slots the block ids), at most
  // max_len rows a list. The cache must hold its blocks' rows evenly apart.
  static void ToLists(AttentionArgs* a, int64_t n, int64_t max_len, const SparseLists* l) {
    FATHOM_CHECK(a->k.s0 == a->block_size * a->k.s1 && a->k.ss0 == a->block_size * a->k.ss1,
                 "a latent cache whose blocks are not rows evenly apart");
    a->k.s0 = a->k.s1;
    a->k.ss0 = a->k.ss1;
    a->v.s0 = a->v.s1;
    a->v.ss0 = a->v.ss1;
    a->block_size = 1;
    a->num_seqs = n;
    a->max_seq_len = max_len;
    if (l != nullptr) {
      a->positions = l->positions;
      a->query_start = l->query_start;
      a->block_table_start = l->block_table_start;
      a->block_tables = l->block_tables;
    }
  }

  OpContext& ctx_;
  MlaLatentKernels mla_;
};

}  // namespace

std::unique_ptr<AttentionLayoutKernels> MakeMlaSparseKernels(OpContext& ctx) {
  return std::make_unique<CudaMlaSparse>(ctx);
}

}  // namespace fathom::cuda
