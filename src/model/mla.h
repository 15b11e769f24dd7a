// Multi-head latent attention (DeepSeek-V2/V3) as a block: its weight specs, its binding (which splits kv_b_proj into
// the per-head projections of the absorbed form), and its forward step in either of its two forms.
//
// Absorbed form (decode, and prefill where it is cheaper):
//   cache row per token per layer = [RmsNorm(c_kv) (kv_lora_rank), rope(k_pe) (qk_rope_head_dim)]
//   q_abs[h] = [W_UK[h]^T q_nope[h], rope(q_pe[h])]        -> MQA over the cache rows, key dim kv_lora + rope
//   out[h]   = W_UV[h] (sum_j p_j c_kv_j)                  -> o_proj
// where kv_b_proj = [W_UK[0]; W_UV[0]; W_UK[1]; W_UV[1]; ...] row blocks of qk_nope_head_dim and v_head_dim.
// Up-projected form (prefill): each sequence's whole context of cache rows is gathered (GatherContext) and
// up-projected by kv_b_proj to per-head k_nope and v; then MHA with key [k_nope[h], k_pe] (MlaContextAttention) gives
// out[h] directly: fewer FLOPs per (query, key) pair (nope + rope + v_head_dim against 2 kv_lora + rope), plus one kv_b
// GEMM over the context. A step takes it when the pairs' saving reaches kMlaUpProjectedMinRatio x the kv_b GEMM's
// FLOPs; on the H200 (V2-Lite) the forms tie up to about 200 tokens, and the up-projected step took 0.95x the absorbed
// one's time at a 512-token prompt, 0.80x at 4 x 2048 and 0.61x at 8192.
//
//   MlaAttention::AddSpecs(b, LayerName(i, "self_attn."), cfg);
//   FATHOM_ASSIGN_OR_RETURN(MlaAttention a, MlaAttention::Bind(weights, be, LayerName(i, "self_attn."), cfg, par, &k));
//   MlaAttention::Scratch s = a.Allocate(be, meta, a.UpProjected(meta, run_options));
//   a.Forward(be, x, step, s, out);
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
  };
  Scratch Allocate(Backend& be, const AttentionMetadata& meta, bool up) const;
  void Forward(Backend& be, const TensorView& x, const LayerStep& step, const Scratch& s, const TensorView& out) const;
};

}  // namespace fathom
