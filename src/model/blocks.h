// The building blocks the model families are made of, each with its weight specs, its binding at load time and its
// forward step: the gated MLP, GQA attention over the paged cache, and DeepSeek's MoE block. Under tensor parallelism
// each block holds this rank's part and writes this rank's partial sum (DecoderModel all-reduces it).
//
//   GatedMlp::AddSpecs(b, LayerName(i, "mlp."), cfg.hidden_size, cfg.intermediate_size);
//   FATHOM_ASSIGN_OR_RETURN(GatedMlp mlp, GatedMlp::Bind(weights, backend, LayerName(i, "mlp.")));
//   mlp.Forward(be, x, gate_scratch, up_scratch, out);   // out = down(silu(gate x) * up x)
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>

#include "model/backend.h"
#include "model/decoder.h"
#include "model/moe.h"
#include "model/weight_specs.h"
#include "model/weights.h"

namespace fathom {

// down(silu(gate(x)) * up(x)): gate and up [inter, hidden] column-parallel, down [hidden, inter] row-parallel.
struct GatedMlp {
  std::array<LinearWeight, 2> gate_up;  // one fan-out
  LinearWeight down;

  // prefix + "gate_proj", "up_proj", "down_proj" (prefix ends in '.').
  // `split`: tensor-parallel (gate/up by columns, down by rows), or whole on this rank (an expert under expert
  // parallelism).
  static void AddSpecs(WeightSpecBuilder& b, const std::string& prefix, int64_t hidden, int64_t inter,
                       bool bias = false, double active = 1.0, bool split = true);
  static StatusOr<GatedMlp> Bind(const WeightStore& w, Backend& be, const std::string& prefix);

  // out = down(silu(gate x) * up x), gate and up in one fan-out.   x [m, hidden]; g, u [m, local inter] (scratch);
  // out [m, hidden]
  void Forward(Backend& be, const TensorView& x, const TensorView& g, const TensorView& u, const TensorView& out) const;
  // The same with its own scratch.
  void Forward(Backend& be, const TensorView& x, const TensorView& out) const;
  int64_t local_inter() const { return gate_up[0].out_features(); }
};

// Grouped-query attention (Llama, Qwen2): q/k/v column-parallel by heads in one fan-out, rope and the KV write in one
// op, paged attention, o_proj row-parallel.
struct GqaAttention {
  std::array<LinearWeight, 3> qkv;
  LinearWeight o;
  int64_t heads = 0, kv_heads = 0, head_dim = 0;  // this rank's
  float scale = 1.0f;
  bool interleaved = false;

  // prefix + "q_proj", "k_proj", "v_proj", "o_proj" (prefix ends in '.'), shaped by cfg.
  static void AddSpecs(WeightSpecBuilder& b, const std::string& prefix, const ModelConfig& cfg);
  static StatusOr<GqaAttention> Bind(const WeightStore& w, Backend& be, const std::string& prefix,
                                     const ModelConfig& cfg, const ParallelConfig& par);

  // Its share of a step's memory (an Architecture's attention_footprint).
  static AttentionFootprint Footprint(const ModelConfig& cfg);

  // A step's q, k, v and attention output, shared by the layers, and its attention plan (model/attention.h).
  struct Scratch {
    Tensor q, k, v, attn;  // [n, heads, head_dim], [n, kv_heads, head_dim] twice, [n, heads, head_dim]
    AttentionPlan plan;
  };
  // For meta.num_tokens tokens; the plan over `first_layer`'s cache.
  Scratch Allocate(Backend& be, const AttentionMetadata& meta, const KvLayerView& first_layer) const;
  void Forward(Backend& be, const TensorView& x, const LayerStep& step, const Scratch& s, const TensorView& out) const;
};

// DeepSeek's MoE MLP: the router (float32 logits over float32 activations), the shared experts densely, then the
// routed experts weighted by the router (Backend::MoeRoute, Backend::MoeExperts).
struct MoeBlock {
  LinearWeight router;
  TensorView router_bias;  // f32 [n_experts] on the device, or empty
  ExpertSet experts;
  std::optional<GatedMlp> shared;
  moe_route::Params route;

  // prefix + "gate", "gate.e_score_correction_bias", "experts.{e}.", "shared_experts." (prefix ends in '.'). Under
  // expert parallelism only this rank's experts, whole (ParallelConfig::ExpertBegin); otherwise every expert, split.
  static void AddSpecs(WeightSpecBuilder& b, const std::string& prefix, const ModelConfig& cfg);
  // Binds the layer and prepares its experts for the backend; `constants` owns the router bias's device copy.
  static StatusOr<MoeBlock> Bind(const WeightStore& w, Backend& be, const std::string& prefix, const ModelConfig& cfg,
                                 const ParallelConfig& par, std::vector<Tensor>* constants);

  // out = shared(x) + sum_j weight_j expert_j(x).   x, out [n, hidden]
  Status Forward(Backend& be, const TensorView& x, const TensorView& out) const;
  // The experts run without a host round trip on this backend (the CPU, or device state from PrepareExperts).
  bool on_device(const Backend& be) const { return experts.device_state != nullptr || be.device() == Device::kCpu; }
};

// A host copy of a contiguous tensor, wherever the backend keeps it.
StatusOr<Tensor> ToHost(Backend& be, const TensorView& t);

}  // namespace fathom
