// The DeepSeek family: DeepseekV2ForCausalLM (V2, V2-Lite) and DeepseekV3ForCausalLM (V3, R1), with multi-head
// latent attention over a latent paged cache, mixture-of-experts MLPs, and V3's block-scaled FP8 weights.
//
// MLA, absorbed form (used for prefill and decode alike on the reference backend):
//   cache row per token per layer = [RmsNorm(c_kv) (kv_lora_rank), rope(k_pe) (qk_rope_head_dim)]
//   q_abs[h] = [W_UK[h]^T q_nope[h], rope(q_pe[h])]        -> MQA over the cache rows, key dim kv_lora + rope
//   out[h]   = W_UV[h] (sum_j p_j c_kv_j)                  -> o_proj
// where kv_b_proj = [W_UK[0]; W_UV[0]; W_UK[1]; W_UV[1]; ...] row blocks of qk_nope_head_dim and v_head_dim.
//
// MLA, up-projected form (prefill): each sequence's whole context of cache rows is gathered (GatherContext) and
// up-projected by kv_b_proj to per-head k_nope and v; then MHA with key [k_nope[h], k_pe] (MlaContextAttention) gives
// out[h] directly. Fewer FLOPs per (query, key) pair than the absorbed form (nope + rope + v_head_dim against
// 2 kv_lora + rope), plus one kv_b GEMM over the context. A step takes it when the pairs' saving reaches 0.75x the
// kv_b GEMM's FLOPs (UpProjectedPrefill, model/mla.h); on the H200 (V2-Lite) the forms tie up to about 200 tokens and
// the up-projected step took 0.95x the absorbed one's time at a 512-token prompt, 0.80x at 4 x 2048 and 0.61x at
// 8192. FATHOM_MLA_PREFILL=up or =absorbed forces a form.
#include <fmt/format.h>

#include <array>
#include <cmath>
#include <cstdlib>
#include <string_view>

#include "model/mla.h"
#include "model/moe.h"
#include "model/registry.h"
#include "model/rope.h"

namespace fathom {

bool MlaUpProjectedPays(const MlaConfig& m, int64_t causal_pairs, int64_t context_rows) {
  const int64_t lora = m.kv_lora_rank, rope = m.qk_rope_head_dim, nope = m.qk_nope_head_dim, vd = m.v_head_dim;
  // Per head: scores and values over the latent against over [k_nope, k_pe] and v; kv_b's output per row.
  const double saved_per_pair = static_cast<double>(2 * (lora + rope) + 2 * lora - (2 * (nope + rope) + 2 * vd));
  const double kv_b_per_row = static_cast<double>(2 * lora * (nope + vd));
  return static_cast<double>(causal_pairs) * saved_per_pair >=
         kMlaUpProjectedMinRatio * static_cast<double>(context_rows) * kv_b_per_row;
}

namespace {

std::string LayerName(int64_t i, const std::string& rest) {
  return fmt::format("model.layers.{}.{}", i, rest);
}

int64_t CeilDiv(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

std::vector<WeightSpec> DeepseekWeightSpecs(const ModelConfig& c) {
  const DType dt = c.dtype;
  const MlaConfig& m = c.mla;
  const int64_t h = c.hidden_size, nh = c.num_heads, qd = m.qk_nope_head_dim + m.qk_rope_head_dim;
  std::vector<WeightSpec> s;
  auto add = [&](std::string name, std::vector<int64_t> shape, DType dtype, WeightInit init = WeightInit::kRandom,
                 double active = 1.0) {
    WeightSpec w;
    w.name = std::move(name);
    w.shape = std::move(shape);
    w.dtype = dtype;
    w.init = init;
    w.active_fraction = active;
    w.read_fraction = active;
    s.push_back(std::move(w));
  };
  // A linear layer: fp8 weight plus its 128x128 block scales in FP8 checkpoints, else the model dtype.
  auto linear = [&](const std::string& prefix, int64_t out, int64_t in, double active = 1.0) {
    if (c.quant.fp8) {
      add(prefix + ".weight", {out, in}, DType::kF8E4M3, WeightInit::kRandom, active);
      add(prefix + ".weight_scale_inv", {CeilDiv(out, c.quant.block_n), CeilDiv(in, c.quant.block_k)}, DType::kF32,
          WeightInit::kConstant, active);
      s.back().init_value = 0.02f;
    } else {
      add(prefix + ".weight", {out, in}, dt, WeightInit::kRandom, active);
    }
  };
  add("model.embed_tokens.weight", {c.vocab_size, h}, dt);
  // One row per token; DeepSeek's "activated parameters" (37 B for V3, 2.4 B for V2-Lite) leave the table out.
  s.back().read_fraction = s.back().active_fraction = 1.0 / static_cast<double>(c.vocab_size);
  for (int64_t i = 0; i < c.num_layers; ++i) {
    add(LayerName(i, "input_layernorm.weight"), {h}, dt, WeightInit::kOnes);
    if (m.q_lora_rank > 0) {
      linear(LayerName(i, "self_attn.q_a_proj"), m.q_lora_rank, h);
      add(LayerName(i, "self_attn.q_a_layernorm.weight"), {m.q_lora_rank}, dt, WeightInit::kOnes);
      linear(LayerName(i, "self_attn.q_b_proj"), nh * qd, m.q_lora_rank);
    } else {
      linear(LayerName(i, "self_attn.q_proj"), nh * qd, h);
    }
    linear(LayerName(i, "self_attn.kv_a_proj_with_mqa"), m.kv_lora_rank + m.qk_rope_head_dim, h);
    add(LayerName(i, "self_attn.kv_a_layernorm.weight"), {m.kv_lora_rank}, dt, WeightInit::kOnes);
    linear(LayerName(i, "self_attn.kv_b_proj"), nh * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank);
    linear(LayerName(i, "self_attn.o_proj"), h, nh * m.v_head_dim);
    add(LayerName(i, "post_attention_layernorm.weight"), {h}, dt, WeightInit::kOnes);
    if (c.IsMoeLayer(i)) {
      const MoeConfig& e = c.moe;
      add(LayerName(i, "mlp.gate.weight"), {e.n_routed_experts, h}, dt);
      if (e.topk_method == "noaux_tc") {
        add(LayerName(i, "mlp.gate.e_score_correction_bias"), {e.n_routed_experts}, DType::kF32, WeightInit::kZeros);
      }
      const double active = static_cast<double>(e.num_experts_per_tok) / static_cast<double>(e.n_routed_experts);
      for (int64_t x = 0; x < e.n_routed_experts; ++x) {
        const std::string p = LayerName(i, fmt::format("mlp.experts.{}.", x));
        linear(p + "gate_proj", e.moe_intermediate_size, h, active);
        linear(p + "up_proj", e.moe_intermediate_size, h, active);
        linear(p + "down_proj", h, e.moe_intermediate_size, active);
      }
      if (e.n_shared_experts > 0) {
        const int64_t inter = e.moe_intermediate_size * e.n_shared_experts;
        linear(LayerName(i, "mlp.shared_experts.gate_proj"), inter, h);
        linear(LayerName(i, "mlp.shared_experts.up_proj"), inter, h);
        linear(LayerName(i, "mlp.shared_experts.down_proj"), h, inter);
      }
    } else {
      linear(LayerName(i, "mlp.gate_proj"), c.intermediate_size, h);
      linear(LayerName(i, "mlp.up_proj"), c.intermediate_size, h);
      linear(LayerName(i, "mlp.down_proj"), h, c.intermediate_size);
    }
  }
  // The multi-token-prediction layers (num_nextn_predict_layers, stored past num_hidden_layers) are not used for
  // plain decoding; their tensors stay unread in the checkpoint.
  add("model.norm.weight", {h}, dt, WeightInit::kOnes);
  add("lm_head.weight", {c.vocab_size, h}, dt);
  if (c.tie_word_embeddings) {
    s.back().fallback = "model.embed_tokens.weight";
    s.back().shares_storage = true;
  }
  return s;
}

KvCacheSpec DeepseekKvSpec(const ModelConfig& c) {
  KvCacheSpec k;
  k.num_layers = c.num_layers;
  k.num_kv_heads = 1;
  k.k_dim = c.mla.kv_lora_rank + c.mla.qk_rope_head_dim;
  k.v_dim = c.mla.kv_lora_rank;
  k.v_in_k = true;
  return k;
}

struct Mlp {
  LinearWeight gate, up, down;
};

class DeepseekModel final : public Model {
 public:
  DeepseekModel(const ModelConfig& cfg, std::unique_ptr<WeightStore> weights, Backend& backend)
      : cfg_(cfg), weights_(std::move(weights)), backend_(backend), router_(RouterConfigFrom(cfg.moe)) {}

  Status Init() {
    const MlaConfig& m = cfg_.mla;
    if (cfg_.is_moe()) route_params_ = RouteParams(router_);
    const RopeFrequencies f = ComputeRopeFrequencies(cfg_.rope, m.qk_rope_head_dim, cfg_.max_position_embeddings);
    rope_scale_ = f.attention_scale;
    FATHOM_ASSIGN_OR_RETURN(inv_freq_, UploadConstant(backend_, f.inv_freq, DType::kF32,
                                                      {static_cast<int64_t>(f.inv_freq.size())}, &owned_));
    softmax_scale_ = 1.0f / std::sqrt(static_cast<float>(m.qk_nope_head_dim + m.qk_rope_head_dim));
    if (cfg_.rope.type == RopeType::kYarn && cfg_.rope.mscale_all_dim && *cfg_.rope.mscale_all_dim != 0.0) {
      const float ms = static_cast<float>(YarnMscale(cfg_.rope.factor, *cfg_.rope.mscale_all_dim));
      softmax_scale_ *= ms * ms;
    }
    for (int64_t i = 0; i < cfg_.num_layers; ++i) {
      Layer l;
      l.input_norm = weights_->Get(LayerName(i, "input_layernorm.weight"));
      l.post_norm = weights_->Get(LayerName(i, "post_attention_layernorm.weight"));
      if (m.q_lora_rank > 0) {
        l.q_a = Linear(LayerName(i, "self_attn.q_a_proj"));
        l.q_a_norm = weights_->Get(LayerName(i, "self_attn.q_a_layernorm.weight"));
        l.q_b = Linear(LayerName(i, "self_attn.q_b_proj"));
      } else {
        l.q_b = Linear(LayerName(i, "self_attn.q_proj"));
      }
      l.kv_a = Linear(LayerName(i, "self_attn.kv_a_proj_with_mqa"));
      l.attn_in = {m.q_lora_rank > 0 ? l.q_a : l.q_b, l.kv_a};
      l.kv_a_norm = weights_->Get(LayerName(i, "self_attn.kv_a_layernorm.weight"));
      l.o = Linear(LayerName(i, "self_attn.o_proj"));
      l.kv_b = Linear(LayerName(i, "self_attn.kv_b_proj"));
      FATHOM_RETURN_IF_ERROR(SplitKvB(l.kv_b, &l));
      l.moe = cfg_.IsMoeLayer(i);
      if (l.moe) {
        // The router runs on float32 activations, as DeepSeek's reference gate does (F.linear on float32 copies):
        // rounding them to bf16 would move near-tied expert choices.
        l.router.weight = weights_->Get(LayerName(i, "mlp.gate.weight"));
        l.router.float32_inputs = true;
        if (const TensorView* b = weights_->Find(LayerName(i, "mlp.gate.e_score_correction_bias"))) {
          FATHOM_ASSIGN_OR_RETURN(Tensor host, ToHost(*b));
          std::vector<float> bias(static_cast<size_t>(b->numel()));
          ConvertToF32(host.view().raw(), b->dtype(), 0, b->numel(), bias.data());
          FATHOM_ASSIGN_OR_RETURN(l.router_bias, UploadConstant(backend_, bias, DType::kF32, {b->numel()}, &owned_));
        }
        for (int64_t x = 0; x < cfg_.moe.n_routed_experts; ++x) {
          const Mlp e = MlpAt(LayerName(i, fmt::format("mlp.experts.{}.", x)));
          l.experts.gate.push_back(e.gate);
          l.experts.up.push_back(e.up);
          l.experts.down.push_back(e.down);
        }
        FATHOM_RETURN_IF_ERROR(backend_.PrepareExperts(l.experts));
        // Without the backend's device state the experts take the host-sorted path, which reads the routing back.
        experts_on_device_ =
            experts_on_device_ && (l.experts.device_state != nullptr || backend_.device() == Device::kCpu);
        if (cfg_.moe.n_shared_experts > 0) {
          l.shared = MlpAt(LayerName(i, "mlp.shared_experts."));
          l.has_shared = true;
        }
      } else {
        l.dense = MlpAt(LayerName(i, "mlp."));
      }
      layers_.push_back(std::move(l));
    }
    embed_ = weights_->Get("model.embed_tokens.weight");
    final_norm_ = weights_->Get("model.norm.weight");
    lm_head_.weight = weights_->Get("lm_head.weight");
    return OkStatus();
  }

  const ModelConfig& config() const override { return cfg_; }
  KvCacheSpec kv_cache_spec() const override { return DeepseekKvSpec(cfg_); }

  Status Forward(const ForwardBatch& batch, KvCache& kv, Tensor* logits) override {
    FATHOM_RETURN_IF_ERROR(CheckForwardInputs(batch, kv, DeepseekKvSpec(cfg_), cfg_.vocab_size));
    const int64_t n = batch.num_tokens(), n_out = batch.num_logits();
    Backend& be = backend_;
    if (n == 0) {
      *logits = be.Alloc(DType::kF32, {n_out, cfg_.vocab_size});
      return OkStatus();
    }
    FATHOM_ASSIGN_OR_RETURN(BatchOnDevice dev, BatchOnDevice::Upload(batch, be));
    FATHOM_RETURN_IF_ERROR(ForwardOnDevice(dev, kv, logits));
    return be.Synchronize();
  }

  // No host synchronization where the backend routes and runs the experts on the device (CUDA, bf16 experts);
  // otherwise (FP8 experts on the GPU, for now) MoeExperts reads the routing on the host, so no graph can record a
  // step, and the engine runs decode steps eagerly.
  bool SupportsForwardOnDevice() const override { return experts_on_device_; }
  void set_max_batched_tokens(int64_t n) override { max_batched_tokens_ = n; }

  Status ForwardOnDevice(const BatchOnDevice& dev, KvCache& kv, Tensor* logits) override {
    Backend& be = backend_;
    const AttentionMetadata& meta = dev.meta();
    const int64_t n = meta.num_tokens, n_out = dev.logits_indices().dim(0);
    const DType act = be.activation_dtype();
    *logits = be.Alloc(DType::kF32, {n_out, cfg_.vocab_size});
    const MlaConfig& m = cfg_.mla;
    const int64_t h = cfg_.hidden_size, nh = cfg_.num_heads, nope = m.qk_nope_head_dim, rope = m.qk_rope_head_dim;
    const int64_t qd = nope + rope, lora = m.kv_lora_rank, vd = m.v_head_dim;
    const float eps = static_cast<float>(cfg_.rms_norm_eps);

    Tensor residual = be.Alloc(act, {n, h});  // [n_tokens, hidden]
    Tensor normed = be.Alloc(act, {n, h});    // [n_tokens, hidden]
    Tensor proj = be.Alloc(act, {n, h});      // [n_tokens, hidden]
    Tensor qa, qa_n;
    if (m.q_lora_rank > 0) {
      qa = be.Alloc(act, {n, m.q_lora_rank});    // [n_tokens, q_lora_rank]
      qa_n = be.Alloc(act, {n, m.q_lora_rank});  // [n_tokens, q_lora_rank]
    }
    Tensor q = be.Alloc(act, {n, nh, qd});               // [n_tokens, n_heads, nope + rope]
    Tensor latent = be.Alloc(act, {n, 1, lora + rope});  // [n_tokens, 1, kv_lora + rope]: the cache row
    Tensor q_abs = be.Alloc(act, {n, nh, lora + rope});  // [n_tokens, n_heads, kv_lora + rope]
    Tensor attn_lat = be.Alloc(act, {n, nh, lora});      // [n_tokens, n_heads, kv_lora]
    Tensor attn = be.Alloc(act, {n, nh, vd});            // [n_tokens, n_heads, v_head_dim]
    Tensor cos = be.Alloc(DType::kF32, {n, rope / 2});   // [n_tokens, rope / 2]
    Tensor sin = be.Alloc(DType::kF32, {n, rope / 2});
    const bool up = UpProjectedPrefill(meta);
    Tensor ctx_lat, ctx_kv;
    if (up) {
      ctx_lat = be.Alloc(act, {meta.total_seq_len, lora + rope});   // [context rows, kv_lora + rope]
      ctx_kv = be.Alloc(act, {meta.total_seq_len, nh, nope + vd});  // [context rows, n_heads, nope + v_head_dim]
    }

    be.RopeCosSin(meta.positions, inv_freq_, rope_scale_, cos, sin);
    be.Embedding(dev.token_ids(), embed_, residual);
    const TensorView latent2 = latent.view().Reshape({n, lora + rope});
    const TensorView c_kv = latent2.Slice(1, 0, lora);                  // [n_tokens, kv_lora], strided
    const TensorView k_pe = latent.view().Slice(2, lora, lora + rope);  // [n_tokens, 1, rope], strided
    const TensorView q_pe = q.view().Slice(2, nope, qd);                // [n_tokens, n_heads, rope], strided
    const TensorView q2 = q.view().Reshape({n, nh * qd});

    for (int64_t i = 0; i < cfg_.num_layers; ++i) {
      const Layer& l = layers_[static_cast<size_t>(i)];
      if (i == 0) {
        be.RmsNorm(residual, l.input_norm, eps, normed);
      } else {
        be.AddRmsNorm(residual, proj, l.input_norm, eps, normed);
      }
      // The projections of the normed input share one launch at decode sizes: q (or its LoRA down-projection)
      // and the compressed KV.
      if (m.q_lora_rank > 0) {
        be.LinearFanOut(normed, l.attn_in, std::array<TensorView, 2>{qa.view(), latent2});
        be.RmsNorm(qa, l.q_a_norm, eps, qa_n);
        be.Linear(qa_n, l.q_b, q2);
      } else {
        be.LinearFanOut(normed, l.attn_in, std::array<TensorView, 2>{q2, latent2});
      }
      be.RmsNorm(c_kv, l.kv_a_norm, eps, c_kv);
      be.ApplyRope(k_pe, cos, sin, cfg_.rope.interleaved);
      be.ApplyRope(q_pe, cos, sin, cfg_.rope.interleaved);
      const KvLayerView cache = kv.layer(i);
      be.WriteKv(latent, TensorView(), meta, cache);
      if (up) {
        be.GatherContext(cache.k, meta, ctx_lat);
        be.Linear(ctx_lat.view().Slice(1, 0, lora), l.kv_b,
                  ctx_kv.view().Reshape({meta.total_seq_len, nh * (nope + vd)}));
        be.MlaContextAttention(q, ctx_kv.view().Slice(2, 0, nope), ctx_lat.view().Slice(1, lora, lora + rope),
                               ctx_kv.view().Slice(2, nope, nope + vd), meta, softmax_scale_, attn);
      } else {
        // q_abs[:, h, :lora] = q_nope[:, h] W_UK[h]
        be.HeadLinear(q.view().Slice(2, 0, nope), l.w_uk_t, q_abs.view().Slice(2, 0, lora));
        be.Copy(q_pe, q_abs.view().Slice(2, lora, lora + rope));
        be.PagedAttention(q_abs, cache, meta, softmax_scale_, attn_lat);
        be.HeadLinear(attn_lat, l.w_uv, attn);  // attn[:, h] = W_UV[h] attn_lat[:, h]
      }
      be.Linear(attn.view().Reshape({n, nh * vd}), l.o, proj);
      be.AddRmsNorm(residual, proj, l.post_norm, eps, normed);
      if (l.moe) {
        FATHOM_RETURN_IF_ERROR(MoeForward(l, normed, proj));
      } else {
        MlpForward(l.dense, normed, proj);
      }
    }
    be.AddInPlace(residual, proj);
    ComputeLogits(be, residual, dev.logits_indices(), final_norm_, eps, lm_head_, *logits);
    return OkStatus();
  }

 private:
  // The up-projected form for this step: only on a step with prefill tokens (a decode step of one token per
  // sequence keeps the absorbed form, and graphs record only those), and when the FLOPs it saves on the step's
  // (query, key) pairs exceed those of up-projecting every context row: a long prompt, not a short chunk next to
  // long decode contexts. FATHOM_MLA_PREFILL=up or =absorbed overrides the rule (read per step: tests switch it).
  bool UpProjectedPrefill(const AttentionMetadata& meta) const {
    if (meta.num_tokens <= meta.num_seqs || meta.total_seq_len == 0) return false;
    // Its context rows are step activations: the memory plan reserves them for max_batched_tokens rows.
    if (max_batched_tokens_ > 0 && meta.total_seq_len > max_batched_tokens_) return false;
    const char* v = std::getenv("FATHOM_MLA_PREFILL");
    if (v != nullptr && std::string_view(v) == "up") return true;
    if (v != nullptr && std::string_view(v) == "absorbed") return false;
    return MlaUpProjectedPays(cfg_.mla, meta.causal_pairs, meta.total_seq_len);
  }

  struct Layer {
    TensorView input_norm, post_norm, q_a_norm, kv_a_norm;
    LinearWeight q_a, q_b, kv_a, o;
    std::array<LinearWeight, 2> attn_in;  // {q_a or q_b, kv_a}: the projections of the normed input
    LinearWeight kv_b;                    // [n_heads * (nope + v_head_dim), kv_lora]: up-projects the prefill context
    TensorView w_uk_t;                    // [n_heads, kv_lora, nope]: W_UK transposed, per head
    TensorView w_uv;                      // [n_heads, v_head_dim, kv_lora]
    bool moe = false;
    Mlp dense;
    LinearWeight router;
    TensorView router_bias;  // f32 [n_experts] on the device, or empty
    ExpertSet experts;
    Mlp shared;
    bool has_shared = false;
  };

  LinearWeight Linear(const std::string& prefix) const {
    LinearWeight w;
    w.weight = weights_->Get(prefix + ".weight");
    if (w.weight.dtype() == DType::kF8E4M3) {
      w.format = LinearFormat::kFp8Block;
      w.scale_inv = weights_->Get(prefix + ".weight_scale_inv");
      w.block_n = cfg_.quant.block_n;
      w.block_k = cfg_.quant.block_k;
    }
    return w;
  }

  Mlp MlpAt(const std::string& prefix) const {
    return Mlp{Linear(prefix + "gate_proj"), Linear(prefix + "up_proj"), Linear(prefix + "down_proj")};
  }

  // Splits kv_b_proj into per-head W_UK^T and W_UV for the absorbed attention, on the backend's device. They keep
  // kv_b_proj's dtype (exact); FP8 blocks are dequantized to float32 (a product of an e4m3 value and a float32
  // scale needs more bits than bf16 has).
  Status SplitKvB(const LinearWeight& kv_b, Layer* l) {
    const MlaConfig& m = cfg_.mla;
    const int64_t lora = m.kv_lora_rank, nope = m.qk_nope_head_dim, vd = m.v_head_dim, nh = cfg_.num_heads;
    const DType dt = kv_b.weight.dtype() == DType::kF8E4M3 ? DType::kF32 : kv_b.weight.dtype();
    FATHOM_ASSIGN_OR_RETURN(Tensor weight, ToHost(kv_b.weight));  // [n_heads * (nope + v_head_dim), kv_lora]
    Tensor scale_inv;
    if (kv_b.weight.dtype() == DType::kF8E4M3) {
      FATHOM_ASSIGN_OR_RETURN(scale_inv, ToHost(kv_b.scale_inv));
    }
    std::vector<float> row(static_cast<size_t>(lora));
    std::vector<float> uk_t(static_cast<size_t>(nh * lora * nope));  // [n_heads, kv_lora, nope]
    std::vector<float> uv(static_cast<size_t>(nh * vd * lora));      // [n_heads, v_head_dim, kv_lora]
    for (int64_t hh = 0; hh < nh; ++hh) {
      for (int64_t r = 0; r < nope + vd; ++r) {
        const int64_t src_row = hh * (nope + vd) + r;
        ConvertToF32(weight.view().raw(), kv_b.weight.dtype(), src_row * lora, lora, row.data());
        if (kv_b.weight.dtype() == DType::kF8E4M3) {
          const float* sc = scale_inv.data<float>() + (src_row / kv_b.block_n) * scale_inv.view().stride(0);
          for (int64_t c = 0; c < lora; ++c) row[c] *= sc[c / kv_b.block_k];
        }
        for (int64_t c = 0; c < lora; ++c) {
          if (r < nope) {
            uk_t[(hh * lora + c) * nope + r] = row[c];
          } else {
            uv[(hh * vd + (r - nope)) * lora + c] = row[c];
          }
        }
      }
    }
    FATHOM_ASSIGN_OR_RETURN(l->w_uk_t, UploadConstant(backend_, uk_t, dt, {nh, lora, nope}, &owned_));
    FATHOM_ASSIGN_OR_RETURN(l->w_uv, UploadConstant(backend_, uv, dt, {nh, vd, lora}, &owned_));
    return OkStatus();
  }

  // A host copy of a (contiguous) weight, wherever the backend keeps it.
  StatusOr<Tensor> ToHost(const TensorView& w) {
    if (!w.is_contiguous()) return InternalError("a DeepSeek weight read on the host is not contiguous");
    Tensor host = Tensor::Empty(w.dtype(), w.shape());
    FATHOM_RETURN_IF_ERROR(backend_.CopyToHost(w, host.view().raw()));
    return host;
  }

  // out = down(silu(gate(x)) * up(x)), gate and up in one fan-out.   x [m, hidden]; out [m, hidden]
  void MlpForward(const Mlp& mlp, const TensorView& x, const TensorView& out) {
    Backend& be = backend_;
    const int64_t rows = x.dim(0), inter = mlp.gate.out_features();
    Tensor g = be.Alloc(be.activation_dtype(), {rows, inter});  // [m, intermediate]
    Tensor u = be.Alloc(be.activation_dtype(), {rows, inter});
    be.LinearFanOut(x, std::array<LinearWeight, 2>{mlp.gate, mlp.up}, std::array<TensorView, 2>{g.view(), u.view()});
    be.SiluMul(g, u, g);
    be.Linear(g, mlp.down, out);
  }

  // The shared experts' output, plus the routed experts weighted by the router (MoeRoute, then MoeExperts).
  Status MoeForward(const Layer& l, const TensorView& x, const TensorView& out) {
    Backend& be = backend_;
    const int64_t n = x.dim(0), e = router_.n_experts, k = router_.top_k;
    Tensor logits = be.Alloc(DType::kF32, {n, e});  // [n_tokens, n_experts], float32 as DeepSeek routes
    Tensor ids = be.Alloc(DType::kI32, {n, k});     // [n_tokens, top_k]
    Tensor w = be.Alloc(DType::kF32, {n, k});       // [n_tokens, top_k]
    if (l.has_shared) {  // the router and the shared experts' gate and up read x in one fan-out
      const int64_t inter = l.shared.gate.out_features();
      Tensor g = be.Alloc(be.activation_dtype(), {n, inter});  // [n_tokens, shared intermediate]
      Tensor u = be.Alloc(be.activation_dtype(), {n, inter});
      be.LinearFanOut(x, std::array<LinearWeight, 3>{l.router, l.shared.gate, l.shared.up},
                      std::array<TensorView, 3>{logits.view(), g.view(), u.view()});
      be.MoeRoute(logits, l.router_bias, route_params_, ids, w);
      be.SiluMul(g, u, g);
      be.Linear(g, l.shared.down, out);
    } else {
      be.Linear(x, l.router, logits);
      be.MoeRoute(logits, l.router_bias, route_params_, ids, w);
      Tensor zero = be.Alloc(be.activation_dtype(), {n, x.dim(1)});
      be.Copy(zero, out);
    }
    return be.MoeExperts(x, l.experts, ids, w, out);
  }

  ModelConfig cfg_;
  int64_t max_batched_tokens_ = 0;  // UpProjectedPrefill's bound on context rows (0: none)
  std::unique_ptr<WeightStore> weights_;
  Backend& backend_;
  RouterConfig router_;
  moe_route::Params route_params_;
  std::vector<Layer> layers_;
  bool experts_on_device_ = true;  // every MoE layer's experts run without a host round trip
  std::vector<Tensor> owned_;
  TensorView embed_, final_norm_;
  LinearWeight lm_head_;
  TensorView inv_freq_;  // [qk_rope_head_dim / 2] f32, on the device
  float rope_scale_ = 1.0f;
  float softmax_scale_ = 1.0f;
};

}  // namespace

void RegisterDeepseekFamily(std::vector<Architecture>& out) {
  for (const char* name : {"DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM"}) {
    Architecture a;
    a.name = name;
    a.weight_specs = &DeepseekWeightSpecs;
    a.kv_cache_spec = &DeepseekKvSpec;
    a.create = &CreateModel<DeepseekModel>;
    out.push_back(a);
  }
}

}  // namespace fathom
