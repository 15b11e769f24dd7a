// Builds an architecture's weight specs: plain tensors (norms, embeddings, the router's bias) in the model's dtype, and
// linear layers in the checkpoint's weight format, which the builder asks for each layer's tensors (model files never
// name a format). Tensor-parallel splits are declared per linear; the format shards its tensors by them.
//
//   WeightSpecBuilder b(cfg, parallel);
//   b.Embedding("model.embed_tokens.weight");
//   b.Norm(LayerName(i, "input_layernorm.weight"), cfg.hidden_size);
//   b.Linear(LayerName(i, "self_attn.q_proj"), q_dim, hidden, {.bias = cfg.qkv_bias, .split = LinearSplit::kColumns});
//   FATHOM_ASSIGN_OR_RETURN(std::vector<WeightSpec> specs, b.Finish());   // the first error of any layer
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "comm/parallel.h"
#include "format/linear_method.h"
#include "format/weight_spec.h"
#include "io/model_config.h"

namespace fathom {

// "model.layers.3.self_attn.q_proj": the HF name of layer i's tensor or module `rest`.
std::string LayerName(int64_t i, const std::string& rest);

// How a model declares one linear layer (WeightSpecBuilder::Linear).
struct LinearOptions {
  bool bias = false;
  LinearSplit split = LinearSplit::kReplicated;
  double active = 1.0;         // share of the layer one token reads and uses (routed experts: top_k / n_experts)
  bool quantizable = true;     // false: float in every checkpoint (DeepSeek's router, lm_head)
  bool routed_expert = false;  // a routed expert's (DeepSeek-V4's MXFP4 under expert_dtype fp4)
  int64_t parts = 0;           // LinearSpec's: 0, tp_size parts; else that many, this rank holding `part`
  int64_t part = 0;
};

class WeightSpecBuilder {
 public:
  WeightSpecBuilder(const ModelConfig& cfg, const ParallelConfig& parallel) : cfg_(cfg), parallel_(parallel) {}

  // A replicated tensor (the model's dtype unless given).
  WeightSpec& Tensor(std::string name, std::vector<int64_t> shape, WeightInit init = WeightInit::kRandom);
  WeightSpec& Tensor(std::string name, std::vector<int64_t> shape, WeightInit init, DType dtype);
  // An RMSNorm weight [dim], ones in dummy weights.
  void Norm(std::string name, int64_t dim) { Tensor(std::move(name), {dim}, WeightInit::kOnes); }
  // An embedding table [vocab, hidden]: one row per token is read and active.
  void Embedding(std::string name);

  // The linear layer `prefix` of [out, in] (the whole layer; the split derives this rank's part).
  void Linear(const std::string& prefix, int64_t out, int64_t in, LinearOptions options = {});

  // Checks that `n` of `what` (a config key: "num_attention_heads") split evenly between the tensor-parallel ranks.
  void RequireSplit(const char* what, int64_t n);
  // KV heads split into the ranks or shared by them (ParallelConfig::SplitsKvHeads); otherwise an error naming them.
  void RequireKvSplit(int64_t num_kv_heads);

  // The specs in the order they were added, or the first error (an unsupported format, a split that does not divide).
  StatusOr<std::vector<WeightSpec>> Finish();

  const ParallelConfig& parallel() const { return parallel_; }
  // False once a check or a spec has failed: callers stop there (Finish returns the error).
  bool ok() const { return status_.ok(); }

 private:
  const ModelConfig& cfg_;
  ParallelConfig parallel_;
  std::vector<WeightSpec> specs_;
  Status status_;
};

}  // namespace fathom
