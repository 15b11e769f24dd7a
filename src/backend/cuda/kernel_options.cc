#include "backend/cuda/kernel_options.h"

#include <array>
#include <atomic>
#include <mutex>
#include <optional>

#include "backend/cuda/launcher.h"
#include "core/check.h"
#include "core/env.h"

namespace fathom::cuda {

namespace {

// The streams whose backend turned programmatic launch off: a few entries at most (one a backend with
// KernelOptions::pdl false), read at every launch without a lock, written under one.
struct PdlOffStreams {
  static constexpr int kSlots = 64;
  std::mutex write;
  std::atomic<int> used{0};  // slots [0, used) have been written; a cleared slot holds null
  std::array<std::atomic<Stream>, kSlots> streams{};
};

PdlOffStreams& Off() {
  static PdlOffStreams* off = new PdlOffStreams();  // never destroyed: launches may come during static destruction
  return *off;
}

}  // namespace

void SetProgrammaticLaunch(Stream stream, bool on) {
  if (stream == nullptr) return;
  PdlOffStreams& off = Off();
  std::lock_guard<std::mutex> lock(off.write);
  const int used = off.used.load(std::memory_order_relaxed);
  int free_slot = -1;
  for (int i = 0; i < used; ++i) {
    const Stream s = off.streams[i].load(std::memory_order_relaxed);
    if (s == stream) {
      if (on) off.streams[i].store(nullptr, std::memory_order_release);
      return;
    }
    if (s == nullptr && free_slot < 0) free_slot = i;
  }
  if (on) return;
  if (free_slot < 0) {
    FATHOM_CHECK(used < PdlOffStreams::kSlots, "more than 64 CUDA streams with programmatic launch off");
    free_slot = used;
    off.used.store(used + 1, std::memory_order_release);
  }
  off.streams[free_slot].store(stream, std::memory_order_release);
}

void ForgetProgrammaticLaunch(Stream stream) {
  SetProgrammaticLaunch(stream, true);
}

bool ProgrammaticLaunch(Stream stream) {
  const PdlOffStreams& off = Off();
  const int used = off.used.load(std::memory_order_acquire);
  for (int i = 0; i < used; ++i) {
    if (off.streams[i].load(std::memory_order_acquire) == stream) return false;
  }
  return true;
}

StatusOr<KernelOptions> KernelOptions::FromEnvironment() {
  KernelOptions o;
  // Every variable through core/env.h: switches take 1/true/on/yes or 0/false/off/no, numbers a decimal integer,
  // and anything else is refused by name (FATHOM_CUDA_FUSED_SILU=true used to turn the feature off).
  const auto flag = [](const char* name, bool& field, bool invert = false) -> Status {
    FATHOM_ASSIGN_OR_RETURN(const std::optional<bool> v, EnvSwitch(name));
    if (v) field = invert ? !*v : *v;
    return OkStatus();
  };
  const auto number = [](const char* name, int64_t& field) -> Status {
    FATHOM_ASSIGN_OR_RETURN(const std::optional<int64_t> v, EnvInteger(name));
    if (v) field = *v;
    return OkStatus();
  };
  FATHOM_RETURN_IF_ERROR(flag("FATHOM_CUDA_GENERIC_LINEAR", o.generic_linear));
  FATHOM_RETURN_IF_ERROR(flag("FATHOM_CUDA_F32_GEMM", o.f32_gemm));
  FATHOM_RETURN_IF_ERROR(number("FATHOM_CUDA_FP8_GEMM_TOKENS", o.fp8_gemm_tokens));
  FATHOM_RETURN_IF_ERROR(flag("FATHOM_CUDA_GEMM_TUNE", o.gemm_tune));
  FATHOM_RETURN_IF_ERROR(flag("FATHOM_CUDA_NO_SPLIT_ATTENTION", o.split_attention, /*invert=*/true));
  FATHOM_RETURN_IF_ERROR(flag("FATHOM_CUDA_NO_GQA_ATTENTION", o.gqa_attention, /*invert=*/true));
  FATHOM_RETURN_IF_ERROR(flag("FATHOM_CUDA_NO_MMA_ATTENTION", o.mma_attention, /*invert=*/true));
  FATHOM_RETURN_IF_ERROR(flag("FATHOM_CUDA_HOST_MOE", o.host_moe));
  FATHOM_RETURN_IF_ERROR(number("FATHOM_CUDA_MOE_MMA_TOKENS", o.moe_mma_tokens));
  FATHOM_RETURN_IF_ERROR(number("FATHOM_CUDA_INT4_GEMM_TOKENS", o.int4_gemm_tokens));
  FATHOM_RETURN_IF_ERROR(flag("FATHOM_CUDA_PROFILE", o.profile));
  FATHOM_RETURN_IF_ERROR(flag("FATHOM_CUDA_NO_PDL", o.pdl, /*invert=*/true));
  FATHOM_RETURN_IF_ERROR(number("FATHOM_CUDA_ATTENTION_ONE_CHUNK_WAVES", o.attention_one_chunk_waves));
  FATHOM_RETURN_IF_ERROR(number("FATHOM_CUDA_GEMV_PREFETCH_BYTES", o.gemv_prefetch_bytes));
  FATHOM_RETURN_IF_ERROR(flag("FATHOM_CUDA_FUSED_SILU", o.fused_silu_staging));
  FATHOM_RETURN_IF_ERROR(flag("FATHOM_CUDA_PREFILL_MMA_ATTENTION", o.prefill_mma_attention));
  return o;
}

}  // namespace fathom::cuda
