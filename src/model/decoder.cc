#include "model/decoder.h"

#include "model/rope.h"
#include "model/weight_specs.h"

namespace fathom {

StatusOr<std::vector<WeightSpec>> DecoderWeightSpecs(const ModelConfig& c, const ParallelConfig& par,
                                                     const LayerSpecs& attention, const LayerSpecs& mlp) {
  WeightSpecBuilder b(c, par);
  b.Embedding("model.embed_tokens.weight");
  for (int64_t i = 0; i < c.num_layers; ++i) {
    b.Norm(LayerName(i, "input_layernorm.weight"), c.hidden_size);
    attention(b, i, c);
    b.Norm(LayerName(i, "post_attention_layernorm.weight"), c.hidden_size);
    mlp(b, i, c);
  }
  b.Norm("model.norm.weight", c.hidden_size);
  // lm_head: vocab-parallel where it can be (each rank's vocab / tp rows, the logits all-gathered), else whole.
  const bool split_head = VocabParallelLmHead(c, par);
  WeightSpec& head =
      b.Tensor("lm_head.weight", {split_head ? c.vocab_size / par.tp_size : c.vocab_size, c.hidden_size});
  if (split_head) head.shard = {.dim = 0, .parts = par.tp_size, .index = par.tp_rank};
  if (c.tie_word_embeddings) {
    head.fallback = "model.embed_tokens.weight";
    head.shares_storage = true;
  }
  return b.Finish();
}

Status DecoderModel::InitDecoder(int64_t rope_dim) {
  rope_dim_ = rope_dim;
  const RopeFrequencies f = ComputeRopeFrequencies(cfg_.rope, rope_dim, cfg_.max_position_embeddings);
  rope_scale_ = f.attention_scale;
  FATHOM_ASSIGN_OR_RETURN(inv_freq_, Constant(f.inv_freq, DType::kF32, {static_cast<int64_t>(f.inv_freq.size())}));
  for (int64_t i = 0; i < cfg_.num_layers; ++i) {
    input_norms_.push_back(weights_->Get(LayerName(i, "input_layernorm.weight")));
    post_norms_.push_back(weights_->Get(LayerName(i, "post_attention_layernorm.weight")));
  }
  embed_ = weights_->Get("model.embed_tokens.weight");
  final_norm_ = weights_->Get("model.norm.weight");
  lm_head_.weight = weights_->Get("lm_head.weight");
  return OkStatus();
}

Status DecoderModel::Forward(const ForwardBatch& batch, KvCache& kv, Tensor* logits) {
  return ForwardThroughDevice(*this, backend_, batch, kv, logits);
}

Status DecoderModel::ForwardOnDevice(const BatchOnDevice& dev, KvCache& kv, Tensor* logits) {
  Backend& be = backend_;
  const AttentionMetadata& meta = dev.meta();
  const int64_t n = meta.num_tokens, h = cfg_.hidden_size;
  const DType act = be.activation_dtype();
  *logits = be.Alloc(DType::kF32, {dev.logits_indices().dim(0), cfg_.vocab_size});
  Tensor residual = be.Alloc(act, {n, h});                 // [n_tokens, hidden]
  Tensor normed = be.Alloc(act, {n, h});                   // [n_tokens, hidden]
  Tensor proj = be.Alloc(act, {n, h});                     // [n_tokens, hidden]: each block's output
  Tensor cos = be.Alloc(DType::kF32, {n, rope_dim_ / 2});  // [n_tokens, rope_dim / 2]
  Tensor sin = be.Alloc(DType::kF32, {n, rope_dim_ / 2});
  BeginStep(meta, kv);
  be.RopeCosSin(meta.positions, inv_freq_, rope_scale_, cos, sin);
  be.Embedding(dev.token_ids(), embed_, residual);
  Status status;
  for (int64_t i = 0; i < cfg_.num_layers && status.ok(); ++i) {
    if (i == 0) {
      be.RmsNorm(residual, input_norms_[0], eps(), normed);
    } else {
      be.AddRmsNorm(residual, proj, input_norms_[static_cast<size_t>(i)], eps(), normed);  // + the previous MLP's
    }
    status = Attention(i, normed, LayerStep{meta, kv.layer(i), cos, sin}, proj);
    if (status.ok()) status = comm_.AllReduceSum(proj);
    if (!status.ok()) break;
    be.AddRmsNorm(residual, proj, post_norms_[static_cast<size_t>(i)], eps(), normed);
    status = Mlp(i, normed, proj);
    if (status.ok()) status = comm_.AllReduceSum(proj);
  }
  EndStep();
  FATHOM_RETURN_IF_ERROR(status);
  be.AddInPlace(residual, proj);
  return ComputeLogits(be, residual, dev.logits_indices(), final_norm_, eps(), lm_head_, *logits, comm_);
}

}  // namespace fathom
