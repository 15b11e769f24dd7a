// The DeepSeek-V4 family (DeepseekV4ForCausalLM: V4-Flash, V4-Pro), as transformers' deepseek_v4 computes it:
//   - attention: shared-KV MQA (one head of head_dim that is key and value, its last rope_dim values rotated by
//     pairs), a low-rank query (wq_a, q_norm, wq_b, then each head RMS-normalized), a sink logit a head, and the
//     grouped output projection (wo_a per group of heads, wo_b); each layer also reads a sliding window, and CSA and
//     HCA layers compressed entries (model/v4_hybrid.h, the layout's provider, owns those ops);
//   - mHC: hc_mult residual streams, collapsed before each block and mixed after it (HcPre, HcPost, HcHead);
//   - MoE in every layer: sqrt(softplus) routing (hash_moe layers: the token's tid2eid row), a shared expert, the
//     SwiGLU clamped by swiglu_limit (shared expert too, as transformers' DeepseekV4MLP does);
//   - the hub checkpoint's own names (DeepSeek's: embed, layers.i.attn.wq_a, ..., head), FP8 with F8_E8M0 `.scale`
//     (format/fp8_block_linear.cc reads it as scale_inv) and MXFP4 routed experts (format/mxfp4.h).
// The MTP layers (mtp.k.*) are loaded and kept for speculative decoding; plain decoding does not run them.
// One rank: no tensor or expert parallelism yet. The CPU serves the layout; other backends refuse the model.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "model/blocks.h"
#include "model/registry.h"
#include "model/rope.h"
#include "model/v4_hybrid.h"
#include "model/weight_specs.h"

namespace fathom {

namespace {

std::string V4LayerName(int64_t i, const std::string& rest) {
  return fmt::format("layers.{}.{}", i, rest);
}

std::string MtpName(int64_t k, const std::string& rest) {
  return fmt::format("mtp.{}.{}", k, rest);
}

// A plain float32 tensor (mHC's, the sinks, the compressors' position biases, the router's bias).
void F32Tensor(WeightSpecBuilder& b, std::string name, std::vector<int64_t> shape,
               WeightInit init = WeightInit::kRandom, double active = 1.0) {
  WeightSpec& s = b.Tensor(std::move(name), std::move(shape), init, DType::kF32);
  s.read_fraction = s.active_fraction = active;
}

void NormSpec(WeightSpecBuilder& b, std::string name, int64_t dim, double active) {
  WeightSpec& s = b.Tensor(std::move(name), {dim}, WeightInit::kOnes);
  s.read_fraction = s.active_fraction = active;
}

// One block's tensors at `p` ("layers.3." or "mtp.0."): mHC, attention (with its compressor and indexer), the MoE.
// `active` 0 for the MTP layers (loaded, not run by plain decoding).
void BlockSpecs(WeightSpecBuilder& b, const std::string& p, V4Attention kind, bool hash, const ModelConfig& c,
                double active) {
  const V4Config& v = c.v4;
  const int64_t h = c.hidden_size, hd = c.head_dim, nh = c.num_heads, hc = v.hc_mult, mixes = (2 + hc) * hc;
  for (const char* which : {"attn", "ffn"}) {
    F32Tensor(b, p + fmt::format("hc_{}_fn", which), {mixes, hc * h}, WeightInit::kRandom, active);
    F32Tensor(b, p + fmt::format("hc_{}_base", which), {mixes}, WeightInit::kZeros, active);
    F32Tensor(b, p + fmt::format("hc_{}_scale", which), {3}, WeightInit::kOnes, active);
  }
  NormSpec(b, p + "attn_norm.weight", h, active);
  NormSpec(b, p + "ffn_norm.weight", h, active);
  const std::string a = p + "attn.";
  F32Tensor(b, a + "attn_sink", {nh}, WeightInit::kZeros, active);
  b.Linear(a + "wq_a", v.q_lora_rank, h, {.active = active});
  NormSpec(b, a + "q_norm.weight", v.q_lora_rank, active);
  b.Linear(a + "wq_b", nh * hd, v.q_lora_rank, {.active = active});
  b.Linear(a + "wkv", hd, h, {.active = active});
  NormSpec(b, a + "kv_norm.weight", hd, active);
  b.Linear(a + "wo_a", v.o_groups * v.o_lora_rank, nh * hd / v.o_groups, {.active = active});
  b.Linear(a + "wo_b", h, v.o_groups * v.o_lora_rank, {.active = active});
  if (kind != V4Attention::kSliding) {
    // The compressors' projections ship in bf16 beside FP8 layers (transformers' _keep_in_fp32_modules).
    const int64_t width = (kind == V4Attention::kCsa ? 2 : 1) * hd;
    b.Linear(a + "compressor.wkv", width, h, {.active = active, .quantizable = false});
    b.Linear(a + "compressor.wgate", width, h, {.active = active, .quantizable = false});
    F32Tensor(b, a + "compressor.ape", {v.Rate(kind), width}, WeightInit::kZeros, active);
    NormSpec(b, a + "compressor.norm.weight", hd, active);
  }
  if (kind == V4Attention::kCsa) {
    const int64_t ihd = v.index_head_dim;
    b.Linear(a + "indexer.wq_b", v.index_n_heads * ihd, v.q_lora_rank, {.active = active});
    b.Linear(a + "indexer.weights_proj", v.index_n_heads, h, {.active = active, .quantizable = false});
    b.Linear(a + "indexer.compressor.wkv", 2 * ihd, h, {.active = active, .quantizable = false});
    b.Linear(a + "indexer.compressor.wgate", 2 * ihd, h, {.active = active, .quantizable = false});
    F32Tensor(b, a + "indexer.compressor.ape", {v.csa_rate, 2 * ihd}, WeightInit::kZeros, active);
    NormSpec(b, a + "indexer.compressor.norm.weight", ihd, active);
  }
  const MoeConfig& e = c.moe;
  const std::string f = p + "ffn.";
  b.Linear(f + "gate", e.n_routed_experts, h, {.active = active, .quantizable = false});
  if (hash) {
    WeightSpec& t =
        b.Tensor(f + "gate.tid2eid", {c.vocab_size, e.num_experts_per_tok}, WeightInit::kRandomIndex, DType::kI64);
    t.init_value = static_cast<float>(e.n_routed_experts);
    t.params_per_element = 0;  // a table, not parameters
    t.read_fraction = t.active_fraction = active / static_cast<double>(c.vocab_size);
  } else {
    F32Tensor(b, f + "gate.bias", {e.n_routed_experts}, WeightInit::kZeros, active);
  }
  const double routed = active * static_cast<double>(e.num_experts_per_tok) / static_cast<double>(e.n_routed_experts);
  const int64_t inter = e.moe_intermediate_size;
  for (int64_t x = 0; x < e.n_routed_experts; ++x) {
    const std::string ex = f + fmt::format("experts.{}.", x);
    b.Linear(ex + "w1", inter, h, {.active = routed, .routed_expert = true});
    b.Linear(ex + "w3", inter, h, {.active = routed, .routed_expert = true});
    b.Linear(ex + "w2", h, inter, {.active = routed, .routed_expert = true});
  }
  b.Linear(f + "shared_experts.w1", inter, h, {.active = active});
  b.Linear(f + "shared_experts.w3", inter, h, {.active = active});
  b.Linear(f + "shared_experts.w2", h, inter, {.active = active});
}

void HeadSpecs(WeightSpecBuilder& b, const std::string& p, const ModelConfig& c, double active) {
  const int64_t hc = c.v4.hc_mult;
  F32Tensor(b, p + "hc_head_fn", {hc, hc * c.hidden_size}, WeightInit::kRandom, active);
  F32Tensor(b, p + "hc_head_base", {hc}, WeightInit::kZeros, active);
  F32Tensor(b, p + "hc_head_scale", {1}, WeightInit::kOnes, active);
}

StatusOr<std::vector<WeightSpec>> V4WeightSpecs(const ModelConfig& c, const ParallelConfig& par) {
  if (!par.single()) {
    return UnimplementedError(
        "DeepSeek-V4 runs on one rank for now: no tensor or expert parallelism (use --tensor-parallel-size 1)");
  }
  WeightSpecBuilder b(c, par);
  b.Embedding("embed.weight");
  for (int64_t i = 0; i < c.num_layers; ++i) {
    BlockSpecs(b, V4LayerName(i, ""), c.v4.attention[static_cast<size_t>(i)], c.v4.hash_moe[static_cast<size_t>(i)], c,
               1.0);
  }
  NormSpec(b, "norm.weight", c.hidden_size, 1.0);
  HeadSpecs(b, "", c, 1.0);
  WeightSpec& head = b.Tensor("head.weight", {c.vocab_size, c.hidden_size});
  if (c.tie_word_embeddings) {
    head.fallback = "embed.weight";
    head.shares_storage = true;
  }
  // The MTP layers: a block each plus its input projections and head, kept for speculative decoding.
  for (int64_t k = 0; k < c.num_nextn_predict_layers; ++k) {
    const std::string p = MtpName(k, "");
    BlockSpecs(b, p, c.v4.mtp_attention[static_cast<size_t>(k)], /*hash=*/false, c, 0.0);
    b.Linear(p + "e_proj", c.hidden_size, c.hidden_size, {.active = 0.0});
    b.Linear(p + "h_proj", c.hidden_size, c.hidden_size, {.active = 0.0});
    for (const char* norm : {"enorm.weight", "hnorm.weight", "norm.weight"}) NormSpec(b, p + norm, c.hidden_size, 0.0);
    HeadSpecs(b, p, c, 0.0);
  }
  FATHOM_ASSIGN_OR_RETURN(std::vector<WeightSpec> specs, b.Finish());
  for (WeightSpec& s : specs) s.draft = s.name.rfind("mtp.", 0) == 0;
  return specs;
}

// Each layer's rows as wide as its kind needs (V4RowLayout): a window row a token, and an entry row a window of
// `rate` tokens (none in a sliding layer); k_dim the widest entry row. The window group keeps the rows a token reads
// back: the sliding window's keys, and the compressors' projections of a window (CSA: and the one before) until it
// closes.
KvCacheSpec V4KvSpec(const ModelConfig& c, const ParallelConfig& /*par*/) {
  const V4Config& v = c.v4;
  KvCacheSpec k;
  k.num_layers = c.num_layers;
  k.num_kv_heads = 1;
  k.layout = AttentionLayout::kV4Hybrid;
  k.window_tokens = v.sliding_window;
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const V4Attention kind = v.attention.at(static_cast<size_t>(l));
    const V4RowLayout row = V4RowLayout::For(kind, c.head_dim, v.index_head_dim);
    k.layer_window_dims.push_back(row.width);
    k.layer_k_dims.push_back(row.entry_width);
    k.layer_rates.push_back(kind == V4Attention::kSliding ? 1 : v.Rate(kind));
    k.k_dim = std::max(k.k_dim, row.entry_width);
    if (kind == V4Attention::kCsa) k.window_tokens = std::max(k.window_tokens, 2 * v.csa_rate);
    if (kind == V4Attention::kHca) k.window_tokens = std::max(k.window_tokens, v.hca_rate);
  }
  k.v_dim = 0;  // the values are the keys, read from the window rows and the entries
  k.v_in_k = true;
  return k;
}

AttentionFootprint V4Footprint(const ModelConfig& c) {
  const V4Config& v = c.v4;
  const int64_t hd = c.head_dim, nh = c.num_heads, ihd = v.index_head_dim;
  AttentionFootprint f;
  f.values_per_token = 3 * nh * hd + 2 * v.q_lora_rank + 6 * hd + 4 * ihd + v.index_n_heads * (ihd + 1) +
                       v.o_groups * v.o_lora_rank + v.index_topk + 2 * v.hc_mult * c.hidden_size +
                       v.hc_mult * (v.hc_mult + 1);
  f.widest_weight = std::max(nh * hd * v.q_lora_rank, c.hidden_size * v.o_groups * v.o_lora_rank);
  f.widest_input = std::max(nh * hd / v.o_groups, v.o_groups * v.o_lora_rank);
  return f;
}

class DeepseekV4Model final : public Model {
 public:
  DeepseekV4Model(const ModelConfig& cfg, std::unique_ptr<WeightStore> weights, Backend& backend, Communicator& comm)
      : cfg_(cfg), weights_(std::move(weights)), be_(backend), comm_(comm) {}

  Status Init();
  const ModelConfig& config() const override { return cfg_; }
  KvCacheSpec kv_cache_spec() const override { return V4KvSpec(cfg_, comm_.parallel()); }
  Status Forward(const ForwardBatch& batch, KvCache& kv, Tensor* logits) override;
  bool SupportsForwardOnDevice() const override { return be_.device() == Device::kCpu; }
  Status ForwardOnDevice(const BatchOnDevice& dev, KvCache& kv, Tensor* logits) override;

 private:
  struct Rope {
    TensorView inv_freq, neg_inv_freq;  // f32 [rope_dim / 2]
    float scale = 1.0f;
  };
  struct Hc {
    TensorView fn, base, scale;  // f32
  };
  struct Layer {
    V4Attention kind = V4Attention::kSliding;
    V4RowLayout row;
    Hc attn_hc, ffn_hc;
    TensorView attn_norm, ffn_norm, q_norm, kv_norm, sinks;
    LinearWeight wq_a, wq_b, wkv, wo_b;
    TensorView wo_a;  // [o_groups, o_lora_rank, heads * head_dim / o_groups], a float dtype
    // The compressor (CSA, HCA) and the indexer (CSA).
    LinearWeight c_wkv, c_wgate, i_wq_b, i_weights, i_wkv, i_wgate;
    TensorView c_ape, c_norm, i_ape, i_norm;
    // The MoE.
    LinearWeight gate;
    TensorView gate_bias;  // f32 [experts] (top-k layers)
    TensorView tid2eid;    // i32 [vocab, top_k] (hash layers)
    ExpertSet experts;
    LinearWeight s_w1, s_w3, s_w2;
  };
  // What one step's layers share.
  struct Step {
    const AttentionMetadata& meta;
    const TensorView& token_ids;
    TensorView cos[2], sin[2], neg_sin[2];  // [0] main rope, [1] compress rope: f32 [n, rope_dim / 2]
  };

  StatusOr<TensorView> F32(const std::string& name);
  StatusOr<LinearWeight> Linear(const std::string& prefix) { return weights_->Linear(prefix, be_); }
  StatusOr<Layer> BindLayer(int64_t i);
  void Attention(const Layer& l, const TensorView& x, const Step& step, const KvLayerView& cache,
                 const TensorView& out);
  Status Moe(const Layer& l, const TensorView& x, const Step& step, const TensorView& out);
  float eps() const { return static_cast<float>(cfg_.rms_norm_eps); }
  // A compressor's work (the layer's or its indexer's): its rate, its columns of the row, its weights, the compress
  // rope.
  V4CompressArgs CompressArgs(int64_t rate, bool overlap, int64_t dim, int64_t kv, int64_t gate, int64_t out,
                              const TensorView& ape, const TensorView& norm) const {
    return {.rate = rate,
            .overlap = overlap,
            .dim = dim,
            .kv = kv,
            .gate = gate,
            .out = out,
            .ape = ape,
            .norm = norm,
            .eps = eps(),
            .inv_freq = rope_[1].inv_freq,
            .rope_scale = rope_[1].scale};
  }

  ModelConfig cfg_;
  std::unique_ptr<WeightStore> weights_;
  Backend& be_;
  Communicator& comm_;
  std::vector<Tensor> owned_;
  std::vector<Layer> layers_;
  Rope rope_[2];  // main, compress
  Hc head_hc_;
  TensorView embed_, final_norm_, ones_hd_;
  LinearWeight lm_head_;
  moe_route::Params route_;
};

StatusOr<TensorView> DeepseekV4Model::F32(const std::string& name) {
  const TensorView& t = weights_->Get(name);
  FATHOM_ASSIGN_OR_RETURN(Tensor host, ToHost(be_, t));
  std::vector<float> v(static_cast<size_t>(t.numel()));
  ConvertToF32(host.view().raw(), t.dtype(), 0, t.numel(), v.data());
  const auto dims = t.shape();
  std::vector<int64_t> shape(dims.begin(), dims.end());
  // UploadConstant takes an initializer list: flatten to 1-d or 2-d shapes, which every such tensor has.
  if (shape.size() == 1) return UploadConstant(be_, v, DType::kF32, {shape[0]}, &owned_);
  FATHOM_CHECK(shape.size() == 2, "{}: {} dims", name, shape.size());
  return UploadConstant(be_, v, DType::kF32, {shape[0], shape[1]}, &owned_);
}

StatusOr<DeepseekV4Model::Layer> DeepseekV4Model::BindLayer(int64_t i) {
  const V4Config& v = cfg_.v4;
  Layer l;
  l.kind = v.attention[static_cast<size_t>(i)];
  l.row = V4RowLayout::For(l.kind, cfg_.head_dim, v.index_head_dim);
  const std::string p = V4LayerName(i, "");
  Hc* hcs[] = {&l.attn_hc, &l.ffn_hc};
  const char* which[] = {"attn", "ffn"};
  for (int j = 0; j < 2; ++j) {
    FATHOM_ASSIGN_OR_RETURN(hcs[j]->fn, F32(p + fmt::format("hc_{}_fn", which[j])));
    FATHOM_ASSIGN_OR_RETURN(hcs[j]->base, F32(p + fmt::format("hc_{}_base", which[j])));
    FATHOM_ASSIGN_OR_RETURN(hcs[j]->scale, F32(p + fmt::format("hc_{}_scale", which[j])));
  }
  l.attn_norm = weights_->Get(p + "attn_norm.weight");
  l.ffn_norm = weights_->Get(p + "ffn_norm.weight");
  const std::string a = p + "attn.";
  FATHOM_ASSIGN_OR_RETURN(l.sinks, F32(a + "attn_sink"));
  l.q_norm = weights_->Get(a + "q_norm.weight");
  l.kv_norm = weights_->Get(a + "kv_norm.weight");
  FATHOM_ASSIGN_OR_RETURN(l.wq_a, Linear(a + "wq_a"));
  FATHOM_ASSIGN_OR_RETURN(l.wq_b, Linear(a + "wq_b"));
  FATHOM_ASSIGN_OR_RETURN(l.wkv, Linear(a + "wkv"));
  FATHOM_ASSIGN_OR_RETURN(l.wo_b, Linear(a + "wo_b"));
  {
    // wo_a as per-group matrices for HeadLinear, in the dtype that holds its values exactly.
    FATHOM_ASSIGN_OR_RETURN(LinearWeight wo_a, weights_->UnpreparedLinear(a + "wo_a"));
    std::vector<Tensor> keep;
    FATHOM_ASSIGN_OR_RETURN(LinearWeight host, MapTensors(wo_a, [&](const TensorView& t) -> StatusOr<TensorView> {
                              FATHOM_ASSIGN_OR_RETURN(Tensor h, ToHost(be_, t));
                              keep.push_back(std::move(h));
                              return keep.back().view();
                            }));
    const int64_t out = wo_a.out_features(), in = wo_a.in_features();
    std::vector<float> w(static_cast<size_t>(out * in));
    for (int64_t r = 0; r < out; ++r) DequantizeRow(host, r, w.data() + r * in);
    FATHOM_ASSIGN_OR_RETURN(l.wo_a, UploadConstant(be_, w, MethodOf(wo_a.format).ExactFloatDType(wo_a),
                                                   {v.o_groups, v.o_lora_rank, in}, &owned_));
  }
  if (l.kind != V4Attention::kSliding) {
    FATHOM_ASSIGN_OR_RETURN(l.c_wkv, Linear(a + "compressor.wkv"));
    FATHOM_ASSIGN_OR_RETURN(l.c_wgate, Linear(a + "compressor.wgate"));
    FATHOM_ASSIGN_OR_RETURN(l.c_ape, F32(a + "compressor.ape"));
    l.c_norm = weights_->Get(a + "compressor.norm.weight");
  }
  if (l.kind == V4Attention::kCsa) {
    FATHOM_ASSIGN_OR_RETURN(l.i_wq_b, Linear(a + "indexer.wq_b"));
    FATHOM_ASSIGN_OR_RETURN(l.i_weights, Linear(a + "indexer.weights_proj"));
    l.i_weights.float32_inputs = true;
    FATHOM_ASSIGN_OR_RETURN(l.i_wkv, Linear(a + "indexer.compressor.wkv"));
    FATHOM_ASSIGN_OR_RETURN(l.i_wgate, Linear(a + "indexer.compressor.wgate"));
    FATHOM_ASSIGN_OR_RETURN(l.i_ape, F32(a + "indexer.compressor.ape"));
    l.i_norm = weights_->Get(a + "indexer.compressor.norm.weight");
  }
  const std::string f = p + "ffn.";
  FATHOM_ASSIGN_OR_RETURN(l.gate, Linear(f + "gate"));
  l.gate.float32_inputs = true;
  const int64_t experts = cfg_.moe.n_routed_experts, k = cfg_.moe.num_experts_per_tok;
  if (v.hash_moe[static_cast<size_t>(i)]) {
    const TensorView& t = weights_->Get(f + "gate.tid2eid");
    if (t.ndim() != 2 || t.dim(0) != cfg_.vocab_size || t.dim(1) != k ||
        (t.dtype() != DType::kI64 && t.dtype() != DType::kI32)) {
      return InvalidArgumentError(fmt::format("'{}gate.tid2eid' must be I64 or I32 [{}, {}]", f, cfg_.vocab_size, k));
    }
    FATHOM_ASSIGN_OR_RETURN(Tensor host, ToHost(be_, t));
    Tensor ids = Tensor::Empty(DType::kI32, {cfg_.vocab_size, k});
    for (int64_t e = 0; e < t.numel(); ++e) {
      const int64_t id = t.dtype() == DType::kI64 ? host.view().data<int64_t>()[e] : host.view().data<int32_t>()[e];
      if (id < 0 || id >= experts) {
        return InvalidArgumentError(
            fmt::format("'{}gate.tid2eid' routes token {} to expert {}, outside [0, {})", f, e / k, id, experts));
      }
      ids.view().data<int32_t>()[e] = static_cast<int32_t>(id);
    }
    FATHOM_ASSIGN_OR_RETURN(Tensor dev, be_.Upload(ids));
    l.tid2eid = dev.view();
    owned_.push_back(std::move(ids));
    owned_.push_back(std::move(dev));
  } else {
    FATHOM_ASSIGN_OR_RETURN(l.gate_bias, F32(f + "gate.bias"));
  }
  l.experts.total = experts;
  l.experts.swiglu_limit = static_cast<float>(v.swiglu_limit);
  for (int64_t x = 0; x < experts; ++x) {
    const std::string ex = f + fmt::format("experts.{}.", x);
    FATHOM_ASSIGN_OR_RETURN(LinearWeight w1, Linear(ex + "w1"));
    FATHOM_ASSIGN_OR_RETURN(LinearWeight w3, Linear(ex + "w3"));
    FATHOM_ASSIGN_OR_RETURN(LinearWeight w2, Linear(ex + "w2"));
    l.experts.gate.push_back(std::move(w1));
    l.experts.up.push_back(std::move(w3));
    l.experts.down.push_back(std::move(w2));
  }
  FATHOM_RETURN_IF_ERROR(be_.PrepareExperts(l.experts));
  FATHOM_ASSIGN_OR_RETURN(l.s_w1, Linear(f + "shared_experts.w1"));
  FATHOM_ASSIGN_OR_RETURN(l.s_w3, Linear(f + "shared_experts.w3"));
  FATHOM_ASSIGN_OR_RETURN(l.s_w2, Linear(f + "shared_experts.w2"));
  return l;
}

Status DeepseekV4Model::Init() {
  if (be_.attention_ops(AttentionLayout::kV4Hybrid) == nullptr) {
    return UnimplementedError(fmt::format(
        "DeepSeek-V4 needs the v4_hybrid attention layout, which the {} backend does not serve yet; run it with "
        "--device cpu",
        be_.name()));
  }
  const V4Config& v = cfg_.v4;
  const RopeConfig* ropes[] = {&cfg_.rope, &v.compress_rope};
  for (int j = 0; j < 2; ++j) {
    const RopeFrequencies f = ComputeRopeFrequencies(*ropes[j], v.rope_dim, cfg_.max_position_embeddings);
    std::vector<float> neg(f.inv_freq.size());
    for (size_t i = 0; i < neg.size(); ++i) neg[i] = -f.inv_freq[i];
    const int64_t half = static_cast<int64_t>(f.inv_freq.size());
    FATHOM_ASSIGN_OR_RETURN(rope_[j].inv_freq, UploadConstant(be_, f.inv_freq, DType::kF32, {half}, &owned_));
    FATHOM_ASSIGN_OR_RETURN(rope_[j].neg_inv_freq, UploadConstant(be_, neg, DType::kF32, {half}, &owned_));
    rope_[j].scale = f.attention_scale;
  }
  std::vector<float> ones(static_cast<size_t>(cfg_.head_dim), 1.0f);
  FATHOM_ASSIGN_OR_RETURN(ones_hd_, UploadConstant(be_, ones, DType::kF32, {cfg_.head_dim}, &owned_));
  for (int64_t i = 0; i < cfg_.num_layers; ++i) {
    FATHOM_ASSIGN_OR_RETURN(Layer l, BindLayer(i));
    layers_.push_back(std::move(l));
  }
  FATHOM_ASSIGN_OR_RETURN(head_hc_.fn, F32("hc_head_fn"));
  FATHOM_ASSIGN_OR_RETURN(head_hc_.base, F32("hc_head_base"));
  FATHOM_ASSIGN_OR_RETURN(head_hc_.scale, F32("hc_head_scale"));
  embed_ = weights_->Get("embed.weight");
  final_norm_ = weights_->Get("norm.weight");
  lm_head_.weight = weights_->Get("head.weight");
  RouterConfig rc = RouterConfigFrom(cfg_.moe);
  route_ = RouteParams(rc);
  return OkStatus();
}

Status DeepseekV4Model::Forward(const ForwardBatch& batch, KvCache& kv, Tensor* logits) {
  return ForwardThroughDevice(*this, be_, batch, kv, logits);
}

void DeepseekV4Model::Attention(const Layer& l, const TensorView& x, const Step& step, const KvLayerView& cache,
                                const TensorView& out) {
  Backend& be = be_;
  V4HybridOps& ops = AttentionOpsOf<V4HybridOps>(be);
  const V4Config& v = cfg_.v4;
  const AttentionMetadata& meta = step.meta;
  const int64_t n = x.dim(0), nh = cfg_.num_heads, hd = cfg_.head_dim, rd = v.rope_dim;
  const DType act = be.activation_dtype();
  const int r = l.kind == V4Attention::kSliding ? 0 : 1;  // sliding layers: the main rope; others: compress
  // The query: q_norm(wq_a(x)), wq_b, each head RMS-normalized, its last rope_dim values rotated.
  Tensor q_lin = be.Alloc(act, {n, v.q_lora_rank});  // [n, q_lora_rank]
  Tensor q_res = be.Alloc(act, {n, v.q_lora_rank});
  be.Linear(x, l.wq_a, q_lin);
  be.RmsNorm(q_lin, l.q_norm, eps(), q_res);
  Tensor q_raw = be.Alloc(act, {n, nh, hd});  // [n, heads, head_dim]
  Tensor q = be.Alloc(act, {n, nh, hd});
  be.Linear(q_res, l.wq_b, q_raw.view().Reshape({n, nh * hd}));
  be.RmsNorm(q_raw.view().Reshape({n * nh, hd}), ones_hd_, eps(), q.view().Reshape({n * nh, hd}));
  be.ApplyRope(q.view().Slice(2, hd - rd, hd), step.cos[r], step.sin[r], /*interleaved=*/true);
  // The key (= value): kv_norm(wkv(x)), rotated likewise, into the token's row.
  Tensor kv_lin = be.Alloc(act, {n, hd});  // [n, head_dim]
  Tensor kv = be.Alloc(act, {n, hd});
  be.Linear(x, l.wkv, kv_lin);
  be.RmsNorm(kv_lin, l.kv_norm, eps(), kv);
  be.ApplyRope(kv.view().Reshape({n, 1, hd}).Slice(2, hd - rd, hd), step.cos[r], step.sin[r], true);
  ops.WriteRows(kv, l.row.kv, meta, cache);
  V4AttendArgs args;
  args.window = v.sliding_window;
  args.sinks = l.sinks;
  args.scale = 1.0f / std::sqrt(static_cast<float>(hd));
  Tensor selected;
  if (l.kind != V4Attention::kSliding) {
    const int64_t rate = v.Rate(l.kind), width = (l.kind == V4Attention::kCsa ? 2 : 1) * hd;
    Tensor ckv = be.Alloc(act, {n, width});  // [n, c * head_dim]
    Tensor cgate = be.Alloc(act, {n, width});
    be.Linear(x, l.c_wkv, ckv);
    be.Linear(x, l.c_wgate, cgate);
    ops.WriteRows(ckv, l.row.ckv, meta, cache);
    ops.WriteRows(cgate, l.row.cgate, meta, cache);
    ops.Compress(
        CompressArgs(rate, l.kind == V4Attention::kCsa, hd, l.row.ckv, l.row.cgate, l.row.entry, l.c_ape, l.c_norm),
        meta, cache);
    args.rate = rate;
    args.entry = l.row.entry;
  }
  if (l.kind == V4Attention::kCsa) {
    const int64_t ih = v.index_n_heads, ihd = v.index_head_dim;
    Tensor ikv = be.Alloc(act, {n, 2 * ihd});  // [n, 2 * index_head_dim]
    Tensor igate = be.Alloc(act, {n, 2 * ihd});
    be.Linear(x, l.i_wkv, ikv);
    be.Linear(x, l.i_wgate, igate);
    ops.WriteRows(ikv, l.row.ikv, meta, cache);
    ops.WriteRows(igate, l.row.igate, meta, cache);
    ops.Compress(CompressArgs(v.csa_rate, true, ihd, l.row.ikv, l.row.igate, l.row.ientry, l.i_ape, l.i_norm), meta,
                 cache);
    Tensor iq = be.Alloc(act, {n, ih, ihd});     // [n, index heads, index_head_dim]
    Tensor iw = be.Alloc(DType::kF32, {n, ih});  // [n, index heads]
    be.Linear(q_res, l.i_wq_b, iq.view().Reshape({n, ih * ihd}));
    be.ApplyRope(iq.view().Slice(2, ihd - rd, ihd), step.cos[1], step.sin[1], true);
    be.Linear(x, l.i_weights, iw);
    selected = be.Alloc(DType::kI32, {n, v.index_topk});  // [n, index_topk]
    ops.SelectEntries(iq, iw, l.row.ientry, v.csa_rate, meta, cache, 1.0f / std::sqrt(static_cast<float>(ihd)),
                      1.0f / std::sqrt(static_cast<float>(ih)), selected);
    args.selected = selected;
  }
  Tensor attn = be.Alloc(act, {n, nh, hd});  // [n, heads, head_dim]
  ops.Attend(q, args, meta, cache, attn);
  // The values carried their keys' rotation: undo it at the query's position (transformers' conjugate rope).
  be.ApplyRope(attn.view().Slice(2, hd - rd, hd), step.cos[r], step.neg_sin[r], true);
  // The grouped output projection: each group of heads through its wo_a block, then wo_b.
  const int64_t groups = v.o_groups;
  Tensor mid = be.Alloc(act, {n, groups, v.o_lora_rank});  // [n, o_groups, o_lora_rank]
  be.HeadLinear(attn.view().Reshape({n, groups, nh * hd / groups}), l.wo_a, mid);
  be.Linear(mid.view().Reshape({n, groups * v.o_lora_rank}), l.wo_b, out);
}

Status DeepseekV4Model::Moe(const Layer& l, const TensorView& x, const Step& step, const TensorView& out) {
  Backend& be = be_;
  const int64_t n = x.dim(0), e = route_.n_experts, k = route_.top_k, inter = cfg_.moe.moe_intermediate_size;
  Tensor logits = be.Alloc(DType::kF32, {n, e});  // [n, experts]
  Tensor ids = be.Alloc(DType::kI32, {n, k});     // [n, top_k]
  Tensor w = be.Alloc(DType::kF32, {n, k});
  be.Linear(x, l.gate, logits);
  if (!l.tid2eid.empty()) {
    AttentionOpsOf<V4HybridOps>(be).HashIds(step.token_ids, l.tid2eid, ids);
    moe_route::Params p = route_;
    p.fixed_ids = true;
    be.MoeRoute(logits, TensorView(), p, ids, w);
  } else {
    be.MoeRoute(logits, l.gate_bias, route_, ids, w);
  }
  Tensor g = be.Alloc(be.activation_dtype(), {n, inter});  // [n, moe_intermediate]
  Tensor u = be.Alloc(be.activation_dtype(), {n, inter});
  be.Linear(x, l.s_w1, g);
  be.Linear(x, l.s_w3, u);
  be.ClampedSiluMul(g, u, l.experts.swiglu_limit, g);
  be.Linear(g, l.s_w2, out);
  return be.MoeExperts(x, l.experts, ids, w, out);
}

Status DeepseekV4Model::ForwardOnDevice(const BatchOnDevice& dev, KvCache& kv, Tensor* logits) {
  Backend& be = be_;
  V4HybridOps& ops = AttentionOpsOf<V4HybridOps>(be);
  const AttentionMetadata& meta = dev.meta();
  const V4Config& v = cfg_.v4;
  const int64_t n = meta.num_tokens, h = cfg_.hidden_size, hc = v.hc_mult, half = v.rope_dim / 2;
  const DType act = be.activation_dtype();
  *logits = be.Alloc(DType::kF32, {dev.logits_indices().dim(0), cfg_.vocab_size});
  // The step's rope tables: each rope's cos and sin at the tokens' positions, and sin of the negated angles.
  Tensor tables[2][4];
  Step step{meta, dev.token_ids(), {}, {}, {}};
  for (int j = 0; j < 2; ++j) {
    for (Tensor& t : tables[j]) t = be.Alloc(DType::kF32, {n, half});
    be.RopeCosSin(meta.positions, rope_[j].inv_freq, rope_[j].scale, tables[j][0], tables[j][1]);
    be.RopeCosSin(meta.positions, rope_[j].neg_inv_freq, rope_[j].scale, tables[j][2], tables[j][3]);
    step.cos[j] = tables[j][0];
    step.sin[j] = tables[j][1];
    step.neg_sin[j] = tables[j][3];
  }
  // The streams: hc copies of the embedding.
  Tensor streams = be.Alloc(act, {n, hc, h});  // [n, hc_mult, hidden]
  Tensor next = be.Alloc(act, {n, hc, h});
  Tensor collapsed = be.Alloc(act, {n, h});  // [n, hidden]
  Tensor normed = be.Alloc(act, {n, h});
  Tensor block = be.Alloc(act, {n, h});
  Tensor post = be.Alloc(DType::kF32, {n, hc});      // [n, hc_mult]
  Tensor comb = be.Alloc(DType::kF32, {n, hc, hc});  // [n, hc_mult, hc_mult]
  be.Embedding(dev.token_ids(), embed_, collapsed);
  for (int64_t j = 0; j < hc; ++j) be.Copy(collapsed, streams.view().Select(1, j));
  const float hc_eps = static_cast<float>(v.hc_eps);
  const int64_t iters = v.hc_sinkhorn_iters;
  for (int64_t i = 0; i < cfg_.num_layers; ++i) {
    const Layer& l = layers_[static_cast<size_t>(i)];
    ops.HcPre(streams, l.attn_hc.fn, l.attn_hc.base, l.attn_hc.scale, iters, hc_eps, eps(), collapsed, post, comb);
    be.RmsNorm(collapsed, l.attn_norm, eps(), normed);
    Attention(l, normed, step, kv.layer(i), block);
    ops.HcPost(streams, block, post, comb, next);
    std::swap(streams, next);
    ops.HcPre(streams, l.ffn_hc.fn, l.ffn_hc.base, l.ffn_hc.scale, iters, hc_eps, eps(), collapsed, post, comb);
    be.RmsNorm(collapsed, l.ffn_norm, eps(), normed);
    FATHOM_RETURN_IF_ERROR(Moe(l, normed, step, block));
    ops.HcPost(streams, block, post, comb, next);
    std::swap(streams, next);
  }
  ops.HcHead(streams, head_hc_.fn, head_hc_.base, head_hc_.scale, hc_eps, eps(), collapsed);
  return ComputeLogits(be, collapsed, dev.logits_indices(), final_norm_, eps(), lm_head_, *logits, comm_);
}

}  // namespace

void RegisterDeepseekV4Family(std::vector<Architecture>& out) {
  RegisterFamily(out, {"DeepseekV4ForCausalLM"},
                 {.kv_spec = &V4KvSpec,
                  .create = &CreateModel<DeepseekV4Model>,
                  .attention_footprint = &V4Footprint,
                  .specs = &V4WeightSpecs});
}

}  // namespace fathom
