// How a checkpoint's linear weights are stored, as its config files say, parsed once: `quantization_config` in
// config.json, or the older files beside it, `quant_config.json` (AutoAWQ) and `quantize_config.json` (AutoGPTQ).
// Parsing only reads what is written; which methods and settings fathom can run is the weight formats' decision
// (format/linear_method.h), which refuses the rest by name.
//
//   FATHOM_ASSIGN_OR_RETURN(QuantConfig q, ParseQuantizationConfig(j["quantization_config"], "config.json"));
//   q.method == "fp8", q.block_n == 128; q.method == "awq", q.bits == 4, q.group_size == 128
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "core/status.h"

namespace fathom {

struct QuantConfig {
  // quant_method as written, lower-cased: "" (float weights), "fp8", "awq", "gptq", "compressed-tensors", ...
  std::string method;
  std::string source;  // where it was read, for messages: "config.json 'quantization_config'", "quant_config.json"
  int64_t bits = 0;    // weight bits: 8 for fp8; AWQ `w_bit`/`bits`; GPTQ `bits`
  // fp8
  std::string fmt;                // "e4m3"
  std::string activation_scheme;  // "dynamic"
  int64_t block_n = 128;          // weight_block_size[0]: output rows per scale
  int64_t block_k = 128;          // weight_block_size[1]: input columns per scale
  std::string scale_fmt;          // "ue8m0": power-of-two scales (V3.2, V4; V4 stores them as F8_E8M0)
  // config.json's top-level `expert_dtype` (DeepSeek-V4): "fp4" stores the routed experts in MXFP4 whatever the
  // method says of the other layers; "" as the method says.
  std::string expert_dtype;
  // AWQ / GPTQ
  int64_t group_size = 0;                           // input rows per scale group; -1: one group over all of K (GPTQ)
  bool zero_point = true;                           // AWQ
  std::string version;                              // AWQ: "gemm", "gemv", ...
  bool desc_act = false;                            // GPTQ act-order
  bool sym = true;                                  // GPTQ
  std::string checkpoint_format;                    // GPTQ: "gptq" (zeros stored minus one) or "gptq_v2"
  std::vector<std::string> modules_to_not_convert;  // name parts whose linears stay float

  bool quantized() const { return !method.empty(); }
  // "awq (4-bit, group 128)": for messages.
  std::string Describe() const;
};

// `quantization_config` (an object; null or absent: no quantization). `where` names the file for messages.
StatusOr<QuantConfig> ParseQuantizationConfig(const nlohmann::json& q, const std::string& where);
// The legacy files: `file` is "quant_config.json" (AWQ: w_bit, q_group_size, zero_point, version) or
// "quantize_config.json" (GPTQ: bits, group_size, desc_act, sym, checkpoint_format).
StatusOr<QuantConfig> ParseLegacyQuantConfig(const nlohmann::json& q, const std::string& file);

}  // namespace fathom
