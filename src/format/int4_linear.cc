// The 4-bit weight formats of AutoAWQ and AutoGPTQ/GPTQModel, as their packers write them (W is nn.Linear's
// [N, K] weight: N outputs, K inputs; g the group size):
//   AWQ GEMM (`quant_method: awq`, `version: gemm`, `zero_point: true`): `qweight` i32 [K, N / 8], where nibble i
//     (bits 4i..4i+3) of word c holds column 8c + [0, 2, 4, 6, 1, 3, 5, 7][i]; `qzeros` i32 [K / g, N / 8] packed
//     the same way; `scales` f16 [K / g, N]. W[n, k] = (q[k, n] - z[k / g, n]) * s[k / g, n].
//   GPTQ (`quant_method: gptq`): `qweight` i32 [K / 8, N], nibble j of word r holds input row 8r + j; `qzeros`
//     i32 [G, N / 8], nibble j of word c holds column 8c + j; `scales` f16 [G, N]; `g_idx` i32 [K], the group of each
//     input row (not k / g under desc_act). v1 checkpoints (`checkpoint_format: gptq`, or none) store zero - 1;
//     gptq_v2 stores the zero. W[n, k] = (q[k, n] - z[g_idx[k], n]) * s[g_idx[k], n]; group_size -1: G = 1.
// The CPU reference dequantizes a row of W at a time inside its GEMM (CpuBackend::Linear through DequantizeRow); the
// values are exact in float32 (a 5-bit integer times an f16 scale).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "format/int4.h"
#include "format/methods.h"

namespace fathom {

namespace {

// AWQ's nibble of column offset j within a word: the inverse of its packing order [0, 2, 4, 6, 1, 3, 5, 7].
constexpr int kAwqNibble[8] = {0, 4, 1, 5, 2, 6, 3, 7};

inline uint32_t Nibble(int32_t word, int i) {
  return (static_cast<uint32_t>(word) >> (4 * i)) & 0xFu;
}

inline float ScaleAt(const TensorView& s, int64_t g, int64_t n) {
  const int64_t off = g * s.stride(0) + n;
  switch (s.dtype()) {
    case DType::kF16:
      return F16ToF32(s.data<uint16_t>()[off]);
    case DType::kBF16:
      return Bf16ToF32(s.data<uint16_t>()[off]);
    default:
      return s.data<float>()[off];
  }
}

const TensorView* Need(const TensorLookup& find, const std::string& name, Status* st) {
  const TensorView* t = find(name);
  if (t == nullptr && st->ok()) *st = NotFoundError(fmt::format("tensor '{}' was not loaded", name));
  return t;
}

Status CheckTensor(const TensorView& t, const std::string& name, std::initializer_list<DType> dtypes,
                   std::vector<int64_t> shape, const char* what) {
  bool dtype_ok = false;
  for (DType d : dtypes) dtype_ok = dtype_ok || t.dtype() == d;
  if (!dtype_ok) {
    return InvalidArgumentError(fmt::format("tensor '{}' has dtype {}, but {} needs {}", name,
                                            DTypeSafetensorsName(t.dtype()), what,
                                            DTypeSafetensorsName(*dtypes.begin())));
  }
  if (t.shape() != shape) {
    return InvalidArgumentError(fmt::format("tensor '{}' has shape [{}], but {} needs [{}]", name,
                                            fmt::join(t.shape(), ", "), what, fmt::join(shape, ", ")));
  }
  return OkStatus();
}

class Int4Method final : public LinearMethod {
 public:
  Int4Method(LinearFormat format, int64_t group_size, int32_t zero_offset)
      : format_(format), group_size_(group_size), zero_offset_(zero_offset) {}

  std::string_view name() const override { return format_ == LinearFormat::kAwq ? "awq 4-bit" : "gptq 4-bit"; }
  LinearFormat format() const override { return format_; }

  // The group size of a layer with `in` inputs (GPTQ's -1: one group over all of them).
  int64_t Group(int64_t in) const { return group_size_ < 0 ? in : group_size_; }

  // A rank's shard: column-parallel layers split their outputs in whole packed words (8 columns); row-parallel
  // layers split their inputs, AWQ in whole scale groups (its group is the input's index over the group size) and
  // GPTQ in whole packed words, every rank keeping all of GPTQ's scales and zeros, which g_idx (split with the inputs)
  // indexes by group (act-order groups are spread over all inputs).
  Status CheckShape(const LinearSpec& l) const {
    if (l.out % 8 != 0 || l.in % 8 != 0 || Group(l.in) <= 0) {
      return InvalidArgumentError(fmt::format("{}: a {} layer of [{}, {}] needs outputs and inputs in multiples of 8",
                                              l.prefix, name(), l.out, l.in));
    }
    if (l.split == LinearSplit::kColumns) return l.CheckSplit(8, 1);
    if (l.split == LinearSplit::kRows) {
      return format_ == LinearFormat::kAwq ? l.CheckSplit(1, std::max<int64_t>(Group(l.in), 8)) : l.CheckSplit(1, 8);
    }
    return OkStatus();
  }

  // This rank's scale and zero rows: AWQ's row-parallel shard holds its inputs' groups; otherwise all of them.
  int64_t LocalGroups(const LinearSpec& l) const {
    return format_ == LinearFormat::kAwq && l.split == LinearSplit::kRows ? Groups(l.in) / l.split_parts()
                                                                          : Groups(l.in);
  }
  // Shards: AWQ's scales and zeros follow the weight both ways; GPTQ's only by columns.
  WeightShard GroupShard(const LinearSpec& l) const {
    return format_ == LinearFormat::kAwq ? l.ShardFor(1, 0) : l.ShardFor(1, -1);
  }

  // Scale groups over `in` inputs; a last group may be partial (V2-Lite's 10944 inputs in groups of 128: 86 groups,
  // the last of 64 rows), as the group index k / g implies.
  int64_t Groups(int64_t in) const { return (in + Group(in) - 1) / Group(in); }

  Status AddSpecs(const LinearSpec& l, std::vector<WeightSpec>* specs) const override {
    FATHOM_RETURN_IF_ERROR(CheckShape(l));
    const int64_t groups = LocalGroups(l), out = l.local_out(), in = l.local_in();
    const bool awq = format_ == LinearFormat::kAwq;
    // Dummy weights: random nibbles, random zeros, one small constant scale (|W| <= 15 * 0.003), g_idx k / group.
    WeightSpec q =
        LayerTensorSpec(l, ".qweight", awq ? std::vector<int64_t>{in, out / 8} : std::vector<int64_t>{in / 8, out},
                        DType::kI32, l.ShardFor(1, 0));
    q.params_per_element = 8;
    specs->push_back(std::move(q));
    WeightSpec z = LayerTensorSpec(l, ".qzeros", {groups, out / 8}, DType::kI32, GroupShard(l));
    z.params_per_element = 0;
    specs->push_back(std::move(z));
    WeightSpec s = LayerTensorSpec(l, ".scales", {groups, out}, DType::kF16, GroupShard(l));
    s.init = WeightInit::kConstant;
    s.init_value = 0.003f;
    s.params_per_element = 0;
    specs->push_back(std::move(s));
    if (!awq) {
      WeightSpec g = LayerTensorSpec(l, ".g_idx", {in}, DType::kI32, l.ShardFor(-1, 0));
      g.init = WeightInit::kGroupIndex;  // desc_act false: input k in group k / group (of the whole layer)
      g.init_value = static_cast<float>(Group(l.in));
      g.params_per_element = 0;
      specs->push_back(std::move(g));
    }
    AddBiasSpec(l, specs);
    return OkStatus();
  }

  StatusOr<LinearWeight> Bind(const LinearSpec& l, const TensorLookup& find) const override {
    FATHOM_RETURN_IF_ERROR(CheckShape(l));
    const bool awq = format_ == LinearFormat::kAwq;
    const int64_t groups = LocalGroups(l), out = l.local_out(), in = l.local_in();
    Status st;
    const TensorView* qw = Need(find, l.prefix + ".qweight", &st);
    const TensorView* qz = Need(find, l.prefix + ".qzeros", &st);
    const TensorView* sc = Need(find, l.prefix + ".scales", &st);
    const TensorView* gi = awq ? nullptr : Need(find, l.prefix + ".g_idx", &st);
    FATHOM_RETURN_IF_ERROR(st);
    const std::string what = fmt::format("a {} layer of [{}, {}] in groups of {}{}", name(), l.out, l.in, Group(l.in),
                                         l.split_parts() > 1 && l.split != LinearSplit::kReplicated
                                             ? fmt::format(" (a tensor-parallel rank's [{}, {}])", out, in)
                                             : std::string());
    FATHOM_RETURN_IF_ERROR(CheckTensor(*qw, l.prefix + ".qweight", {DType::kI32},
                                       awq ? std::vector<int64_t>{in, out / 8} : std::vector<int64_t>{in / 8, out},
                                       what.c_str()));
    FATHOM_RETURN_IF_ERROR(CheckTensor(*qz, l.prefix + ".qzeros", {DType::kI32}, {groups, out / 8}, what.c_str()));
    FATHOM_RETURN_IF_ERROR(
        CheckTensor(*sc, l.prefix + ".scales", {DType::kF16, DType::kBF16, DType::kF32}, {groups, out}, what.c_str()));
    LinearWeight w;
    w.format = format_;
    w.weight = *qw;
    w.logical_out = out;
    w.logical_in = in;
    auto p = std::make_shared<Int4Payload>();
    p->qzeros = *qz;
    p->scales = *sc;
    p->group_size = Group(l.in);
    p->zero_offset = zero_offset_;
    if (gi != nullptr) {
      FATHOM_RETURN_IF_ERROR(CheckTensor(*gi, l.prefix + ".g_idx", {DType::kI32}, {in}, what.c_str()));
      // Every group index is read as an offset into qzeros and scales: check them all once, on the host.
      if (gi->device() == Device::kCpu) {
        for (int64_t k = 0; k < in; ++k) {
          const int32_t g = gi->data<int32_t>()[k * gi->stride(0)];
          if (g < 0 || g >= groups) {
            return InvalidArgumentError(
                fmt::format("tensor '{}.g_idx': row {} is in group {}, outside [0, {})", l.prefix, k, g, groups));
          }
        }
      }
      p->g_idx = *gi;
    }
    w.format_payload = std::move(p);
    FATHOM_ASSIGN_OR_RETURN(w.bias, BindBias(l, find));
    return w;
  }

  void DequantizeRow(const LinearWeight& w, int64_t n, float* dst) const override {
    const int64_t in = w.in_features();
    const TensorView& q = w.weight;
    const Int4Payload& p = w.payload<Int4Payload>();
    const int32_t* qz = p.qzeros.data<int32_t>();
    if (w.format == LinearFormat::kAwq) {
      const int nib = kAwqNibble[n % 8];
      const int64_t word = n / 8;
      for (int64_t k = 0; k < in; ++k) {
        const int64_t g = k / p.group_size;
        const int32_t qv = static_cast<int32_t>(Nibble(q.data<int32_t>()[k * q.stride(0) + word], nib));
        const int32_t z = static_cast<int32_t>(Nibble(qz[g * p.qzeros.stride(0) + word], nib));
        dst[k] = static_cast<float>(qv - z) * ScaleAt(p.scales, g, n);
      }
      return;
    }
    const int32_t* gidx = p.g_idx.empty() ? nullptr : p.g_idx.data<int32_t>();
    for (int64_t k = 0; k < in; ++k) {
      const int64_t g = gidx != nullptr ? gidx[k * p.g_idx.stride(0)] : k / p.group_size;
      const int32_t qv =
          static_cast<int32_t>(Nibble(q.data<int32_t>()[(k / 8) * q.stride(0) + n], static_cast<int>(k % 8)));
      const int32_t z =
          static_cast<int32_t>(Nibble(qz[g * p.qzeros.stride(0) + n / 8], static_cast<int>(n % 8))) + p.zero_offset;
      dst[k] = static_cast<float>(qv - z) * ScaleAt(p.scales, g, n);
    }
  }

  // An integer up to 16 in magnitude times an f16 scale needs more mantissa than bf16's 8 bits.
  DType ExactFloatDType(const LinearWeight& /*w*/) const override { return DType::kF32; }

  // The CUDA backend's prefill path dequantizes the weight to bf16 in its workspace, next to the bf16 input.
  int64_t PrefillScratchBytes(int64_t weight_elems, int64_t input_cols, int64_t tokens) const override {
    return 2 * weight_elems + 2 * tokens * input_cols;
  }

 private:
  LinearFormat format_;
  int64_t group_size_;
  int32_t zero_offset_;
};

}  // namespace

StatusOr<std::shared_ptr<const FormatPayload>> Int4Payload::MapTensors(
    const std::function<StatusOr<TensorView>(const TensorView&)>& f) const {
  auto p = std::make_shared<Int4Payload>(*this);
  for (TensorView* t : {&p->qzeros, &p->scales, &p->g_idx}) {
    if (!t->empty()) {
      FATHOM_ASSIGN_OR_RETURN(*t, f(*t));
    }
  }
  return std::shared_ptr<const FormatPayload>(std::move(p));
}

LinearWeight Int4Weight(LinearFormat format, const TensorView& qweight, int64_t out, int64_t in, Int4Payload payload) {
  FATHOM_CHECK(Int4Payload::Holds(format));
  LinearWeight w;
  w.format = format;
  w.weight = qweight;
  w.logical_out = out;
  w.logical_in = in;
  w.format_payload = std::make_shared<Int4Payload>(std::move(payload));
  return w;
}

namespace {

Status CheckInt4Config(const QuantConfig& q) {
  if (q.bits != 4) {
    return UnimplementedError(fmt::format("{}: {}-bit {} weights are not supported (supported: 4-bit AWQ and GPTQ)",
                                          q.source, q.bits, q.method));
  }
  if (q.method == "awq") {
    if (!q.version.empty() && q.version != "gemm") {
      return UnimplementedError(
          fmt::format("{}: AWQ version '{}' is not supported (supported: gemm, the layout AutoAWQ writes by default)",
                      q.source, q.version));
    }
    if (!q.zero_point) {
      return UnimplementedError(
          fmt::format("{}: AWQ without zero points (zero_point: false) is not supported", q.source));
    }
    if (q.group_size <= 0) {
      return InvalidArgumentError(fmt::format("{}: AWQ needs a group size > 0 (q_group_size / group_size)", q.source));
    }
    return OkStatus();
  }
  if (q.group_size == 0 || q.group_size < -1) {
    return InvalidArgumentError(fmt::format("{}: GPTQ group_size must be -1 or > 0, not {}", q.source, q.group_size));
  }
  if (!q.checkpoint_format.empty() && q.checkpoint_format != "gptq" && q.checkpoint_format != "gptq_v2") {
    return UnimplementedError(fmt::format("{}: GPTQ checkpoint_format '{}' is not supported (supported: gptq, gptq_v2)",
                                          q.source, q.checkpoint_format));
  }
  return OkStatus();
}

std::shared_ptr<const LinearMethod> MakeInt4Method(const QuantConfig& q) {
  const bool awq = q.method == "awq";
  return std::make_shared<Int4Method>(awq ? LinearFormat::kAwq : LinearFormat::kGptq, q.group_size,
                                      !awq && q.checkpoint_format != "gptq_v2" ? 1 : 0);
}

}  // namespace

const FormatFamily& Int4FormatFamily() {
  static const FormatFamily f{.supported = "4-bit awq and gptq",
                              .takes = [](const QuantConfig& q) { return q.method == "awq" || q.method == "gptq"; },
                              .check = CheckInt4Config,
                              .make = MakeInt4Method};
  return f;
}

const LinearMethod& AwqMethodInstance() {
  static const Int4Method m(LinearFormat::kAwq, 128, 0);  // run-time parts read the LinearWeight's settings
  return m;
}

const LinearMethod& GptqMethodInstance() {
  static const Int4Method m(LinearFormat::kGptq, 128, 1);
  return m;
}

}  // namespace fathom
