// A linear layer's weights as the backends see them: y = x W^T + b, W logically [out, in], stored in one of the weight
// formats (format/linear_method.h says how each is read from a checkpoint and dequantized on the CPU).
//
//   LinearWeight w;                         // dense: w.weight [out, in] f32/f16/bf16
//   w.weight = q_proj_weight;
//   be.Linear(x, w, out);                   // x [n, in] -> out [n, out]
//
// Backends dispatch on `format`; model code never looks inside.
#pragma once

#include <cstdint>
#include <memory>

#include "core/tensor.h"

namespace fathom {

enum class LinearFormat : uint8_t {
  kDense,     // weight [out, in] f32, f16 or bf16
  kFp8Block,  // weight [out, in] f8 e4m3, scale_inv [ceil(out / block_n), ceil(in / block_k)] f32 (DeepSeek-V3)
  kAwq,       // 4-bit AWQ GEMM: weight = qweight i32 [in, out / 8] in AWQ's nibble order, qzeros, scales
  kGptq,      // 4-bit GPTQ: weight = qweight i32 [in / 8, out], qzeros, scales, g_idx
};

struct LinearWeight {
  LinearFormat format = LinearFormat::kDense;
  TensorView weight;      // [out, in]: the stored values (see LinearFormat)
  TensorView bias;        // [out] or empty
  TensorView scale_inv;   // kFp8Block: [ceil(out / block_n), ceil(in / block_k)] f32; else empty
  int64_t block_n = 128;  // kFp8Block: output rows per scale
  int64_t block_k = 128;  // kFp8Block: input columns per scale
  // kAwq / kGptq (format/int4_linear.cc): qzeros i32 [groups, out / 8], scales f16/bf16/f32 [groups, out], g_idx
  // (kGptq) i32 [in]: the group of each input row. W[n, k] = (q[k, n] - (z[g, n] + zero_offset)) * s[g, n].
  TensorView qzeros;
  TensorView scales;
  TensorView g_idx;
  int64_t group_size = 0;   // input rows per group (kAwq; kGptq reads g_idx)
  int32_t zero_offset = 0;  // kGptq v1 checkpoints store zero - 1: 1 there, else 0
  int64_t int4_out = 0;     // kAwq / kGptq: W's logical [out, in]
  int64_t int4_in = 0;
  // The activations keep float32 precision (a backend may otherwise round them to bf16 for tensor cores): DeepSeek's
  // router, whose near-tied expert choices would move.
  bool float32_inputs = false;
  // The backend's own form of this weight (Backend::PrepareLinear: a repacked layout, padded scales), or null.
  std::shared_ptr<void> device_state;

  bool int4() const { return format == LinearFormat::kAwq || format == LinearFormat::kGptq; }
  int64_t out_features() const { return int4() ? int4_out : weight.dim(0); }
  int64_t in_features() const { return int4() ? int4_in : weight.dim(1); }
  bool fp8_block() const { return format == LinearFormat::kFp8Block; }
};

}  // namespace fathom
