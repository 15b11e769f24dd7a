// CudaBackend's host side of the 4-bit formats (LinearFormat::kAwq, kGptq; format/int4_linear.cc): PrepareLinear's
// in-place repack into int4.h's tile layout (with GPTQ act-order turned into a permutation of the inputs), and
// Linear's paths: the W4A16 tensor-core kernel for decode batches, dequantize-to-bf16 then cuBLASLt for prefill
// batches, and the float32 generic kernel (shapes the tile layout does not fit, bf16 scales, and the exact reference
// path of KernelOptions::f32_gemm / generic_linear); and the device table of a MoE layer's 4-bit experts for moe.h's
// grouped W4A16 kernels.
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <numeric>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/int4.h"
#include "backend/cuda/linear.h"
#include "backend/cuda/moe.h"
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
  // The W4A16 kernel's counters, partial-sum scratch and bf16 staging of x: one of each for every 4-bit layer (their
  // kernels run one after another on the stream), allocated before any graph captures their pointers.
  if (int4_counters_ == nullptr) {
    const size_t bytes = static_cast<size_t>(cuda::kInt4MaxCounters) * sizeof(int);
    if (cudaMalloc(&int4_counters_, bytes) != cudaSuccess) {
      cudaGetLastError();
      int4_counters_ = nullptr;
      return ResourceExhaustedError("PrepareLinear: cudaMalloc of the 4-bit kernels' counters");
    }
    FATHOM_RETURN_IF_ERROR(CudaStatus(cudaMemset(int4_counters_, 0, bytes), "4-bit counters"));
  }
  if (int4_scratch_ == nullptr) {
    const size_t bytes = static_cast<size_t>(cuda::kInt4MmaScratchFloats) * sizeof(float);
    if (cudaMalloc(&int4_scratch_, bytes) != cudaSuccess) {
      cudaGetLastError();
      int4_scratch_ = nullptr;  // the kernel then runs without partial sums
    }
  }
  const size_t stage_bytes =
      static_cast<size_t>(std::clamp<int64_t>(options_.int4_gemm_tokens, kInt4StageMinTokens, 1024) * k * 2);
  if (stage_bytes > int4_stage_bytes_ && graphs_.empty()) {
    void* p = nullptr;
    if (cudaMalloc(&p, stage_bytes) == cudaSuccess) {
      if (int4_stage_ != nullptr) cudaFree(int4_stage_);
      int4_stage_ = p;
      int4_stage_bytes_ = stage_bytes;
    } else {
      cudaGetLastError();  // decode batches then read x as float32
    }
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
  const cuda::Int4MmaPart part{tiled, bias, bias_dt, out.data<float>(), out.stride(0)};
  Int4Mma(x, st->perm, &part, 1);
}

void CudaBackend::Int4Mma(const TensorView& x, const int32_t* perm, const cuda::Int4MmaPart* parts, int count) {
  const int64_t n = x.dim(0), k = x.dim(1);
  // Batches past kInt4StageMinTokens tokens: x rounded to bf16 (through the act-order permutation) once, for every
  // block of the kernel to stage directly; smaller ones are rounded by the kernel as it stages them.
  const bool stage =
      n > kInt4StageMinTokens && int4_stage_ != nullptr && static_cast<size_t>(n * k * 2) <= int4_stage_bytes_;
  if (stage) {
    Launch(perm != nullptr ? "GatherToBf16" : "ToBf16", [&] {
      return perm != nullptr ? cuda::LaunchGatherToBf16(x.data<float>(), x.stride(0), n, k, perm, int4_stage_, stream_)
                             : cuda::LaunchToBf16(x.data<float>(), x.stride(0), n, k, int4_stage_, stream_);
    });
  }
  Launch(count > 1 ? "LinearInt4FanOut" : "LinearInt4", [&] {
    return cuda::LaunchInt4MmaParts(stage ? int4_stage_ : x.raw(), stage, stage ? k : x.stride(0), n, parts, count,
                                    int4_scratch_, cuda::kInt4MmaScratchFloats, int4_counters_, sm_count_, stream_);
  });
}

bool CudaBackend::LinearInt4FanOut(const TensorView& x, std::span<const LinearWeight> ws,
                                   std::span<const TensorView> outs) {
  const int64_t n = x.dim(0), k = x.dim(1);
  if (ws.size() < 2 || ws.size() > static_cast<size_t>(cuda::kInt4MaxParts) || options_.f32_gemm ||
      options_.generic_linear) {
    return false;
  }
  // The prefill path (dequantize, then cuBLASLt) is one weight at a time.
  if (n > options_.int4_gemm_tokens && gemm_ != nullptr && !capturing_) return false;
  if (x.stride(1) != 1 || x.stride(0) % 4 != 0 || reinterpret_cast<uintptr_t>(x.raw()) % 16 != 0) return false;
  std::array<cuda::Int4MmaPart, cuda::kInt4MaxParts> parts{};
  std::array<std::shared_ptr<void>, cuda::kInt4MaxParts> held;
  for (size_t i = 0; i < ws.size(); ++i) {
    const LinearWeight& w = ws[i];
    if (!w.int4() || w.in_features() != k || outs[i].stride(1) != 1 || outs[i].dim(1) != w.out_features()) {
      return false;
    }
    held[i] = w.device_state != nullptr ? w.device_state : DerivedState(w.weight.raw());
    const auto* st = static_cast<const Int4LinearState*>(held[i].get());
    if (st == nullptr || !st->tiled || st->perm != nullptr) return false;  // act-order: each weight its own order
    parts[i] = {TiledOf(w, *st), w.bias.empty() ? nullptr : w.bias.raw(), w.bias.empty() ? 0 : Dt(w.bias),
                outs[i].data<float>(), outs[i].stride(0)};
    const cuda::Int4Tiled& a = parts[i].w;
    const cuda::Int4Tiled& b = parts[0].w;
    if (a.group != b.group || a.scales_dtype != b.scales_dtype || a.zero_offset != b.zero_offset) return false;
  }
  Int4Mma(x, nullptr, parts.data(), static_cast<int>(ws.size()));
  return true;
}

Status CudaBackend::PrepareInt4Experts(ExpertSet& experts) {
  const size_t e = experts.gate.size();
  const LinearWeight& g0 = experts.gate[0];
  const LinearWeight& d0 = experts.down[0];
  const int64_t inter = g0.out_features(), hidden = g0.in_features();
  // One group a row in every matrix (each its own group_size, K), or one group size throughout.
  const auto one_group = [](const LinearWeight& w) { return w.scales.dim(0) == 1; };
  const int64_t group = g0.group_size == d0.group_size ? g0.group_size : 0;
  if (!cuda::MoeInt4Fits(hidden, inter, group) ||
      (g0.scales.dtype() != DType::kF16 && g0.scales.dtype() != DType::kF32)) {
    return OkStatus();  // the host path, one expert at a time
  }
  const auto fits = [&](const LinearWeight& w, int64_t out, int64_t in) {
    if (w.format != g0.format || !w.bias.empty() || w.out_features() != out || w.in_features() != in ||
        w.scales.dtype() != g0.scales.dtype() || w.zero_offset != g0.zero_offset ||
        (group == 0 ? !one_group(w) : w.group_size != group)) {
      return false;
    }
    std::shared_ptr<void> held = w.device_state != nullptr ? w.device_state : DerivedState(w.weight.raw());
    const auto* st = static_cast<const Int4LinearState*>(held.get());
    return st != nullptr && st->tiled && st->perm == nullptr;  // act-order: each expert its own input order
  };
  std::vector<const void*> table(9 * e);
  for (size_t i = 0; i < e; ++i) {
    const LinearWeight* parts[3] = {&experts.gate[i], &experts.up[i], &experts.down[i]};
    if (!fits(*parts[0], inter, hidden) || !fits(*parts[1], inter, hidden) || !fits(*parts[2], hidden, inter)) {
      return OkStatus();
    }
    for (size_t p = 0; p < 3; ++p) {
      table[p * e + i] = parts[p]->weight.raw();
      table[(3 + p) * e + i] = parts[p]->scales.raw();
      table[(6 + p) * e + i] = parts[p]->qzeros.raw();
    }
  }
  void* p = nullptr;
  FATHOM_RETURN_IF_ERROR(CudaStatus(cudaMalloc(&p, table.size() * sizeof(void*)), "4-bit expert table"));
  experts.device_state = std::shared_ptr<void>(p, [](void* q) { cudaFree(q); });
  return CudaStatus(cudaMemcpy(p, table.data(), table.size() * sizeof(void*), cudaMemcpyHostToDevice),
                    "4-bit expert table");
}

}  // namespace fathom
