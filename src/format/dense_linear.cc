// The dense weight format: W [out, in] in f32, f16 or bf16, as the checkpoint stores it (converted in the kernels).
#include <fmt/format.h>

#include "format/methods.h"

namespace fathom {

namespace {

class DenseMethod final : public LinearMethod {
 public:
  std::string_view name() const override { return "dense"; }
  LinearFormat format() const override { return LinearFormat::kDense; }

  Status AddSpecs(const LinearSpec& l, std::vector<WeightSpec>* specs) const override {
    FATHOM_RETURN_IF_ERROR(l.CheckSplit(1, 1));
    WeightSpec w;
    w.name = l.prefix + ".weight";
    w.shape = {l.local_out(), l.local_in()};
    w.dtype = l.dtype;
    w.read_fraction = l.read_fraction;
    w.active_fraction = l.active_fraction;
    w.shard = l.ShardFor(0, 1);
    specs->push_back(std::move(w));
    if (l.bias) {
      WeightSpec b;
      b.name = l.prefix + ".bias";
      b.shape = {l.local_out()};
      b.dtype = l.dtype;
      b.read_fraction = l.read_fraction;
      b.active_fraction = l.active_fraction;
      b.shard = l.ShardFor(0, -1);
      specs->push_back(std::move(b));
    }
    return OkStatus();
  }

  StatusOr<LinearWeight> Bind(const LinearSpec& l, const TensorLookup& find) const override {
    const std::string name = l.prefix + ".weight";
    const TensorView* w = find(name);
    if (w == nullptr) return NotFoundError(fmt::format("tensor '{}' was not loaded", name));
    if (w->dtype() == DType::kF8E4M3) {
      return InvalidArgumentError(fmt::format(
          "tensor '{}' holds f8_e4m3 values, but config.json names no fp8 quantization_config for it", name));
    }
    if (!IsFloating(w->dtype())) {
      return InvalidArgumentError(fmt::format("tensor '{}' has dtype {}, expected a float dtype", name,
                                              DTypeSafetensorsName(w->dtype())));
    }
    LinearWeight lw;
    lw.format = LinearFormat::kDense;
    lw.weight = *w;
    FATHOM_ASSIGN_OR_RETURN(lw.bias, BindBias(l, find));
    return lw;
  }

  void DequantizeRow(const LinearWeight& w, int64_t row, float* dst) const override {
    ConvertToF32(w.weight.raw(), w.weight.dtype(), row * w.weight.stride(0), w.in_features(), dst);
  }

  DType ExactFloatDType(const LinearWeight& w) const override { return w.weight.dtype(); }
};

}  // namespace

StatusOr<TensorView> BindBias(const LinearSpec& l, const TensorLookup& find) {
  // A row-parallel layer's ranks each hold a partial sum: the bias is added once, on rank 0.
  if (!l.bias || (l.split == LinearSplit::kRows && l.parallel.tp_rank != 0)) return TensorView();
  const std::string name = l.prefix + ".bias";
  const TensorView* b = find(name);
  if (b == nullptr) return NotFoundError(fmt::format("tensor '{}' was not loaded", name));
  if (!IsFloating(b->dtype()) || b->dtype() == DType::kF8E4M3) {
    return InvalidArgumentError(
        fmt::format("tensor '{}' has dtype {}, expected f32, f16 or bf16", name, DTypeSafetensorsName(b->dtype())));
  }
  return *b;
}

const LinearMethod& DenseMethodInstance() {
  static const DenseMethod m;
  return m;
}

}  // namespace fathom
