// The architecture registry, keyed by the HF `architectures` string, and the one-call model loader.
//
//   FATHOM_ASSIGN_OR_RETURN(const Architecture* arch, FindArchitecture("Qwen2ForCausalLM"));
//   FATHOM_ASSIGN_OR_RETURN(std::vector<WeightSpec> specs, arch->weight_specs(cfg));   // one rank's; or (cfg, par)
//   FATHOM_ASSIGN_OR_RETURN(auto model, LoadModel(dir, cfg, options, backend));       // or (..., backend, comm)
//
// To add an architecture: write model/<family>.cc with its weight specs, KV spec and Model subclass, declare
// its Register function below and call it from Architectures() in registry.cc.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "model/decoder.h"
#include "model/model.h"

namespace fathom {

struct Architecture {
  using KvSpecFn = KvCacheSpec (*)(const ModelConfig& cfg, const ParallelConfig& par);
  using CreateFn = StatusOr<std::unique_ptr<Model>> (*)(const ModelConfig& cfg, std::unique_ptr<WeightStore> weights,
                                                        Backend& backend, Communicator& comm);
  using SpecsFn = StatusOr<std::vector<WeightSpec>> (*)(const ModelConfig& cfg, const ParallelConfig& par);
  std::string name = "";  // "LlamaForCausalLM" (RegisterFamily sets it)
  // Each layer's attention and MLP tensors (the decoder skeleton adds the rest: model/decoder.h DecoderWeightSpecs).
  LayerSpecs attention_specs = nullptr;
  LayerSpecs mlp_specs = nullptr;
  KvSpecFn kv_spec = nullptr;
  CreateFn create = nullptr;
  // Its attention block's share of a step's memory (GqaAttention::Footprint, MlaAttention::Footprint).
  AttentionFootprintFn attention_footprint = nullptr;
  // A family whose checkpoint is not the decoder skeleton's (DeepSeek-V4: its own names, mHC, MTP layers) lists all
  // of its specs itself; attention_specs and mlp_specs are then unused.
  SpecsFn specs = nullptr;

  // The weights one rank of `par` loads (all of them for one rank); an unsupported weight format or a shape that does
  // not split is an error naming it.
  StatusOr<std::vector<WeightSpec>> weight_specs(const ModelConfig& cfg, const ParallelConfig& par = {}) const {
    return specs != nullptr ? specs(cfg, par) : DecoderWeightSpecs(cfg, par, attention_specs, mlp_specs);
  }
  KvCacheSpec kv_cache_spec(const ModelConfig& cfg, const ParallelConfig& par = {}) const { return kv_spec(cfg, par); }
};

const std::vector<Architecture>& Architectures();
StatusOr<const Architecture*> FindArchitecture(const std::string& name);

// Specs, weights and the model for the rank `comm` stands for (SingleRank(): the whole model).
StatusOr<std::unique_ptr<Model>> LoadModel(const std::string& model_dir, const ModelConfig& cfg,
                                           const LoadOptions& options, Backend& backend,
                                           Communicator& comm = SingleRank());

// Registers one family's functions under each of its architecture names.
void RegisterFamily(std::vector<Architecture>& out, std::initializer_list<const char*> names,
                    const Architecture& family);

// Per-family registration hooks (one per model/<family>.cc).
void RegisterLlamaFamily(std::vector<Architecture>& out);
void RegisterDeepseekFamily(std::vector<Architecture>& out);
void RegisterDeepseekV4Family(std::vector<Architecture>& out);

}  // namespace fathom
