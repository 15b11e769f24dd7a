// The Llama family: LlamaForCausalLM (deepseek-coder, deepseek-llm, R1-Distill-Llama) and Qwen2ForCausalLM
// (R1-Distill-Qwen). The two differ only in biases (Qwen2: q/k/v bias; Llama: all attention projections when
// attention_bias) and config defaults, so one file serves both: GQA attention and a gated MLP per layer.
#include "model/blocks.h"
#include "model/registry.h"

namespace fathom {

namespace {

void LlamaAttentionSpecs(WeightSpecBuilder& b, int64_t i, const ModelConfig& c) {
  GqaAttention::AddSpecs(b, LayerName(i, "self_attn."), c);
}

void LlamaMlpSpecs(WeightSpecBuilder& b, int64_t i, const ModelConfig& c) {
  GatedMlp::AddSpecs(b, LayerName(i, "mlp."), c.hidden_size, c.intermediate_size, c.mlp_bias);
}

KvCacheSpec LlamaKvSpec(const ModelConfig& c, const ParallelConfig& par) {
  KvCacheSpec k;
  k.num_layers = c.num_layers;
  k.num_kv_heads = par.KvHeads(c.num_kv_heads);
  k.k_dim = c.head_dim;
  k.v_dim = c.head_dim;
  return k;
}

class LlamaModel final : public DecoderModel {
 public:
  using DecoderModel::DecoderModel;

  Status Init() {
    FATHOM_RETURN_IF_ERROR(InitDecoder(cfg_.head_dim));
    for (int64_t i = 0; i < cfg_.num_layers; ++i) {
      Layer l;
      FATHOM_ASSIGN_OR_RETURN(l.attn,
                              GqaAttention::Bind(weights(), backend(), LayerName(i, "self_attn."), cfg_, parallel()));
      FATHOM_ASSIGN_OR_RETURN(l.mlp, GatedMlp::Bind(weights(), backend(), LayerName(i, "mlp.")));
      layers_.push_back(std::move(l));
    }
    return OkStatus();
  }

  KvCacheSpec kv_cache_spec() const override { return LlamaKvSpec(cfg_, parallel()); }
  bool SupportsForwardOnDevice() const override { return true; }

 private:
  struct Layer {
    GqaAttention attn;
    GatedMlp mlp;
  };

  // The step's scratch, shared by the layers.
  void BeginStep(const AttentionMetadata& meta, const KvCache& kv) override {
    const int64_t n = meta.num_tokens, inter = layers_[0].mlp.local_inter();
    attn_ = layers_[0].attn.Allocate(backend(), meta, kv.layer(0));
    gate_ = backend().Alloc(backend().activation_dtype(), {n, inter});  // [n_tokens, intermediate]
    up_ = backend().Alloc(backend().activation_dtype(), {n, inter});    // [n_tokens, intermediate]
  }
  void EndStep() override {
    attn_ = {};
    gate_ = up_ = Tensor();
  }

  Status Attention(int64_t i, const TensorView& x, const LayerStep& step, const TensorView& out) override {
    layers_[static_cast<size_t>(i)].attn.Forward(backend(), x, step, attn_, out);
    return OkStatus();
  }
  Status Mlp(int64_t i, const TensorView& x, const TensorView& out) override {
    layers_[static_cast<size_t>(i)].mlp.Forward(backend(), x, gate_, up_, out);
    return OkStatus();
  }

  std::vector<Layer> layers_;
  GqaAttention::Scratch attn_;
  Tensor gate_, up_;
};

}  // namespace

void RegisterLlamaFamily(std::vector<Architecture>& out) {
  RegisterFamily(out, {"LlamaForCausalLM", "Qwen2ForCausalLM"},
                 {.attention_specs = &LlamaAttentionSpecs,
                  .mlp_specs = &LlamaMlpSpecs,
                  .kv_spec = &LlamaKvSpec,
                  .create = &CreateModel<LlamaModel>,
                  .attention_footprint = &GqaAttention::Footprint});
}

}  // namespace fathom
