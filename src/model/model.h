// A loaded model: runs one forward step of a ForwardBatch over a paged KV cache.
//
//   FATHOM_ASSIGN_OR_RETURN(ModelConfig cfg, LoadModelConfig(dir));
//   FATHOM_ASSIGN_OR_RETURN(auto model, LoadModel(dir, cfg, LoadOptions{}, backend));   // registry.h
//   FATHOM_ASSIGN_OR_RETURN(KvCache kv, KvCache::Allocate(backend, model->kv_cache_spec(), 64, 16));
//   Tensor logits;                                                                       // [n_logits, vocab]
//   FATHOM_RETURN_IF_ERROR(model->Forward(batch, kv, &logits));
#pragma once

#include <memory>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "io/model_config.h"
#include "model/backend.h"
#include "model/forward_batch.h"
#include "model/weights.h"

namespace fathom {

// What one layer's cache holds per token. Dense attention: K and V of every KV head. MLA: one latent row of
// k_dim = kv_lora_rank + qk_rope_head_dim values and no separate V (v_in_k: V is the first v_dim values of K).
struct KvCacheSpec {
  int64_t num_layers = 0;
  int64_t num_kv_heads = 0;
  int64_t k_dim = 0;
  int64_t v_dim = 0;
  bool v_in_k = false;

  // Values stored per token across all layers.
  int64_t values_per_token() const { return num_layers * num_kv_heads * (k_dim + (v_in_k ? 0 : v_dim)); }
};

class KvCache {
 public:
  KvCache() = default;
  static StatusOr<KvCache> Allocate(Backend& backend, const KvCacheSpec& spec, DType dtype, int64_t num_blocks,
                                    int64_t block_size);

  KvLayerView layer(int64_t i) const { return layers_.at(static_cast<size_t>(i)); }
  int64_t num_blocks() const { return num_blocks_; }
  int64_t block_size() const { return block_size_; }
  const KvCacheSpec& spec() const { return spec_; }
  DType dtype() const { return dtype_; }

 private:
  KvCacheSpec spec_;
  DType dtype_ = DType::kF32;
  int64_t num_blocks_ = 0;
  int64_t block_size_ = 0;
  std::vector<Tensor> storage_;
  std::vector<KvLayerView> layers_;
};

class Model {
 public:
  virtual ~Model() = default;
  virtual const ModelConfig& config() const = 0;
  virtual KvCacheSpec kv_cache_spec() const = 0;
  // Appends the batch's tokens to `kv` and returns logits [batch.num_logits(), vocab] (f32, on the backend's
  // device) for the rows in batch.logits_indices.
  virtual Status Forward(const ForwardBatch& batch, KvCache& kv, Tensor* logits) = 0;
};

// The checks every Model::Forward makes before touching a kernel: the batch itself (ForwardBatch::Validate), its block
// size against the cache's, and the cache's layout against the one the model needs.
Status CheckForwardInputs(const ForwardBatch& batch, const KvCache& kv, const KvCacheSpec& want, int64_t vocab_size);

// The common tail of a decoder: logits [n_logits, vocab] = lm_head(RmsNorm(hidden[indices])), computed only for the
// rows asked for.   hidden [n_tokens, hidden_size]; indices i32 [n_logits]
void ComputeLogits(Backend& be, const TensorView& hidden, const TensorView& indices, const TensorView& final_norm,
                   float eps, const LinearWeight& lm_head, const TensorView& logits);

// Builds a model of type M (constructor (cfg, weights, backend), then Status Init()) for the registry.
template <typename M>
StatusOr<std::unique_ptr<Model>> CreateModel(const ModelConfig& cfg, std::unique_ptr<WeightStore> weights,
                                             Backend& backend) {
  auto m = std::make_unique<M>(cfg, std::move(weights), backend);
  FATHOM_RETURN_IF_ERROR(m->Init());
  return std::unique_ptr<Model>(std::move(m));
}

// Host views of the batch's index arrays, uploaded to the backend. Keeps the uploaded tensors alive.
class BatchOnDevice {
 public:
  static StatusOr<BatchOnDevice> Upload(const ForwardBatch& batch, Backend& backend);
  const AttentionMetadata& meta() const { return meta_; }
  const TensorView& token_ids() const { return token_ids_.view(); }
  const TensorView& logits_indices() const { return logits_indices_.view(); }

 private:
  AttentionMetadata meta_;
  std::vector<Tensor> keep_;
  Tensor token_ids_;
  Tensor logits_indices_;
};

}  // namespace fathom
