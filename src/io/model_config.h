// A typed view of a Hugging Face config.json for the architectures fathom runs.
//
//   FATHOM_ASSIGN_OR_RETURN(ModelConfig cfg, LoadModelConfig("/models/qwen"));  // folder or config.json path
//   cfg.num_heads, cfg.head_dim, cfg.rope.type, cfg.mla.kv_lora_rank, ...
//
// Both rope spellings are read: the legacy `rope_theta` + `rope_scaling` keys and the transformers v5
// `rope_parameters` object. Unknown architectures and inconsistent configs are rejected with a message that
// lists what is supported.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "io/quant_config.h"

namespace fathom {

enum class RopeType { kDefault, kLinear, kDynamic, kLlama3, kYarn };
std::string_view RopeTypeName(RopeType t);

struct RopeConfig {
  RopeType type = RopeType::kDefault;
  double theta = 10000.0;
  double factor = 1.0;
  // llama3
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 0;  // 0: use max_position_embeddings
  // yarn
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  std::optional<double> mscale;
  std::optional<double> mscale_all_dim;
  std::optional<double> attention_factor;
  bool truncate = true;
  // Rotation layout: false rotates halves (NeoX; Llama, Qwen2), true rotates interleaved pairs (DeepSeek MLA).
  bool interleaved = false;
};

struct MlaConfig {
  int64_t q_lora_rank = 0;  // 0: a plain q_proj
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;
  // DeepSeek Sparse Attention (DeepSeek-V3.2): a lightning indexer of index_n_heads heads of index_head_dim scores
  // every cached token per query, and MLA attends to the top index_topk. index_topk 0: dense MLA (V2, V3).
  int64_t index_n_heads = 0;
  int64_t index_head_dim = 0;
  int64_t index_topk = 0;

  bool sparse() const { return index_topk > 0; }
};

struct MoeConfig {
  int64_t n_routed_experts = 0;  // 0: dense model
  int64_t n_shared_experts = 0;
  int64_t num_experts_per_tok = 0;
  int64_t moe_intermediate_size = 0;
  int64_t first_k_dense_replace = 0;
  int64_t moe_layer_freq = 1;
  int64_t n_group = 1;
  int64_t topk_group = 1;
  std::string topk_method = "greedy";    // greedy | group_limited_greedy | noaux_tc
  std::string scoring_func = "softmax";  // softmax | sigmoid | sqrtsoftplus (V4)
  bool norm_topk_prob = false;
  double routed_scaling_factor = 1.0;
};

// DeepSeek-V4's attention kinds, one a layer: a sliding window alone, or beside compressed entries, either picked by
// a lightning indexer (compressed sparse attention, CSA) or all read (heavily compressed attention, HCA).
enum class V4Attention : uint8_t { kSliding, kCsa, kHca };
// transformers' layer_types names: "sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention".
std::string_view V4AttentionName(V4Attention kind);

// DeepSeek-V4 (model_type deepseek_v4), as transformers' DeepseekV4Config reads config.json, the legacy spellings
// folded in (compress_ratios, compress_rate_csa / _hca, num_hash_layers, qk_rope_head_dim).
struct V4Config {
  std::vector<V4Attention> attention;      // [num_hidden_layers]: layer_types, or compress_ratios 0 / 4 / 128
  std::vector<V4Attention> mtp_attention;  // [num_nextn_predict_layers]: compress_ratios past the layers (sliding)
  std::vector<bool> hash_moe;              // [num_hidden_layers]: mlp_layer_types "hash_moe" (num_hash_layers)
  int64_t csa_rate = 4;                    // compress_rates: tokens a CSA entry compresses
  int64_t hca_rate = 128;                  // and an HCA entry
  int64_t sliding_window = 128;            // the newest tokens every layer attends to, itself included
  int64_t q_lora_rank = 1024;
  int64_t o_groups = 8;        // the grouped output projection: heads in o_groups groups,
  int64_t o_lora_rank = 1024;  // each projected to o_lora_rank values
  int64_t rope_dim = 64;       // qk_rope_head_dim (head_dim * partial_rotary_factor): a head's last values rotate
  int64_t index_n_heads = 64;
  int64_t index_head_dim = 128;
  int64_t index_topk = 512;  // CSA entries a query reads
  int64_t hc_mult = 4;       // mHC's residual streams
  int64_t hc_sinkhorn_iters = 20;
  double hc_eps = 1e-6;
  double swiglu_limit = 10.0;  // experts' gate clamped above and up both ways by it (0: no clamp)
  // Rope of CSA and HCA layers, their compressors and indexers (compress_rope_theta with rope_scaling's YaRN, its
  // attention factor 1); sliding layers use ModelConfig::rope (rope_theta, unscaled). Both rotate pairs.
  RopeConfig compress_rope;
  std::string expert_dtype;  // config.json's expert_dtype: "fp4" (MXFP4 routed experts), "fp8", "bf16" or ""

  int64_t Rate(V4Attention kind) const {
    return kind == V4Attention::kCsa ? csa_rate : kind == V4Attention::kHca ? hca_rate : 0;
  }
};

struct ModelConfig {
  std::string architecture;    // HF `architectures[0]`, e.g. "Qwen2ForCausalLM"
  std::string model_type;      // "llama", "qwen2", "deepseek_v2", "deepseek_v3", "deepseek_v32", "deepseek_v4"
  DType dtype = DType::kBF16;  // torch_dtype / dtype

  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_layers = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = false;
  bool qkv_bias = false;  // Qwen2 always; Llama when attention_bias
  bool o_bias = false;    // Llama attention_bias
  bool mlp_bias = false;
  std::string hidden_act = "silu";
  RopeConfig rope;

  std::optional<int64_t> bos_token_id;
  std::vector<int64_t> eos_token_ids;

  bool is_mla = false;
  MlaConfig mla;
  bool is_v4 = false;
  V4Config v4;
  MoeConfig moe;
  int64_t num_nextn_predict_layers = 0;
  QuantConfig quant;

  bool is_moe() const { return moe.n_routed_experts > 0; }
  // True when layer `i` uses the MoE block (DeepSeek's first_k_dense_replace / moe_layer_freq rule).
  bool IsMoeLayer(int64_t i) const { return is_moe() && i >= moe.first_k_dense_replace && i % moe.moe_layer_freq == 0; }
};

// The model_type values ParseModelConfig understands, for error messages and `fathom --help`.
const std::vector<std::string>& SupportedModelTypes();

StatusOr<ModelConfig> ParseModelConfig(const nlohmann::json& j);
StatusOr<ModelConfig> ParseModelConfigText(const std::string& text, const std::string& source = "config.json");
// `path` is a config.json file or a folder that holds one. Without a `quantization_config`, the older
// quant_config.json or quantize_config.json beside it is read instead, when present.
StatusOr<ModelConfig> LoadModelConfig(const std::string& path);

}  // namespace fathom
