#include "io/quant_config.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "io/json_reader.h"

namespace fathom {

namespace {

using json = nlohmann::json;

std::string Lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

Status ReadNameList(const json& q, const char* key, const std::string& where, std::vector<std::string>* out) {
  auto it = q.find(key);
  if (it == q.end() || it->is_null()) return OkStatus();
  if (!it->is_array()) return InvalidArgumentError(fmt::format("{}: '{}' must be a list of strings", where, key));
  for (const json& v : *it) {
    if (!v.is_string()) return InvalidArgumentError(fmt::format("{}: '{}' must be a list of strings", where, key));
    out->push_back(v.get<std::string>());
  }
  return OkStatus();
}

Status ReadFp8(const json& q, JsonReader& r, const std::string& where, QuantConfig* c) {
  c->bits = 8;
  FATHOM_RETURN_IF_ERROR(r.String("fmt", &c->fmt));
  FATHOM_RETURN_IF_ERROR(r.String("activation_scheme", &c->activation_scheme));
  FATHOM_RETURN_IF_ERROR(r.String("scale_fmt", &c->scale_fmt));
  c->scale_fmt = Lower(c->scale_fmt);
  auto bs = q.find("weight_block_size");
  if (bs == q.end() || !bs->is_array() || bs->size() != 2 || !(*bs)[0].is_number_integer() ||
      !(*bs)[1].is_number_integer() || (*bs)[0].get<int64_t>() <= 0 || (*bs)[1].get<int64_t>() <= 0) {
    return InvalidArgumentError(fmt::format("{}: fp8 needs weight_block_size [n, k] > 0", where));
  }
  c->block_n = (*bs)[0].get<int64_t>();
  c->block_k = (*bs)[1].get<int64_t>();
  return OkStatus();
}

// AWQ and GPTQ spell the same settings differently in new and old files; both spellings are read.
Status ReadInt4(JsonReader& r, QuantConfig* c) {
  FATHOM_RETURN_IF_ERROR(r.Int("bits", &c->bits));
  FATHOM_RETURN_IF_ERROR(r.Int("w_bit", &c->bits));
  FATHOM_RETURN_IF_ERROR(r.Int("group_size", &c->group_size));
  FATHOM_RETURN_IF_ERROR(r.Int("q_group_size", &c->group_size));
  FATHOM_RETURN_IF_ERROR(r.Bool("zero_point", &c->zero_point));
  FATHOM_RETURN_IF_ERROR(r.String("version", &c->version));
  c->version = Lower(c->version);
  FATHOM_RETURN_IF_ERROR(r.Bool("desc_act", &c->desc_act));
  FATHOM_RETURN_IF_ERROR(r.Bool("sym", &c->sym));
  FATHOM_RETURN_IF_ERROR(r.String("checkpoint_format", &c->checkpoint_format));
  c->checkpoint_format = Lower(c->checkpoint_format);
  return OkStatus();
}

StatusOr<QuantConfig> Parse(const json& q, const std::string& where, std::string default_method) {
  QuantConfig c;
  c.source = where;
  if (q.is_null()) return c;
  if (!q.is_object()) return InvalidArgumentError(fmt::format("{}: must be an object", where));
  JsonReader r(q, where);
  FATHOM_RETURN_IF_ERROR(r.String("quant_method", &c.method));
  c.method = Lower(c.method.empty() ? default_method : c.method);
  if (c.method.empty()) return InvalidArgumentError(fmt::format("{}: 'quant_method' is missing", where));
  FATHOM_RETURN_IF_ERROR(ReadNameList(q, "modules_to_not_convert", where, &c.modules_to_not_convert));
  if (c.method == "fp8") {
    FATHOM_RETURN_IF_ERROR(ReadFp8(q, r, where, &c));
  } else if (c.method == "awq" || c.method == "gptq") {
    FATHOM_RETURN_IF_ERROR(ReadInt4(r, &c));
    if (c.method == "gptq" && c.checkpoint_format.empty()) c.checkpoint_format = "gptq";
  } else {
    FATHOM_RETURN_IF_ERROR(r.Int("bits", &c.bits));
  }
  return c;
}

}  // namespace

std::string QuantConfig::Describe() const {
  if (!quantized()) return "float";
  std::string d = method;
  std::vector<std::string> parts;
  if (bits > 0) parts.push_back(fmt::format("{}-bit", bits));
  if (method == "fp8") {
    if (!fmt.empty()) parts.push_back(fmt);
    parts.push_back(fmt::format("{}x{} blocks", block_n, block_k));
    if (!scale_fmt.empty()) parts.push_back(scale_fmt + " scales");
  }
  if (expert_dtype == "fp4") parts.push_back("routed experts in mxfp4");
  if (group_size != 0) parts.push_back(group_size < 0 ? "one group per column" : fmt::format("group {}", group_size));
  if (!parts.empty()) d += " (" + fmt::format("{}", fmt::join(parts, ", ")) + ")";
  return d;
}

StatusOr<QuantConfig> ParseQuantizationConfig(const json& q, const std::string& where) {
  return Parse(q, fmt::format("{} 'quantization_config'", where), "");
}

StatusOr<QuantConfig> ParseLegacyQuantConfig(const json& q, const std::string& file) {
  // quant_config.json is AutoAWQ's, quantize_config.json AutoGPTQ's; either may also name its method.
  const bool awq = std::filesystem::path(file).filename() == "quant_config.json";
  return Parse(q, file, awq ? "awq" : "gptq");
}

}  // namespace fathom
