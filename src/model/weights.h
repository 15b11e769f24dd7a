// Weight specs (what an architecture needs) and the loaded weights (what a Model reads).
//
//   FATHOM_ASSIGN_OR_RETURN(auto specs, arch->weight_specs(cfg, parallel));   // names, shapes, dtypes, init, shards
//   FATHOM_ASSIGN_OR_RETURN(auto store, LoadWeights(dir, specs, {.format = LoadFormat::kDummy}, backend));
//   const TensorView& norm = store->Get("model.layers.0.input_layernorm.weight");
//   FATHOM_ASSIGN_OR_RETURN(LinearWeight q, store->Linear("model.layers.0.self_attn.q_proj", backend));
//   WeightStats s = ComputeWeightStats(specs, store.get());           // for `fathom inspect`
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "format/linear_method.h"
#include "format/weight_spec.h"
#include "io/model_config.h"
#include "io/safetensors.h"
#include "model/backend.h"
#include "model/run_options.h"

namespace fathom {

enum class LoadFormat { kAuto, kSafetensors, kDummy };
StatusOr<LoadFormat> ParseLoadFormat(const std::string& name);

struct LoadOptions {
  LoadFormat format = LoadFormat::kAuto;
  uint64_t seed = 0;  // dummy weights
  bool show_progress = true;
  ModelRunOptions run;  // Model::set_run_options after loading
};

class WeightStore {
 public:
  const TensorView& Get(const std::string& name) const;
  const TensorView* Find(const std::string& name) const;
  bool Has(const std::string& name) const { return tensors_.count(name) != 0; }
  size_t size() const { return tensors_.size(); }
  const std::map<std::string, TensorView>& tensors() const { return tensors_; }

  void Put(const std::string& name, Tensor owned);
  void PutView(const std::string& name, TensorView view) { tensors_[name] = view; }
  void KeepAlive(std::shared_ptr<void> resource) { resources_.push_back(std::move(resource)); }

  // The linear layer `prefix` in its weight format (the method of its spec binds its tensors), prepared for
  // `backend`'s kernels (Backend::PrepareLinear). Errors name the tensor.
  StatusOr<LinearWeight> Linear(const std::string& prefix, Backend& backend) const;
  // The same before PrepareLinear: the tensors as the checkpoint has them (a backend may repack them in place when the
  // layer is prepared, so read them before; MLA's per-head split of kv_b_proj does).
  StatusOr<LinearWeight> UnpreparedLinear(const std::string& prefix) const;
  void AddLinear(std::shared_ptr<const LinearBinding> binding);
  // The binding of linear `prefix`, or null.
  const LinearBinding* FindLinear(const std::string& prefix) const;

 private:
  std::map<std::string, TensorView> tensors_;
  std::map<std::string, std::shared_ptr<const LinearBinding>> linears_;  // by prefix
  std::vector<Tensor> owned_;
  std::vector<std::shared_ptr<void>> resources_;
};

// Loads `specs` from the checkpoint at `model_dir` (safetensors) or fills them with deterministic random values
// (dummy), then makes them usable on `backend`. A sharded spec reads its rank's part of the checkpoint's tensor (a
// slice of the mmap). Checks every tensor's shape; a missing tensor, a wrong shape or a dtype of the wrong kind (an
// integer for a float) is an error naming the file and the tensor; the weight formats check the rest at binding.
StatusOr<std::unique_ptr<WeightStore>> LoadWeights(const std::string& model_dir, const std::vector<WeightSpec>& specs,
                                                   const LoadOptions& options, Backend& backend);

// Fills `out` (host memory) with the dummy values of `spec`: a counter-based generator, so the same name gives the
// same values whatever the thread count, and a rank's shard holds the values of its part of the whole tensor.
void FillDummy(const WeightSpec& spec, uint64_t seed, const TensorView& out);

struct WeightStats {
  int64_t total_params = 0;
  double active_params = 0;  // per token
  std::map<DType, int64_t> bytes_by_dtype;
  int64_t total_bytes = 0;
  double bytes_read_per_token = 0;  // weight bytes one decode step reads at batch 1
  // The draft (MTP) layers' parameters and bytes (WeightSpec::draft), not in total_params; their bytes are in
  // bytes_by_dtype and total_bytes (they are loaded).
  int64_t draft_params = 0;
  int64_t draft_bytes = 0;
};
// `store` may be null (dummy inspect without allocation): the spec dtypes are used then.
WeightStats ComputeWeightStats(const std::vector<WeightSpec>& specs, const WeightStore* store);

}  // namespace fathom
