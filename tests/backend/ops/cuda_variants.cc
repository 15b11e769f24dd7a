#include "backend/ops/cuda_variants.h"

#include <fmt/format.h>

#include <limits>

namespace fathom::ops {

void VariantOptions::ApplyTo(CudaBackend& gpu) const {
  gpu.set_kernel_options(kernel);
  cuda::MlaKernelsOf(gpu).set_options(mla);
}

StatusOr<VariantOptions> OptionsForVariant(std::string_view variant) {
  VariantOptions v;
  cuda::KernelOptions& o = v.kernel;
  cuda::MlaKernelOptions& m = v.mla;
  if (variant == "default") return v;
  if (variant == "generic_linear") {
    o.generic_linear = true;  // no 16-byte GEMV, no one-launch LinearFanOut
  } else if (variant == "f32_gemm") {
    o.f32_gemm = true;  // every GEMM on float32 inputs
  } else if (variant == "fp8_gemm") {
    o.fp8_gemm_tokens = 1;  // every f8 linear that fits it as the W8A8 GEMM
  } else if (variant == "gemm_tune") {
    o.gemm_tune = true;
  } else if (variant == "no_split_attention") {
    o.split_attention = false;
  } else if (variant == "no_gqa_attention") {
    o.gqa_attention = false;
  } else if (variant == "no_mma_attention") {
    o.mma_attention = false;
  } else if (variant == "fused_silu") {
    o.fused_silu_staging = true;  // SiluMulLinear's product rounded to bf16 into the GEMM's input
  } else if (variant == "no_fused_silu") {
    o.fused_silu_staging = false;  // SiluMulLinear as its two ops: the f32 product, then the GEMM's staging
  } else if (variant == "gemv_prefetch") {
    o.gemv_prefetch_bytes = 2048;  // each warp's first 2 KiB of weights into L2 before it waits
  } else if (variant == "mla_pipeline") {
    m.decode.pipeline = true;  // MLA's decode kernel with two tiles of rows in flight (the 16-head instance's option)
    m.decode.wide = false;
  } else if (variant == "mla_pipeline_fp8") {
    m.decode.pipeline = true;
    m.decode.wide = false;
    m.decode.fp8 = true;
  } else if (variant == "mla_wide_short") {
    m.decode.wide_min_keys = 0;  // the wide MLA instance at every context length
  } else if (variant == "no_mla_wide") {
    m.decode.wide = false;  // MLA's decode kernel with 16 heads a block at every head count
  } else if (variant == "no_mla_wide_fp8") {
    m.decode.wide = false;
    m.decode.fp8 = true;
  } else if (variant == "mla_fp8") {
    m.decode.fp8 = true;  // the MLA decode kernel on f8 latent caches (the default)
  } else if (variant == "no_mla_fp8") {
    m.decode.fp8 = false;  // f8 latent caches on the paged kernels (FATHOM_CUDA_MLA_FP8=0)
  } else if (variant == "prefill_mma_attention") {
    o.prefill_mma_attention = true;  // prefill batches on the tensor-core flash-attention kernel
  } else if (variant == "no_prefill_mma_attention") {
    o.prefill_mma_attention = false;  // prefill batches on the split decode kernels, one query row a block
  } else if (variant == "attention_one_chunk") {
    o.attention_one_chunk_waves = 1;  // one chunk of keys a token wherever that fills a wave
  } else if (variant == "no_mla_attention") {
    m.decode_kernel = false;
  } else if (variant == "mla_context_plain") {
    m.context_mma = false;
  } else if (variant == "host_moe") {
    o.host_moe = true;
  } else if (variant == "moe_gemv") {
    o.moe_mma_tokens = std::numeric_limits<int64_t>::max();  // grouped GEMVs at every batch size they take
  } else {
    return InvalidArgumentError(fmt::format("no CUDA kernel variant '{}'", variant));
  }
  return v;
}

}  // namespace fathom::ops
