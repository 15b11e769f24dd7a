// CUDA kernels of the MoE ops: the router (model/moe_route.h's rule, one warp per token) and the routed experts
// without a host round trip (sort the (token, expert) pairs by expert on the device, then grouped GEMVs over the
// active experts for decode batches, or grouped tensor-core GEMMs for larger ones, and a weighted combine), on bf16 or
// block-scaled f8 e4m3 expert weights; 4-bit (AWQ/GPTQ) experts in int4.h's tile layout run grouped W4A16
// tensor-core kernels at every batch size. Launchers follow launcher.h: pointers, strides and a stream in, a
// cudaError_t (as int) out, no allocation.
//
//   cuda::LaunchMoeRoute(logits, n_experts, n, bias, params, ids, weights, stream);
//   cuda::MoeExpertsArgs a{...};
//   void* ws = ...;   // cuda::MoeExpertsWorkspaceBytes(a) bytes
//   cuda::LaunchMoeExperts(a, ws, stream);
#pragma once

#include <cstdint>

#include "backend/cuda/launcher.h"
#include "model/moe_route.h"

namespace fathom::cuda {

// logits f32 [n, p.n_experts] (row stride ls); bias f32 [n_experts] or null; ids i32 / weights f32 [n, p.top_k].
int LaunchMoeRoute(const float* logits, int64_t ls, int64_t n, const float* bias, const moe_route::Params& p,
                   int32_t* ids, float* weights, Stream s);

// The pairs the device path takes at most (n_tokens * top_k): decode batches up to 512 sequences of V3's top 8.
constexpr int64_t kMaxMoePairs = 4096;

struct MoeExpertsArgs {
  const float* x;  // [n, hidden], rows xs apart (16-byte aligned, xs % 4 == 0)
  int64_t xs;
  int64_t n, hidden, inter, top_k, n_experts;  // hidden and inter multiples of 16
  const int32_t* ids;                          // [n, top_k] contiguous
  const float* weights;                        // [n, top_k] contiguous
  // Device [3 * n_experts]: the bf16 gate [inter, hidden], up, and down [hidden, inter]. With fp8, the e4m3 ones
  // and then [3 * n_experts] more: their float32 128 x 128 block scales, [ceil(rows / 128), ceil(cols / 128)] each.
  // With int4: [9 * n_experts]: the tiled weights of gate, up and down, then their scales, then their zeros (each
  // [3 * n_experts] in that order); groups of int4_group inputs (0: one group over the row), scales f16 or f32.
  const void* const* table;
  bool fp8 = false;
  bool int4 = false;
  int64_t int4_group = 0;
  int int4_scales_dtype = 0;
  int int4_zero_offset = 0;
  float* out;  // [n, hidden], rows os apart: out += the weighted expert outputs
  int64_t os;
  // Grouped bf16 tensor-core GEMMs (activations rounded to bf16, as GemmBf16 does) instead of float32 GEMVs: for
  // prefill-sized batches. Needs MoeTensorCoresFit.
  bool tensor_cores = false;
  int32_t mma_rows = 0;  // the tiles' rows: 16 or 64 (4-bit: 8, 32 or 64); 0 chooses by pairs per expert
};
bool MoeTensorCoresFit(const MoeExpertsArgs& a);
// 4-bit experts the grouped W4A16 kernels take: hidden and inter multiples of 64, groups of a multiple of 16 inputs.
bool MoeInt4Fits(int64_t hidden, int64_t inter, int64_t group);
int64_t MoeExpertsWorkspaceBytes(const MoeExpertsArgs& a);
// Needs n * top_k <= kMaxMoePairs and n_experts <= moe_route::kMaxExperts.
int LaunchMoeExperts(const MoeExpertsArgs& a, void* workspace, Stream s);

}  // namespace fathom::cuda
