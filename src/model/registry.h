// The architecture registry, keyed by the HF `architectures` string, and the one-call model loader.
//
//   FATHOM_ASSIGN_OR_RETURN(const Architecture* arch, FindArchitecture("Qwen2ForCausalLM"));
//   std::vector<WeightSpec> specs = arch->weight_specs(cfg);
//   FATHOM_ASSIGN_OR_RETURN(auto model, LoadModel(dir, cfg, options, backend));
//
// To add an architecture: write model/<family>.cc with its weight specs, KV spec and Model subclass, declare
// its Register function below and call it from Architectures() in registry.cc.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "model/model.h"

namespace fathom {

struct Architecture {
  std::string name;  // "LlamaForCausalLM"
  std::vector<WeightSpec> (*weight_specs)(const ModelConfig& cfg) = nullptr;
  KvCacheSpec (*kv_cache_spec)(const ModelConfig& cfg) = nullptr;
  StatusOr<std::unique_ptr<Model>> (*create)(const ModelConfig& cfg, std::unique_ptr<WeightStore> weights,
                                             Backend& backend) = nullptr;
};

const std::vector<Architecture>& Architectures();
StatusOr<const Architecture*> FindArchitecture(const std::string& name);

StatusOr<std::unique_ptr<Model>> LoadModel(const std::string& model_dir, const ModelConfig& cfg,
                                           const LoadOptions& options, Backend& backend);

// Per-family registration hooks (one per model/<family>.cc).
void RegisterLlamaFamily(std::vector<Architecture>& out);
void RegisterDeepseekFamily(std::vector<Architecture>& out);

}  // namespace fathom
