// The DeepSeek family: DeepseekV2ForCausalLM (V2, V2-Lite), DeepseekV3ForCausalLM (V3, R1, V3.1) and
// DeepseekV32ForCausalLM (V3.2): multi-head latent attention over a latent paged cache (model/mla.h; V3.2's sparse
// form with its lightning indexer, model/mla_sparse.h) and mixture-of-experts MLPs (MoeBlock, model/blocks.h), whose
// first first_k_dense_replace layers are dense gated MLPs. Multi-token-prediction layers (num_nextn_predict_layers,
// stored past num_hidden_layers) are not used for plain decoding; their tensors stay unread in the checkpoint.
#include <optional>

#include "model/blocks.h"
#include "model/mla.h"
#include "model/mla_sparse.h"
#include "model/registry.h"

namespace fathom {

namespace {

// Dense gated MLPs in the first first_k_dense_replace layers (and off the moe_layer_freq grid), MoE blocks elsewhere.
void DeepseekMlpSpecs(WeightSpecBuilder& b, int64_t i, const ModelConfig& c) {
  if (c.IsMoeLayer(i)) {
    MoeBlock::AddSpecs(b, LayerName(i, "mlp."), c);
  } else {
    GatedMlp::AddSpecs(b, LayerName(i, "mlp."), c.hidden_size, c.intermediate_size);
  }
}

// One latent row per token and layer, shared by the heads (and by tensor-parallel ranks: each holds all of it); V3.2
// adds the indexer's key as the side row.
KvCacheSpec DeepseekKvSpec(const ModelConfig& c, const ParallelConfig& /*par*/) {
  KvCacheSpec k;
  k.num_layers = c.num_layers;
  k.num_kv_heads = 1;
  k.layout = c.mla.sparse() ? AttentionLayout::kMlaSparse : AttentionLayout::kMlaLatent;
  k.k_dim = c.mla.kv_lora_rank + c.mla.qk_rope_head_dim;
  k.v_dim = c.mla.kv_lora_rank;
  k.v_in_k = true;
  k.side_dim = c.mla.sparse() ? c.mla.index_head_dim : 0;
  return k;
}

class DeepseekModel final : public DecoderModel {
 public:
  using DecoderModel::DecoderModel;

  Status Init() {
    FATHOM_RETURN_IF_ERROR(InitDecoder(cfg_.mla.qk_rope_head_dim));
    for (int64_t i = 0; i < cfg_.num_layers; ++i) {
      Layer l;
      if (cfg_.mla.sparse()) {
        FATHOM_ASSIGN_OR_RETURN(l.sparse, SparseMlaAttention::Bind(weights(), backend(), LayerName(i, "self_attn."),
                                                                   cfg_, parallel(), &owned_));
      } else {
        FATHOM_ASSIGN_OR_RETURN(
            l.attn, MlaAttention::Bind(weights(), backend(), LayerName(i, "self_attn."), cfg_, parallel(), &owned_));
      }
      if (cfg_.IsMoeLayer(i)) {
        FATHOM_ASSIGN_OR_RETURN(l.moe,
                                MoeBlock::Bind(weights(), backend(), LayerName(i, "mlp."), cfg_, parallel(), &owned_));
        // Without the backend's device state the experts take the host-sorted path, which reads the routing back.
        experts_on_device_ = experts_on_device_ && l.moe->on_device(backend());
      } else {
        FATHOM_ASSIGN_OR_RETURN(l.dense, GatedMlp::Bind(weights(), backend(), LayerName(i, "mlp.")));
      }
      layers_.push_back(std::move(l));
    }
    return OkStatus();
  }

  KvCacheSpec kv_cache_spec() const override { return DeepseekKvSpec(cfg_, parallel()); }
  // No host synchronization where the backend routes and runs the experts on the device (the CPU, or CUDA with the
  // device state PrepareExperts made); otherwise (experts in a layout the device path does not take) MoeExperts
  // reads the routing on the host, so no graph can record a step, and the engine runs decode steps eagerly.
  bool SupportsForwardOnDevice() const override { return experts_on_device_; }
  void set_run_options(const ModelRunOptions& o) override { run_ = o; }

 private:
  struct Layer {
    MlaAttention attn;                         // V2, V3
    std::optional<SparseMlaAttention> sparse;  // V3.2
    std::optional<MoeBlock> moe;
    GatedMlp dense;
  };

  void BeginStep(const AttentionMetadata& meta, const KvCache& kv) override {
    const Layer& l = layers_[0];
    if (l.sparse) {
      sparse_scratch_ = l.sparse->Allocate(backend(), meta, kv.layer(0), run_);
    } else {
      scratch_ = l.attn.Allocate(backend(), meta, kv.layer(0), l.attn.UpProjected(meta, run_));
    }
  }
  void EndStep() override {
    scratch_ = {};
    sparse_scratch_ = {};
  }

  Status Attention(int64_t i, const TensorView& x, const LayerStep& step, const TensorView& out) override {
    const Layer& l = layers_[static_cast<size_t>(i)];
    if (l.sparse) {
      l.sparse->Forward(backend(), x, step, sparse_scratch_, out);
    } else {
      l.attn.Forward(backend(), x, step, scratch_, out);
    }
    return OkStatus();
  }
  Status Mlp(int64_t i, const TensorView& x, const TensorView& out) override {
    const Layer& l = layers_[static_cast<size_t>(i)];
    if (l.moe) return l.moe->Forward(backend(), x, out);
    l.dense.Forward(backend(), x, out);
    return OkStatus();
  }

  std::vector<Layer> layers_;
  std::vector<Tensor> owned_;
  ModelRunOptions run_;
  MlaAttention::Scratch scratch_;
  SparseMlaAttention::Scratch sparse_scratch_;
  bool experts_on_device_ = true;  // every MoE layer's experts run without a host round trip
};

}  // namespace

void RegisterDeepseekFamily(std::vector<Architecture>& out) {
  RegisterFamily(out, {"DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM"},
                 {.attention_specs = &MlaAttention::LayerSpecs,
                  .mlp_specs = &DeepseekMlpSpecs,
                  .kv_spec = &DeepseekKvSpec,
                  .create = &CreateModel<DeepseekModel>,
                  .attention_footprint = &MlaAttention::Footprint});
  RegisterFamily(out, {"DeepseekV32ForCausalLM"},
                 {.attention_specs = &SparseMlaAttention::LayerSpecs,
                  .mlp_specs = &DeepseekMlpSpecs,
                  .kv_spec = &DeepseekKvSpec,
                  .create = &CreateModel<DeepseekModel>,
                  .attention_footprint = &SparseMlaAttention::Footprint});
}

}  // namespace fathom
