// A linear layer's weights as the backends see them: y = x W^T + b, W logically [out, in], stored in one of the weight
// formats (format/linear_method.h says how each is read from a checkpoint and dequantized on the CPU).
//
//   LinearWeight w;                         // dense: w.weight [out, in] f32/f16/bf16
//   w.weight = q_proj_weight;
//   be.Linear(x, w, out);                   // x [n, in] -> out [n, out]
//
//   LinearWeight f = Fp8BlockWeight(codes, scale_inv, 128, 128);   // a quantized format: its payload (fp8_block.h)
//   const Fp8BlockPayload& p = f.payload<Fp8BlockPayload>();        // only the format's own code looks inside
//
// LinearWeight holds what every format has (the stored `weight`, the bias, the logical shape); the rest is the
// format's payload, a type of its own defined next to its LinearMethod (format/fp8_block.h, format/int4.h). Backends
// dispatch on `format` to the format's provider (backend/cuda/linear_format.h); model code never looks inside.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include "core/check.h"
#include "core/status.h"
#include "core/tensor.h"

namespace fathom {

// Every weight format, a row each: X(value, method, family), the one place that lists them (an X-macro: the
// registries expand it, so that a new format is a row here and files of its own, docs/ARCHITECTURE.md's dry run).
// - value: its LinearFormat enumerator;
// - method: its stateless method, `const LinearMethod& <method>MethodInstance()` (format/<name>_linear.cc);
// - family: the code that serves it, by name: `const FormatFamily& <family>FormatFamily()` beside the method (which
//   quantization_config picks it, its refusals, its factory: linear_method.h) and the CUDA provider
//   `cuda::Make<family>Kernels` (backend/cuda/linear_<name>.cc); formats of one family share both.
//   kDense      weight [out, in] f32, f16 or bf16; no payload
//   kFp8Block   weight [out, in] f8 e4m3; Fp8BlockPayload: scale_inv per block (DeepSeek-V3; format/fp8_block.h)
//   kAwq        weight = qweight i32 [in, out / 8] in AWQ's nibble order; Int4Payload (format/int4.h)
//   kGptq       weight = qweight i32 [in / 8, out]; Int4Payload with g_idx (format/int4.h)
//   kMxfp4      weight = i8 [out, in / 2] packed e2m1; Mxfp4Payload: an e8m0 scale per 32 inputs (DeepSeek-V4's
//               routed experts; format/mxfp4.h)
#define FATHOM_LINEAR_FORMATS(X)   \
  X(kDense, Dense, Dense)          \
  X(kFp8Block, Fp8Block, Fp8Block) \
  X(kAwq, Awq, Int4)               \
  X(kGptq, Gptq, Int4)             \
  X(kMxfp4, Mxfp4, Mxfp4)

#define FATHOM_LINEAR_FORMAT_VALUE(value, method, family) value,
enum class LinearFormat : uint8_t { FATHOM_LINEAR_FORMATS(FATHOM_LINEAR_FORMAT_VALUE) };
#undef FATHOM_LINEAR_FORMAT_VALUE
#define FATHOM_LINEAR_FORMAT_ONE(value, method, family) +1
inline constexpr int kNumLinearFormats = 0 FATHOM_LINEAR_FORMATS(FATHOM_LINEAR_FORMAT_ONE);
#undef FATHOM_LINEAR_FORMAT_ONE

// The tensors and settings a format keeps beside `weight`. Each format derives its own (with a static
// `Holds(LinearFormat)` that says which formats carry it) and owns every read of it.
struct FormatPayload {
  virtual ~FormatPayload() = default;
  // A copy whose tensors are f(tensor) (empty ones stay empty): a weight moved to another memory.
  virtual StatusOr<std::shared_ptr<const FormatPayload>> MapTensors(
      const std::function<StatusOr<TensorView>(const TensorView&)>& f) const = 0;
};

struct LinearWeight {
  LinearFormat format = LinearFormat::kDense;
  TensorView weight;  // the stored values (see LinearFormat); dense: [out, in]
  TensorView bias;    // [out] or empty
  // W's logical shape where `weight`'s dims are not it (packed formats); 0: weight [out, in].
  int64_t logical_out = 0;
  int64_t logical_in = 0;
  // The activations keep float32 precision (a backend may otherwise round them to bf16 for tensor cores): DeepSeek's
  // router, whose near-tied expert choices would move.
  bool float32_inputs = false;
  // The format's own tensors and settings (null for kDense).
  std::shared_ptr<const FormatPayload> format_payload;
  // The backend's own form of this weight (Backend::PrepareLinear: a repacked layout, padded scales), or null.
  std::shared_ptr<void> device_state;

  int64_t out_features() const { return logical_out > 0 ? logical_out : weight.dim(0); }
  int64_t in_features() const { return logical_in > 0 ? logical_in : weight.dim(1); }
  bool int4() const { return format == LinearFormat::kAwq || format == LinearFormat::kGptq; }
  bool fp8_block() const { return format == LinearFormat::kFp8Block; }
  // The format's payload as its type P (a programmer error when the weight's format does not carry P).
  template <class P>
  const P& payload() const {
    FATHOM_CHECK(format_payload != nullptr && P::Holds(format), "a weight of format {} has no such payload",
                 static_cast<int>(format));
    return static_cast<const P&>(*format_payload);
  }
};

// A copy of w whose every tensor (weight, bias, the payload's) is f(tensor): e.g. a host copy for the CPU reference
// dequantization of a device weight.
StatusOr<LinearWeight> MapTensors(const LinearWeight& w,
                                  const std::function<StatusOr<TensorView>(const TensorView&)>& f);

}  // namespace fathom
