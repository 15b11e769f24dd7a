// The CUDA backend's kernel switches: which variant of an op runs (for measurements, for the exact float32 reference
// path, for the tests that compare variants), all in one struct with defaults equal to the backend's normal
// behaviour. GQA's paged attention reads its switches here; a layout with kernels of its own keeps its switches in
// its provider (MLA's: attention_mla.h, MlaKernelOptions). KernelOptions::FromEnvironment reads the FATHOM_CUDA_*
// variables below, once, when CudaBackend::Create makes a backend; the launchers get what they need as parameters and
// never read the environment.
//
//   cuda::KernelOptions o = gpu->kernel_options();
//   o.f32_gemm = true;                  // every GEMM on float32 inputs
//   gpu->set_kernel_options(o);
//
// Every variable is read one way (core/env.h): a switch takes 1/true/on/yes or 0/false/off/no (any case), a number
// a decimal integer, and any other value makes CudaBackend::Create fail naming the variable. A FATHOM_CUDA_NO_*
// switch set true turns its feature off. Unset or empty: the default.
//
// Variable                           Field             Default  What it does
// FATHOM_CUDA_GENERIC_LINEAR         generic_linear    false    every Linear on the generic kernel (no 16-byte GEMV,
//                                                               no one-launch LinearFanOut): to measure one against
//                                                               the other
// FATHOM_CUDA_F32_GEMM               f32_gemm          false    every GEMM on float32 inputs (no cuBLASLt bf16 GEMM,
//                                                               no f8 dequantize-then-GEMM or W8A8, no MoE tensor
//                                                               cores): the exact reference path
// FATHOM_CUDA_FP8_GEMM_TOKENS=N      fp8_gemm_tokens   0 (off)  f8 linears of N or more tokens as cuBLASLt's
//                                                               block-scaled FP8 GEMM on activations quantized per
//                                                               token and 128 columns (W8A8, opt-in); N <= 0: off
// FATHOM_CUDA_GEMM_TUNE=1            gemm_tune         false    prefill-sized cuBLASLt GEMMs (n >= 64) time the top 8
//                                                               heuristics once per shape and keep the fastest
// FATHOM_CUDA_NO_SPLIT_ATTENTION     split_attention   true     false: the paged kernels always one block per (token,
//                                                               head), never split-K
// FATHOM_CUDA_NO_GQA_ATTENTION       gqa_attention     true     false: no GQA-packed split kernel (per-head chunks)
// FATHOM_CUDA_NO_MMA_ATTENTION       mma_attention     true     false: no tensor-core split kernel for 16-bit caches
// FATHOM_CUDA_HOST_MOE               host_moe          false    MoeExperts always on the host-sorted path
// FATHOM_CUDA_MOE_MMA_TOKENS=N       moe_mma_tokens    8        routed experts of batches of N tokens or more as
//                                                               grouped tensor-core GEMMs, smaller ones as grouped
//                                                               GEMVs
// FATHOM_CUDA_INT4_GEMM_TOKENS=N     int4_gemm_tokens  256      4-bit linears of more than N tokens dequantized to
//                                                               bf16 for cuBLASLt; up to N (and in captured graphs)
//                                                               on the W4A16 tensor-core kernel. 256: every decode
//                                                               graph's batch
// FATHOM_CUDA_PROFILE                profile           false    every launch timed with CUDA events (ProfileReport);
//                                                               no CUDA graphs then
// FATHOM_CUDA_NO_PDL                 pdl               true     false: kernels launched without programmatic
//                                                               dependent launch (launch.cuh; process-wide)
// FATHOM_CUDA_ATTENTION_ONE_CHUNK_WAVES=N                      the tensor-core attention kernel keeps one chunk of
//                                    attention_one_chunk_waves  keys a token when its grid fills N waves of resident
//                                                      0 (off)  blocks without splitting; 0: the wave rule always
//                                                               (attention_mma.cu)
// FATHOM_CUDA_GEMV_PREFETCH_BYTES=N  gemv_prefetch_bytes  0     each GEMV warp takes the first N bytes of its weight
//                                                      (off)    row into L2 before waiting on the kernel before
//                                                               (linear.h); 0: none
// FATHOM_CUDA_FUSED_SILU=0           fused_silu_staging true    SiluMulLinear on cuBLASLt rounds silu(gate) * up to
//                                                               bf16 straight into the GEMM's input (one pass, no
//                                                               float32 product; the same values); off: the two ops
// FATHOM_CUDA_PREFILL_MMA_ATTENTION=0 prefill_mma_attention    batches of 16 or more query rows a sequence (on
//                                                     true     average) take the tensor-core flash-attention prefill
//                                                              kernel where it fits (attention.h); off: the split
//                                                              decode kernels then
#pragma once

#include <cstdint>

#include "core/status.h"

namespace fathom::cuda {

struct KernelOptions {
  static constexpr int64_t kDefaultMoeMmaTokens = 8;
  static constexpr int64_t kDefaultInt4GemmTokens = 256;

  bool generic_linear = false;
  bool f32_gemm = false;
  int64_t fp8_gemm_tokens = 0;
  bool gemm_tune = false;
  bool split_attention = true;
  bool gqa_attention = true;
  bool mma_attention = true;
  bool host_moe = false;
  int64_t moe_mma_tokens = kDefaultMoeMmaTokens;
  int64_t int4_gemm_tokens = kDefaultInt4GemmTokens;
  bool profile = false;
  bool pdl = true;
  int64_t attention_one_chunk_waves = 0;
  int64_t gemv_prefetch_bytes = 0;
  bool fused_silu_staging = true;
  bool prefill_mma_attention = true;

  // The defaults, changed by the FATHOM_CUDA_* variables that are set (the table above); kInvalidArgument naming a
  // variable whose value is not a switch (1/true/on/yes, 0/false/off/no) or a decimal integer (core/env.h).
  static StatusOr<KernelOptions> FromEnvironment();
};

}  // namespace fathom::cuda
