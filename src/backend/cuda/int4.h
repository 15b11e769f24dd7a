// The 4-bit weight kernels (AWQ and GPTQ, LinearFormat::kAwq / kGptq; format/int4_linear.cc has the checkpoint layouts
// and the reference rule W[n, k] = (q[k, n] - (z[g, n] + zero_offset)) * s[g, n]). Launchers follow launcher.h.
//
// Weights that fit the tile layout below are repacked into it once, in place (LaunchRepackInt4, at PrepareLinear):
// then decode batches run LaunchInt4Mma (LaunchInt4MmaParts: several weights of one x in one launch), W4A16 on
// mma.m16n8k16 tensor cores in the manner of Marlin (codes turned into bf16 in registers, float32 accumulation,
// scales applied per group to the accumulators; stream-K over 128-row groups, or up to 8 tokens split-K within a
// block, int4.cu), and prefill batches
// dequantize to bf16 (LaunchDequantInt4) for the cuBLASLt GEMM. Other shapes run LaunchInt4Generic on the
// checkpoint's own layout.
//
//   int err = cuda::LaunchRepackInt4(src, layout, scratch, stream);          // once per weight
//   err = cuda::LaunchInt4Mma(x, /*x_bf16=*/false, xs, n, tiled, bias, bias_dt, out, os, scratch,
//                             cuda::kInt4MmaScratchFloats, counters, sm_count, stream);
//
// The tile layout (M outputs, K inputs, G groups of `group` inputs; k' an input in tiled order: the checkpoint's
// input perm[k'] for GPTQ act-order, else k' itself; codes q and zeros z as stored):
//   weights u32 [M / 16][K / 64][32 lanes][4 tiles]: for r0 = 16 * rb + lane / 4, r1 = r0 + 8 and
//     kk = 64 * chunk + 16 * tile + 4 * (lane % 4), nibbles 0..7 (bits 4i..4i+3) hold
//     q(r0, kk), q(r1, kk), q(r0, kk + 2), q(r1, kk + 2), q(r0, kk + 1), q(r1, kk + 1), q(r0, kk + 3), q(r1, kk + 3):
//     a lane's mma A fragment of one 16 x 16 tile, with the tile's inputs ordered so that its B fragment is the four
//     consecutive inputs kk..kk + 3.
//   scales [M / 16][G][16] (f16 or f32): s(16 * rb + i, g).
//   zeros u32 [M / 16][G][2]: nibble i of word h is z(16 * rb + 8 * h + i, g).
// It fits when M % 16 == 0, K % 64 == 0, and group % 16 == 0 or G == 1; the three arrays take exactly the bytes of
// qweight, scales and qzeros, which is why the repack can be in place.
#pragma once

#include <cstdint>

#include "backend/cuda/launcher.h"

namespace fathom::cuda {

// A 4-bit weight in the checkpoint's layout (AWQ: qweight [K, M / 8] in AWQ's nibble order, qzeros [G, M / 8] the
// same; GPTQ: qweight [K / 8, M], qzeros [G, M / 8]; scales [G, M]; g_idx [K] or null), all contiguous.
struct Int4Source {
  bool awq = false;
  const int32_t* qweight = nullptr;
  const int32_t* qzeros = nullptr;
  const void* scales = nullptr;
  int scales_dtype = 0;            // f16, bf16 or f32 (generic); f16 or f32 (repack)
  const int32_t* g_idx = nullptr;  // GPTQ: the group of each input, or null (k / group)
  int64_t m = 0, k = 0, groups = 0, group = 0;
  int zero_offset = 0;
};

// A weight in the tile layout.
struct Int4Tiled {
  const uint32_t* weights = nullptr;
  const void* scales = nullptr;
  int scales_dtype = 0;  // f16 or f32
  const uint32_t* zeros = nullptr;
  const int32_t* perm = nullptr;  // [K]: the input of x each tiled k' reads, or null (k' itself)
  int64_t m = 0, k = 0, groups = 0, group = 0;
  int zero_offset = 0;
};

bool Int4TileFits(int64_t m, int64_t k, int64_t groups, int64_t group);

// Writes src in the tile layout to dst_weights (src's qweight bytes), dst_scales (scales' bytes, src's dtype) and
// dst_zeros (qzeros' bytes); perm (device, [K]) or null as in Int4Tiled.
int LaunchRepackInt4(const Int4Source& src, const int32_t* perm, uint32_t* dst_weights, void* dst_scales,
                     uint32_t* dst_zeros, Stream s);

// out[t, r] = sum_k x[t, k] W[r, k] + bias[r] on tensor cores, any n (8 to 64 tokens per pass over the weights;
// float32 x of up to kInt4GemvTokens tokens, on launches of at most kInt4GemvMaxWeights weights, takes a GEMV-like
// kernel that splits each row block's K among the warps of one block, with no partial sums through scratch):
// x float32 [n, K] (rows xs apart, xs % 4 == 0, 16-byte aligned), rounded to bf16 and read through w.perm; or, with
// x_bf16, x already rounded and in tiled order ([n, K] bf16, xs % 8 == 0, 16-byte aligned; w.perm unused). Blocks
// share row groups' K (stream-K) through `scratch` (float32, scratch_floats of it; kInt4MmaScratchFloats is enough
// for any shape) and `counters` (kInt4MaxCounters zeroed ints, left zeroed); with scratch null, one block a 128-row
// group and no partial sums. sm_count: the GPU's multiprocessors, which size the grid (one wave).
int LaunchInt4Mma(const void* x, bool x_bf16, int64_t xs, int64_t n, const Int4Tiled& w, const void* bias,
                  int bias_dtype, float* out, int64_t os, float* scratch, int64_t scratch_floats, int* counters,
                  int sm_count, Stream s);
constexpr int64_t kInt4MaxCounters = 1 << 16;
constexpr int kInt4GemvTokens = 8;
// Measured on the H200 (bench/results/2026-12-04-int4-close.json): the GEMV-like kernel is faster than stream-K on
// V2-Lite's linears (2048 x 2816 and smaller: 7.4 against 11.6 us on 1408 x 2048) and slower from Qwen-7B's o_proj
// (3584 x 3584: 13.9 against 12.4 us) up (gate/up 56.0 against 44.7).
constexpr int64_t kInt4GemvMaxWeights = int64_t{8} << 20;
constexpr int64_t kInt4MmaScratchFloats = 8ll << 20;  // 32 MiB

// Up to kInt4MaxParts weights that share x (q/k/v, gate/up) in one launch of the kernel above: each part its own
// output; all with part 0's K, group, scale dtype, zero offset and permutation.
struct Int4MmaPart {
  Int4Tiled w;
  const void* bias = nullptr;
  int bias_dtype = 0;
  float* out = nullptr;
  int64_t os = 0;
};
constexpr int kInt4MaxParts = 4;
int LaunchInt4MmaParts(const void* x, bool x_bf16, int64_t xs, int64_t n, const Int4MmaPart* parts, int count,
                       float* scratch, int64_t scratch_floats, int* counters, int sm_count, Stream s);

// dst bf16 [M, K] (row-major, inputs in tiled order) = the tiled weight's values, rounded to nearest even.
int LaunchDequantInt4(const Int4Tiled& w, void* dst, Stream s);
// dst bf16 [rows, K] = x[r, perm[k']] (x float32, rows xs apart), rounded: the inputs of a tiled act-order weight
// (without a permutation, linear.h's LaunchToBf16 stages them).
int LaunchGatherToBf16(const float* x, int64_t xs, int64_t rows, int64_t k, const int32_t* perm, void* dst, Stream s);

// out[t, r] = sum_k x[t, k] W[r, k] + bias[r] in float32 (slow; as exact as the CPU's), from the checkpoint's
// layout (any shape) or from the tile layout.
int LaunchInt4Generic(const float* x, int64_t xs, int64_t n, const Int4Source& w, const void* bias, int bias_dtype,
                      float* out, int64_t os, Stream s);
int LaunchInt4GenericTiled(const float* x, int64_t xs, int64_t n, const Int4Tiled& w, const void* bias, int bias_dtype,
                           float* out, int64_t os, Stream s);

}  // namespace fathom::cuda
