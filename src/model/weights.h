// Weight specs (what an architecture needs) and the loaded weights (what a Model reads).
//
//   std::vector<WeightSpec> specs = arch->weight_specs(cfg);          // names, shapes, dtypes, init
//   FATHOM_ASSIGN_OR_RETURN(auto store, LoadWeights(cfg, specs, {.format = LoadFormat::kDummy}, backend));
//   const TensorView& w = store->Get("model.layers.0.self_attn.q_proj.weight");
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
#include "io/model_config.h"
#include "io/safetensors.h"
#include "model/backend.h"

namespace fathom {

enum class WeightInit { kRandom, kOnes, kZeros, kConstant };

struct WeightSpec {
  std::string name;  // the HF tensor name
  std::vector<int64_t> shape;
  DType dtype = DType::kBF16;  // the dtype dummy weights get; checkpoints may hold another float dtype
  WeightInit init = WeightInit::kRandom;
  float init_value = 0.0f;  // for kConstant
  // When the checkpoint lacks `name`, use this tensor instead (tied embeddings: lm_head -> embed_tokens).
  std::string fallback;
  // Share of this tensor that one decoded token reads: 1 for dense layers, k/n for routed experts, one row of an
  // embedding table.
  double read_fraction = 1.0;
  // Parameters that take part in one token's forward pass (routed experts count k/n of theirs).
  double active_fraction = 1.0;
  // Counted once even though another spec points at the same storage (tied lm_head).
  bool shares_storage = false;
};

enum class LoadFormat { kAuto, kSafetensors, kDummy };
StatusOr<LoadFormat> ParseLoadFormat(const std::string& name);

struct LoadOptions {
  LoadFormat format = LoadFormat::kAuto;
  uint64_t seed = 0;  // dummy weights
  bool show_progress = true;
  int64_t max_batched_tokens = 0;  // Model::set_max_batched_tokens (0: no limit)
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

 private:
  std::map<std::string, TensorView> tensors_;
  std::vector<Tensor> owned_;
  std::vector<std::shared_ptr<void>> resources_;
};

// Loads `specs` from the checkpoint at `model_dir` (safetensors) or fills them with deterministic random values
// (dummy), then makes them usable on `backend`. Checks every tensor's shape; a missing tensor, a wrong shape or a
// non-float dtype is an error naming the file and the tensor.
StatusOr<std::unique_ptr<WeightStore>> LoadWeights(const std::string& model_dir, const std::vector<WeightSpec>& specs,
                                                   const LoadOptions& options, Backend& backend);

// Fills `out` (host memory) with the dummy values of `spec`: a counter-based generator, so the same name gives the
// same values whatever the thread count.
void FillDummy(const WeightSpec& spec, uint64_t seed, const TensorView& out);

struct WeightStats {
  int64_t total_params = 0;
  double active_params = 0;  // per token
  std::map<DType, int64_t> bytes_by_dtype;
  int64_t total_bytes = 0;
  double bytes_read_per_token = 0;  // weight bytes one decode step reads at batch 1
};
// `store` may be null (dummy inspect without allocation): the spec dtypes are used then.
WeightStats ComputeWeightStats(const std::vector<WeightSpec>& specs, const WeightStore* store);

}  // namespace fathom
