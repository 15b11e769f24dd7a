// The decoder skeleton every family shares: the token embedding, a pre-norm residual stream through the layers
// (norm -> attention -> add + norm -> MLP), the final norm and lm_head, and the tensor-parallel all-reduces after each
// block's partial sums. A family supplies its attention and MLP blocks (model/blocks.h, model/mla.h).
//
//   class MyModel final : public DecoderModel {
//     Status Attention(int64_t i, const TensorView& x, const LayerStep& step, const TensorView& out) override;
//     Status Mlp(int64_t i, const TensorView& x, const TensorView& out) override;
//   };
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "model/model.h"

namespace fathom {

class WeightSpecBuilder;

// A family's specs in checkpoint order: the embedding; per layer the input norm, `attention`'s tensors, the post-
// attention norm and `mlp`'s; then the final norm and lm_head (tied to the embedding where the config says so).
using LayerSpecs = void (*)(WeightSpecBuilder& b, int64_t layer, const ModelConfig& cfg);
StatusOr<std::vector<WeightSpec>> DecoderWeightSpecs(const ModelConfig& cfg, const ParallelConfig& par,
                                                     const LayerSpecs& attention, const LayerSpecs& mlp);

// What a family's attention block needs of a step's memory, for the memory plan's reserve (engine/memory_plan.cc):
// float32 values per token of its step scratch (q, K/V or the cache row, outputs, and any second form's context
// rows), and its widest linear's weight (elements) and input (values a token).
struct AttentionFootprint {
  int64_t values_per_token = 0;
  int64_t widest_weight = 0;
  int64_t widest_input = 0;
};
using AttentionFootprintFn = AttentionFootprint (*)(const ModelConfig& cfg);

// What a layer's attention block sees of the step.
struct LayerStep {
  const AttentionMetadata& meta;
  KvLayerView cache;
  const TensorView& cos;  // f32 [n_tokens, rope_dim / 2]
  const TensorView& sin;
};

class DecoderModel : public Model {
 public:
  DecoderModel(const ModelConfig& cfg, std::unique_ptr<WeightStore> weights, Backend& backend, Communicator& comm)
      : cfg_(cfg), weights_(std::move(weights)), backend_(backend), comm_(comm) {}

  const ModelConfig& config() const override { return cfg_; }
  // The checks, the batch's upload, ForwardOnDevice, and the synchronization that reports the first op error.
  Status Forward(const ForwardBatch& batch, KvCache& kv, Tensor* logits) override;
  Status ForwardOnDevice(const BatchOnDevice& dev, KvCache& kv, Tensor* logits) override;

 protected:
  // Load time: the rope tables for `rope_dim` rotated values a head, the layers' norms, the embedding, the final norm
  // and lm_head.
  Status InitDecoder(int64_t rope_dim);
  // Per step, before the layers and after them: a family allocates its step scratch for meta.num_tokens tokens and
  // makes its attention layout's plan for the step (model/attention.h).
  virtual void BeginStep(const AttentionMetadata& /*meta*/, const KvCache& /*kv*/) {}
  virtual void EndStep() {}
  // Layer i's attention of x [n, hidden] into out [n, hidden] (this rank's partial sum).
  virtual Status Attention(int64_t i, const TensorView& x, const LayerStep& step, const TensorView& out) = 0;
  // Layer i's MLP (dense or MoE) of x into out, likewise.
  virtual Status Mlp(int64_t i, const TensorView& x, const TensorView& out) = 0;

  Backend& backend() { return backend_; }
  const WeightStore& weights() const { return *weights_; }
  const ParallelConfig& parallel() const { return comm_.parallel(); }
  StatusOr<LinearWeight> BindLinear(const std::string& prefix) { return weights_->Linear(prefix, backend_); }
  // Load-time constants on the device, owned by the model (model.h UploadConstant).
  StatusOr<TensorView> Constant(std::span<const float> values, DType dtype, std::initializer_list<int64_t> shape) {
    return UploadConstant(backend_, values, dtype, shape, &constants_);
  }
  float eps() const { return static_cast<float>(cfg_.rms_norm_eps); }

  ModelConfig cfg_;

 private:
  std::unique_ptr<WeightStore> weights_;
  Backend& backend_;
  Communicator& comm_;
  std::vector<Tensor> constants_;
  std::vector<TensorView> input_norms_, post_norms_;
  TensorView embed_, final_norm_;
  LinearWeight lm_head_;
  TensorView inv_freq_;  // [rope_dim / 2] f32, on the device
  float rope_scale_ = 1.0f;
  int64_t rope_dim_ = 0;
};

}  // namespace fathom
