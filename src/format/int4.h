// The 4-bit weight formats (LinearFormat::kAwq, kGptq; `quant_method: awq` / `gptq`): LinearWeight::weight is the
// checkpoint's qweight (AWQ: i32 [in, out / 8] in AWQ's nibble order; GPTQ: i32 [in / 8, out]) and the logical shape
// is LinearWeight::logical_out / logical_in. W[n, k] = (q[k, n] - (z[g, n] + zero_offset)) * s[g, n], g the group of
// input k. Its LinearMethod is int4_linear.cc's; its CUDA kernels are backend/cuda/linear_int4.cc's.
//
//   LinearWeight w = Int4Weight(LinearFormat::kGptq, qweight, out, in, {.qzeros = z, .scales = s, .group_size = 128});
//   const Int4Payload& p = w.payload<Int4Payload>();   // p.qzeros, p.scales, p.g_idx, p.group_size, p.zero_offset
#pragma once

#include <cstdint>

#include "format/linear_method.h"
#include "format/linear_weight.h"

namespace fathom {

struct Int4Payload final : FormatPayload {
  TensorView qzeros;        // i32 [groups, out / 8]
  TensorView scales;        // f16, bf16 or f32 [groups, out]
  TensorView g_idx;         // kGptq: i32 [in], the group of each input row; else empty
  int64_t group_size = 0;   // input rows per group (kAwq; kGptq reads g_idx when it has one)
  int32_t zero_offset = 0;  // kGptq v1 checkpoints store zero - 1: 1 there, else 0

  static bool Holds(LinearFormat f) { return f == LinearFormat::kAwq || f == LinearFormat::kGptq; }
  StatusOr<std::shared_ptr<const FormatPayload>> MapTensors(
      const std::function<StatusOr<TensorView>(const TensorView&)>& f) const override;
};

// A kAwq or kGptq weight of logical shape [out, in].
LinearWeight Int4Weight(LinearFormat format, const TensorView& qweight, int64_t out, int64_t in, Int4Payload payload);

}  // namespace fathom
