// The Llama family: LlamaForCausalLM (deepseek-coder, deepseek-llm, R1-Distill-Llama) and Qwen2ForCausalLM
// (R1-Distill-Qwen). The two differ only in biases (Qwen2: q/k/v bias; Llama: all attention projections when
// attention_bias) and config defaults, so one file serves both.
#include <fmt/format.h>

#include <array>
#include <cmath>

#include "model/registry.h"
#include "model/rope.h"

namespace fathom {

namespace {

std::string LayerName(int64_t i, const char* rest) {
  return fmt::format("model.layers.{}.{}", i, rest);
}

std::vector<WeightSpec> LlamaWeightSpecs(const ModelConfig& c) {
  const DType dt = c.dtype;
  const int64_t h = c.hidden_size, q_dim = c.num_heads * c.head_dim, kv_dim = c.num_kv_heads * c.head_dim;
  std::vector<WeightSpec> s;
  auto add = [&](std::string name, std::vector<int64_t> shape, WeightInit init = WeightInit::kRandom) {
    WeightSpec w;
    w.name = std::move(name);
    w.shape = std::move(shape);
    w.dtype = dt;
    w.init = init;
    s.push_back(std::move(w));
  };
  add("model.embed_tokens.weight", {c.vocab_size, h});
  // One row per token: counted neither as read nor as active beyond that row (DeepSeek's "activated" convention).
  s.back().read_fraction = s.back().active_fraction = 1.0 / static_cast<double>(c.vocab_size);
  for (int64_t i = 0; i < c.num_layers; ++i) {
    add(LayerName(i, "input_layernorm.weight"), {h}, WeightInit::kOnes);
    add(LayerName(i, "self_attn.q_proj.weight"), {q_dim, h});
    add(LayerName(i, "self_attn.k_proj.weight"), {kv_dim, h});
    add(LayerName(i, "self_attn.v_proj.weight"), {kv_dim, h});
    if (c.qkv_bias) {
      add(LayerName(i, "self_attn.q_proj.bias"), {q_dim});
      add(LayerName(i, "self_attn.k_proj.bias"), {kv_dim});
      add(LayerName(i, "self_attn.v_proj.bias"), {kv_dim});
    }
    add(LayerName(i, "self_attn.o_proj.weight"), {h, q_dim});
    if (c.o_bias) add(LayerName(i, "self_attn.o_proj.bias"), {h});
    add(LayerName(i, "post_attention_layernorm.weight"), {h}, WeightInit::kOnes);
    add(LayerName(i, "mlp.gate_proj.weight"), {c.intermediate_size, h});
    add(LayerName(i, "mlp.up_proj.weight"), {c.intermediate_size, h});
    add(LayerName(i, "mlp.down_proj.weight"), {h, c.intermediate_size});
    if (c.mlp_bias) {
      add(LayerName(i, "mlp.gate_proj.bias"), {c.intermediate_size});
      add(LayerName(i, "mlp.up_proj.bias"), {c.intermediate_size});
      add(LayerName(i, "mlp.down_proj.bias"), {h});
    }
  }
  add("model.norm.weight", {h}, WeightInit::kOnes);
  add("lm_head.weight", {c.vocab_size, h});
  if (c.tie_word_embeddings) {
    s.back().fallback = "model.embed_tokens.weight";
    s.back().shares_storage = true;
  }
  return s;
}

KvCacheSpec LlamaKvSpec(const ModelConfig& c) {
  KvCacheSpec k;
  k.num_layers = c.num_layers;
  k.num_kv_heads = c.num_kv_heads;
  k.k_dim = c.head_dim;
  k.v_dim = c.head_dim;
  return k;
}

class LlamaModel final : public Model {
 public:
  LlamaModel(const ModelConfig& cfg, std::unique_ptr<WeightStore> weights, Backend& backend)
      : cfg_(cfg), weights_(std::move(weights)), backend_(backend) {}

  Status Init() {
    const RopeFrequencies f = ComputeRopeFrequencies(cfg_.rope, cfg_.head_dim, cfg_.max_position_embeddings);
    rope_scale_ = f.attention_scale;
    FATHOM_ASSIGN_OR_RETURN(inv_freq_, UploadConstant(backend_, f.inv_freq, DType::kF32,
                                                      {static_cast<int64_t>(f.inv_freq.size())}, &constants_));
    for (int64_t i = 0; i < cfg_.num_layers; ++i) {
      Layer l;
      l.input_norm = weights_->Get(LayerName(i, "input_layernorm.weight"));
      l.post_norm = weights_->Get(LayerName(i, "post_attention_layernorm.weight"));
      l.q = Linear(LayerName(i, "self_attn.q_proj"), cfg_.qkv_bias);
      l.k = Linear(LayerName(i, "self_attn.k_proj"), cfg_.qkv_bias);
      l.v = Linear(LayerName(i, "self_attn.v_proj"), cfg_.qkv_bias);
      l.o = Linear(LayerName(i, "self_attn.o_proj"), cfg_.o_bias);
      l.gate = Linear(LayerName(i, "mlp.gate_proj"), cfg_.mlp_bias);
      l.up = Linear(LayerName(i, "mlp.up_proj"), cfg_.mlp_bias);
      l.down = Linear(LayerName(i, "mlp.down_proj"), cfg_.mlp_bias);
      l.qkv = {l.q, l.k, l.v};
      l.gate_up = {l.gate, l.up};
      layers_.push_back(l);
    }
    embed_ = weights_->Get("model.embed_tokens.weight");
    final_norm_ = weights_->Get("model.norm.weight");
    lm_head_.weight = weights_->Get("lm_head.weight");
    return OkStatus();
  }

  const ModelConfig& config() const override { return cfg_; }
  KvCacheSpec kv_cache_spec() const override { return LlamaKvSpec(cfg_); }

  Status Forward(const ForwardBatch& batch, KvCache& kv, Tensor* logits) override {
    FATHOM_RETURN_IF_ERROR(CheckForwardInputs(batch, kv, LlamaKvSpec(cfg_), cfg_.vocab_size));
    if (batch.num_tokens() == 0) {
      *logits = backend_.Alloc(DType::kF32, {batch.num_logits(), cfg_.vocab_size});
      return OkStatus();
    }
    FATHOM_ASSIGN_OR_RETURN(BatchOnDevice dev, BatchOnDevice::Upload(batch, backend_));
    return ForwardOnDevice(dev, kv, logits);
  }

  bool SupportsForwardOnDevice() const override { return true; }

  Status ForwardOnDevice(const BatchOnDevice& dev, KvCache& kv, Tensor* logits) override {
    const AttentionMetadata& meta = dev.meta();
    const int64_t n = meta.num_tokens;
    const int64_t n_out = dev.logits_indices().dim(0);
    Backend& be = backend_;
    const DType act = be.activation_dtype();
    *logits = be.Alloc(DType::kF32, {n_out, cfg_.vocab_size});

    const int64_t h = cfg_.hidden_size, hd = cfg_.head_dim, nh = cfg_.num_heads, nkv = cfg_.num_kv_heads;
    const float eps = static_cast<float>(cfg_.rms_norm_eps);
    Tensor residual = be.Alloc(act, {n, h});                   // [n_tokens, hidden]
    Tensor normed = be.Alloc(act, {n, h});                     // [n_tokens, hidden]
    Tensor q = be.Alloc(act, {n, nh, hd});                     // [n_tokens, n_heads, head_dim]
    Tensor k = be.Alloc(act, {n, nkv, hd});                    // [n_tokens, n_kv_heads, head_dim]
    Tensor v = be.Alloc(act, {n, nkv, hd});                    // [n_tokens, n_kv_heads, head_dim]
    Tensor attn = be.Alloc(act, {n, nh, hd});                  // [n_tokens, n_heads, head_dim]
    Tensor proj = be.Alloc(act, {n, h});                       // [n_tokens, hidden]
    Tensor gate = be.Alloc(act, {n, cfg_.intermediate_size});  // [n_tokens, intermediate]
    Tensor up = be.Alloc(act, {n, cfg_.intermediate_size});    // [n_tokens, intermediate]
    Tensor cos = be.Alloc(DType::kF32, {n, hd / 2});           // [n_tokens, head_dim / 2]
    Tensor sin = be.Alloc(DType::kF32, {n, hd / 2});

    be.RopeCosSin(meta.positions, inv_freq_, rope_scale_, cos, sin);
    be.Embedding(dev.token_ids(), embed_, residual);
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    const TensorView q2 = q.view().Reshape({n, nh * hd}), k2 = k.view().Reshape({n, nkv * hd});
    const TensorView v2 = v.view().Reshape({n, nkv * hd}), attn2 = attn.view().Reshape({n, nh * hd});
    const TensorView qkv_out[] = {q2, k2, v2};
    const TensorView gate_up_out[] = {gate, up};

    for (int64_t i = 0; i < cfg_.num_layers; ++i) {
      const Layer& l = layers_[static_cast<size_t>(i)];
      if (i == 0) {
        be.RmsNorm(residual, l.input_norm, eps, normed);
      } else {
        be.AddRmsNorm(residual, proj, l.input_norm, eps, normed);  // adds the previous layer's MLP output
      }
      be.LinearFanOut(normed, l.qkv, qkv_out);
      const KvLayerView cache = kv.layer(i);
      be.RopeWriteKv(q, k, v, cos, sin, cfg_.rope.interleaved, meta, cache);
      be.PagedAttention(q, cache, meta, scale, attn);
      be.Linear(attn2, l.o, proj);
      be.AddRmsNorm(residual, proj, l.post_norm, eps, normed);
      be.LinearFanOut(normed, l.gate_up, gate_up_out);
      be.SiluMul(gate, up, gate);
      be.Linear(gate, l.down, proj);
    }
    be.AddInPlace(residual, proj);
    ComputeLogits(be, residual, dev.logits_indices(), final_norm_, eps, lm_head_, *logits);
    return be.Synchronize();
  }

 private:
  struct Layer {
    TensorView input_norm, post_norm;
    LinearWeight q, k, v, o, gate, up, down;
    std::array<LinearWeight, 3> qkv;      // one fan-out GEMM
    std::array<LinearWeight, 2> gate_up;  // one fan-out GEMM
  };

  LinearWeight Linear(const std::string& prefix, bool bias) const {
    LinearWeight w;
    w.weight = weights_->Get(prefix + ".weight");
    if (bias) w.bias = weights_->Get(prefix + ".bias");
    return w;
  }

  ModelConfig cfg_;
  std::unique_ptr<WeightStore> weights_;
  Backend& backend_;
  std::vector<Layer> layers_;
  TensorView embed_, final_norm_;
  LinearWeight lm_head_;
  TensorView inv_freq_;  // [head_dim / 2] f32, on the device
  std::vector<Tensor> constants_;
  float rope_scale_ = 1.0f;
};

}  // namespace

void RegisterLlamaFamily(std::vector<Architecture>& out) {
  for (const char* name : {"LlamaForCausalLM", "Qwen2ForCausalLM"}) {
    Architecture a;
    a.name = name;
    a.weight_specs = &LlamaWeightSpecs;
    a.kv_cache_spec = &LlamaKvSpec;
    a.create = &CreateModel<LlamaModel>;
    out.push_back(a);
  }
}

}  // namespace fathom
