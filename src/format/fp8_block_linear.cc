// The block-scaled FP8 weight format of DeepSeek-V3 (`quant_method: fp8`, `weight_block_size: [n, k]`):
//   W [out, in] in f8 e4m3, `weight_scale_inv` [ceil(out / n), ceil(in / k)] float32,
//   W[r, c] = f8[r, c] * scale_inv[r / n, c / k].
// Its payload is format/fp8_block.h's. The CUDA side: backend/cuda/linear_fp8.cc (which path a layer takes) and fp8.cu
// (its kernels).
#include <fmt/format.h>

#include "format/fp8_block.h"
#include "format/methods.h"

namespace fathom {

namespace {

int64_t CeilDiv(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

class Fp8BlockMethod final : public LinearMethod {
 public:
  Fp8BlockMethod(int64_t block_n, int64_t block_k) : block_n_(block_n), block_k_(block_k) {}

  std::string_view name() const override { return "fp8 block-scaled"; }
  LinearFormat format() const override { return LinearFormat::kFp8Block; }

  Status AddSpecs(const LinearSpec& l, std::vector<WeightSpec>* specs) const override {
    // A rank's shard holds whole blocks, so that its scales are a shard of the scales.
    FATHOM_RETURN_IF_ERROR(l.CheckSplit(block_n_, block_k_));
    // Dummy weights: random codes of |value| <= 1.875, scaled by the dummy scales.
    specs->push_back(LayerTensorSpec(l, ".weight", {l.local_out(), l.local_in()}, DType::kF8E4M3, l.ShardFor(0, 1)));
    WeightSpec s =
        LayerTensorSpec(l, ".weight_scale_inv", {CeilDiv(l.local_out(), block_n_), CeilDiv(l.local_in(), block_k_)},
                        DType::kF32, l.ShardFor(0, 1));
    s.init = WeightInit::kConstant;
    s.init_value = 0.02f;
    // DeepSeek-V4 names it `<layer>.scale` and stores powers of two as F8_E8M0; the loader decodes them to F32.
    s.fallback = l.prefix + ".scale";
    specs->push_back(std::move(s));
    AddBiasSpec(l, specs);
    return OkStatus();
  }

  StatusOr<LinearWeight> Bind(const LinearSpec& l, const TensorLookup& find) const override {
    const std::string name = l.prefix + ".weight", scale_name = l.prefix + ".weight_scale_inv";
    const TensorView* w = find(name);
    const TensorView* s = find(scale_name);
    if (w == nullptr || s == nullptr) {
      return NotFoundError(fmt::format("tensor '{}' was not loaded", w == nullptr ? name : scale_name));
    }
    if (w->dtype() != DType::kF8E4M3) {
      return InvalidArgumentError(fmt::format("tensor '{}' has dtype {}, but the fp8 quantization_config needs F8_E4M3",
                                              name, DTypeSafetensorsName(w->dtype())));
    }
    if (s->dtype() != DType::kF32) {
      return InvalidArgumentError(
          fmt::format("tensor '{}' has dtype {}, expected F32", scale_name, DTypeSafetensorsName(s->dtype())));
    }
    LinearWeight lw = Fp8BlockWeight(*w, *s, block_n_, block_k_);
    FATHOM_ASSIGN_OR_RETURN(lw.bias, BindBias(l, find));
    return lw;
  }

  void DequantizeRow(const LinearWeight& w, int64_t r, float* dst) const override {
    const int64_t in = w.in_features();
    ConvertToF32(w.weight.raw(), w.weight.dtype(), r * w.weight.stride(0), in, dst);
    const Fp8BlockPayload& p = w.payload<Fp8BlockPayload>();
    const float* scales = p.scale_inv.data<float>() + (r / p.block_n) * p.scale_inv.stride(0);
    for (int64_t c = 0; c < in; ++c) dst[c] *= scales[c / p.block_k];
  }

  // A product of an e4m3 value and a float32 scale needs more bits than bf16 has.
  DType ExactFloatDType(const LinearWeight& /*w*/) const override { return DType::kF32; }

  // A prefill-sized layer dequantizes W into the workspace as bf16, next to its input staged as bf16 (W8A16).
  int64_t PrefillScratchBytes(int64_t weight_elems, int64_t input_cols, int64_t tokens) const override {
    return 2 * weight_elems + 2 * tokens * input_cols;
  }

 private:
  int64_t block_n_, block_k_;
};

}  // namespace

StatusOr<std::shared_ptr<const FormatPayload>> Fp8BlockPayload::MapTensors(
    const std::function<StatusOr<TensorView>(const TensorView&)>& f) const {
  auto p = std::make_shared<Fp8BlockPayload>(*this);
  if (!scale_inv.empty()) {
    FATHOM_ASSIGN_OR_RETURN(p->scale_inv, f(scale_inv));
  }
  return std::shared_ptr<const FormatPayload>(std::move(p));
}

LinearWeight Fp8BlockWeight(const TensorView& codes, const TensorView& scale_inv, int64_t block_n, int64_t block_k) {
  auto p = std::make_shared<Fp8BlockPayload>();
  p->scale_inv = scale_inv;
  p->block_n = block_n;
  p->block_k = block_k;
  LinearWeight w;
  w.format = LinearFormat::kFp8Block;
  w.weight = codes;
  w.format_payload = std::move(p);
  return w;
}

namespace {

Status CheckFp8Config(const QuantConfig& q) {
  if (!q.fmt.empty() && q.fmt != "e4m3") {
    return UnimplementedError(fmt::format("{}: fp8 format '{}' is not supported (supported: e4m3)", q.source, q.fmt));
  }
  if (!q.activation_scheme.empty() && q.activation_scheme != "dynamic") {
    return UnimplementedError(fmt::format(
        "{}: fp8 activation_scheme '{}' is not supported (supported: dynamic; static input scales are not read)",
        q.source, q.activation_scheme));
  }
  if (q.block_n <= 0 || q.block_k <= 0) {
    return InvalidArgumentError(fmt::format("{}: fp8 needs weight_block_size [n, k] > 0", q.source));
  }
  return OkStatus();
}

std::shared_ptr<const LinearMethod> MakeFp8BlockMethod(const QuantConfig& q) {
  return std::make_shared<Fp8BlockMethod>(q.block_n, q.block_k);
}

}  // namespace

const FormatFamily& Fp8BlockFormatFamily() {
  static const FormatFamily f{.supported = "fp8 with block-scaled e4m3 weights, as DeepSeek-V3 ships",
                              .takes = [](const QuantConfig& q) { return q.method == "fp8"; },
                              .check = CheckFp8Config,
                              .make = MakeFp8BlockMethod};
  return f;
}

const LinearMethod& Fp8BlockMethodInstance() {
  static const Fp8BlockMethod m(128, 128);  // run-time parts read the block sizes from the LinearWeight
  return m;
}

}  // namespace fathom
