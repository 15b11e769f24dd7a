// CudaBackend's host side of the 4-bit formats (LinearFormat::kAwq, kGptq; format/int4_linear.cc): PrepareLinear's
// in-place repack into int4.h's tile layout (with GPTQ act-order turned into a permutation of the inputs), and
// Linear's paths: the W4A16 tensor-core kernel for decode batches, dequantize-to-bf16 then cuBLASLt for prefill
// batches, and the float32 generic kernel (shapes the tile layout does not fit, bf16 scales, and the exact reference
// path of KernelOptions::f32_gemm / generic_linear).
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <numeric>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/int4.h"
#include "backend/cuda/linear.h"
#include "format/linear_method.h"

namespace fathom {

namespace {

int Dt(const TensorView& t) {
  return static_cast<int>(t.dtype());
}

// What PrepareLinear keeps for a 4-bit weight (shared by every LinearWeight bound to the same memory: the repack is
// in place and must happen once).
struct Int4LinearState {
  bool tiled = false;       // the weight's memory holds the tile layout
  int32_t* perm = nullptr;  // act-order: [K] device, the input each tiled k' reads; or null
  ~Int4LinearState() {
    if (perm != nullptr) cudaFree(perm);
  }
};

cuda::Int4Source SourceOf(const LinearWeight& w) {
  cuda::Int4Source s;
  s.awq = w.format == LinearFormat::kAwq;
  s.qweight = w.weight.data<int32_t>();
  s.qzeros = w.qzeros.data<int32_t>();
  s.scales = w.scales.raw();
  s.scales_dtype = Dt(w.scales);
  s.g_idx = w.g_idx.empty() ? nullptr : w.g_idx.data<int32_t>();
  s.m = w.int4_out;
  s.k = w.int4_in;
  s.groups = w.scales.dim(0);
  s.group = w.group_size;
  s.zero_offset = w.zero_offset;
  return s;
}

cuda::Int4Tiled TiledOf(const LinearWeight& w, const Int4LinearState& st) {
  cuda::Int4Tiled t;
  t.weights = reinterpret_cast<const uint32_t*>(w.weight.raw());
  t.scales = w.scales.raw();
  t.scales_dtype = Dt(w.scales);
  t.zeros = reinterpret_cast<const uint32_t*>(w.qzeros.raw());
  t.perm = st.perm;
  t.m = w.int4_out;
  t.k = w.int4_in;
  t.groups = w.scales.dim(0);
  t.group = w.group_size;
  t.zero_offset = w.zero_offset;
  return t;
}

}  // namespace

Status CudaBackend::PrepareInt4(LinearWeight& w) {
  if (std::shared_ptr<void> st = DerivedState(w.weight.raw())) {  // bound again (tied or shared): already prepared
    w.device_state = std::move(st);
    return OkStatus();
  }
  if (capturing_) return FailedPreconditionError("PrepareLinear cannot run while a graph is captured");
  const std::string name(MethodOf(w.format).name());
  for (const TensorView* t : {&w.weight, &w.qzeros, &w.scales, &w.g_idx}) {
    if (!t->empty() && (!t->is_contiguous() || t->device() != Device::kCuda)) {
      return UnimplementedError(fmt::format("{} weights on the GPU need contiguous device tensors", name));
    }
  }
  const int64_t m = w.int4_out, k = w.int4_in, groups = w.scales.dim(0), group = w.group_size;
  if (int4_counters_ == nullptr) {
    const size_t bytes = static_cast<size_t>(cuda::kInt4MaxCounters) * sizeof(int);
    if (cudaMalloc(&int4_counters_, bytes) != cudaSuccess) {
      cudaGetLastError();
      int4_counters_ = nullptr;
      return ResourceExhaustedError("PrepareLinear: cudaMalloc of the 4-bit kernels' counters");
    }
    FATHOM_RETURN_IF_ERROR(CudaStatus(cudaMemset(int4_counters_, 0, bytes), "4-bit counters"));
  }
  auto state = std::make_shared<Int4LinearState>();
  bool fits =
      cuda::Int4TileFits(m, k, groups, group) && (w.scales.dtype() == DType::kF16 || w.scales.dtype() == DType::kF32);
  // GPTQ act-order: g_idx not k / group. Its groups, read in g_idx order, are whole runs of `group` inputs (as GPTQ
  // writes them), so the tiled weight takes its inputs in that order and x is read through the permutation.
  std::vector<int32_t> perm;
  if (!w.g_idx.empty()) {
    std::vector<int32_t> g(static_cast<size_t>(k));
    FATHOM_RETURN_IF_ERROR(CopyToHost(w.g_idx, g.data()));
    bool trivial = true;
    for (int64_t i = 0; i < k; ++i) {
      const int32_t gi = g[static_cast<size_t>(i)];
      if (gi < 0 || gi >= groups) {
        return InvalidArgumentError(
            fmt::format("a {} layer's g_idx: input {} is in group {}, outside [0, {})", name, i, gi, groups));
      }
      trivial = trivial && gi == i / group;
    }
    if (!trivial && fits) {
      perm.resize(static_cast<size_t>(k));
      std::iota(perm.begin(), perm.end(), 0);
      std::stable_sort(perm.begin(), perm.end(),
                       [&](int32_t a, int32_t b) { return g[static_cast<size_t>(a)] < g[static_cast<size_t>(b)]; });
      for (int64_t i = 0; i < k && fits; ++i) fits = g[static_cast<size_t>(perm[static_cast<size_t>(i)])] == i / group;
    }
  }
  if (fits) {
    const size_t w_bytes = w.weight.nbytes(), s_bytes = w.scales.nbytes(), z_bytes = w.qzeros.nbytes();
    char* tmp = nullptr;
    if (cudaMalloc(&tmp, w_bytes + s_bytes + z_bytes) != cudaSuccess) {
      cudaGetLastError();
      return ResourceExhaustedError(
          fmt::format("PrepareLinear: cudaMalloc of {} bytes to repack a {} layer", w_bytes + s_bytes + z_bytes, name));
    }
    cudaStream_t s = static_cast<cudaStream_t>(stream_);
    Status st;
    if (!perm.empty()) {
      st = CudaStatus(cudaMalloc(&state->perm, perm.size() * sizeof(int32_t)), "act-order permutation");
      if (st.ok()) {
        st = CudaStatus(
            cudaMemcpyAsync(state->perm, perm.data(), perm.size() * sizeof(int32_t), cudaMemcpyHostToDevice, s),
            "act-order permutation");
      }
    }
    if (st.ok()) {
      st = CudaStatus((cuda::LaunchRepackInt4(SourceOf(w), state->perm, reinterpret_cast<uint32_t*>(tmp), tmp + w_bytes,
                                              reinterpret_cast<uint32_t*>(tmp + w_bytes + s_bytes), stream_)),
                      "4-bit repack");
    }
    // The tile layout takes exactly the checkpoint's bytes: copy it over them.
    if (st.ok()) st = CudaStatus(cudaMemcpyAsync(w.weight.raw(), tmp, w_bytes, cudaMemcpyDeviceToDevice, s), "repack");
    if (st.ok()) {
      st = CudaStatus(cudaMemcpyAsync(w.scales.raw(), tmp + w_bytes, s_bytes, cudaMemcpyDeviceToDevice, s), "repack");
    }
    if (st.ok()) {
      st = CudaStatus(cudaMemcpyAsync(w.qzeros.raw(), tmp + w_bytes + s_bytes, z_bytes, cudaMemcpyDeviceToDevice, s),
                      "repack");
    }
    const Status synced = CudaStatus(cudaStreamSynchronize(s), "repack");
    cudaFree(tmp);
    FATHOM_RETURN_IF_ERROR(st);
    FATHOM_RETURN_IF_ERROR(synced);
    state->tiled = true;
  }
  SetDerivedState(w.weight.raw(), state);
  w.device_state = std::move(state);
  return OkStatus();
}

void CudaBackend::LinearInt4(const TensorView& x, const LinearWeight& w, const TensorView& out) {
  const int64_t n = x.dim(0), k = x.dim(1), m = w.out_features();
  FATHOM_CHECK(out.stride(1) == 1, "a 4-bit linear's output with a column stride of {}", out.stride(1));
  std::shared_ptr<void> held = w.device_state != nullptr ? w.device_state : DerivedState(w.weight.raw());
  const auto* st = static_cast<const Int4LinearState*>(held.get());
  const void* bias = w.bias.empty() ? nullptr : w.bias.raw();
  const int bias_dt = w.bias.empty() ? 0 : Dt(w.bias);
  if (st == nullptr || !st->tiled) {  // the checkpoint's layout (never prepared, or a shape the tiles do not fit)
    FATHOM_CHECK(x.stride(1) == 1, "a 4-bit linear's input with a column stride of {}", x.stride(1));
    Launch("LinearInt4Generic", [&] {
      return cuda::LaunchInt4Generic(x.data<float>(), x.stride(0), n, SourceOf(w), bias, bias_dt, out.data<float>(),
                                     out.stride(0), stream_);
    });
    return;
  }
  const cuda::Int4Tiled tiled = TiledOf(w, *st);
  const bool aligned = x.stride(1) == 1 && x.stride(0) % 4 == 0 && reinterpret_cast<uintptr_t>(x.raw()) % 16 == 0;
  if (options_.f32_gemm || options_.generic_linear || !aligned) {
    FATHOM_CHECK(x.stride(1) == 1, "a 4-bit linear's input with a column stride of {}", x.stride(1));
    Launch("LinearInt4Generic", [&] {
      return cuda::LaunchInt4GenericTiled(x.data<float>(), x.stride(0), n, tiled, bias, bias_dt, out.data<float>(),
                                          out.stride(0), stream_);
    });
    return;
  }
  // Never while a graph is captured: each captured layer would keep a dequantized copy of its weight in the arena.
  if (n > options_.int4_gemm_tokens && gemm_ != nullptr && !capturing_) {
    // Prefill: x (through the act-order permutation) and W as bf16 in the workspace, then the bf16 GEMM.
    const size_t xb_bytes = static_cast<size_t>((n * k * 2 + 255) / 256 * 256);
    char* ws = static_cast<char*>(Workspace(xb_bytes + static_cast<size_t>(m * k * 2)));
    if (ws != nullptr) {
      // x rounded to bf16 as the dense path stages it, or gathered through the act-order permutation.
      Launch(st->perm != nullptr ? "GatherToBf16" : "ToBf16", [&] {
        return st->perm != nullptr ? cuda::LaunchGatherToBf16(x.data<float>(), x.stride(0), n, k, st->perm, ws, stream_)
                                   : cuda::LaunchToBf16(x.data<float>(), x.stride(0), n, k, ws, stream_);
      });
      Launch("DequantInt4", [&] { return cuda::LaunchDequantInt4(tiled, ws + xb_bytes, stream_); });
      GemmFromStaged(ws, n, k, w, out, ws + xb_bytes);
      return;
    }
  }
  int splits = cuda::Int4MmaSplits(m, k, n, sm_count_);
  float* partial = nullptr;
  if (splits > 1) {
    partial = static_cast<float*>(Workspace(static_cast<size_t>(splits * n * m) * sizeof(float)));
    if (partial == nullptr) splits = 1;
  }
  Launch("LinearInt4", [&] {
    return cuda::LaunchInt4Mma(x.data<float>(), x.stride(0), n, tiled, bias, bias_dt, out.data<float>(), out.stride(0),
                               partial, int4_counters_, splits, stream_);
  });
}

}  // namespace fathom
