// The MXFP4 weight format (LinearFormat::kMxfp4, DeepSeek-V4's routed experts under `expert_dtype: fp4`): the OCP
// microscaling FP4 of 4-bit e2m1 values with one shared power-of-two scale per 32 inputs.
//   weight: i8 (or u8) [out, in / 2], two codes a byte: input 2k in the low nibble, 2k + 1 in the high one;
//   code = sign << 3 | m, m indexing e2m1's magnitudes (0, 0.5, 1, 1.5, 2, 3, 4, 6);
//   scale: f8_e8m0 [out, in / 32] (2^(s - 127));   W[o, i] = e2m1(code[o, i]) * 2^(scale[o, i / 32] - 127).
// Its LinearMethod is mxfp4_linear.cc's; the CUDA provider (backend/cuda/linear_mxfp4.cc) has no kernels yet.
//
//   LinearWeight w = Mxfp4Weight(codes /* i8 [out, in / 2] */, scales /* e8m0 [out, in / 32] */, in);
//   const Mxfp4Payload& p = w.payload<Mxfp4Payload>();   // p.scale
#pragma once

#include <cstdint>

#include "format/linear_method.h"
#include "format/linear_weight.h"

namespace fathom {

inline constexpr int64_t kMxfp4Group = 32;  // inputs a scale covers

// e2m1's value of a 4-bit code (its bit 3 the sign): -0.0 for code 8.
inline float E2m1ToF32(uint8_t code) {
  static constexpr float kMagnitude[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const float m = kMagnitude[code & 7u];
  return (code & 8u) ? -m : m;
}

struct Mxfp4Payload final : FormatPayload {
  TensorView scale;  // f8_e8m0 [out, in / 32]

  static bool Holds(LinearFormat f) { return f == LinearFormat::kMxfp4; }
  StatusOr<std::shared_ptr<const FormatPayload>> MapTensors(
      const std::function<StatusOr<TensorView>(const TensorView&)>& f) const override;
};

// A kMxfp4 weight of logical shape [codes.dim(0), in].
LinearWeight Mxfp4Weight(const TensorView& codes, const TensorView& scale, int64_t in);

}  // namespace fathom
