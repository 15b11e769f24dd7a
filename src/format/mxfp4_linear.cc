// The MXFP4 weight format (format/mxfp4.h): DeepSeek-V4's routed experts, stored as packed e2m1 codes with an
// f8_e8m0 scale per 32 inputs. No quantization_config names it: a model asks for it for its routed experts where
// config.json says `expert_dtype: fp4` (LinearMethodFor's routed_expert). It is not split between tensor-parallel
// ranks by columns of a partial group.
#include <fmt/format.h>

#include "format/methods.h"
#include "format/mxfp4.h"

namespace fathom {

namespace {

class Mxfp4Method final : public LinearMethod {
 public:
  std::string_view name() const override { return "mxfp4"; }
  LinearFormat format() const override { return LinearFormat::kMxfp4; }

  Status AddSpecs(const LinearSpec& l, std::vector<WeightSpec>* specs) const override {
    if (l.in % kMxfp4Group != 0) {
      return InvalidArgumentError(
          fmt::format("{}: mxfp4 needs the inputs ({}) in whole groups of {}", l.prefix, l.in, kMxfp4Group));
    }
    FATHOM_RETURN_IF_ERROR(l.CheckSplit(1, kMxfp4Group));
    // Dummy weights: random bytes (every code is finite) under scales of 2^-7.
    WeightSpec w = LayerTensorSpec(l, ".weight", {l.local_out(), l.local_in() / 2}, DType::kI8, l.ShardFor(0, 1));
    w.params_per_element = 2;
    specs->push_back(std::move(w));
    WeightSpec s =
        LayerTensorSpec(l, ".scale", {l.local_out(), l.local_in() / kMxfp4Group}, DType::kF8E8M0, l.ShardFor(0, 1));
    s.init = WeightInit::kConstant;
    s.init_value = 120.0f;  // the code: 2^(120 - 127)
    s.params_per_element = 0;
    specs->push_back(std::move(s));
    if (l.bias) return InvalidArgumentError(fmt::format("{}: mxfp4 layers have no bias", l.prefix));
    return OkStatus();
  }

  StatusOr<LinearWeight> Bind(const LinearSpec& l, const TensorLookup& find) const override {
    const std::string name = l.prefix + ".weight", scale_name = l.prefix + ".scale";
    const TensorView* w = find(name);
    const TensorView* s = find(scale_name);
    if (w == nullptr || s == nullptr) {
      return NotFoundError(fmt::format("tensor '{}' was not loaded", w == nullptr ? name : scale_name));
    }
    if (w->dtype() != DType::kI8 && w->dtype() != DType::kU8) {
      return InvalidArgumentError(fmt::format("tensor '{}' has dtype {}, but mxfp4 experts are packed in I8 or U8",
                                              name, DTypeSafetensorsName(w->dtype())));
    }
    if (s->dtype() != DType::kF8E8M0 && s->dtype() != DType::kU8) {
      return InvalidArgumentError(fmt::format("tensor '{}' has dtype {}, but mxfp4 scales are F8_E8M0", scale_name,
                                              DTypeSafetensorsName(s->dtype())));
    }
    const int64_t in = l.local_in();
    if (w->ndim() != 2 || s->ndim() != 2 || w->dim(1) * 2 != in || s->dim(1) * kMxfp4Group != in ||
        s->dim(0) != w->dim(0)) {
      return InvalidArgumentError(fmt::format("tensors '{}' and '{}' do not hold an mxfp4 [{}, {}] weight", name,
                                              scale_name, l.local_out(), in));
    }
    return Mxfp4Weight(*w, *s, in);
  }

  void DequantizeRow(const LinearWeight& w, int64_t r, float* dst) const override {
    const int64_t in = w.in_features();
    const uint8_t* codes = static_cast<const uint8_t*>(w.weight.raw()) + r * w.weight.stride(0);
    const Mxfp4Payload& p = w.payload<Mxfp4Payload>();
    const uint8_t* scales = static_cast<const uint8_t*>(p.scale.raw()) + r * p.scale.stride(0);
    for (int64_t c = 0; c < in; c += 2) {
      const uint8_t b = codes[c / 2];
      const float scale = F8E8M0ToF32(scales[c / kMxfp4Group]);
      dst[c] = E2m1ToF32(b & 0xfu) * scale;
      dst[c + 1] = E2m1ToF32(b >> 4) * scale;
    }
  }

  // e2m1 times a power of two has at most two significant bits: bf16 holds it exactly.
  DType ExactFloatDType(const LinearWeight& /*w*/) const override { return DType::kBF16; }
};

}  // namespace

StatusOr<std::shared_ptr<const FormatPayload>> Mxfp4Payload::MapTensors(
    const std::function<StatusOr<TensorView>(const TensorView&)>& f) const {
  auto p = std::make_shared<Mxfp4Payload>(*this);
  if (!scale.empty()) {
    FATHOM_ASSIGN_OR_RETURN(p->scale, f(scale));
  }
  return std::shared_ptr<const FormatPayload>(std::move(p));
}

LinearWeight Mxfp4Weight(const TensorView& codes, const TensorView& scale, int64_t in) {
  auto p = std::make_shared<Mxfp4Payload>();
  p->scale = scale;
  LinearWeight w;
  w.format = LinearFormat::kMxfp4;
  w.weight = codes;
  w.logical_out = codes.dim(0);
  w.logical_in = in;
  w.format_payload = std::move(p);
  return w;
}

const FormatFamily& Mxfp4FormatFamily() {
  // No quantization_config picks it (takes is null): LinearMethodFor gives it to routed experts under
  // expert_dtype fp4.
  static const FormatFamily f{.supported = {}, .takes = nullptr, .check = nullptr, .make = nullptr};
  return f;
}

const LinearMethod& Mxfp4MethodInstance() {
  static const Mxfp4Method m;
  return m;
}

}  // namespace fathom
