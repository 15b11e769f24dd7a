// Multi-head latent attention (DeepSeek-V2/V3) as a block: its weight specs, its binding (which splits kv_b_proj into
// the per-head projections of the absorbed form), and its forward step in either of its two forms.
//
// Absorbed form (decode, and prefill where it is cheaper):
//   cache row per token per layer = [RmsNorm(c_kv) (kv_lora_rank), rope(k_pe) (qk_rope_head_dim)]
//   q_abs[h] = [W_UK[h]^T q_nope[h], rope(q_pe[h])]        -> MQA over the cache rows, key dim kv_lora + rope
//   out[h]   = W_UV[h] (sum_j p_j c_kv_j)                  -> o_proj
// where kv_b_proj = [W_UK[0]; W_UV[0]; W_UK[1]; W_UV[1]; ...] row blocks of qk_nope_head_dim and v_head_dim.
// Up-projected form (prefill): each sequence's whole context of cache rows is gathered (GatherContext) and
// up-projected by kv_b_proj to per-head k_nope and v; then MHA with key [k_nope[h], k_pe] (ContextAttention) gives
// out[h] directly: fewer FLOPs per (query, key) pair (nope + rope + v_head_dim against 2 kv_lora + rope), plus one kv_b
// GEMM over the context. A step takes it when the pairs' saving reaches kMlaUpProjectedMinRatio x the kv_b GEMM's
// FLOPs; on the H200 (V2-Lite) the forms tie up to about 200 tokens, and the up-projected step took 0.95x the absorbed
// one's time at a 512-token prompt, 0.80x at 4 x 2048 and 0.61x at 8192.
//
//   MlaAttention::AddSpecs(b, LayerName(i, "self_attn."), cfg);
//   FATHOM_ASSIGN_OR_RETURN(MlaAttention a, MlaAttention::Bind(weights, be, LayerName(i, "self_attn."), cfg, par, &k));
//   MlaAttention::Scratch s = a.Allocate(be, meta, kv.layer(0), a.UpProjected(meta, run_options));  // plans the step
//   a.Forward(be, x, step, s, out);
// The latent cache is an attention layout of its own (MlaLatentOps below, model/attention.h): its ops are the
// providers', backend/cpu/attention_mla.cc and backend/cuda/attention_mla.cc.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "io/model_config.h"
#include "model/backend.h"
#include "model/decoder.h"
#include "model/run_options.h"
#include "model/weight_specs.h"
#include "model/weights.h"

namespace fathom {

// On the H200 (V2-Lite, whole prompts) the up-projected step was faster from a FLOP ratio (pairs' saving over the kv_b
// GEMM) of kMlaUpProjectedMinRatio up; see docs/PERFORMANCE.md.
inline constexpr double kMlaUpProjectedMinRatio = 0.75;

// True when the attention FLOPs that the up-projected form saves on `causal_pairs` (query, key) pairs reach
// kMlaUpProjectedMinRatio x the FLOPs of up-projecting `context_rows` latent rows by kv_b_proj.
bool MlaUpProjectedPays(const MlaConfig& m, int64_t causal_pairs, int64_t context_rows);

// MLA's latent cache as an attention layout: per layer one row a token, [RmsNorm(c_kv) (kv_lora_rank),
// rope(k_pe) (qk_rope_head_dim)], one KV head, V the first kv_lora_rank values of each row (KvLayerView::v a strided
// view into k). Written with Backend::WriteKv.
class MlaLatentOps : public AttentionOps {
 public:
  static constexpr AttentionLayout kLayout = AttentionLayout::kMlaLatent;
  AttentionLayout layout() const override { return kLayout; }
  // The absorbed form: MQA of q [n, heads, kv_lora + rope] over the latent rows with the step's plan (Plan for
  // {heads, kv_lora + rope, kv_lora}); out [n, heads, kv_lora]. Causal: token t sees its sequence's rows
  // 0 .. positions[t].
  virtual void Absorbed(const AttentionPlan& plan, const TensorView& q, const KvLayerView& cache,
                        const AttentionMetadata& meta, float scale, const TensorView& out) = 0;
  // Every sequence's cached rows in order (its positions 0 .. seq_len - 1, sequence after sequence), widened to
  // float32 (FP8 with cache.k_scale): the up-projected form's context. out f32 [meta.total_seq_len, d], d the row.
  virtual void GatherContext(const KvLayerView& cache, const AttentionMetadata& meta, const TensorView& out) = 0;
  // The up-projected form's attention: per head, q [n, heads, nope + rope] against keys whose first `nope` values are
  // per head (k_nope [ctx, heads, nope]) and whose last `rope` are shared by the heads (k_rope [ctx, rope]); values
  // v [ctx, heads, v_dim]. The ctx rows hold every sequence's context in GatherContext's order; token t attends
  // causally to its sequence's rows 0 .. positions[t]. out [n, heads, v_dim]. Views may be strided with a unit inner
  // stride.
  virtual void ContextAttention(const TensorView& q, const TensorView& k_nope, const TensorView& k_rope,
                                const TensorView& v, const AttentionMetadata& meta, float scale,
                                const TensorView& out) = 0;
};

struct MlaAttention {
  LinearWeight q_b, kv_b, o;            // q_b: q_b_proj, or q_proj without q LoRA
  std::array<LinearWeight, 2> attn_in;  // {q_a_proj or q_proj, kv_a_proj_with_mqa}: the projections of the normed input
  TensorView q_a_norm, kv_a_norm;
  TensorView w_uk_t;  // [heads, kv_lora, nope]: W_UK transposed, per head
  TensorView w_uv;    // [heads, v_head_dim, kv_lora]
  MlaConfig m;
  int64_t heads = 0;  // this rank's
  float softmax_scale = 1.0f;
  float eps = 1e-6f;
  bool interleaved = true;

  // prefix + "q_a_proj", "q_a_layernorm", "q_b_proj" (or "q_proj"), "kv_a_proj_with_mqa", "kv_a_layernorm",
  // "kv_b_proj", "o_proj" (prefix ends in '.'). Heads are split between tensor-parallel ranks; the latent is not.
  static void AddSpecs(WeightSpecBuilder& b, const std::string& prefix, const ModelConfig& cfg);
  // Its share of a step's memory (an Architecture's attention_footprint): both forms' scratch, the up-projected
  // form's per context row (at most max_batched_tokens of them), and its widest linear (o_proj, q_b_proj or kv_b_proj).
  static AttentionFootprint Footprint(const ModelConfig& cfg);
  // Layer i's: AddSpecs at "model.layers.i.self_attn." (an Architecture's attention_specs).
  static void LayerSpecs(WeightSpecBuilder& b, int64_t i, const ModelConfig& cfg);
  // `constants` owns the per-head projections split out of kv_b_proj (exact: kv_b's dtype, or float32 for scaled
  // formats).
  static StatusOr<MlaAttention> Bind(const WeightStore& w, Backend& be, const std::string& prefix,
                                     const ModelConfig& cfg, const ParallelConfig& par, std::vector<Tensor>* constants);

  // The up-projected form for this step: only on a step with prefill tokens (a decode step of one token per sequence
  // keeps the absorbed form, and graphs record only those), within the context rows the memory plan reserves, and by
  // MlaUpProjectedPays unless the options force a form.
  bool UpProjected(const AttentionMetadata& meta, const ModelRunOptions& options) const;

  // A step's activations, shared by the layers.
  struct Scratch {
    Tensor qa, qa_n;  // [n, q_lora_rank]
    Tensor q;         // [n, heads, nope + rope]
    Tensor latent;    // [n, 1, kv_lora + rope]: the cache row
    Tensor q_abs;     // [n, heads, kv_lora + rope]
    Tensor attn_lat;  // [n, heads, kv_lora]
    Tensor attn;      // [n, heads, v_head_dim]
    Tensor ctx_lat;   // up-projected: [context rows, kv_lora + rope]
    Tensor ctx_kv;    // up-projected: [context rows, heads, nope + v_head_dim]
    bool up = false;
    AttentionPlan plan;  // the absorbed form's, made once a step
  };
  // The step's scratch and, for the absorbed form, its plan over `first_layer`'s cache.
  Scratch Allocate(Backend& be, const AttentionMetadata& meta, const KvLayerView& first_layer, bool up) const;
  // Project, AttendDense, Output.
  void Forward(Backend& be, const TensorView& x, const LayerStep& step, const Scratch& s, const TensorView& out) const;

  // Forward's parts, for a block built on this one (model/mla_sparse.h). Project: the projections, norms and rope of
  // x [n, hidden] into s.q (and s.qa_n, the q LoRA's normed activations) and s.latent, whose rows it writes into the
  // cache. AttendDense: attention over every cached row into s.attn, in the step's form. AbsorbQuery: s.q_abs from
  // s.q (the absorbed form's query). Output: o_proj of s.attn into out [n, hidden].
  void Project(Backend& be, const TensorView& x, const LayerStep& step, const Scratch& s) const;
  void AttendDense(Backend& be, const LayerStep& step, const Scratch& s) const;
  void AbsorbQuery(Backend& be, const Scratch& s) const;
  void Output(Backend& be, const Scratch& s, const TensorView& out) const;
};

}  // namespace fathom
