#include "format/linear_method.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <array>

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

namespace {

// The families in the table's order (a family of several formats more than once).
#define FATHOM_LINEAR_FORMAT_FAMILY(value, method, family) &family##FormatFamily(),
const std::array<const FormatFamily*, kNumLinearFormats>& Families() {
  static const std::array<const FormatFamily*, kNumLinearFormats> families = {
      FATHOM_LINEAR_FORMATS(FATHOM_LINEAR_FORMAT_FAMILY)};
  return families;
}
#undef FATHOM_LINEAR_FORMAT_FAMILY

// The family a quantized configuration names; null for none.
const FormatFamily* FamilyFor(const QuantConfig& q) {
  for (const FormatFamily* f : Families()) {
    if (f->takes != nullptr && f->takes(q)) return f;
  }
  return nullptr;
}

}  // namespace

Status CheckQuantConfig(const QuantConfig& q) {
  if (!q.quantized()) return OkStatus();
  if (const FormatFamily* f = FamilyFor(q)) return f->check(q);
  std::vector<std::string_view> supported;
  for (const FormatFamily* f : Families()) {
    if (!f->supported.empty() && std::find(supported.begin(), supported.end(), f->supported) == supported.end()) {
      supported.push_back(f->supported);
    }
  }
  return UnimplementedError(fmt::format("{}: quantization method '{}' is not supported yet (supported: {})", q.source,
                                        q.Describe(), fmt::join(supported, "; ")));
}

StatusOr<std::shared_ptr<const LinearMethod>> LinearMethodFor(const QuantConfig& q, std::string_view prefix,
                                                              bool quantizable, bool routed_expert) {
  FATHOM_RETURN_IF_ERROR(CheckQuantConfig(q));
  if (routed_expert && q.expert_dtype == "fp4") {
    return std::shared_ptr<const LinearMethod>(std::shared_ptr<void>(), &MethodOf(LinearFormat::kMxfp4));
  }
  bool dense = !q.quantized() || !quantizable;
  for (const std::string& part : q.modules_to_not_convert) {
    if (!part.empty() && prefix.find(part) != std::string_view::npos) dense = true;
  }
  if (dense) return std::shared_ptr<const LinearMethod>(std::shared_ptr<void>(), &MethodOf(LinearFormat::kDense));
  return FamilyFor(q)->make(q);  // CheckQuantConfig found it
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
#define FATHOM_LINEAR_FORMAT_CASE(value, method, family) \
  case LinearFormat::value:                              \
    return method##MethodInstance();
    FATHOM_LINEAR_FORMATS(FATHOM_LINEAR_FORMAT_CASE)
#undef FATHOM_LINEAR_FORMAT_CASE
  }
  return DenseMethodInstance();
}

}  // namespace fathom
