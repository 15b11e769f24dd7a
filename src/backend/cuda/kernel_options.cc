#include "backend/cuda/kernel_options.h"

#include <atomic>
#include <cstdlib>
#include <string_view>

#include "backend/cuda/launcher.h"

namespace fathom::cuda {

namespace {
std::atomic<bool> g_programmatic_launch{true};
}  // namespace

void SetProgrammaticLaunch(bool on) {
  g_programmatic_launch.store(on, std::memory_order_relaxed);
}
bool ProgrammaticLaunch() {
  return g_programmatic_launch.load(std::memory_order_relaxed);
}

KernelOptions KernelOptions::FromEnvironment() {
  const auto set = [](const char* name) { return std::getenv(name) != nullptr; };
  KernelOptions o;
  o.generic_linear = set("FATHOM_CUDA_GENERIC_LINEAR");
  o.f32_gemm = set("FATHOM_CUDA_F32_GEMM");
  if (const char* v = std::getenv("FATHOM_CUDA_FP8_GEMM_TOKENS")) o.fp8_gemm_tokens = std::atoll(v);
  if (const char* v = std::getenv("FATHOM_CUDA_GEMM_TUNE")) o.gemm_tune = std::string_view(v) == "1";
  o.split_attention = !set("FATHOM_CUDA_NO_SPLIT_ATTENTION");
  o.gqa_attention = !set("FATHOM_CUDA_NO_GQA_ATTENTION");
  o.mma_attention = !set("FATHOM_CUDA_NO_MMA_ATTENTION");
  o.mla_attention = !set("FATHOM_CUDA_NO_MLA_ATTENTION");
  if (const char* v = std::getenv("FATHOM_CUDA_MLA_CONTEXT_MMA")) o.mla_context_mma = std::string_view(v) != "0";
  o.host_moe = set("FATHOM_CUDA_HOST_MOE");
  if (const char* v = std::getenv("FATHOM_CUDA_MOE_MMA_TOKENS")) o.moe_mma_tokens = std::atoll(v);
  if (const char* v = std::getenv("FATHOM_CUDA_INT4_GEMM_TOKENS")) o.int4_gemm_tokens = std::atoll(v);
  o.profile = set("FATHOM_CUDA_PROFILE");
  o.pdl = !set("FATHOM_CUDA_NO_PDL");
  if (const char* v = std::getenv("FATHOM_CUDA_ATTENTION_ONE_CHUNK_WAVES")) {
    o.attention_one_chunk_waves = std::atoll(v);
  }
  if (const char* v = std::getenv("FATHOM_CUDA_GEMV_PREFETCH_BYTES")) o.gemv_prefetch_bytes = std::atoll(v);
  if (const char* v = std::getenv("FATHOM_CUDA_FUSED_SILU")) o.fused_silu_staging = std::string_view(v) == "1";
  if (const char* v = std::getenv("FATHOM_CUDA_MLA_FP8")) o.mla_fp8 = std::string_view(v) == "1";  // default on
  if (const char* v = std::getenv("FATHOM_CUDA_MLA_PIPELINE")) o.mla_pipeline = std::string_view(v) == "1";
  if (const char* v = std::getenv("FATHOM_CUDA_MLA_WIDE")) o.mla_wide = std::string_view(v) == "1";  // default on
  if (const char* v = std::getenv("FATHOM_CUDA_PREFILL_MMA_ATTENTION")) {
    o.prefill_mma_attention = std::string_view(v) == "1";
  }
  return o;
}

}  // namespace fathom::cuda
