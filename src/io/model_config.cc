#include "io/model_config.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "io/json_reader.h"
#include "io/quant_config.h"

namespace fathom {

namespace {

using json = nlohmann::json;
using Reader = JsonReader;

struct ArchInfo {
  const char* model_type;
  const char* architecture;
};
constexpr ArchInfo kArchs[] = {
    {"llama", "LlamaForCausalLM"},
    {"qwen2", "Qwen2ForCausalLM"},
    {"deepseek_v2", "DeepseekV2ForCausalLM"},
    {"deepseek_v3", "DeepseekV3ForCausalLM"},
    {"deepseek_v32", "DeepseekV32ForCausalLM"},
    {"deepseek_v4", "DeepseekV4ForCausalLM"},
};

std::string SupportedList() {
  std::string s;
  for (const auto& a : kArchs) {
    if (!s.empty()) s += ", ";
    s += fmt::format("{} ({})", a.architecture, a.model_type);
  }
  return s;
}

StatusOr<RopeType> ParseRopeType(const std::string& s) {
  if (s == "default" || s.empty()) return RopeType::kDefault;
  if (s == "linear") return RopeType::kLinear;
  if (s == "dynamic") return RopeType::kDynamic;
  if (s == "llama3") return RopeType::kLlama3;
  if (s == "yarn") return RopeType::kYarn;
  return InvalidArgumentError(
      fmt::format("config.json: unsupported rope scaling type '{}' (supported: default, linear, llama3, yarn)", s));
}

Status ParseRopeParams(const json& params, const std::string& where, RopeConfig* out);

Status ParseRope(const json& j, ModelConfig* c) {
  Reader top(j);
  FATHOM_RETURN_IF_ERROR(top.Double("rope_theta", &c->rope.theta));
  // v5 `rope_parameters` and legacy `rope_scaling` carry the same keys; `rope_parameters` wins when both exist.
  const json* params = nullptr;
  std::string where;
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    auto it = j.find(key);
    if (it != j.end() && !it->is_null()) {
      if (!it->is_object()) return InvalidArgumentError(fmt::format("config.json: '{}' must be an object", key));
      params = &*it;
      where = fmt::format("config.json '{}'", key);
      break;
    }
  }
  if (params == nullptr) return OkStatus();
  return ParseRopeParams(*params, where, &c->rope);
}

Status ParseRopeParams(const json& params, const std::string& where, RopeConfig* out) {
  Reader r(params, where);
  FATHOM_RETURN_IF_ERROR(r.Double("rope_theta", &out->theta));
  std::string type;
  FATHOM_RETURN_IF_ERROR(r.String("rope_type", &type));
  if (type.empty()) FATHOM_RETURN_IF_ERROR(r.String("type", &type));
  FATHOM_ASSIGN_OR_RETURN(out->type, ParseRopeType(type));
  RopeConfig& rope = *out;
  if (rope.type == RopeType::kDefault) return OkStatus();
  FATHOM_RETURN_IF_ERROR(r.Double("factor", &rope.factor, /*required=*/true));
  if (!(rope.factor >= 1.0) && rope.type != RopeType::kLinear) {
    return InvalidArgumentError(fmt::format("{}: 'factor' must be >= 1, got {}", where, rope.factor));
  }
  if (!(rope.factor > 0.0)) return InvalidArgumentError(fmt::format("{}: 'factor' must be > 0", where));
  FATHOM_RETURN_IF_ERROR(r.Int("original_max_position_embeddings", &rope.original_max_position_embeddings));
  switch (rope.type) {
    case RopeType::kDynamic:
      return UnimplementedError(
          "config.json: rope scaling type 'dynamic' (NTK) is not supported: its frequencies depend on the batch's "
          "longest sequence, which a paged, continuously batched cache cannot reproduce; supported: default, linear, "
          "llama3, yarn");
    case RopeType::kLlama3:
      FATHOM_RETURN_IF_ERROR(r.Double("low_freq_factor", &rope.low_freq_factor, true));
      FATHOM_RETURN_IF_ERROR(r.Double("high_freq_factor", &rope.high_freq_factor, true));
      if (rope.original_max_position_embeddings <= 0) {
        return InvalidArgumentError(fmt::format("{}: llama3 rope needs original_max_position_embeddings", where));
      }
      if (!(rope.high_freq_factor > rope.low_freq_factor)) {
        return InvalidArgumentError(fmt::format("{}: llama3 rope needs high_freq_factor > low_freq_factor", where));
      }
      break;
    case RopeType::kYarn:
      FATHOM_RETURN_IF_ERROR(r.Double("beta_fast", &rope.beta_fast));
      FATHOM_RETURN_IF_ERROR(r.Double("beta_slow", &rope.beta_slow));
      FATHOM_RETURN_IF_ERROR(r.OptDouble("mscale", &rope.mscale));
      FATHOM_RETURN_IF_ERROR(r.OptDouble("mscale_all_dim", &rope.mscale_all_dim));
      FATHOM_RETURN_IF_ERROR(r.OptDouble("attention_factor", &rope.attention_factor));
      FATHOM_RETURN_IF_ERROR(r.Bool("truncate", &rope.truncate));
      break;
    default:
      break;
  }
  return OkStatus();
}

Status ParseDeepseek(const json& j, ModelConfig* c) {
  Reader r(j);
  // V3.2 is V3 plus the indexer (and V3.1 is V3 as far as the weights go: model_type deepseek_v3).
  const bool v32 = c->model_type == "deepseek_v32";
  const bool v3 = c->model_type == "deepseek_v3" || v32;
  c->is_mla = true;
  c->rope.interleaved = true;
  MlaConfig& m = c->mla;
  m.q_lora_rank = 1536;
  m.kv_lora_rank = 512;
  m.qk_nope_head_dim = 128;
  m.qk_rope_head_dim = 64;
  m.v_head_dim = 128;
  // q_lora_rank: null means a plain q_proj.
  auto ql = j.find("q_lora_rank");
  if (ql != j.end() && ql->is_null()) {
    m.q_lora_rank = 0;
  } else {
    FATHOM_RETURN_IF_ERROR(r.Int("q_lora_rank", &m.q_lora_rank));
  }
  FATHOM_RETURN_IF_ERROR(r.Int("kv_lora_rank", &m.kv_lora_rank));
  FATHOM_RETURN_IF_ERROR(r.Int("qk_nope_head_dim", &m.qk_nope_head_dim));
  FATHOM_RETURN_IF_ERROR(r.Int("qk_rope_head_dim", &m.qk_rope_head_dim));
  FATHOM_RETURN_IF_ERROR(r.Int("v_head_dim", &m.v_head_dim));
  if (m.q_lora_rank < 0 || m.kv_lora_rank <= 0 || m.qk_nope_head_dim <= 0 || m.qk_rope_head_dim <= 0 ||
      m.v_head_dim <= 0 || m.qk_rope_head_dim % 2 != 0) {
    return InvalidArgumentError(fmt::format(
        "config.json: inconsistent MLA dims (q_lora_rank {}, kv_lora_rank {}, qk_nope_head_dim {}, qk_rope_head_dim {} "
        "(must be even), v_head_dim {})",
        m.q_lora_rank, m.kv_lora_rank, m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim));
  }
  c->head_dim = m.qk_nope_head_dim + m.qk_rope_head_dim;
  // transformers' DeepSeek rope: interleaved pairs unless rope_interleave is false.
  FATHOM_RETURN_IF_ERROR(r.Bool("rope_interleave", &c->rope.interleaved));
  if (v32) {
    m.index_n_heads = 64;
    m.index_head_dim = 128;
    m.index_topk = 2048;
    FATHOM_RETURN_IF_ERROR(r.Int("index_n_heads", &m.index_n_heads));
    FATHOM_RETURN_IF_ERROR(r.Int("index_head_dim", &m.index_head_dim));
    FATHOM_RETURN_IF_ERROR(r.Int("index_topk", &m.index_topk));
    // The indexer rotates the first qk_rope_head_dim values of its heads (transformers' DeepseekV32Indexer).
    if (m.index_n_heads <= 0 || m.index_topk <= 0 || m.index_head_dim < m.qk_rope_head_dim) {
      return InvalidArgumentError(fmt::format(
          "config.json: inconsistent indexer (index_n_heads {} and index_topk {} must be positive, index_head_dim {} "
          "at least qk_rope_head_dim {})",
          m.index_n_heads, m.index_topk, m.index_head_dim, m.qk_rope_head_dim));
    }
  }

  MoeConfig& e = c->moe;
  e.moe_intermediate_size = v3 ? 2048 : 1407;
  e.topk_method = v3 ? "noaux_tc" : "greedy";
  e.scoring_func = v3 ? "sigmoid" : "softmax";
  e.routed_scaling_factor = v3 ? 2.5 : 1.0;
  e.norm_topk_prob = v3;
  FATHOM_RETURN_IF_ERROR(r.Int("n_routed_experts", &e.n_routed_experts));
  FATHOM_RETURN_IF_ERROR(r.Int("n_shared_experts", &e.n_shared_experts));
  FATHOM_RETURN_IF_ERROR(r.Int("num_experts_per_tok", &e.num_experts_per_tok));
  FATHOM_RETURN_IF_ERROR(r.Int("moe_intermediate_size", &e.moe_intermediate_size));
  FATHOM_RETURN_IF_ERROR(r.Int("first_k_dense_replace", &e.first_k_dense_replace));
  FATHOM_RETURN_IF_ERROR(r.Int("moe_layer_freq", &e.moe_layer_freq));
  FATHOM_RETURN_IF_ERROR(r.Int("n_group", &e.n_group));
  FATHOM_RETURN_IF_ERROR(r.Int("topk_group", &e.topk_group));
  FATHOM_RETURN_IF_ERROR(r.String("topk_method", &e.topk_method));
  FATHOM_RETURN_IF_ERROR(r.String("scoring_func", &e.scoring_func));
  FATHOM_RETURN_IF_ERROR(r.Bool("norm_topk_prob", &e.norm_topk_prob));
  FATHOM_RETURN_IF_ERROR(r.Double("routed_scaling_factor", &e.routed_scaling_factor));
  FATHOM_RETURN_IF_ERROR(r.Int("num_nextn_predict_layers", &c->num_nextn_predict_layers));
  if (e.n_routed_experts > 0) {
    if (e.num_experts_per_tok <= 0 || e.num_experts_per_tok > e.n_routed_experts) {
      return InvalidArgumentError(
          fmt::format("config.json: num_experts_per_tok ({}) must be between 1 and n_routed_experts ({})",
                      e.num_experts_per_tok, e.n_routed_experts));
    }
    // The router's limits (model/moe_route.h): DeepSeek-V3 has 256 experts, top 8, 8 groups.
    if (e.n_routed_experts > 512 || e.num_experts_per_tok > 32 || e.n_group > 64) {
      return InvalidArgumentError(
          fmt::format("config.json: n_routed_experts ({}), num_experts_per_tok ({}) or n_group ({}) exceeds what "
                      "fathom routes (512, 32, 64)",
                      e.n_routed_experts, e.num_experts_per_tok, e.n_group));
    }
    if (e.n_group <= 0 || e.n_routed_experts % e.n_group != 0) {
      return InvalidArgumentError(fmt::format("config.json: n_routed_experts ({}) must be a multiple of n_group ({})",
                                              e.n_routed_experts, e.n_group));
    }
    if (e.topk_group <= 0 || e.topk_group > e.n_group) {
      return InvalidArgumentError(
          fmt::format("config.json: topk_group ({}) must be between 1 and n_group ({})", e.topk_group, e.n_group));
    }
    if (e.topk_method != "greedy" && e.topk_method != "group_limited_greedy" && e.topk_method != "noaux_tc") {
      return InvalidArgumentError(
          fmt::format("config.json: unsupported topk_method '{}' (supported: greedy, group_limited_greedy, noaux_tc)",
                      e.topk_method));
    }
    if (e.scoring_func != "softmax" && e.scoring_func != "sigmoid") {
      return InvalidArgumentError(
          fmt::format("config.json: unsupported scoring_func '{}' (supported: softmax, sigmoid)", e.scoring_func));
    }
    if (e.topk_method == "noaux_tc" && e.num_experts_per_tok > (e.n_routed_experts / e.n_group) * e.topk_group) {
      return InvalidArgumentError(
          fmt::format("config.json: num_experts_per_tok ({}) exceeds the experts in topk_group ({}) groups of {}",
                      e.num_experts_per_tok, e.topk_group, e.n_routed_experts / e.n_group));
    }
    if (e.moe_intermediate_size <= 0 || e.moe_layer_freq <= 0 || e.first_k_dense_replace < 0 ||
        e.n_shared_experts < 0) {
      return InvalidArgumentError(
          "config.json: moe_intermediate_size and moe_layer_freq must be positive, first_k_dense_replace and "
          "n_shared_experts non-negative");
    }
  }
  return OkStatus();
}

// DeepSeek-V4 as transformers' DeepseekV4Config reads it (its __post_init__ folds the legacy keys the hub config
// ships: compress_ratios, compress_rate_csa / _hca, num_hash_layers, qk_rope_head_dim). Its MoE is every layer's.
Status ParseDeepseekV4(const json& j, ModelConfig* c) {
  Reader r(j);
  V4Config& v = c->v4;
  c->is_v4 = true;
  c->rope.interleaved = true;
  // The attention kinds: layer_types > compress_ratios (one entry a layer, then one an MTP layer) > transformers'
  // default (two HCA layers, then CSA and HCA in turn).
  if (auto it = j.find("compress_rates"); it != j.end() && !it->is_null()) {
    if (!it->is_object()) return InvalidArgumentError("config.json: 'compress_rates' must be an object");
    Reader rates(*it, "config.json 'compress_rates'");
    FATHOM_RETURN_IF_ERROR(rates.Int("compressed_sparse_attention", &v.csa_rate));
    FATHOM_RETURN_IF_ERROR(rates.Int("heavily_compressed_attention", &v.hca_rate));
  }
  FATHOM_RETURN_IF_ERROR(r.Int("compress_rate_csa", &v.csa_rate));
  FATHOM_RETURN_IF_ERROR(r.Int("compress_rate_hca", &v.hca_rate));
  if (v.csa_rate < 1 || v.csa_rate > 1024 || v.hca_rate < 1 || v.hca_rate > 4096) {
    return InvalidArgumentError(
        fmt::format("config.json: compress rates must be in [1, 1024] (compressed_sparse_attention, {}) and [1, 4096] "
                    "(heavily_compressed_attention, {})",
                    v.csa_rate, v.hca_rate));
  }
  const int64_t n = c->num_layers;
  if (auto it = j.find("layer_types"); it != j.end() && !it->is_null()) {
    if (!it->is_array() || static_cast<int64_t>(it->size()) != n) {
      return InvalidArgumentError(
          fmt::format("config.json: 'layer_types' must list one attention kind for each of the {} layers", n));
    }
    for (size_t i = 0; i < it->size(); ++i) {
      const json& e = (*it)[i];
      const std::string name = e.is_string() ? e.get<std::string>() : e.dump();
      bool found = false;
      for (V4Attention k : {V4Attention::kSliding, V4Attention::kCsa, V4Attention::kHca}) {
        if (name == V4AttentionName(k)) {
          v.attention.push_back(k);
          found = true;
        }
      }
      if (!found) {
        return InvalidArgumentError(
            fmt::format("config.json: layer_types[{}] is {}: DeepSeek-V4's kinds are sliding_attention, "
                        "compressed_sparse_attention and heavily_compressed_attention",
                        i, name));
      }
    }
  } else if (auto ratios = j.find("compress_ratios"); ratios != j.end() && !ratios->is_null()) {
    if (!ratios->is_array() || static_cast<int64_t>(ratios->size()) < n) {
      return InvalidArgumentError(
          fmt::format("config.json: 'compress_ratios' must list a ratio for each of the {} layers", n));
    }
    for (size_t i = 0; i < ratios->size(); ++i) {
      const json& e = (*ratios)[i];
      const int64_t ratio = e.is_number_integer() ? e.get<int64_t>() : -1;
      // transformers maps these three values to the kinds, whatever compress_rates says.
      if (ratio != 0 && ratio != 4 && ratio != 128) {
        return InvalidArgumentError(fmt::format(
            "config.json: compress_ratios[{}] is {}: DeepSeek-V4 layers compress by 0 (sliding window only), 4 "
            "(compressed sparse attention) or 128 (heavily compressed attention)",
            i, e.dump()));
      }
      const V4Attention kind = ratio == 0 ? V4Attention::kSliding : ratio == 4 ? V4Attention::kCsa : V4Attention::kHca;
      (static_cast<int64_t>(i) < n ? v.attention : v.mtp_attention).push_back(kind);
    }
  } else {
    for (int64_t i = 0; i < n; ++i) {
      v.attention.push_back(i < 2 ? V4Attention::kHca : (i - 2) % 2 ? V4Attention::kCsa : V4Attention::kHca);
    }
  }
  // The MoE routing: mlp_layer_types > num_hash_layers > 3 hash-routed layers.
  if (auto it = j.find("mlp_layer_types"); it != j.end() && !it->is_null()) {
    if (!it->is_array() || static_cast<int64_t>(it->size()) != n) {
      return InvalidArgumentError(
          fmt::format("config.json: 'mlp_layer_types' must list hash_moe or moe for each of the {} layers", n));
    }
    for (size_t i = 0; i < it->size(); ++i) {
      const json& e = (*it)[i];
      if (!e.is_string() || (e.get<std::string>() != "hash_moe" && e.get<std::string>() != "moe")) {
        return InvalidArgumentError(
            fmt::format("config.json: mlp_layer_types[{}] is {}: DeepSeek-V4's are hash_moe and moe", i, e.dump()));
      }
      v.hash_moe.push_back(e.get<std::string>() == "hash_moe");
    }
  } else {
    int64_t hash_layers = 3;
    FATHOM_RETURN_IF_ERROR(r.Int("num_hash_layers", &hash_layers));
    if (hash_layers < 0) return InvalidArgumentError("config.json: 'num_hash_layers' must not be negative");
    for (int64_t i = 0; i < n; ++i) v.hash_moe.push_back(i < hash_layers);
  }

  c->head_dim = 512;
  FATHOM_RETURN_IF_ERROR(r.Int("head_dim", &c->head_dim));
  FATHOM_RETURN_IF_ERROR(r.Int("sliding_window", &v.sliding_window));
  FATHOM_RETURN_IF_ERROR(r.Int("q_lora_rank", &v.q_lora_rank));
  FATHOM_RETURN_IF_ERROR(r.Int("o_groups", &v.o_groups));
  FATHOM_RETURN_IF_ERROR(r.Int("o_lora_rank", &v.o_lora_rank));
  FATHOM_RETURN_IF_ERROR(r.Int("index_n_heads", &v.index_n_heads));
  FATHOM_RETURN_IF_ERROR(r.Int("index_head_dim", &v.index_head_dim));
  FATHOM_RETURN_IF_ERROR(r.Int("index_topk", &v.index_topk));
  FATHOM_RETURN_IF_ERROR(r.Int("hc_mult", &v.hc_mult));
  FATHOM_RETURN_IF_ERROR(r.Int("hc_sinkhorn_iters", &v.hc_sinkhorn_iters));
  FATHOM_RETURN_IF_ERROR(r.Double("hc_eps", &v.hc_eps));
  FATHOM_RETURN_IF_ERROR(r.Double("swiglu_limit", &v.swiglu_limit));
  // The rotated values a head: partial_rotary_factor > qk_rope_head_dim > 64 of 512.
  double partial = 0.0;
  FATHOM_RETURN_IF_ERROR(r.Double("partial_rotary_factor", &partial));
  if (partial > 0.0) {
    v.rope_dim = static_cast<int64_t>(static_cast<double>(c->head_dim) * partial);
  } else {
    v.rope_dim = c->head_dim / 8;
    FATHOM_RETURN_IF_ERROR(r.Int("qk_rope_head_dim", &v.rope_dim));
  }
  if (c->head_dim < 2 || v.rope_dim < 2 || v.rope_dim % 2 != 0 || v.rope_dim > c->head_dim ||
      v.rope_dim > v.index_head_dim) {
    return InvalidArgumentError(
        fmt::format("config.json: qk_rope_head_dim ({}) must be even and at most head_dim ({}) and index_head_dim ({})",
                    v.rope_dim, c->head_dim, v.index_head_dim));
  }
  if (c->num_kv_heads != 1) {
    return InvalidArgumentError(fmt::format(
        "config.json: num_key_value_heads is {}: DeepSeek-V4's attention shares one key-value head", c->num_kv_heads));
  }
  if (v.o_groups < 1 || c->num_heads % v.o_groups != 0) {
    return InvalidArgumentError(fmt::format("config.json: num_attention_heads ({}) must be a multiple of o_groups ({})",
                                            c->num_heads, v.o_groups));
  }
  // Ropes: sliding layers rope_theta unscaled; compressed layers compress_rope_theta with the YaRN of rope_scaling
  // (attention factor 1: transformers sets it, as DeepSeek's code never scales cos and sin). A nested
  // rope_parameters {main, compress} (transformers' own save) is read as it stands.
  RopeConfig yarn = c->rope;
  const double main_theta = c->rope.theta;
  c->rope = RopeConfig();
  c->rope.theta = main_theta;
  c->rope.interleaved = true;
  double compress_theta = 160000.0;
  FATHOM_RETURN_IF_ERROR(r.Double("compress_rope_theta", &compress_theta));
  yarn.theta = compress_theta;
  yarn.interleaved = true;
  if (yarn.type == RopeType::kYarn && !yarn.attention_factor) yarn.attention_factor = 1.0;
  v.compress_rope = yarn;
  if (auto rp = j.find("rope_parameters");
      rp != j.end() && rp->is_object() && rp->contains("main") && rp->contains("compress")) {
    for (const char* key : {"main", "compress"}) {
      const json& sub = (*rp)[key];
      if (!sub.is_object())
        return InvalidArgumentError(fmt::format("config.json: rope_parameters.{} must be an object", key));
      RopeConfig* out = std::string_view(key) == "main" ? &c->rope : &v.compress_rope;
      *out = RopeConfig();
      out->interleaved = true;
      FATHOM_RETURN_IF_ERROR(ParseRopeParams(sub, fmt::format("config.json 'rope_parameters.{}'", key), out));
      if (out->type == RopeType::kYarn && !out->attention_factor && out == &v.compress_rope)
        out->attention_factor = 1.0;
    }
  }
  if (c->rope.type == RopeType::kDynamic || v.compress_rope.type == RopeType::kDynamic) {
    return UnimplementedError("config.json: rope scaling type 'dynamic' is not supported");
  }

  MoeConfig& e = c->moe;
  e.moe_intermediate_size = c->intermediate_size;
  e.n_routed_experts = 256;
  e.n_shared_experts = 1;
  e.num_experts_per_tok = 6;
  e.topk_method = "noaux_tc";
  e.scoring_func = "sqrtsoftplus";
  e.norm_topk_prob = true;
  e.routed_scaling_factor = 1.5;
  FATHOM_RETURN_IF_ERROR(r.Int("n_routed_experts", &e.n_routed_experts));
  FATHOM_RETURN_IF_ERROR(r.Int("n_shared_experts", &e.n_shared_experts));
  FATHOM_RETURN_IF_ERROR(r.Int("num_experts_per_tok", &e.num_experts_per_tok));
  FATHOM_RETURN_IF_ERROR(r.String("scoring_func", &e.scoring_func));
  FATHOM_RETURN_IF_ERROR(r.Bool("norm_topk_prob", &e.norm_topk_prob));
  FATHOM_RETURN_IF_ERROR(r.Double("routed_scaling_factor", &e.routed_scaling_factor));
  FATHOM_RETURN_IF_ERROR(r.Int("num_nextn_predict_layers", &c->num_nextn_predict_layers));
  // transformers' router normalizes the chosen weights whatever norm_topk_prob says.
  e.norm_topk_prob = true;
  if (e.scoring_func != "sqrtsoftplus" && e.scoring_func != "sigmoid" && e.scoring_func != "softmax") {
    return InvalidArgumentError(fmt::format(
        "config.json: unsupported scoring_func '{}' (DeepSeek-V4: sqrtsoftplus, sigmoid, softmax)", e.scoring_func));
  }
  if (e.n_routed_experts < 1 || e.n_routed_experts > 512 || e.num_experts_per_tok < 1 ||
      e.num_experts_per_tok > std::min<int64_t>(32, e.n_routed_experts)) {
    return InvalidArgumentError(fmt::format(
        "config.json: n_routed_experts ({}) must be in [1, 512] and num_experts_per_tok ({}) in [1, min(32, it)]",
        e.n_routed_experts, e.num_experts_per_tok));
  }
  if (e.n_shared_experts != 1) {
    return InvalidArgumentError(
        fmt::format("config.json: n_shared_experts is {}: DeepSeek-V4 has one shared expert of moe_intermediate_size",
                    e.n_shared_experts));
  }
  // An MTP layer compress_ratios leaves out slides only, as transformers' (unused) entry for it would.
  v.mtp_attention.resize(static_cast<size_t>(std::clamp<int64_t>(c->num_nextn_predict_layers, 0, 64)),
                         V4Attention::kSliding);
  std::string expert_dtype;
  FATHOM_RETURN_IF_ERROR(r.String("expert_dtype", &expert_dtype));
  if (!expert_dtype.empty() && expert_dtype != "fp4" && expert_dtype != "fp8" && expert_dtype != "bf16") {
    return InvalidArgumentError(
        fmt::format("config.json: expert_dtype '{}' is not one of DeepSeek-V4's (fp4, fp8, bf16)", expert_dtype));
  }
  v.expert_dtype = expert_dtype;
  return OkStatus();
}

Status ParseTokenIds(const json& j, ModelConfig* c) {
  auto b = j.find("bos_token_id");
  if (b != j.end() && b->is_number_integer()) c->bos_token_id = b->get<int64_t>();
  auto e = j.find("eos_token_id");
  if (e != j.end() && !e->is_null()) {
    if (e->is_number_integer()) {
      c->eos_token_ids.push_back(e->get<int64_t>());
    } else if (e->is_array()) {
      for (const json& v : *e) {
        if (!v.is_number_integer()) return InvalidArgumentError("config.json: 'eos_token_id' list holds a non-integer");
        c->eos_token_ids.push_back(v.get<int64_t>());
      }
    } else {
      return InvalidArgumentError("config.json: 'eos_token_id' must be an integer or a list of integers");
    }
  }
  return OkStatus();
}

}  // namespace

namespace {

// Every number of a config in a range no real model leaves, checked before anything is sized by it: a hostile or
// broken config.json gets an error naming the key, never an allocation of terabytes or NaN logits.
Status CheckRange(const char* key, double v, double lo, double hi, bool lo_open = false) {
  if (std::isfinite(v) && (lo_open ? v > lo : v >= lo) && v <= hi) return OkStatus();
  return InvalidArgumentError(
      fmt::format("config.json: '{}' is {}, outside {}{}, {}]", key, v, lo_open ? "(" : "[", lo, hi));
}

Status ValidateRanges(const ModelConfig& c) {
  struct IntRange {
    const char* key;
    int64_t v, lo, hi;
  };
  const MlaConfig& m = c.mla;
  const MoeConfig& e = c.moe;
  std::vector<IntRange> ints = {
      {"vocab_size", c.vocab_size, 1, int64_t{1} << 24},
      {"hidden_size", c.hidden_size, 1, 1 << 17},
      {"intermediate_size", c.intermediate_size, 1, 1 << 20},
      {"num_hidden_layers", c.num_layers, 1, 1024},
      {"num_attention_heads", c.num_heads, 1, 1024},
      {"num_key_value_heads", c.num_kv_heads, 1, 1024},
      {"head_dim", c.head_dim, 2, 1024},
      {"max_position_embeddings", c.max_position_embeddings, 1, int64_t{1} << 24},
      {"num_nextn_predict_layers", c.num_nextn_predict_layers, 0, 64},
  };
  if (c.is_mla) {
    ints.insert(ints.end(), {{"q_lora_rank", m.q_lora_rank, 0, 1 << 17},
                             {"kv_lora_rank", m.kv_lora_rank, 1, 1 << 17},
                             {"qk_nope_head_dim", m.qk_nope_head_dim, 1, 1024},
                             {"qk_rope_head_dim", m.qk_rope_head_dim, 2, 1024},
                             {"v_head_dim", m.v_head_dim, 1, 1024}});
    if (m.sparse()) {
      ints.insert(ints.end(), {{"index_n_heads", m.index_n_heads, 1, 1024},
                               {"index_head_dim", m.index_head_dim, 2, 1024},
                               {"index_topk", m.index_topk, 1, 1 << 16}});
    }
  }
  if (c.is_v4) {
    const V4Config& v = c.v4;
    ints.insert(ints.end(), {{"sliding_window", v.sliding_window, 1, 1 << 20},
                             {"q_lora_rank", v.q_lora_rank, 1, 1 << 17},
                             {"o_groups", v.o_groups, 1, 1024},
                             {"o_lora_rank", v.o_lora_rank, 1, 1 << 17},
                             {"index_n_heads", v.index_n_heads, 1, 1024},
                             {"index_head_dim", v.index_head_dim, 2, 1024},
                             {"index_topk", v.index_topk, 1, 1 << 16},
                             {"hc_mult", v.hc_mult, 1, 16},
                             {"hc_sinkhorn_iters", v.hc_sinkhorn_iters, 1, 1000}});
  }
  if (c.is_moe()) {
    ints.insert(ints.end(), {{"moe_intermediate_size", e.moe_intermediate_size, 1, 1 << 20},
                             {"n_shared_experts", e.n_shared_experts, 0, 64},
                             {"first_k_dense_replace", e.first_k_dense_replace, 0, c.num_layers},
                             {"moe_layer_freq", e.moe_layer_freq, 1, std::max<int64_t>(c.num_layers, 1)}});
  }
  for (const IntRange& r : ints) {
    if (r.v < r.lo || r.v > r.hi) {
      return InvalidArgumentError(fmt::format("config.json: '{}' is {}, outside [{}, {}]", r.key, r.v, r.lo, r.hi));
    }
  }
  FATHOM_RETURN_IF_ERROR(CheckRange("rms_norm_eps", c.rms_norm_eps, 0, 1, /*lo_open=*/true));
  FATHOM_RETURN_IF_ERROR(CheckRange("rope_theta", c.rope.theta, 1, 1e15));  // below 1, inv_freq overflows
  FATHOM_RETURN_IF_ERROR(CheckRange("rope_scaling.factor", c.rope.factor, 0, 1e6, /*lo_open=*/true));
  if (c.rope.type == RopeType::kLlama3) {
    FATHOM_RETURN_IF_ERROR(CheckRange("rope_scaling.low_freq_factor", c.rope.low_freq_factor, 0, 1e6, true));
    FATHOM_RETURN_IF_ERROR(CheckRange("rope_scaling.high_freq_factor", c.rope.high_freq_factor, 0, 1e6, true));
  }
  if (c.rope.type == RopeType::kYarn) {
    FATHOM_RETURN_IF_ERROR(CheckRange("rope_scaling.beta_fast", c.rope.beta_fast, 0, 1e6, true));
    FATHOM_RETURN_IF_ERROR(CheckRange("rope_scaling.beta_slow", c.rope.beta_slow, 0, 1e6, true));
    if (c.rope.mscale) FATHOM_RETURN_IF_ERROR(CheckRange("rope_scaling.mscale", *c.rope.mscale, -1e3, 1e3));
    if (c.rope.mscale_all_dim) {
      FATHOM_RETURN_IF_ERROR(CheckRange("rope_scaling.mscale_all_dim", *c.rope.mscale_all_dim, -1e3, 1e3));
    }
    if (c.rope.attention_factor) {
      FATHOM_RETURN_IF_ERROR(CheckRange("rope_scaling.attention_factor", *c.rope.attention_factor, 0, 1e3, true));
    }
  }
  if (c.rope.original_max_position_embeddings < 0 || c.rope.original_max_position_embeddings > (int64_t{1} << 24)) {
    return InvalidArgumentError(fmt::format("config.json: 'original_max_position_embeddings' is {}, outside [0, {}]",
                                            c.rope.original_max_position_embeddings, int64_t{1} << 24));
  }
  if (c.is_v4) {
    FATHOM_RETURN_IF_ERROR(CheckRange("hc_eps", c.v4.hc_eps, 0, 1));
    FATHOM_RETURN_IF_ERROR(CheckRange("swiglu_limit", c.v4.swiglu_limit, 0, 1e6));
    FATHOM_RETURN_IF_ERROR(CheckRange("compress_rope_theta", c.v4.compress_rope.theta, 1, 1e15));
    const RopeConfig& cr = c.v4.compress_rope;
    FATHOM_RETURN_IF_ERROR(CheckRange("rope_scaling.factor", cr.factor, 0, 1e6, /*lo_open=*/true));
    if (cr.type == RopeType::kYarn) {
      FATHOM_RETURN_IF_ERROR(CheckRange("rope_scaling.beta_fast", cr.beta_fast, 0, 1e6, true));
      FATHOM_RETURN_IF_ERROR(CheckRange("rope_scaling.beta_slow", cr.beta_slow, 0, 1e6, true));
    }
  }
  if (c.is_moe()) {
    FATHOM_RETURN_IF_ERROR(CheckRange("routed_scaling_factor", e.routed_scaling_factor, 0, 1e6, /*lo_open=*/true));
  }
  return OkStatus();
}

}  // namespace

std::string_view V4AttentionName(V4Attention kind) {
  switch (kind) {
    case V4Attention::kSliding:
      return "sliding_attention";
    case V4Attention::kCsa:
      return "compressed_sparse_attention";
    case V4Attention::kHca:
      return "heavily_compressed_attention";
  }
  return "?";
}

std::string_view RopeTypeName(RopeType t) {
  switch (t) {
    case RopeType::kDefault:
      return "default";
    case RopeType::kLinear:
      return "linear";
    case RopeType::kDynamic:
      return "dynamic";
    case RopeType::kLlama3:
      return "llama3";
    case RopeType::kYarn:
      return "yarn";
  }
  return "?";
}

const std::vector<std::string>& SupportedModelTypes() {
  static const std::vector<std::string> types = [] {
    std::vector<std::string> v;
    for (const auto& a : kArchs) v.emplace_back(a.model_type);
    return v;
  }();
  return types;
}

StatusOr<ModelConfig> ParseModelConfig(const json& j) {
  if (!j.is_object()) return InvalidArgumentError("config.json: not a JSON object");
  ModelConfig c;
  Reader r(j);
  FATHOM_RETURN_IF_ERROR(r.String("model_type", &c.model_type));
  auto archs = j.find("architectures");
  if (archs != j.end() && archs->is_array() && !archs->empty() && (*archs)[0].is_string()) {
    c.architecture = (*archs)[0].get<std::string>();
  }
  const ArchInfo* info = nullptr;
  for (const auto& a : kArchs) {
    if ((!c.model_type.empty() && c.model_type == a.model_type) ||
        (c.model_type.empty() && c.architecture == a.architecture)) {
      info = &a;
    }
  }
  if (info == nullptr) {
    return UnimplementedError(
        fmt::format("config.json: unsupported architecture (model_type '{}', architectures '{}'); "
                    "supported: {}",
                    c.model_type, c.architecture, SupportedList()));
  }
  if (!c.architecture.empty() && c.architecture != info->architecture) {
    return UnimplementedError(
        fmt::format("config.json: architecture '{}' does not match model_type '{}' (expected '{}'); supported: {}",
                    c.architecture, c.model_type, info->architecture, SupportedList()));
  }
  c.model_type = info->model_type;
  c.architecture = info->architecture;

  std::string dtype_name;
  FATHOM_RETURN_IF_ERROR(r.String("torch_dtype", &dtype_name));
  if (dtype_name.empty()) FATHOM_RETURN_IF_ERROR(r.String("dtype", &dtype_name));
  if (!dtype_name.empty()) {
    StatusOr<DType> dt = DTypeFromString(dtype_name);
    if (!dt.ok()) return dt.status().WithContext("config.json 'torch_dtype'");
    c.dtype = *dt;
  }

  FATHOM_RETURN_IF_ERROR(r.Int("vocab_size", &c.vocab_size, true));
  FATHOM_RETURN_IF_ERROR(r.Int("hidden_size", &c.hidden_size, true));
  const bool v4 = c.model_type == "deepseek_v4";
  // DeepSeek-V4 has no dense MLP: its shared expert's width, moe_intermediate_size, stands in (transformers'
  // attribute_map).
  FATHOM_RETURN_IF_ERROR(r.Int(v4 ? "moe_intermediate_size" : "intermediate_size", &c.intermediate_size, !v4));
  if (v4 && c.intermediate_size == 0) c.intermediate_size = 2048;
  FATHOM_RETURN_IF_ERROR(r.Int("num_hidden_layers", &c.num_layers, true));
  FATHOM_RETURN_IF_ERROR(r.Int("num_attention_heads", &c.num_heads, true));
  c.num_kv_heads = v4 ? 1 : c.num_heads;
  FATHOM_RETURN_IF_ERROR(r.Int("num_key_value_heads", &c.num_kv_heads));
  FATHOM_RETURN_IF_ERROR(r.Int("max_position_embeddings", &c.max_position_embeddings));
  FATHOM_RETURN_IF_ERROR(r.Double("rms_norm_eps", &c.rms_norm_eps));
  FATHOM_RETURN_IF_ERROR(r.Bool("tie_word_embeddings", &c.tie_word_embeddings));
  FATHOM_RETURN_IF_ERROR(r.String("hidden_act", &c.hidden_act));
  FATHOM_RETURN_IF_ERROR(ParseTokenIds(j, &c));

  if (c.vocab_size <= 0 || c.hidden_size <= 0 || c.intermediate_size <= 0 || c.num_layers <= 0 || c.num_heads <= 0 ||
      c.num_kv_heads <= 0) {
    return InvalidArgumentError(
        fmt::format("config.json: vocab_size ({}), hidden_size ({}), intermediate_size ({}), num_hidden_layers ({}), "
                    "num_attention_heads ({}) and num_key_value_heads ({}) must all be positive",
                    c.vocab_size, c.hidden_size, c.intermediate_size, c.num_layers, c.num_heads, c.num_kv_heads));
  }
  if (c.num_heads % c.num_kv_heads != 0) {
    return InvalidArgumentError(
        fmt::format("config.json: num_attention_heads ({}) must be a multiple of num_key_value_heads ({})", c.num_heads,
                    c.num_kv_heads));
  }
  if (!(c.rms_norm_eps > 0.0)) return InvalidArgumentError("config.json: rms_norm_eps must be positive");
  if (c.hidden_act != "silu" && c.hidden_act != "swish") {
    return UnimplementedError(
        fmt::format("config.json: hidden_act '{}' is not supported (supported: silu)", c.hidden_act));
  }
  if (c.tie_word_embeddings && c.model_type.rfind("deepseek", 0) == 0) {
    // DeepSeek checkpoints never tie; accept it anyway, the weight map handles it.
  }

  FATHOM_RETURN_IF_ERROR(ParseRope(j, &c));

  if (c.model_type == "llama" || c.model_type == "qwen2") {
    int64_t head_dim = 0;
    FATHOM_RETURN_IF_ERROR(r.Int("head_dim", &head_dim));
    if (head_dim == 0) {
      if (c.hidden_size % c.num_heads != 0) {
        return InvalidArgumentError(fmt::format(
            "config.json: hidden_size ({}) is not a multiple of num_attention_heads ({}) and no head_dim is given",
            c.hidden_size, c.num_heads));
      }
      head_dim = c.hidden_size / c.num_heads;
    }
    if (head_dim <= 0 || head_dim % 2 != 0) {
      return InvalidArgumentError(fmt::format("config.json: head_dim ({}) must be positive and even", head_dim));
    }
    c.head_dim = head_dim;
    if (c.model_type == "qwen2") {
      c.qkv_bias = true;
      bool sliding = false;
      FATHOM_RETURN_IF_ERROR(r.Bool("use_sliding_window", &sliding));
      if (sliding) {
        return UnimplementedError(
            "config.json: use_sliding_window=true is not supported (Qwen2 sliding-window layers)");
      }
    } else {
      bool bias = false;
      FATHOM_RETURN_IF_ERROR(r.Bool("attention_bias", &bias));
      c.qkv_bias = c.o_bias = bias;
      FATHOM_RETURN_IF_ERROR(r.Bool("mlp_bias", &c.mlp_bias));
      int64_t tp = 1;
      FATHOM_RETURN_IF_ERROR(r.Int("pretraining_tp", &tp));
    }
  } else if (v4) {
    if (c.num_layers > 1024) return InvalidArgumentError("config.json: 'num_hidden_layers' is above 1024");
    FATHOM_RETURN_IF_ERROR(ParseDeepseekV4(j, &c));
  } else {
    FATHOM_RETURN_IF_ERROR(ParseDeepseek(j, &c));
  }
  if (auto q = j.find("quantization_config"); q != j.end()) {
    FATHOM_ASSIGN_OR_RETURN(c.quant, ParseQuantizationConfig(*q, "config.json"));
  }
  if (v4) c.quant.expert_dtype = c.v4.expert_dtype;
  if (c.max_position_embeddings <= 0) c.max_position_embeddings = 4096;
  FATHOM_RETURN_IF_ERROR(ValidateRanges(c));
  return c;
}

StatusOr<ModelConfig> ParseModelConfigText(const std::string& text, const std::string& source) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return InvalidArgumentError(fmt::format("'{}' is not valid JSON", source));
  StatusOr<ModelConfig> c = ParseModelConfig(j);
  if (!c.ok() && source != "config.json") return c.status().WithContext(source);
  return c;
}

StatusOr<ModelConfig> LoadModelConfig(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path p(path);
  if (fs::is_directory(p, ec)) p /= "config.json";
  std::ifstream in(p);
  if (!in) return NotFoundError(fmt::format("cannot read model config '{}'", p.string()));
  std::stringstream ss;
  ss << in.rdbuf();
  FATHOM_ASSIGN_OR_RETURN(ModelConfig c, ParseModelConfigText(ss.str(), p.string()));
  if (c.quant.quantized()) return c;
  // Older AWQ and GPTQ checkpoints keep their settings in a file of their own beside config.json.
  for (const char* name : {"quant_config.json", "quantize_config.json"}) {
    const fs::path legacy = p.parent_path() / name;
    if (!fs::exists(legacy, ec)) continue;
    std::ifstream lin(legacy);
    std::stringstream ls;
    ls << lin.rdbuf();
    json lj = json::parse(ls.str(), nullptr, /*allow_exceptions=*/false);
    if (lj.is_discarded()) return InvalidArgumentError(fmt::format("'{}' is not valid JSON", legacy.string()));
    FATHOM_ASSIGN_OR_RETURN(c.quant, ParseLegacyQuantConfig(lj, legacy.string()));
    break;
  }
  return c;
}

}  // namespace fathom
