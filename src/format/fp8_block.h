// The block-scaled FP8 weight format (LinearFormat::kFp8Block, DeepSeek-V3's `quant_method: fp8`): W [out, in] in
// f8 e4m3 and float32 scale_inv [ceil(out / block_n), ceil(in / block_k)], W[r, c] = f8[r, c] * scale_inv[r / block_n,
// c / block_k]. Its LinearMethod is fp8_block_linear.cc's; its CUDA kernels are backend/cuda/linear_fp8.cc's.
//
//   LinearWeight w = Fp8BlockWeight(codes /* f8 [out, in] */, scale_inv, 128, 128);
//   const Fp8BlockPayload& p = w.payload<Fp8BlockPayload>();    // p.scale_inv, p.block_n, p.block_k
#pragma once

#include <cstdint>

#include "format/linear_method.h"
#include "format/linear_weight.h"

namespace fathom {

struct Fp8BlockPayload final : FormatPayload {
  TensorView scale_inv;   // f32 [ceil(out / block_n), ceil(in / block_k)]
  int64_t block_n = 128;  // output rows per scale
  int64_t block_k = 128;  // input columns per scale

  static bool Holds(LinearFormat f) { return f == LinearFormat::kFp8Block; }
  StatusOr<std::shared_ptr<const FormatPayload>> MapTensors(
      const std::function<StatusOr<TensorView>(const TensorView&)>& f) const override;
};

// A kFp8Block weight of `codes` (f8 e4m3 [out, in]) and its scales.
LinearWeight Fp8BlockWeight(const TensorView& codes, const TensorView& scale_inv, int64_t block_n = 128,
                            int64_t block_k = 128);

}  // namespace fathom
