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
  Reader r(*params, where);
  FATHOM_RETURN_IF_ERROR(r.Double("rope_theta", &c->rope.theta));
  std::string type;
  FATHOM_RETURN_IF_ERROR(r.String("rope_type", &type));
  if (type.empty()) FATHOM_RETURN_IF_ERROR(r.String("type", &type));
  FATHOM_ASSIGN_OR_RETURN(c->rope.type, ParseRopeType(type));
  RopeConfig& rope = c->rope;
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
  if (c.is_moe()) {
    FATHOM_RETURN_IF_ERROR(CheckRange("routed_scaling_factor", e.routed_scaling_factor, 0, 1e6, /*lo_open=*/true));
  }
  return OkStatus();
}

}  // namespace

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
  FATHOM_RETURN_IF_ERROR(r.Int("intermediate_size", &c.intermediate_size, true));
  FATHOM_RETURN_IF_ERROR(r.Int("num_hidden_layers", &c.num_layers, true));
  FATHOM_RETURN_IF_ERROR(r.Int("num_attention_heads", &c.num_heads, true));
  c.num_kv_heads = c.num_heads;
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
  } else {
    FATHOM_RETURN_IF_ERROR(ParseDeepseek(j, &c));
  }
  if (auto q = j.find("quantization_config"); q != j.end()) {
    FATHOM_ASSIGN_OR_RETURN(c.quant, ParseQuantizationConfig(*q, "config.json"));
  }
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
