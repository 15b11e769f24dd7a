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
    specs->push_back(LayerTensorSpec(l, ".weight", {l.local_out(), l.local_in()}, l.dtype, l.ShardFor(0, 1)));
    AddBiasSpec(l, specs);
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
      return InvalidArgumentError(
          fmt::format("tensor '{}' has dtype {}, expected a float dtype", name, DTypeSafetensorsName(w->dtype())));
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

WeightSpec LayerTensorSpec(const LinearSpec& l, const std::string& suffix, std::vector<int64_t> shape, DType dtype,
                           WeightShard shard) {
  WeightSpec w;
  w.name = l.prefix + suffix;
  w.shape = std::move(shape);
  w.dtype = dtype;
  w.read_fraction = l.read_fraction;
  w.active_fraction = l.active_fraction;
  w.shard = shard;
  return w;
}

void AddBiasSpec(const LinearSpec& l, std::vector<WeightSpec>* specs) {
  // A row-parallel layer's bias is whole on every rank (rank 0 adds it).
  if (l.bias) specs->push_back(LayerTensorSpec(l, ".bias", {l.local_out()}, l.dtype, l.ShardFor(0, -1)));
}

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

const FormatFamily& DenseFormatFamily() {
  static const FormatFamily f{};  // never picked by a configuration: LinearMethodFor's default
  return f;
}

}  // namespace fathom
