#include "model/blocks.h"

#include <fmt/format.h>

#include <cmath>

namespace fathom {

StatusOr<Tensor> ToHost(Backend& be, const TensorView& t) {
  if (!t.is_contiguous()) return InternalError("a weight read back to the host is not contiguous");
  Tensor host = Tensor::Empty(t.dtype(), t.shape());
  FATHOM_RETURN_IF_ERROR(be.CopyToHost(t, host.view().raw()));
  return host;
}

// ---- GatedMlp

void GatedMlp::AddSpecs(WeightSpecBuilder& b, const std::string& prefix, int64_t hidden, int64_t inter, bool bias,
                        double active, bool split) {
  const LinearSplit cols = split ? LinearSplit::kColumns : LinearSplit::kReplicated;
  const LinearSplit rows = split ? LinearSplit::kRows : LinearSplit::kReplicated;
  b.Linear(prefix + "gate_proj", inter, hidden, {.bias = bias, .split = cols, .active = active});
  b.Linear(prefix + "up_proj", inter, hidden, {.bias = bias, .split = cols, .active = active});
  b.Linear(prefix + "down_proj", hidden, inter, {.bias = bias, .split = rows, .active = active});
}

StatusOr<GatedMlp> GatedMlp::Bind(const WeightStore& w, Backend& be, const std::string& prefix) {
  GatedMlp m;
  FATHOM_ASSIGN_OR_RETURN(m.gate_up[0], w.Linear(prefix + "gate_proj", be));
  FATHOM_ASSIGN_OR_RETURN(m.gate_up[1], w.Linear(prefix + "up_proj", be));
  FATHOM_ASSIGN_OR_RETURN(m.down, w.Linear(prefix + "down_proj", be));
  return m;
}

void GatedMlp::Forward(Backend& be, const TensorView& x, const TensorView& g, const TensorView& u,
                       const TensorView& out) const {
  be.LinearFanOut(x, gate_up, std::array<TensorView, 2>{g, u});
  be.SiluMulLinear(g, u, down, out);
}

void GatedMlp::Forward(Backend& be, const TensorView& x, const TensorView& out) const {
  const int64_t rows = x.dim(0);
  Tensor g = be.Alloc(be.activation_dtype(), {rows, local_inter()});  // [m, intermediate]
  Tensor u = be.Alloc(be.activation_dtype(), {rows, local_inter()});
  Forward(be, x, g, u, out);
}

// ---- GqaAttention

void GqaAttention::AddSpecs(WeightSpecBuilder& b, const std::string& prefix, const ModelConfig& c) {
  b.RequireSplit("num_attention_heads", c.num_heads);
  b.RequireKvSplit(c.num_kv_heads);
  if (!b.ok()) return;  // a split that does not divide: nothing below may divide by it
  const int64_t h = c.hidden_size, q_dim = c.num_heads * c.head_dim, kv_dim = c.num_kv_heads * c.head_dim;
  b.Linear(prefix + "q_proj", q_dim, h, {.bias = c.qkv_bias, .split = LinearSplit::kColumns});
  // Fewer KV heads than ranks: each rank loads the one head its query heads read.
  const ParallelConfig& par = b.parallel();
  const LinearOptions kv = {.bias = c.qkv_bias,
                            .split = LinearSplit::kColumns,
                            .parts = par.KvParts(c.num_kv_heads),
                            .part = par.KvPart(c.num_kv_heads)};
  b.Linear(prefix + "k_proj", kv_dim, h, kv);
  b.Linear(prefix + "v_proj", kv_dim, h, kv);
  b.Linear(prefix + "o_proj", h, q_dim, {.bias = c.o_bias, .split = LinearSplit::kRows});
}

StatusOr<GqaAttention> GqaAttention::Bind(const WeightStore& w, Backend& be, const std::string& prefix,
                                          const ModelConfig& c, const ParallelConfig& par) {
  GqaAttention a;
  FATHOM_ASSIGN_OR_RETURN(a.qkv[0], w.Linear(prefix + "q_proj", be));
  FATHOM_ASSIGN_OR_RETURN(a.qkv[1], w.Linear(prefix + "k_proj", be));
  FATHOM_ASSIGN_OR_RETURN(a.qkv[2], w.Linear(prefix + "v_proj", be));
  FATHOM_ASSIGN_OR_RETURN(a.o, w.Linear(prefix + "o_proj", be));
  a.heads = par.Part(c.num_heads);
  a.kv_heads = par.KvHeads(c.num_kv_heads);
  a.head_dim = c.head_dim;
  a.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  a.interleaved = c.rope.interleaved;
  return a;
}

AttentionFootprint GqaAttention::Footprint(const ModelConfig& c) {
  const int64_t q = c.num_heads * c.head_dim, kv = 2 * c.num_kv_heads * c.head_dim;
  // q and the attention output, k and v (twice: the projections and their rotated copies).
  return {.values_per_token = 2 * q + 2 * kv, .widest_weight = q * c.hidden_size, .widest_input = q};
}

GqaAttention::Scratch GqaAttention::Allocate(Backend& be, const AttentionMetadata& meta,
                                             const KvLayerView& first_layer) const {
  const DType act = be.activation_dtype();
  const int64_t n = meta.num_tokens;
  Scratch s;
  s.q = be.Alloc(act, {n, heads, head_dim});     // [n_tokens, n_heads, head_dim]
  s.k = be.Alloc(act, {n, kv_heads, head_dim});  // [n_tokens, n_kv_heads, head_dim]
  s.v = be.Alloc(act, {n, kv_heads, head_dim});  // [n_tokens, n_kv_heads, head_dim]
  s.attn = be.Alloc(act, {n, heads, head_dim});  // [n_tokens, n_heads, head_dim]
  s.plan = AttentionOpsOf<PagedAttentionOps>(be).Plan(meta, {.heads = heads, .k_dim = head_dim, .v_dim = head_dim},
                                                      first_layer);
  return s;
}

void GqaAttention::Forward(Backend& be, const TensorView& x, const LayerStep& step, const Scratch& s,
                           const TensorView& out) const {
  const int64_t n = x.dim(0);
  const TensorView qkv_out[] = {s.q.view().Reshape({n, heads * head_dim}), s.k.view().Reshape({n, kv_heads * head_dim}),
                                s.v.view().Reshape({n, kv_heads * head_dim})};
  be.LinearFanOut(x, qkv, qkv_out);
  be.RopeWriteKv(s.q, s.k, s.v, step.cos, step.sin, interleaved, step.meta, step.cache);
  AttentionOpsOf<PagedAttentionOps>(be).Run(s.plan, s.q, step.cache, step.meta, scale, s.attn);
  be.Linear(s.attn.view().Reshape({n, heads * head_dim}), o, out);
}

// ---- MoeBlock

void MoeBlock::AddSpecs(WeightSpecBuilder& b, const std::string& prefix, const ModelConfig& c) {
  const MoeConfig& e = c.moe;
  const int64_t h = c.hidden_size;
  b.Linear(prefix + "gate", e.n_routed_experts, h, {.quantizable = false});
  if (e.topk_method == "noaux_tc") {
    b.Tensor(prefix + "gate.e_score_correction_bias", {e.n_routed_experts}, WeightInit::kZeros, DType::kF32);
  }
  const double active = static_cast<double>(e.num_experts_per_tok) / static_cast<double>(e.n_routed_experts);
  const ParallelConfig& par = b.parallel();
  const bool ep = par.expert_parallel && !par.single();
  if (ep) b.RequireSplit("n_routed_experts", e.n_routed_experts);
  const int64_t first = ep ? par.ExpertBegin(e.n_routed_experts) : 0;
  const int64_t count = ep ? par.Part(e.n_routed_experts) : e.n_routed_experts;
  for (int64_t x = first; x < first + count; ++x) {
    GatedMlp::AddSpecs(b, prefix + fmt::format("experts.{}.", x), h, e.moe_intermediate_size, false, active,
                       /*split=*/!ep);
  }
  if (e.n_shared_experts > 0) {
    GatedMlp::AddSpecs(b, prefix + "shared_experts.", h, e.moe_intermediate_size * e.n_shared_experts);
  }
}

StatusOr<MoeBlock> MoeBlock::Bind(const WeightStore& w, Backend& be, const std::string& prefix, const ModelConfig& c,
                                  const ParallelConfig& par, std::vector<Tensor>* constants) {
  MoeBlock m;
  m.route = RouteParams(RouterConfigFrom(c.moe));
  // The router runs on float32 activations, as DeepSeek's reference gate does (F.linear on float32 copies): rounding
  // them to bf16 would move near-tied expert choices.
  FATHOM_ASSIGN_OR_RETURN(m.router, w.Linear(prefix + "gate", be));
  m.router.float32_inputs = true;
  if (const TensorView* b = w.Find(prefix + "gate.e_score_correction_bias")) {
    FATHOM_ASSIGN_OR_RETURN(Tensor host, ToHost(be, *b));
    std::vector<float> bias(static_cast<size_t>(b->numel()));
    ConvertToF32(host.view().raw(), b->dtype(), 0, b->numel(), bias.data());
    FATHOM_ASSIGN_OR_RETURN(m.router_bias, UploadConstant(be, bias, DType::kF32, {b->numel()}, constants));
  }
  const int64_t n = c.moe.n_routed_experts;
  const bool ep = par.expert_parallel && !par.single();
  m.experts.first = ep ? par.ExpertBegin(n) : 0;
  m.experts.total = n;
  for (int64_t x = m.experts.first; x < m.experts.first + (ep ? par.Part(n) : n); ++x) {
    FATHOM_ASSIGN_OR_RETURN(GatedMlp e, GatedMlp::Bind(w, be, prefix + fmt::format("experts.{}.", x)));
    m.experts.gate.push_back(e.gate_up[0]);
    m.experts.up.push_back(e.gate_up[1]);
    m.experts.down.push_back(e.down);
  }
  FATHOM_RETURN_IF_ERROR(be.PrepareExperts(m.experts));
  if (c.moe.n_shared_experts > 0) {
    FATHOM_ASSIGN_OR_RETURN(m.shared, GatedMlp::Bind(w, be, prefix + "shared_experts."));
  }
  return m;
}

Status MoeBlock::Forward(Backend& be, const TensorView& x, const TensorView& out) const {
  const int64_t n = x.dim(0), e = route.n_experts, k = route.top_k;
  Tensor logits = be.Alloc(DType::kF32, {n, e});  // [n_tokens, n_experts], float32 as DeepSeek routes
  Tensor ids = be.Alloc(DType::kI32, {n, k});     // [n_tokens, top_k]
  Tensor w = be.Alloc(DType::kF32, {n, k});       // [n_tokens, top_k]
  if (shared) {  // the router and the shared experts' gate and up read x in one fan-out
    const int64_t inter = shared->local_inter();
    Tensor g = be.Alloc(be.activation_dtype(), {n, inter});  // [n_tokens, shared intermediate]
    Tensor u = be.Alloc(be.activation_dtype(), {n, inter});
    be.LinearFanOut(x, std::array<LinearWeight, 3>{router, shared->gate_up[0], shared->gate_up[1]},
                    std::array<TensorView, 3>{logits.view(), g.view(), u.view()});
    be.MoeRoute(logits, router_bias, route, ids, w);
    be.SiluMulLinear(g, u, shared->down, out);
  } else {
    be.Linear(x, router, logits);
    be.MoeRoute(logits, router_bias, route, ids, w);
    Tensor zero = be.Alloc(be.activation_dtype(), {n, x.dim(1)});
    be.Copy(zero, out);
  }
  return be.MoeExperts(x, experts, ids, w, out);
}

}  // namespace fathom
