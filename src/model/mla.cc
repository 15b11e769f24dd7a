#include "model/mla.h"

#include <cmath>

#include "model/blocks.h"
#include "model/rope.h"

namespace fathom {

bool MlaUpProjectedPays(const MlaConfig& m, int64_t causal_pairs, int64_t context_rows) {
  const int64_t lora = m.kv_lora_rank, rope = m.qk_rope_head_dim, nope = m.qk_nope_head_dim, vd = m.v_head_dim;
  // Per head: scores and values over the latent against over [k_nope, k_pe] and v; kv_b's output per row.
  const double saved_per_pair = static_cast<double>(2 * (lora + rope) + 2 * lora - (2 * (nope + rope) + 2 * vd));
  const double kv_b_per_row = static_cast<double>(2 * lora * (nope + vd));
  return static_cast<double>(causal_pairs) * saved_per_pair >=
         kMlaUpProjectedMinRatio * static_cast<double>(context_rows) * kv_b_per_row;
}

void MlaAttention::AddSpecs(WeightSpecBuilder& b, const std::string& p, const ModelConfig& c) {
  const MlaConfig& m = c.mla;
  const int64_t h = c.hidden_size, nh = c.num_heads, qd = m.qk_nope_head_dim + m.qk_rope_head_dim;
  b.RequireSplit("num_attention_heads", nh);
  if (m.q_lora_rank > 0) {
    b.Linear(p + "q_a_proj", m.q_lora_rank, h);
    b.Norm(p + "q_a_layernorm.weight", m.q_lora_rank);
    b.Linear(p + "q_b_proj", nh * qd, m.q_lora_rank, {.split = LinearSplit::kColumns});
  } else {
    b.Linear(p + "q_proj", nh * qd, h, {.split = LinearSplit::kColumns});
  }
  b.Linear(p + "kv_a_proj_with_mqa", m.kv_lora_rank + m.qk_rope_head_dim, h);
  b.Norm(p + "kv_a_layernorm.weight", m.kv_lora_rank);
  b.Linear(p + "kv_b_proj", nh * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank, {.split = LinearSplit::kColumns});
  b.Linear(p + "o_proj", h, nh * m.v_head_dim, {.split = LinearSplit::kRows});
}

void MlaAttention::LayerSpecs(WeightSpecBuilder& b, int64_t i, const ModelConfig& c) {
  AddSpecs(b, LayerName(i, "self_attn."), c);
}

namespace {

// Splits kv_b_proj ([heads * (nope + v_head_dim), kv_lora]) into per-head W_UK^T and W_UV for the absorbed attention,
// on the backend's device, in the dtype that holds kv_b's values exactly.
Status SplitKvB(Backend& be, MlaAttention* a, std::vector<Tensor>* constants) {
  const MlaConfig& m = a->m;
  const int64_t lora = m.kv_lora_rank, nope = m.qk_nope_head_dim, vd = m.v_head_dim, nh = a->heads;
  const LinearWeight& kv_b = a->kv_b;
  // The layer's tensors on the host, for the format's reference dequantization.
  std::vector<Tensor> keep;
  FATHOM_ASSIGN_OR_RETURN(LinearWeight host, MapTensors(kv_b, [&](const TensorView& t) -> StatusOr<TensorView> {
                            FATHOM_ASSIGN_OR_RETURN(Tensor h, ToHost(be, t));
                            keep.push_back(std::move(h));
                            return keep.back().view();
                          }));
  std::vector<float> row(static_cast<size_t>(lora));
  std::vector<float> uk_t(static_cast<size_t>(nh * lora * nope));  // [n_heads, kv_lora, nope]
  std::vector<float> uv(static_cast<size_t>(nh * vd * lora));      // [n_heads, v_head_dim, kv_lora]
  for (int64_t hh = 0; hh < nh; ++hh) {
    for (int64_t r = 0; r < nope + vd; ++r) {
      DequantizeRow(host, hh * (nope + vd) + r, row.data());
      for (int64_t c = 0; c < lora; ++c) {
        if (r < nope) {
          uk_t[(hh * lora + c) * nope + r] = row[c];
        } else {
          uv[(hh * vd + (r - nope)) * lora + c] = row[c];
        }
      }
    }
  }
  const DType dt = MethodOf(kv_b.format).ExactFloatDType(kv_b);
  FATHOM_ASSIGN_OR_RETURN(a->w_uk_t, UploadConstant(be, uk_t, dt, {nh, lora, nope}, constants));
  FATHOM_ASSIGN_OR_RETURN(a->w_uv, UploadConstant(be, uv, dt, {nh, vd, lora}, constants));
  return OkStatus();
}

}  // namespace

StatusOr<MlaAttention> MlaAttention::Bind(const WeightStore& w, Backend& be, const std::string& p, const ModelConfig& c,
                                          const ParallelConfig& par, std::vector<Tensor>* constants) {
  MlaAttention a;
  a.m = c.mla;
  a.heads = par.Part(c.num_heads);
  a.eps = static_cast<float>(c.rms_norm_eps);
  a.interleaved = c.rope.interleaved;
  a.softmax_scale = 1.0f / std::sqrt(static_cast<float>(a.m.qk_nope_head_dim + a.m.qk_rope_head_dim));
  if (c.rope.type == RopeType::kYarn && c.rope.mscale_all_dim && *c.rope.mscale_all_dim != 0.0) {
    const float ms = static_cast<float>(YarnMscale(c.rope.factor, *c.rope.mscale_all_dim));
    a.softmax_scale *= ms * ms;
  }
  if (a.m.q_lora_rank > 0) {
    FATHOM_ASSIGN_OR_RETURN(a.attn_in[0], w.Linear(p + "q_a_proj", be));
    a.q_a_norm = w.Get(p + "q_a_layernorm.weight");
    FATHOM_ASSIGN_OR_RETURN(a.q_b, w.Linear(p + "q_b_proj", be));
  } else {
    FATHOM_ASSIGN_OR_RETURN(a.q_b, w.Linear(p + "q_proj", be));
    a.attn_in[0] = a.q_b;
  }
  FATHOM_ASSIGN_OR_RETURN(a.attn_in[1], w.Linear(p + "kv_a_proj_with_mqa", be));
  a.kv_a_norm = w.Get(p + "kv_a_layernorm.weight");
  FATHOM_ASSIGN_OR_RETURN(a.o, w.Linear(p + "o_proj", be));
  // kv_b's per-head split reads its tensors as the checkpoint has them: before PrepareLinear, which may repack them.
  FATHOM_ASSIGN_OR_RETURN(a.kv_b, w.UnpreparedLinear(p + "kv_b_proj"));
  FATHOM_RETURN_IF_ERROR(SplitKvB(be, &a, constants));
  FATHOM_RETURN_IF_ERROR(be.PrepareLinear(a.kv_b));
  return a;
}

AttentionFootprint MlaAttention::Footprint(const ModelConfig& c) {
  const MlaConfig& m = c.mla;
  const int64_t head = std::max(c.head_dim, m.qk_nope_head_dim + m.qk_rope_head_dim), q = c.num_heads * head;
  const int64_t kv = std::max(2 * c.num_kv_heads * c.head_dim, m.kv_lora_rank + m.qk_rope_head_dim);
  // The absorbed form: per head a query over the latent (kv_lora_rank + rope) and an output of kv_lora_rank. The
  // up-projected prefill: per context row the gathered latent row and its per-head k_nope and v.
  const int64_t forms = c.num_heads * (2 * m.kv_lora_rank + m.qk_rope_head_dim) +
                        c.num_heads * (m.qk_nope_head_dim + m.v_head_dim) + m.kv_lora_rank + m.qk_rope_head_dim;
  const int64_t v_dim = m.v_head_dim > 0 ? m.v_head_dim : c.head_dim;
  return {.values_per_token = 2 * q + 2 * kv + forms,
          .widest_weight = std::max({c.num_heads * v_dim * c.hidden_size, c.num_heads * head * m.q_lora_rank,
                                     c.num_heads * (m.qk_nope_head_dim + v_dim) * m.kv_lora_rank}),
          .widest_input = c.num_heads * v_dim};
}

bool MlaAttention::UpProjected(const AttentionMetadata& meta, const ModelRunOptions& options) const {
  if (meta.num_tokens <= meta.num_seqs || meta.total_seq_len == 0) return false;
  // Its context rows are step activations: the memory plan reserves them for max_batched_tokens rows.
  if (options.max_batched_tokens > 0 && meta.total_seq_len > options.max_batched_tokens) return false;
  if (options.prefill_form != PrefillForm::kAuto) return options.prefill_form == PrefillForm::kExpanded;
  return MlaUpProjectedPays(m, meta.causal_pairs, meta.total_seq_len);
}

MlaAttention::Scratch MlaAttention::Allocate(Backend& be, const AttentionMetadata& meta, const KvLayerView& first_layer,
                                             bool up) const {
  const DType act = be.activation_dtype();
  const int64_t n = meta.num_tokens, nope = m.qk_nope_head_dim, rope = m.qk_rope_head_dim, lora = m.kv_lora_rank;
  const int64_t vd = m.v_head_dim;
  Scratch s;
  if (m.q_lora_rank > 0) {
    s.qa = be.Alloc(act, {n, m.q_lora_rank});    // [n_tokens, q_lora_rank]
    s.qa_n = be.Alloc(act, {n, m.q_lora_rank});  // [n_tokens, q_lora_rank]
  }
  s.q = be.Alloc(act, {n, heads, nope + rope});      // [n_tokens, n_heads, nope + rope]
  s.latent = be.Alloc(act, {n, 1, lora + rope});     // [n_tokens, 1, kv_lora + rope]: the cache row
  s.q_abs = be.Alloc(act, {n, heads, lora + rope});  // [n_tokens, n_heads, kv_lora + rope]
  s.attn_lat = be.Alloc(act, {n, heads, lora});      // [n_tokens, n_heads, kv_lora]
  s.attn = be.Alloc(act, {n, heads, vd});            // [n_tokens, n_heads, v_head_dim]
  s.up = up;
  if (up) {
    s.ctx_lat = be.Alloc(act, {meta.total_seq_len, lora + rope});      // [context rows, kv_lora + rope]
    s.ctx_kv = be.Alloc(act, {meta.total_seq_len, heads, nope + vd});  // [context rows, n_heads, nope + v_head_dim]
  } else {
    s.plan =
        AttentionOpsOf<MlaLatentOps>(be).Plan(meta, {.heads = heads, .k_dim = lora + rope, .v_dim = lora}, first_layer);
  }
  return s;
}

void MlaAttention::Project(Backend& be, const TensorView& x, const LayerStep& step, const Scratch& s) const {
  const AttentionMetadata& meta = step.meta;
  const int64_t n = x.dim(0), nope = m.qk_nope_head_dim, rope = m.qk_rope_head_dim, qd = nope + rope;
  const int64_t lora = m.kv_lora_rank;
  const TensorView latent2 = s.latent.view().Reshape({n, lora + rope});
  const TensorView c_kv = latent2.Slice(1, 0, lora);                    // [n_tokens, kv_lora], strided
  const TensorView k_pe = s.latent.view().Slice(2, lora, lora + rope);  // [n_tokens, 1, rope], strided
  const TensorView q_pe = s.q.view().Slice(2, nope, qd);                // [n_tokens, n_heads, rope], strided
  const TensorView q2 = s.q.view().Reshape({n, heads * qd});
  // The projections of the normed input share one launch at decode sizes: q (or its LoRA down-projection) and the
  // compressed KV.
  if (m.q_lora_rank > 0) {
    be.LinearFanOut(x, attn_in, std::array<TensorView, 2>{s.qa.view(), latent2});
    be.RmsNorm(s.qa, q_a_norm, eps, s.qa_n);
    be.Linear(s.qa_n, q_b, q2);
  } else {
    be.LinearFanOut(x, attn_in, std::array<TensorView, 2>{q2, latent2});
  }
  be.RmsNorm(c_kv, kv_a_norm, eps, c_kv);
  be.ApplyRope(k_pe, step.cos, step.sin, interleaved);
  be.ApplyRope(q_pe, step.cos, step.sin, interleaved);
  be.WriteKv(s.latent, TensorView(), meta, step.cache);
}

void MlaAttention::AbsorbQuery(Backend& be, const Scratch& s) const {
  const int64_t nope = m.qk_nope_head_dim, rope = m.qk_rope_head_dim, lora = m.kv_lora_rank;
  // q_abs[:, h, :lora] = q_nope[:, h] W_UK[h]
  be.HeadLinear(s.q.view().Slice(2, 0, nope), w_uk_t, s.q_abs.view().Slice(2, 0, lora));
  be.Copy(s.q.view().Slice(2, nope, nope + rope), s.q_abs.view().Slice(2, lora, lora + rope));
}

void MlaAttention::AttendDense(Backend& be, const LayerStep& step, const Scratch& s) const {
  const AttentionMetadata& meta = step.meta;
  const int64_t nope = m.qk_nope_head_dim, rope = m.qk_rope_head_dim, lora = m.kv_lora_rank, vd = m.v_head_dim;
  MlaLatentOps& ops = AttentionOpsOf<MlaLatentOps>(be);
  if (s.up) {
    ops.GatherContext(step.cache, meta, s.ctx_lat);
    be.Linear(s.ctx_lat.view().Slice(1, 0, lora), kv_b,
              s.ctx_kv.view().Reshape({meta.total_seq_len, heads * (nope + vd)}));
    ops.ContextAttention(s.q, s.ctx_kv.view().Slice(2, 0, nope), s.ctx_lat.view().Slice(1, lora, lora + rope),
                         s.ctx_kv.view().Slice(2, nope, nope + vd), meta, softmax_scale, s.attn);
  } else {
    AbsorbQuery(be, s);
    ops.Absorbed(s.plan, s.q_abs, step.cache, meta, softmax_scale, s.attn_lat);
    be.HeadLinear(s.attn_lat, w_uv, s.attn);  // attn[:, h] = W_UV[h] attn_lat[:, h]
  }
}

void MlaAttention::Output(Backend& be, const Scratch& s, const TensorView& out) const {
  be.Linear(s.attn.view().Reshape({s.attn.dim(0), heads * m.v_head_dim}), o, out);
}

void MlaAttention::Forward(Backend& be, const TensorView& x, const LayerStep& step, const Scratch& s,
                           const TensorView& out) const {
  Project(be, x, step, s);
  AttendDense(be, step, s);
  Output(be, s, out);
}

}  // namespace fathom
