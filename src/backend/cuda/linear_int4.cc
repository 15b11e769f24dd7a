// The 4-bit formats on the GPU (LinearFormat::kAwq, kGptq; format/int4.h), linear_format.h's provider: Prepare's
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
#include <utility>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/int4.h"
#include "backend/cuda/linear.h"
#include "backend/cuda/linear_format.h"
#include "backend/cuda/moe.h"
#include "format/int4.h"
#include "format/linear_method.h"

namespace fathom::cuda {

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

Int4Source SourceOf(const LinearWeight& w) {
  const Int4Payload& p = w.payload<Int4Payload>();
  Int4Source s;
  s.awq = w.format == LinearFormat::kAwq;
  s.qweight = w.weight.data<int32_t>();
  s.qzeros = p.qzeros.data<int32_t>();
  s.scales = p.scales.raw();
  s.scales_dtype = Dt(p.scales);
  s.g_idx = p.g_idx.empty() ? nullptr : p.g_idx.data<int32_t>();
  s.m = w.out_features();
  s.k = w.in_features();
  s.groups = p.scales.dim(0);
  s.group = p.group_size;
  s.zero_offset = p.zero_offset;
  return s;
}

Int4Tiled TiledOf(const LinearWeight& w, const Int4LinearState& st) {
  const Int4Payload& p = w.payload<Int4Payload>();
  Int4Tiled t;
  t.weights = reinterpret_cast<const uint32_t*>(w.weight.raw());
  t.scales = p.scales.raw();
  t.scales_dtype = Dt(p.scales);
  t.zeros = reinterpret_cast<const uint32_t*>(p.qzeros.raw());
  t.perm = st.perm;
  t.m = w.out_features();
  t.k = w.in_features();
  t.groups = p.scales.dim(0);
  t.group = p.group_size;
  t.zero_offset = p.zero_offset;
  return t;
}

class Int4Kernels final : public LinearFormatKernels {
 public:
  explicit Int4Kernels(OpContext& ctx) : ctx_(ctx) {}
  ~Int4Kernels() override {
    if (counters_ != nullptr) cudaFree(counters_);
    if (scratch_ != nullptr) cudaFree(scratch_);
    if (stage_ != nullptr) cudaFree(stage_);
  }

  Status Prepare(LinearWeight& w) override;
  void Linear(const TensorView& x, const LinearWeight& w, const TensorView& out) override;
  bool FanOut(const TensorView& x, std::span<const LinearWeight> ws, std::span<const TensorView> outs) override;
  Status PrepareExperts(ExpertSet& experts) override;
  bool SetExpertArgs(const ExpertSet& experts, MoeExpertsArgs* a) const override;

 private:
  // The prepared state of w (its own, or that of another weight bound to the same memory), or null.
  std::shared_ptr<void> StateOf(const LinearWeight& w) {
    return w.device_state != nullptr ? w.device_state : ctx_.DerivedState(w.weight.raw());
  }
  void Mma(const TensorView& x, const int32_t* perm, const Int4MmaPart* parts, int count);

  OpContext& ctx_;
  int* counters_ = nullptr;   // kInt4MaxCounters zeroed ints for the W4A16 kernel's partial sums
  float* scratch_ = nullptr;  // kInt4MmaScratchFloats: its partial sums
  void* stage_ = nullptr;     // x as bf16 for its batches past kStageMinTokens
  size_t stage_bytes_ = 0;
  static constexpr int64_t kStageMinTokens = 16;
};

}  // namespace

std::unique_ptr<LinearFormatKernels> MakeInt4Kernels(OpContext& ctx) {
  return std::make_unique<Int4Kernels>(ctx);
}

Status Int4Kernels::Prepare(LinearWeight& w) {
  if (std::shared_ptr<void> st = ctx_.DerivedState(w.weight.raw())) {  // bound again (tied or shared): already prepared
    w.device_state = std::move(st);
    return OkStatus();
  }
  if (ctx_.capturing()) return FailedPreconditionError("PrepareLinear cannot run while a graph is captured");
  const std::string name(MethodOf(w.format).name());
  const Int4Payload& p = w.payload<Int4Payload>();
  for (const TensorView* t : {&std::as_const(w.weight), &p.qzeros, &p.scales, &p.g_idx}) {
    if (!t->empty() && (!t->is_contiguous() || t->device() != Device::kCuda)) {
      return UnimplementedError(fmt::format("{} weights on the GPU need contiguous device tensors", name));
    }
  }
  const int64_t m = w.out_features(), k = w.in_features(), groups = p.scales.dim(0), group = p.group_size;
  // The W4A16 kernel's counters, partial-sum scratch and bf16 staging of x: one of each for every 4-bit layer (their
  // kernels run one after another on the stream), allocated before any graph captures their pointers.
  if (counters_ == nullptr) {
    const size_t bytes = static_cast<size_t>(kInt4MaxCounters) * sizeof(int);
    if (cudaMalloc(&counters_, bytes) != cudaSuccess) {
      cudaGetLastError();
      counters_ = nullptr;
      return ResourceExhaustedError("PrepareLinear: cudaMalloc of the 4-bit kernels' counters");
    }
    FATHOM_RETURN_IF_ERROR(CudaStatus(cudaMemset(counters_, 0, bytes), "4-bit counters"));
  }
  if (scratch_ == nullptr) {
    const size_t bytes = static_cast<size_t>(kInt4MmaScratchFloats) * sizeof(float);
    if (cudaMalloc(&scratch_, bytes) != cudaSuccess) {
      cudaGetLastError();
      scratch_ = nullptr;  // the kernel then runs without partial sums
    }
  }
  const size_t stage_bytes =
      static_cast<size_t>(std::clamp<int64_t>(ctx_.kernel_options().int4_gemm_tokens, kStageMinTokens, 1024) * k * 2);
  if (stage_bytes > stage_bytes_ && !ctx_.has_graphs()) {
    void* buf = nullptr;
    if (cudaMalloc(&buf, stage_bytes) == cudaSuccess) {
      if (stage_ != nullptr) cudaFree(stage_);
      stage_ = buf;
      stage_bytes_ = stage_bytes;
    } else {
      cudaGetLastError();  // decode batches then read x as float32
    }
  }
  auto state = std::make_shared<Int4LinearState>();
  bool fits = Int4TileFits(m, k, groups, group) && (p.scales.dtype() == DType::kF16 || p.scales.dtype() == DType::kF32);
  // GPTQ act-order: g_idx not k / group. Its groups, read in g_idx order, are whole runs of `group` inputs (as GPTQ
  // writes them), so the tiled weight takes its inputs in that order and x is read through the permutation.
  std::vector<int32_t> perm;
  if (!p.g_idx.empty()) {
    std::vector<int32_t> g(static_cast<size_t>(k));
    FATHOM_RETURN_IF_ERROR(ctx_.CopyToHost(p.g_idx, g.data()));
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
    const size_t w_bytes = w.weight.nbytes(), s_bytes = p.scales.nbytes(), z_bytes = p.qzeros.nbytes();
    char* tmp = nullptr;
    if (cudaMalloc(&tmp, w_bytes + s_bytes + z_bytes) != cudaSuccess) {
      cudaGetLastError();
      return ResourceExhaustedError(
          fmt::format("PrepareLinear: cudaMalloc of {} bytes to repack a {} layer", w_bytes + s_bytes + z_bytes, name));
    }
    cudaStream_t s = static_cast<cudaStream_t>(ctx_.cuda_stream());
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
      st = CudaStatus((LaunchRepackInt4(SourceOf(w), state->perm, reinterpret_cast<uint32_t*>(tmp), tmp + w_bytes,
                                        reinterpret_cast<uint32_t*>(tmp + w_bytes + s_bytes), s)),
                      "4-bit repack");
    }
    // The tile layout takes exactly the checkpoint's bytes: copy it over them.
    if (st.ok()) st = CudaStatus(cudaMemcpyAsync(w.weight.raw(), tmp, w_bytes, cudaMemcpyDeviceToDevice, s), "repack");
    if (st.ok()) {
      st = CudaStatus(cudaMemcpyAsync(p.scales.raw(), tmp + w_bytes, s_bytes, cudaMemcpyDeviceToDevice, s), "repack");
    }
    if (st.ok()) {
      st = CudaStatus(cudaMemcpyAsync(p.qzeros.raw(), tmp + w_bytes + s_bytes, z_bytes, cudaMemcpyDeviceToDevice, s),
                      "repack");
    }
    const Status synced = CudaStatus(cudaStreamSynchronize(s), "repack");
    cudaFree(tmp);
    FATHOM_RETURN_IF_ERROR(st);
    FATHOM_RETURN_IF_ERROR(synced);
    state->tiled = true;
  }
  ctx_.SetDerivedState(w.weight.raw(), state);
  w.device_state = std::move(state);
  return OkStatus();
}

void Int4Kernels::Linear(const TensorView& x, const LinearWeight& w, const TensorView& out) {
  const int64_t n = x.dim(0), k = x.dim(1), m = w.out_features();
  const KernelOptions& o = ctx_.kernel_options();
  FATHOM_CHECK(out.stride(1) == 1, "a 4-bit linear's output with a column stride of {}", out.stride(1));
  std::shared_ptr<void> held = StateOf(w);
  const auto* st = static_cast<const Int4LinearState*>(held.get());
  const void* bias = w.bias.empty() ? nullptr : w.bias.raw();
  const int bias_dt = w.bias.empty() ? 0 : Dt(w.bias);
  if (st == nullptr || !st->tiled) {  // the checkpoint's layout (never prepared, or a shape the tiles do not fit)
    FATHOM_CHECK(x.stride(1) == 1, "a 4-bit linear's input with a column stride of {}", x.stride(1));
    ctx_.Launch("LinearInt4Generic", [&] {
      return LaunchInt4Generic(x.data<float>(), x.stride(0), n, SourceOf(w), bias, bias_dt, out.data<float>(),
                               out.stride(0), ctx_.cuda_stream());
    });
    return;
  }
  const Int4Tiled tiled = TiledOf(w, *st);
  const bool aligned = x.stride(1) == 1 && x.stride(0) % 4 == 0 && reinterpret_cast<uintptr_t>(x.raw()) % 16 == 0;
  if (o.f32_gemm || o.generic_linear || !aligned) {
    FATHOM_CHECK(x.stride(1) == 1, "a 4-bit linear's input with a column stride of {}", x.stride(1));
    ctx_.Launch("LinearInt4Generic", [&] {
      return LaunchInt4GenericTiled(x.data<float>(), x.stride(0), n, tiled, bias, bias_dt, out.data<float>(),
                                    out.stride(0), ctx_.cuda_stream());
    });
    return;
  }
  // Never while a graph is captured: each captured layer would keep a dequantized copy of its weight in the arena.
  if (n > o.int4_gemm_tokens && ctx_.gemm() != nullptr && !ctx_.capturing()) {
    // Prefill: x (through the act-order permutation) and W as bf16 in the workspace, then the bf16 GEMM.
    const size_t xb_bytes = static_cast<size_t>((n * k * 2 + 255) / 256 * 256);
    char* ws = static_cast<char*>(ctx_.Workspace(xb_bytes + static_cast<size_t>(m * k * 2)));
    if (ws != nullptr) {
      // x rounded to bf16 as the dense path stages it, or gathered through the act-order permutation.
      ctx_.Launch(st->perm != nullptr ? "GatherToBf16" : "ToBf16", [&] {
        return st->perm != nullptr
                   ? LaunchGatherToBf16(x.data<float>(), x.stride(0), n, k, st->perm, ws, ctx_.cuda_stream())
                   : LaunchToBf16(x.data<float>(), x.stride(0), n, k, ws, ctx_.cuda_stream());
      });
      ctx_.Launch("DequantInt4", [&] { return LaunchDequantInt4(tiled, ws + xb_bytes, ctx_.cuda_stream()); });
      GemmFromStaged(ctx_, ws, n, k, w, out, ws + xb_bytes);
      return;
    }
  }
  const Int4MmaPart part{tiled, bias, bias_dt, out.data<float>(), out.stride(0)};
  Mma(x, st->perm, &part, 1);
}

void Int4Kernels::Mma(const TensorView& x, const int32_t* perm, const Int4MmaPart* parts, int count) {
  const int64_t n = x.dim(0), k = x.dim(1);
  // Batches past kStageMinTokens tokens: x rounded to bf16 (through the act-order permutation) once, for every
  // block of the kernel to stage directly; smaller ones are rounded by the kernel as it stages them.
  const bool stage = n > kStageMinTokens && stage_ != nullptr && static_cast<size_t>(n * k * 2) <= stage_bytes_;
  if (stage) {
    ctx_.Launch(perm != nullptr ? "GatherToBf16" : "ToBf16", [&] {
      return perm != nullptr ? LaunchGatherToBf16(x.data<float>(), x.stride(0), n, k, perm, stage_, ctx_.cuda_stream())
                             : LaunchToBf16(x.data<float>(), x.stride(0), n, k, stage_, ctx_.cuda_stream());
    });
  }
  ctx_.Launch(count > 1 ? "LinearInt4FanOut" : "LinearInt4", [&] {
    return LaunchInt4MmaParts(stage ? stage_ : x.raw(), stage, stage ? k : x.stride(0), n, parts, count, scratch_,
                              kInt4MmaScratchFloats, counters_, ctx_.sm_count(), ctx_.cuda_stream());
  });
}

bool Int4Kernels::FanOut(const TensorView& x, std::span<const LinearWeight> ws, std::span<const TensorView> outs) {
  const int64_t n = x.dim(0), k = x.dim(1);
  const KernelOptions& o = ctx_.kernel_options();
  if (ws.size() < 2 || ws.size() > static_cast<size_t>(kInt4MaxParts) || o.f32_gemm || o.generic_linear) {
    return false;
  }
  // The prefill path (dequantize, then cuBLASLt) is one weight at a time.
  if (n > o.int4_gemm_tokens && ctx_.gemm() != nullptr && !ctx_.capturing()) return false;
  if (x.stride(1) != 1 || x.stride(0) % 4 != 0 || reinterpret_cast<uintptr_t>(x.raw()) % 16 != 0) return false;
  std::array<Int4MmaPart, kInt4MaxParts> parts{};
  std::array<std::shared_ptr<void>, kInt4MaxParts> held;
  for (size_t i = 0; i < ws.size(); ++i) {
    const LinearWeight& w = ws[i];
    if (!w.int4() || w.in_features() != k || outs[i].stride(1) != 1 || outs[i].dim(1) != w.out_features()) {
      return false;
    }
    held[i] = StateOf(w);
    const auto* st = static_cast<const Int4LinearState*>(held[i].get());
    if (st == nullptr || !st->tiled || st->perm != nullptr) return false;  // act-order: each weight its own order
    parts[i] = {TiledOf(w, *st), w.bias.empty() ? nullptr : w.bias.raw(), w.bias.empty() ? 0 : Dt(w.bias),
                outs[i].data<float>(), outs[i].stride(0)};
    const Int4Tiled& a = parts[i].w;
    const Int4Tiled& b = parts[0].w;
    if (a.group != b.group || a.scales_dtype != b.scales_dtype || a.zero_offset != b.zero_offset) return false;
  }
  Mma(x, nullptr, parts.data(), static_cast<int>(ws.size()));
  return true;
}

Status Int4Kernels::PrepareExperts(ExpertSet& experts) {
  const size_t e = experts.gate.size();
  const LinearWeight& g0 = experts.gate[0];
  const Int4Payload& gp = g0.payload<Int4Payload>();
  const Int4Payload& dp = experts.down[0].payload<Int4Payload>();
  const int64_t inter = g0.out_features(), hidden = g0.in_features();
  // One group a row in every matrix (each its own group_size, K), or one group size throughout.
  const int64_t group = gp.group_size == dp.group_size ? gp.group_size : 0;
  if (!MoeInt4Fits(hidden, inter, group) || (gp.scales.dtype() != DType::kF16 && gp.scales.dtype() != DType::kF32)) {
    return OkStatus();  // the host path, one expert at a time
  }
  const auto fits = [&](const LinearWeight& w, int64_t out, int64_t in) {
    if (w.format != g0.format || !w.bias.empty() || w.out_features() != out || w.in_features() != in) return false;
    const Int4Payload& p = w.payload<Int4Payload>();
    if (p.scales.dtype() != gp.scales.dtype() || p.zero_offset != gp.zero_offset ||
        (group == 0 ? p.scales.dim(0) != 1 : p.group_size != group)) {
      return false;
    }
    std::shared_ptr<void> held = StateOf(w);
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
      const Int4Payload& q = parts[p]->payload<Int4Payload>();
      table[p * e + i] = parts[p]->weight.raw();
      table[(3 + p) * e + i] = q.scales.raw();
      table[(6 + p) * e + i] = q.qzeros.raw();
    }
  }
  return UploadExpertTable(table, &experts);
}

// The grouped W4A16 kernels at every batch size (PrepareExperts checked that every expert has the gate's group,
// scales dtype and zero offset), except that KernelOptions::f32_gemm / generic_linear take the host path's exact
// float32 kernels outside a graph.
bool Int4Kernels::SetExpertArgs(const ExpertSet& experts, MoeExpertsArgs* a) const {
  const KernelOptions& o = ctx_.kernel_options();
  if ((o.f32_gemm || o.generic_linear) && !ctx_.capturing()) return false;
  const Int4Payload& g = experts.gate[0].payload<Int4Payload>();
  a->int4 = true;
  a->int4_group = g.group_size == experts.down[0].payload<Int4Payload>().group_size ? g.group_size : 0;  // 0: a row
  a->int4_scales_dtype = static_cast<int>(g.scales.dtype());
  a->int4_zero_offset = g.zero_offset;
  return true;
}

}  // namespace fathom::cuda
