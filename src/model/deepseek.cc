// The DeepSeek family: DeepseekV2ForCausalLM (V2, V2-Lite) and DeepseekV3ForCausalLM (V3, R1), with multi-head
// latent attention over a latent paged cache, mixture-of-experts MLPs, and V3's block-scaled FP8 weights.
//
// MLA, absorbed form (used for prefill and decode alike on the reference backend):
//   cache row per token per layer = [RmsNorm(c_kv) (kv_lora_rank), rope(k_pe) (qk_rope_head_dim)]
//   q_abs[h] = [W_UK[h]^T q_nope[h], rope(q_pe[h])]        -> MQA over the cache rows, key dim kv_lora + rope
//   out[h]   = W_UV[h] (sum_j p_j c_kv_j)                  -> o_proj
// where kv_b_proj = [W_UK[0]; W_UV[0]; W_UK[1]; W_UV[1]; ...] row blocks of qk_nope_head_dim and v_head_dim.
#include <fmt/format.h>

#include <cmath>

#include "model/moe.h"
#include "model/registry.h"
#include "model/rope.h"

namespace fathom {

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
    if (backend_.device() != Device::kCpu) {
      return UnimplementedError(fmt::format("DeepSeek models do not run on the {} backend yet", backend_.name()));
    }
    const MlaConfig& m = cfg_.mla;
    const RopeFrequencies f = ComputeRopeFrequencies(cfg_.rope, m.qk_rope_head_dim, cfg_.max_position_embeddings);
    rope_scale_ = f.attention_scale;
    inv_freq_ = Tensor::Empty(DType::kF32, {static_cast<int64_t>(f.inv_freq.size())});
    std::copy(f.inv_freq.begin(), f.inv_freq.end(), inv_freq_.data<float>());
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
      l.kv_a_norm = weights_->Get(LayerName(i, "self_attn.kv_a_layernorm.weight"));
      l.o = Linear(LayerName(i, "self_attn.o_proj"));
      FATHOM_RETURN_IF_ERROR(SplitKvB(Linear(LayerName(i, "self_attn.kv_b_proj")), &l));
      l.moe = cfg_.IsMoeLayer(i);
      if (l.moe) {
        l.router.weight = weights_->Get(LayerName(i, "mlp.gate.weight"));
        if (const TensorView* b = weights_->Find(LayerName(i, "mlp.gate.e_score_correction_bias"))) {
          l.router_bias.resize(static_cast<size_t>(b->numel()));
          ConvertToF32(b->raw(), b->dtype(), 0, b->numel(), l.router_bias.data());
        }
        for (int64_t x = 0; x < cfg_.moe.n_routed_experts; ++x) {
          l.experts.push_back(MlpAt(LayerName(i, fmt::format("mlp.experts.{}.", x))));
        }
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
    const DType act = be.activation_dtype();
    *logits = be.Alloc(DType::kF32, {n_out, cfg_.vocab_size});
    if (n == 0) return OkStatus();
    FATHOM_ASSIGN_OR_RETURN(BatchOnDevice dev, BatchOnDevice::Upload(batch, be));
    const AttentionMetadata& meta = dev.meta();
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
      if (m.q_lora_rank > 0) {
        be.Linear(normed, l.q_a, qa);
        be.RmsNorm(qa, l.q_a_norm, eps, qa_n);
        be.Linear(qa_n, l.q_b, q2);
      } else {
        be.Linear(normed, l.q_b, q2);
      }
      be.Linear(normed, l.kv_a, latent2);
      be.RmsNorm(c_kv, l.kv_a_norm, eps, c_kv);
      be.ApplyRope(k_pe, cos, sin, cfg_.rope.interleaved);
      be.ApplyRope(q_pe, cos, sin, cfg_.rope.interleaved);
      const KvLayerView cache = kv.layer(i);
      be.WriteKv(latent, TensorView(), meta, cache);
      for (int64_t hh = 0; hh < nh; ++hh) {  // q_abs[:, h, :lora] = q_nope[:, h] W_UK[h]
        be.Linear(q.view().Select(1, hh).Slice(1, 0, nope), l.w_uk_t[static_cast<size_t>(hh)],
                  q_abs.view().Select(1, hh).Slice(1, 0, lora));
      }
      be.Copy(q_pe, q_abs.view().Slice(2, lora, lora + rope));
      be.PagedAttention(q_abs, cache, meta, softmax_scale_, attn_lat);
      for (int64_t hh = 0; hh < nh; ++hh) {  // attn[:, h] = W_UV[h] attn_lat[:, h]
        be.Linear(attn_lat.view().Select(1, hh), l.w_uv[static_cast<size_t>(hh)], attn.view().Select(1, hh));
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
    return be.Synchronize();
  }

 private:
  struct Layer {
    TensorView input_norm, post_norm, q_a_norm, kv_a_norm;
    LinearWeight q_a, q_b, kv_a, o;
    std::vector<LinearWeight> w_uk_t;  // per head: [kv_lora, nope] (W_UK transposed)
    std::vector<LinearWeight> w_uv;    // per head: [v_head_dim, kv_lora]
    bool moe = false;
    Mlp dense;
    LinearWeight router;
    std::vector<float> router_bias;  // [n_experts] or empty
    std::vector<Mlp> experts;
    Mlp shared;
    bool has_shared = false;
  };

  LinearWeight Linear(const std::string& prefix) const {
    LinearWeight w;
    w.weight = weights_->Get(prefix + ".weight");
    if (w.weight.dtype() == DType::kF8E4M3) {
      w.scale_inv = weights_->Get(prefix + ".weight_scale_inv");
      w.block_n = cfg_.quant.block_n;
      w.block_k = cfg_.quant.block_k;
    }
    return w;
  }

  Mlp MlpAt(const std::string& prefix) const {
    return Mlp{Linear(prefix + "gate_proj"), Linear(prefix + "up_proj"), Linear(prefix + "down_proj")};
  }

  // Dequantizes kv_b_proj into per-head float32 W_UK^T and W_UV for the absorbed attention.
  Status SplitKvB(const LinearWeight& kv_b, Layer* l) {
    const MlaConfig& m = cfg_.mla;
    const int64_t lora = m.kv_lora_rank, nope = m.qk_nope_head_dim, vd = m.v_head_dim, nh = cfg_.num_heads;
    std::vector<float> row(static_cast<size_t>(lora));
    Tensor uk_t = Tensor::Empty(DType::kF32, {nh, lora, nope});  // [n_heads, kv_lora, nope]
    Tensor uv = Tensor::Empty(DType::kF32, {nh, vd, lora});      // [n_heads, v_head_dim, kv_lora]
    for (int64_t hh = 0; hh < nh; ++hh) {
      for (int64_t r = 0; r < nope + vd; ++r) {
        const int64_t src_row = hh * (nope + vd) + r;
        ConvertToF32(kv_b.weight.raw(), kv_b.weight.dtype(), src_row * kv_b.weight.stride(0), lora, row.data());
        if (kv_b.weight.dtype() == DType::kF8E4M3) {
          const float* sc = kv_b.scale_inv.data<float>() + (src_row / kv_b.block_n) * kv_b.scale_inv.stride(0);
          for (int64_t c = 0; c < lora; ++c) row[c] *= sc[c / kv_b.block_k];
        }
        for (int64_t c = 0; c < lora; ++c) {
          if (r < nope) {
            uk_t.data<float>()[(hh * lora + c) * nope + r] = row[c];
          } else {
            uv.data<float>()[(hh * vd + (r - nope)) * lora + c] = row[c];
          }
        }
      }
    }
    for (int64_t hh = 0; hh < nh; ++hh) {
      LinearWeight a, b;
      a.weight = uk_t.view().Select(0, hh);
      b.weight = uv.view().Select(0, hh);
      l->w_uk_t.push_back(a);
      l->w_uv.push_back(b);
    }
    owned_.push_back(std::move(uk_t));
    owned_.push_back(std::move(uv));
    return OkStatus();
  }

  // out = down(silu(gate(x)) * up(x)).   x [m, hidden]; out [m, hidden]
  void MlpForward(const Mlp& mlp, const TensorView& x, const TensorView& out) {
    Backend& be = backend_;
    const int64_t rows = x.dim(0), inter = mlp.gate.out_features();
    Tensor g = be.Alloc(be.activation_dtype(), {rows, inter});  // [m, intermediate]
    Tensor u = be.Alloc(be.activation_dtype(), {rows, inter});
    be.Linear(x, mlp.gate, g);
    be.Linear(x, mlp.up, u);
    be.SiluMul(g, u, g);
    be.Linear(g, mlp.down, out);
  }

  // Routed experts grouped by expert (gather -> MLP -> weighted scatter-add), plus the shared experts.
  Status MoeForward(const Layer& l, const TensorView& x, const TensorView& out) {
    Backend& be = backend_;
    const int64_t n = x.dim(0), h = x.dim(1), e = router_.n_experts, k = router_.top_k;
    Tensor logits = be.Alloc(DType::kF32, {n, e});  // [n_tokens, n_experts], float32 as DeepSeek routes
    be.Linear(x, l.router, logits);
    std::vector<float> host(static_cast<size_t>(n * e));
    FATHOM_RETURN_IF_ERROR(be.Synchronize());
    FATHOM_RETURN_IF_ERROR(be.CopyToHost(logits, host.data()));
    std::vector<int32_t> ids(static_cast<size_t>(n * k));
    std::vector<float> w(static_cast<size_t>(n * k));
    RouteExperts(router_, host.data(), n, l.router_bias.empty() ? nullptr : l.router_bias.data(), ids.data(), w.data());
    // Counting sort of the (token, expert) pairs by expert.
    std::vector<int32_t> offsets(static_cast<size_t>(e + 1), 0);
    for (int32_t id : ids) ++offsets[static_cast<size_t>(id) + 1];
    for (int64_t x2 = 0; x2 < e; ++x2) offsets[x2 + 1] += offsets[x2];
    std::vector<int32_t> fill(offsets.begin(), offsets.end() - 1);
    std::vector<int32_t> tokens(static_cast<size_t>(n * k));
    std::vector<float> weights(static_cast<size_t>(n * k));
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t j = 0; j < k; ++j) {
        const int32_t slot = fill[ids[t * k + j]]++;
        tokens[slot] = static_cast<int32_t>(t);
        weights[slot] = w[t * k + j];
      }
    }
    const int64_t total = n * k;
    Tensor tokens_host = Tensor::Empty(DType::kI32, {total});
    Tensor weights_host = Tensor::Empty(DType::kF32, {total});
    std::copy(tokens.begin(), tokens.end(), tokens_host.data<int32_t>());
    std::copy(weights.begin(), weights.end(), weights_host.data<float>());
    FATHOM_ASSIGN_OR_RETURN(Tensor tokens_dev, be.Upload(tokens_host));
    FATHOM_ASSIGN_OR_RETURN(Tensor weights_dev, be.Upload(weights_host));
    Tensor gathered = be.Alloc(be.activation_dtype(), {total, h});  // [n_tokens * top_k, hidden], by expert
    Tensor expert_out = be.Alloc(be.activation_dtype(), {total, h});
    be.GatherRows(x, tokens_dev, gathered);
    for (int64_t x2 = 0; x2 < e; ++x2) {
      const int64_t b = offsets[x2], end = offsets[x2 + 1];
      if (b == end) continue;
      MlpForward(l.experts[static_cast<size_t>(x2)], gathered.view().Slice(0, b, end),
                 expert_out.view().Slice(0, b, end));
    }
    if (l.has_shared) {
      MlpForward(l.shared, x, out);
    } else {
      Tensor zero = be.Alloc(be.activation_dtype(), {n, h});
      be.Copy(zero, out);
    }
    be.ScatterAddRows(expert_out, tokens_dev, weights_dev, out);
    return OkStatus();
  }

  ModelConfig cfg_;
  std::unique_ptr<WeightStore> weights_;
  Backend& backend_;
  RouterConfig router_;
  std::vector<Layer> layers_;
  std::vector<Tensor> owned_;
  TensorView embed_, final_norm_;
  LinearWeight lm_head_;
  Tensor inv_freq_;
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
