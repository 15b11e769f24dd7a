#include "format/linear_method.h"

#include <fmt/format.h>

#include "format/fp8_block.h"
#include "format/int4.h"
#include "format/methods.h"

namespace fathom {

WeightShard LinearSpec::ShardFor(int out_dim, int in_dim) const {
  WeightShard s;
  const int dim = split == LinearSplit::kColumns ? out_dim : split == LinearSplit::kRows ? in_dim : -1;
  if (dim < 0 || split_parts() == 1) return s;
  s.dim = dim;
  s.parts = split_parts();
  s.index = split_part();
  return s;
}

Status LinearSpec::CheckSplit(int64_t granule_out, int64_t granule_in) const {
  if (split == LinearSplit::kReplicated || split_parts() == 1) return OkStatus();
  const bool cols = split == LinearSplit::kColumns;
  const int64_t n = cols ? out : in, granule = cols ? granule_out : granule_in;
  if (n % (split_parts() * granule) == 0) return OkStatus();
  return InvalidArgumentError(fmt::format("{}: its {} ({}) do not split into {} tensor-parallel parts{}", prefix,
                                          cols ? "output rows" : "input columns", n, split_parts(),
                                          granule > 1 ? fmt::format(" of whole {}-wide blocks", granule) : ""));
}

Status AddLinearSpecs(std::shared_ptr<const LinearMethod> m, const LinearSpec& l, std::vector<WeightSpec>* specs) {
  const size_t first = specs->size();
  FATHOM_RETURN_IF_ERROR(m->AddSpecs(l, specs));
  FATHOM_CHECK(specs->size() > first, "{} added no tensors for {}", m->name(), l.prefix);
  auto binding = std::make_shared<LinearBinding>();
  binding->spec = l;
  binding->method = std::move(m);
  (*specs)[first].linear = std::move(binding);
  return OkStatus();
}

Status CheckQuantConfig(const QuantConfig& q) {
  if (!q.quantized()) return OkStatus();
  if (q.method == "fp8") return CheckFp8Config(q);
  if (q.method == "awq" || q.method == "gptq") return CheckInt4Config(q);
  return UnimplementedError(
      fmt::format("{}: quantization method '{}' is not supported yet (supported: fp8 with "
                  "block-scaled e4m3 weights, as DeepSeek-V3 ships; 4-bit awq and gptq)",
                  q.source, q.Describe()));
}

StatusOr<std::shared_ptr<const LinearMethod>> LinearMethodFor(const QuantConfig& q, std::string_view prefix,
                                                              bool quantizable) {
  FATHOM_RETURN_IF_ERROR(CheckQuantConfig(q));
  bool dense = !q.quantized() || !quantizable;
  for (const std::string& part : q.modules_to_not_convert) {
    if (!part.empty() && prefix.find(part) != std::string_view::npos) dense = true;
  }
  if (dense) return std::shared_ptr<const LinearMethod>(std::shared_ptr<void>(), &MethodOf(LinearFormat::kDense));
  if (q.method == "awq" || q.method == "gptq") return MakeInt4Method(q);
  return MakeFp8BlockMethod(q);
}

StatusOr<LinearWeight> MapTensors(const LinearWeight& w,
                                  const std::function<StatusOr<TensorView>(const TensorView&)>& f) {
  LinearWeight out = w;
  out.device_state = nullptr;  // the backend's form of the old tensors
  for (TensorView* t : {&out.weight, &out.bias}) {
    if (!t->empty()) {
      FATHOM_ASSIGN_OR_RETURN(*t, f(*t));
    }
  }
  if (w.format_payload != nullptr) {
    FATHOM_ASSIGN_OR_RETURN(out.format_payload, w.format_payload->MapTensors(f));
  }
  return out;
}

const LinearMethod& MethodOf(LinearFormat format) {
  switch (format) {
    case LinearFormat::kDense:
      return DenseMethodInstance();
    case LinearFormat::kFp8Block:
      return Fp8BlockMethodInstance();
    case LinearFormat::kAwq:
      return AwqMethodInstance();
    case LinearFormat::kGptq:
      return GptqMethodInstance();
  }
  return DenseMethodInstance();
}

}  // namespace fathom
