// DeepSeek Sparse Attention (DeepSeek-V3.2) as a block: MLA (model/mla.h) whose queries each attend only to the
// top index_topk cached tokens that a lightning indexer picks.
//
// Indexer, per layer (transformers' DeepseekV32Indexer, the oracle; no Hadamard rotation or FP8 rounding, as there):
//   qi[t, h] = rope_halves(wq_b(q_resid[t]))[h]       q_resid = q_a_layernorm(q_a_proj(x)), MLA's q LoRA activations
//   ki[t]    = rope_halves(LayerNorm(wk(x[t])))        one key row a token, kept in the cache's side row
//   w[t, h]  = weights_proj(x[t])[h]
//   I[t, j]  = sum_h w[t, h] relu(qi[t, h] . ki[j]) / sqrt(index_head_dim * index_n_heads)     j <= positions[t]
// rope_halves rotates the first qk_rope_head_dim values by halves (NeoX), unlike MLA's interleaved pairs. Token t
// keeps the min(index_topk, positions[t] + 1) positions of largest I (ties to the lower position), and MLA's absorbed
// form attends over those rows only. A step whose every context fits in index_topk selects everything, so it runs
// dense MLA (either form) instead: the same values, and the test of this block against mla_latent.
//
//   SparseMlaAttention::LayerSpecs(b, i, cfg);        // MLA's specs plus "indexer.*"
//   FATHOM_ASSIGN_OR_RETURN(SparseMlaAttention a, SparseMlaAttention::Bind(w, be, LayerName(i, "self_attn."), cfg,
//                                                                            par, &constants));
//   SparseMlaAttention::Scratch s = a.Allocate(be, meta, kv.layer(0), options);   // once a step: dense or sparse
//   a.Forward(be, x, step, s, out);
//
// The cache is its own attention layout, mla_sparse (MlaSparseOps below): MLA's latent rows plus the indexer's key
// as the side row (KvCacheSpec::side_dim = index_head_dim). Its providers: backend/cpu/attention_mla_sparse.cc and
// backend/cuda/attention_mla_sparse.cc.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/mla.h"

namespace fathom {

class MlaSparseOps : public AttentionOps {
 public:
  static constexpr AttentionLayout kLayout = AttentionLayout::kMlaSparse;
  AttentionLayout layout() const override { return kLayout; }

  // OK where this provider's kernels take an indexer of `heads` heads of `dim` values; otherwise INVALID_ARGUMENT
  // saying what they take, so that such a model is refused at load rather than failing at its first sparse step.
  virtual Status ServesIndexer(int64_t /*heads*/, int64_t /*dim*/) const { return OkStatus(); }

  // The indexer's key rows, in place: k [n, d] becomes LayerNorm(k) * norm_weight + norm_bias (eps; weight and bias
  // f32 [d]), its first 2 * cos.dim(1) values rotated by halves (Backend::ApplyRope, interleaved=false); then each
  // row is written to its token's slot of cache.side (d = the side row's width).
  virtual void WriteIndexKeys(const TensorView& k, const TensorView& norm_weight, const TensorView& norm_bias,
                              float eps, const TensorView& cos, const TensorView& sin, const AttentionMetadata& meta,
                              const KvLayerView& cache) = 0;
  // The indexer's choice. For token t and each cached position j <= positions[t] of its sequence:
  // I[t, j] = scale * sum_h weights[t, h] * relu(q[t, h] . side[j]). selected[t] gets the positions of the
  // min(k, positions[t] + 1) largest I in ascending order (equal I: the lower position wins), then -1s; k =
  // selected.dim(1). q [n, index_heads, d]; weights [n, index_heads]; selected i32 [n, k].
  virtual void Select(const AttentionPlan& plan, const TensorView& q, const TensorView& weights,
                      const KvLayerView& cache, const AttentionMetadata& meta, float scale,
                      const TensorView& selected) = 0;
  // MlaLatentOps::Absorbed's attention over only each token's selected positions (selected as Select leaves it: -1
  // ends a row's list). q [n, heads, kv_lora + rope]; out [n, heads, kv_lora]. `lists` i32 [ListInts(n, k)] is
  // scratch the provider may use (the GPU's: each token's selected rows as a sequence of its own). The plan is Plan's
  // for a meta whose max_seq_len is the longest list, min(k, the step's longest context).
  virtual void SparseAbsorbed(const AttentionPlan& plan, const TensorView& q, const KvLayerView& cache,
                              const AttentionMetadata& meta, const TensorView& selected, const TensorView& lists,
                              float scale, const TensorView& out) = 0;
  static int64_t ListInts(int64_t n, int64_t k) { return n * (k + 4) + 2; }
};

struct SparseMlaAttention {
  MlaAttention mla;
  LinearWeight wq_b;          // [index_heads * index_head_dim, q_lora_rank]
  LinearWeight wk;            // [index_head_dim, hidden]
  LinearWeight weights_proj;  // [index_heads, hidden]
  TensorView k_norm_weight;   // f32 [index_head_dim]
  TensorView k_norm_bias;     // f32 [index_head_dim]
  int64_t index_heads = 0;
  int64_t index_head_dim = 0;
  int64_t topk = 0;
  float index_scale = 1.0f;  // 1 / sqrt(index_head_dim * index_heads)
  float k_norm_eps = 1e-6f;  // transformers' nn.LayerNorm(eps=1e-6)

  // MLA's specs at prefix (ends in '.') plus prefix + "indexer." {"wq_b", "wk", "k_norm.weight", "k_norm.bias",
  // "weights_proj"}. The indexer is not split between tensor-parallel ranks: each holds and runs all of it.
  static void AddSpecs(WeightSpecBuilder& b, const std::string& prefix, const ModelConfig& cfg);
  static void LayerSpecs(WeightSpecBuilder& b, int64_t i, const ModelConfig& cfg);
  // MLA's footprint plus the indexer's activations and each token's list of index_topk positions.
  static AttentionFootprint Footprint(const ModelConfig& cfg);
  // A config without q LoRA is INVALID_ARGUMENT: the indexer's queries come from its activations.
  static StatusOr<SparseMlaAttention> Bind(const WeightStore& w, Backend& be, const std::string& prefix,
                                           const ModelConfig& cfg, const ParallelConfig& par,
                                           std::vector<Tensor>* constants);

  struct Scratch {
    MlaAttention::Scratch mla;
    Tensor k;         // [n, index_head_dim]
    Tensor q;         // [n, index_heads, index_head_dim]; empty on a dense step, as are w and selected
    Tensor w;         // [n, index_heads]
    Tensor selected;  // i32 [n, index_topk]
    Tensor lists;     // i32 [MlaSparseOps::ListInts(n, index_topk)]: SparseAbsorbed's scratch
    AttentionPlan plan;
  };
  // Sparse when some sequence's context exceeds index_topk; otherwise dense MLA in the form MlaAttention picks.
  bool Sparse(const AttentionMetadata& meta) const { return meta.max_seq_len > topk; }
  Scratch Allocate(Backend& be, const AttentionMetadata& meta, const KvLayerView& first_layer,
                   const ModelRunOptions& options) const;
  void Forward(Backend& be, const TensorView& x, const LayerStep& step, const Scratch& s, const TensorView& out) const;
};

}  // namespace fathom
