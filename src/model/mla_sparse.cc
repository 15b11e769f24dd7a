#include "model/mla_sparse.h"

#include <cmath>

#include "model/blocks.h"

namespace fathom {

void SparseMlaAttention::AddSpecs(WeightSpecBuilder& b, const std::string& p, const ModelConfig& c) {
  MlaAttention::AddSpecs(b, p, c);
  const MlaConfig& m = c.mla;
  const std::string ix = p + "indexer.";
  b.Linear(ix + "wq_b", m.index_n_heads * m.index_head_dim, m.q_lora_rank);
  b.Linear(ix + "wk", m.index_head_dim, c.hidden_size);
  b.Tensor(ix + "k_norm.weight", {m.index_head_dim}, WeightInit::kOnes, DType::kF32);
  b.Tensor(ix + "k_norm.bias", {m.index_head_dim}, WeightInit::kZeros, DType::kF32);
  // Unquantized in the FP8 checkpoint (and float32 in transformers: _keep_in_fp32_modules).
  b.Linear(ix + "weights_proj", m.index_n_heads, c.hidden_size, {.quantizable = false});
}

void SparseMlaAttention::LayerSpecs(WeightSpecBuilder& b, int64_t i, const ModelConfig& c) {
  AddSpecs(b, LayerName(i, "self_attn."), c);
}

AttentionFootprint SparseMlaAttention::Footprint(const ModelConfig& c) {
  AttentionFootprint f = MlaAttention::Footprint(c);
  const MlaConfig& m = c.mla;
  // The indexer's q, k and weights, and a token's selected positions and the provider's lists of them (i32, counted
  // as one value each).
  f.values_per_token += m.index_n_heads * m.index_head_dim + m.index_head_dim + m.index_n_heads + 2 * m.index_topk + 4;
  f.widest_weight = std::max(f.widest_weight, m.index_n_heads * m.index_head_dim * m.q_lora_rank);
  return f;
}

namespace {

// A norm's weight or bias as float32 on the backend's device (its kernels take f32).
StatusOr<TensorView> F32Constant(const WeightStore& w, Backend& be, const std::string& name,
                                 std::vector<Tensor>* constants) {
  const TensorView& t = w.Get(name);
  FATHOM_ASSIGN_OR_RETURN(Tensor host, ToHost(be, t));
  std::vector<float> v(static_cast<size_t>(t.numel()));
  ConvertToF32(host.view().raw(), t.dtype(), 0, t.numel(), v.data());
  return UploadConstant(be, v, DType::kF32, {t.numel()}, constants);
}

}  // namespace

StatusOr<SparseMlaAttention> SparseMlaAttention::Bind(const WeightStore& w, Backend& be, const std::string& p,
                                                      const ModelConfig& c, const ParallelConfig& par,
                                                      std::vector<Tensor>* constants) {
  const MlaConfig& m = c.mla;
  if (m.q_lora_rank <= 0) {
    return InvalidArgumentError("config.json: DeepSeek sparse attention needs q_lora_rank (the indexer's queries)");
  }
  if (const auto* ops = dynamic_cast<const MlaSparseOps*>(be.attention_ops(AttentionLayout::kMlaSparse))) {
    FATHOM_RETURN_IF_ERROR(ops->ServesIndexer(m.index_n_heads, m.index_head_dim));
  }
  SparseMlaAttention a;
  FATHOM_ASSIGN_OR_RETURN(a.mla, MlaAttention::Bind(w, be, p, c, par, constants));
  const std::string ix = p + "indexer.";
  FATHOM_ASSIGN_OR_RETURN(a.wq_b, w.Linear(ix + "wq_b", be));
  FATHOM_ASSIGN_OR_RETURN(a.wk, w.Linear(ix + "wk", be));
  FATHOM_ASSIGN_OR_RETURN(a.weights_proj, w.Linear(ix + "weights_proj", be));
  FATHOM_ASSIGN_OR_RETURN(a.k_norm_weight, F32Constant(w, be, ix + "k_norm.weight", constants));
  FATHOM_ASSIGN_OR_RETURN(a.k_norm_bias, F32Constant(w, be, ix + "k_norm.bias", constants));
  a.index_heads = m.index_n_heads;
  a.index_head_dim = m.index_head_dim;
  a.topk = m.index_topk;
  a.index_scale = 1.0f / std::sqrt(static_cast<float>(m.index_head_dim * m.index_n_heads));
  return a;
}

SparseMlaAttention::Scratch SparseMlaAttention::Allocate(Backend& be, const AttentionMetadata& meta,
                                                         const KvLayerView& first_layer,
                                                         const ModelRunOptions& options) const {
  const DType act = be.activation_dtype();
  const int64_t n = meta.num_tokens;
  const bool sparse = Sparse(meta);
  Scratch s;
  s.mla = mla.Allocate(be, meta, first_layer, !sparse && mla.UpProjected(meta, options));
  s.k = be.Alloc(act, {n, index_head_dim});  // [n_tokens, index_head_dim]: written on every step
  if (sparse) {
    s.q = be.Alloc(act, {n, index_heads, index_head_dim});  // [n_tokens, index_heads, index_head_dim]
    s.w = be.Alloc(act, {n, index_heads});                  // [n_tokens, index_heads]
    s.selected = be.Alloc(DType::kI32, {n, topk});          // [n_tokens, index_topk]
    s.lists = be.Alloc(DType::kI32, {MlaSparseOps::ListInts(n, topk)});
    AttentionMetadata lists_meta = meta;  // the plan is for the longest list of selected rows
    lists_meta.max_seq_len = std::min(meta.max_seq_len, topk);
    s.plan = AttentionOpsOf<MlaSparseOps>(be).Plan(
        lists_meta,
        {.heads = mla.heads, .k_dim = mla.m.kv_lora_rank + mla.m.qk_rope_head_dim, .v_dim = mla.m.kv_lora_rank},
        first_layer);
  }
  return s;
}

void SparseMlaAttention::Forward(Backend& be, const TensorView& x, const LayerStep& step, const Scratch& s,
                                 const TensorView& out) const {
  const MlaAttention::Scratch& ms = s.mla;
  mla.Project(be, x, step, ms);
  MlaSparseOps& ops = AttentionOpsOf<MlaSparseOps>(be);
  // Every step writes the indexer's keys: a later step's context may outgrow index_topk.
  be.Linear(x, wk, s.k);
  ops.WriteIndexKeys(s.k, k_norm_weight, k_norm_bias, k_norm_eps, step.cos, step.sin, step.meta, step.cache);
  if (s.selected.empty()) {
    mla.AttendDense(be, step, ms);
  } else {
    const int64_t n = x.dim(0), rope = mla.m.qk_rope_head_dim;
    be.Linear(ms.qa_n, wq_b, s.q.view().Reshape({n, index_heads * index_head_dim}));
    be.ApplyRope(s.q.view().Slice(2, 0, rope), step.cos, step.sin, /*interleaved=*/false);
    be.Linear(x, weights_proj, s.w);
    ops.Select(s.plan, s.q, s.w, step.cache, step.meta, index_scale, s.selected);
    mla.AbsorbQuery(be, ms);
    ops.SparseAbsorbed(s.plan, ms.q_abs, step.cache, step.meta, s.selected, s.lists, mla.softmax_scale, ms.attn_lat);
    be.HeadLinear(ms.attn_lat, mla.w_uv, ms.attn);  // attn[:, h] = W_UV[h] attn_lat[:, h]
  }
  mla.Output(be, ms, out);
}

}  // namespace fathom
