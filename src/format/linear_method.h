// Weight formats as objects: each format has one LinearMethod (in the manner of vLLM's QuantizeMethodBase) that owns
//   - the checkpoint tensors a linear layer of that format reads (AddSpecs),
//   - turning the loaded tensors into a LinearWeight (Bind; a backend may then repack it: Backend::PrepareLinear),
//   - the CPU reference dequantization (DequantizeRow), which the CPU backend's Linear and exact host copies use,
//   - and, in backend/cuda, its kernels in files of its own (linear_fp8.cc and fp8.cu for kFp8Block).
// Model code asks for "a linear of [out, in] named X" (model/weight_specs.h) and never names a format.
//
//   FATHOM_ASSIGN_OR_RETURN(auto m, LinearMethodFor(cfg.quant, prefix));   // refuses what it cannot run
//   LinearSpec l{.prefix = "model.layers.0.mlp.up_proj", .out = 18944, .in = 3584, .dtype = DType::kBF16};
//   FATHOM_RETURN_IF_ERROR(m->AddSpecs(l, &specs));       // up_proj.weight (and, for FP8, up_proj.weight_scale_inv)
//   ... load ...
//   FATHOM_ASSIGN_OR_RETURN(LinearWeight w, m->Bind(l, lookup));
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "comm/parallel.h"
#include "core/status.h"
#include "core/tensor.h"
#include "format/linear_weight.h"
#include "format/weight_spec.h"
#include "io/quant_config.h"

namespace fathom {

// How a linear layer is cut between tensor-parallel ranks.
enum class LinearSplit {
  kReplicated,  // every rank holds all of W
  kColumns,     // column-parallel: each rank holds out / tp_size output rows (q/k/v, gate/up)
  kRows,        // row-parallel: each rank holds in / tp_size input columns and a partial sum (o_proj, down_proj)
};

// One linear layer as a model declares it: the whole layer's shape; the method derives this rank's tensors.
struct LinearSpec {
  std::string prefix;  // "model.layers.0.self_attn.q_proj": tensors prefix + ".weight", ".bias", ...
  int64_t out = 0;
  int64_t in = 0;
  bool bias = false;
  DType dtype = DType::kBF16;  // the model's float dtype (dense weights, and dummy weights of float tensors)
  double read_fraction = 1.0;  // WeightSpec's, for every tensor of the layer
  double active_fraction = 1.0;
  LinearSplit split = LinearSplit::kReplicated;
  ParallelConfig parallel;
  // The split's parts and this rank's part; 0: tp_size parts, part tp_rank. Fewer parts than ranks replicate a part
  // on several ranks (KV projections with fewer KV heads than ranks: ParallelConfig::KvParts, KvPart).
  int64_t parts = 0;
  int64_t part = 0;

  int64_t split_parts() const { return parts > 0 ? parts : parallel.tp_size; }
  int64_t split_part() const { return parts > 0 ? part : parallel.tp_rank; }
  // This rank's shape.
  int64_t local_out() const { return split == LinearSplit::kColumns ? out / split_parts() : out; }
  int64_t local_in() const { return split == LinearSplit::kRows ? in / split_parts() : in; }
  // The shard of a tensor whose dimension `out_dim` runs over outputs and `in_dim` over inputs (-1: none).
  WeightShard ShardFor(int out_dim, int in_dim) const;
  // Checks that this rank's share is whole: `out` or `in` (with `granule` rows per indivisible block, 1 for none) cut
  // evenly into tp_size parts. The error names the layer and the dimension.
  Status CheckSplit(int64_t granule_out, int64_t granule_in) const;
};

// Finds a loaded tensor by name (null when absent).
using TensorLookup = std::function<const TensorView*(const std::string& name)>;

class LinearMethod {
 public:
  virtual ~LinearMethod() = default;
  virtual std::string_view name() const = 0;  // "dense", "fp8 block-scaled"
  virtual LinearFormat format() const = 0;
  // Appends the tensors of `l` (this rank's shapes and shards) to `specs`; the first one carries the binding.
  virtual Status AddSpecs(const LinearSpec& l, std::vector<WeightSpec>* specs) const = 0;
  // The LinearWeight of `l` from its loaded tensors, their dtypes and shapes checked (errors name the tensor). A
  // row-parallel layer's bias is bound on rank 0 only (it is added once to the sum).
  virtual StatusOr<LinearWeight> Bind(const LinearSpec& l, const TensorLookup& find) const = 0;
  // CPU reference: row `row` of W in float32 (dst [in]), from tensors in host memory.
  virtual void DequantizeRow(const LinearWeight& w, int64_t row, float* dst) const = 0;
  // The dtype that holds W's values exactly (for host-computed copies such as MLA's per-head projections).
  virtual DType ExactFloatDType(const LinearWeight& w) const = 0;
  // Device scratch that running a prefill-sized layer of `weight_elems` weights and `input_cols` inputs at `tokens`
  // tokens may take beyond its activations (the memory plan's reserve). 0 for dense weights.
  virtual int64_t PrefillScratchBytes(int64_t /*weight_elems*/, int64_t /*input_cols*/, int64_t /*tokens*/) const {
    return 0;
  }
};

// A linear layer's spec together with its method: what the loader keeps to bind it (WeightSpec::linear).
struct LinearBinding {
  LinearSpec spec;
  std::shared_ptr<const LinearMethod> method;
};

// Appends the tensors of `l` by method `m` and attaches the binding to the first of them (the loader binds the layer
// from it: WeightStore::Linear).
Status AddLinearSpecs(std::shared_ptr<const LinearMethod> m, const LinearSpec& l, std::vector<WeightSpec>* specs);

// The method for the linear `prefix` of a checkpoint quantized as `q`. Layers that are never quantized (`quantizable`
// false: DeepSeek's router, lm_head) and names in modules_to_not_convert get the dense one. A routed expert's layer
// (`routed_expert`) under `expert_dtype: fp4` (DeepSeek-V4) gets MXFP4 whatever the method. A method or setting fathom
// cannot run is an Unimplemented error that names it.
StatusOr<std::shared_ptr<const LinearMethod>> LinearMethodFor(const QuantConfig& q, std::string_view prefix,
                                                              bool quantizable = true, bool routed_expert = false);
// Checks the whole configuration once (the same refusal, without a layer name).
Status CheckQuantConfig(const QuantConfig& q);
// The stateless instance of each format, for its run-time parts (DequantizeRow, ExactFloatDType).
const LinearMethod& MethodOf(LinearFormat format);

// What the registry (linear_method.cc) knows of a family of formats (FATHOM_LINEAR_FORMATS' third column): each
// family's <name>_linear.cc defines `<family>FormatFamily()`.
struct FormatFamily {
  // Its formats as the refusal of an unknown method lists them ("4-bit awq and gptq"); empty: never picked by a
  // configuration (dense).
  std::string_view supported;
  bool (*takes)(const QuantConfig& q) = nullptr;  // whether quantization_config names it (q.quantized())
  Status (*check)(const QuantConfig& q) = nullptr;
  std::shared_ptr<const LinearMethod> (*make)(const QuantConfig& q) = nullptr;
};

// Each format's instance and each family, declared from the table (linear_weight.h).
#define FATHOM_DECLARE_LINEAR_FORMAT(value, method, family) \
  const LinearMethod& method##MethodInstance();             \
  const FormatFamily& family##FormatFamily();
FATHOM_LINEAR_FORMATS(FATHOM_DECLARE_LINEAR_FORMAT)
#undef FATHOM_DECLARE_LINEAR_FORMAT

// Row `row` of w in float32 by its format's reference rule (host memory).   dst [w.in_features()]
inline void DequantizeRow(const LinearWeight& w, int64_t row, float* dst) {
  MethodOf(w.format).DequantizeRow(w, row, dst);
}

}  // namespace fathom
