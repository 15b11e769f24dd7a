// The dense weight format on the GPU (LinearFormat::kDense: f32, f16, bf16; linear_format.h's provider), the bf16
// cuBLASLt path every format's prefill may end in, and CudaBackend's linear ops, which dispatch on the weight's format
// (kFp8Block: linear_fp8.cc, kAwq and kGptq: linear_int4.cc). Prefill-sized batches of bf16 weights run on cuBLASLt
// (gemm.h) on activations rounded to bf16; the rest on the GEMV and generic kernels (linear.h).
#include <cuda_runtime.h>

#include <array>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/elementwise.h"
#include "backend/cuda/linear.h"
#include "backend/cuda/linear_format.h"
#include "backend/cuda/moe.h"

namespace fathom {

namespace cuda {

namespace {

int Dt(const TensorView& t) {
  return static_cast<int>(t.dtype());
}

// A float32 copy of a 16-bit bias, made once (cuBLASLt's bias epilogue with float32 output takes float32 biases) and
// freed with the bias's memory block; null for a bias that is not a pooled block of its own, or while capturing a
// graph before the copy exists: the caller then adds the bias with a kernel.
const float* F32Bias(OpContext& ctx, const TensorView& bias) {
  if (bias.dtype() == DType::kF32 && bias.is_contiguous()) return bias.data<float>();
  const int64_t m = bias.ndim() == 1 ? bias.dim(0) : 0;
  return static_cast<const float*>(
      ctx.DerivedCopy(bias.raw(), bias.ndim() == 1, static_cast<size_t>(m) * sizeof(float), [&](void* p) {
        cudaStream_t s = static_cast<cudaStream_t>(ctx.cuda_stream());
        ctx.Check(static_cast<int>(cudaMemsetAsync(p, 0, static_cast<size_t>(m) * sizeof(float), s)), "bias copy");
        ctx.Check(LaunchAddBias(static_cast<float*>(p), m, bias.raw(), Dt(bias), 1, m, s), "bias copy");
      }));
}

class DenseKernels final : public LinearFormatKernels {
 public:
  explicit DenseKernels(OpContext& ctx) : ctx_(ctx) {}

  void Linear(const TensorView& x, const LinearWeight& w, const TensorView& out) override {
    const int64_t n = x.dim(0), k = x.dim(1), m = w.out_features();
    if (DenseTakesGemm(ctx_, n, w)) {
      void* xb = StageBf16(ctx_, x.data<float>(), x.stride(0), n, k);
      if (xb != nullptr) GemmFromStaged(ctx_, xb, n, k, w, out);
      return;
    }
    const KernelOptions& o = ctx_.kernel_options();
    ctx_.Launch("Linear", [&] {
      return LaunchLinear(x.data<float>(), x.stride(0), n, k, w.weight.raw(), Dt(w.weight), w.weight.stride(0), m,
                          nullptr, 0, 128, 128, w.bias.empty() ? nullptr : w.bias.raw(),
                          w.bias.empty() ? 0 : Dt(w.bias), out.data<float>(), out.stride(0), o.generic_linear,
                          ctx_.sm_count(), ctx_.cuda_stream(), static_cast<int>(o.gemv_prefetch_bytes));
    });
  }

  // bf16 and f16 weights stream through the fan-out GEMV; f32 ones take Linear.
  bool GemvPartOf(const LinearWeight& w, GemvPart* part) const override {
    if (w.weight.dtype() != DType::kBF16 && w.weight.dtype() != DType::kF16) return false;
    part->f16 = w.weight.dtype() == DType::kF16;
    return true;
  }

  bool TakesStagedGemm(int64_t n, const LinearWeight& w) const override { return DenseTakesGemm(ctx_, n, w); }

  // bf16 experts of one shape, contiguous and 16-byte aligned: their pointers in one device table (moe.h).
  Status PrepareExperts(ExpertSet& experts) override {
    const size_t e = experts.gate.size();
    if (experts.gate[0].weight.dtype() != DType::kBF16) return OkStatus();
    const int64_t inter = experts.gate[0].out_features(), hidden = experts.gate[0].in_features();
    if (inter % 8 != 0 || hidden % 8 != 0) return OkStatus();  // 8 values per 16-byte load
    const auto fits = [&](const LinearWeight& w, int64_t out, int64_t in) {
      return w.format == LinearFormat::kDense && w.weight.dtype() == DType::kBF16 && w.weight.is_contiguous() &&
             w.bias.empty() && w.weight.dim(0) == out && w.weight.dim(1) == in &&
             reinterpret_cast<uintptr_t>(w.weight.raw()) % 16 == 0;
    };
    std::vector<const void*> table(3 * e);
    for (size_t i = 0; i < e; ++i) {
      if (!fits(experts.gate[i], inter, hidden) || !fits(experts.up[i], inter, hidden) ||
          !fits(experts.down[i], hidden, inter)) {
        return OkStatus();
      }
      table[i] = experts.gate[i].weight.raw();
      table[e + i] = experts.up[i].weight.raw();
      table[2 * e + i] = experts.down[i].weight.raw();
    }
    return UploadExpertTable(table, &experts);
  }

 private:
  OpContext& ctx_;
};

}  // namespace

std::unique_ptr<LinearFormatKernels> MakeDenseKernels(OpContext& ctx) {
  return std::make_unique<DenseKernels>(ctx);
}

bool DenseTakesGemm(const OpContext& ctx, int64_t n, const LinearWeight& w) {
  return n > 8 && w.format == LinearFormat::kDense && w.weight.dtype() == DType::kBF16 &&
         !ctx.kernel_options().f32_gemm && !w.float32_inputs && ctx.gemm() != nullptr;
}

void* StageBf16(OpContext& ctx, const float* x, int64_t xs, int64_t rows, int64_t cols) {
  void* xb = ctx.Workspace(static_cast<size_t>(rows * cols) * 2);
  if (xb == nullptr) return nullptr;
  ctx.Launch("ToBf16", [&] { return LaunchToBf16(x, xs, rows, cols, xb, ctx.cuda_stream()); });
  return xb;
}

void GemmFromStaged(OpContext& ctx, const void* xb, int64_t n, int64_t k, const LinearWeight& w, const TensorView& out,
                    const void* w_bf16) {
  const int64_t m = w.out_features();
  void* t0 = ctx.ProfileStart();
  bool bias_added = false;
  const float* bias = w.bias.empty() ? nullptr : F32Bias(ctx, w.bias);
  Status st = ctx.gemm()->Run(xb, n, k, w_bf16 != nullptr ? w_bf16 : w.weight.raw(),
                              w_bf16 != nullptr ? k : w.weight.stride(0), m, out.data<float>(), out.stride(0), bias,
                              bias != nullptr ? static_cast<int>(DType::kF32) : -1, &bias_added);
  ctx.ProfileEnd("GemmBf16", t0);
  if (!st.ok()) {
    ctx.RecordError(st);
    return;
  }
  if (!w.bias.empty() && !bias_added) {  // no epilogue for this shape and bias type
    ctx.Launch("AddBias", [&] {
      return LaunchAddBias(out.data<float>(), out.stride(0), w.bias.raw(), Dt(w.bias), n, m, ctx.cuda_stream());
    });
  }
}

Status UploadExpertTable(const std::vector<const void*>& table, ExpertSet* experts) {
  void* p = nullptr;
  FATHOM_RETURN_IF_ERROR(CudaStatus(cudaMalloc(&p, table.size() * sizeof(void*)), "expert table"));
  experts->device_state = std::shared_ptr<void>(p, [](void* q) { cudaFree(q); });
  return CudaStatus(cudaMemcpy(p, table.data(), table.size() * sizeof(void*), cudaMemcpyHostToDevice), "expert table");
}

}  // namespace cuda

namespace {

int Dt(const TensorView& t) {
  return static_cast<int>(t.dtype());
}

// The weight's dtype is its format's: f8 e4m3 exactly for kFp8Block, which has its block scales.
void CheckFormat(const LinearWeight& w) {
  FATHOM_CHECK(w.fp8_block() == (w.weight.dtype() == DType::kF8E4M3), "a {} weight in format {}",
               DTypeName(w.weight.dtype()), w.fp8_block() ? "kFp8Block" : "kDense");
  FATHOM_CHECK(w.format == LinearFormat::kDense || w.format_payload != nullptr, "a format-{} weight without payload",
               static_cast<int>(w.format));
}

}  // namespace

Status CudaBackend::PrepareLinear(LinearWeight& w) {
  return Kernels(w.format).Prepare(w);
}

void CudaBackend::Linear(const TensorView& x, const LinearWeight& w, const TensorView& out) {
  FATHOM_CHECK_EQ(w.in_features(), x.dim(1));
  FATHOM_CHECK_EQ(out.dim(1), w.out_features());
  CheckFormat(w);
  Kernels(w.format).Linear(x, w, out);
}

void CudaBackend::SiluMulLinear(const TensorView& gate, const TensorView& up, const LinearWeight& w,
                                const TensorView& out) {
  const int64_t n = gate.dim(0), k = gate.dim(1);
  if (!options_.fused_silu_staging || !cuda::DenseTakesGemm(*this, n, w) || w.in_features() != k ||
      gate.stride(1) != 1 || up.stride(1) != 1) {
    Backend::SiluMulLinear(gate, up, w, out);
    return;
  }
  // silu(gate) * up rounded to bf16 straight into the GEMM's staged input: no float32 product written and read back.
  void* xb = Workspace(static_cast<size_t>(n * k) * 2);
  if (xb == nullptr) return;
  Launch("SiluMulToBf16", [&] {
    return cuda::LaunchSiluMulToBf16(gate.data<float>(), gate.stride(0), up.data<float>(), up.stride(0), n, k, xb,
                                     stream_);
  });
  cuda::GemmFromStaged(*this, xb, n, k, w, out);
}

void CudaBackend::LinearFanOut(const TensorView& x, std::span<const LinearWeight> ws,
                               std::span<const TensorView> outs) {
  FATHOM_CHECK_EQ(ws.size(), outs.size());
  const int64_t n = x.dim(0), k = x.dim(1);
  if (!ws.empty() && Kernels(ws[0].format).FanOut(x, ws, outs)) return;
  // Decode-sized batches whose weights all have a GEMV form (bf16, f16, f8) and biases of one dtype: one GEMV launch
  // for all the weights. Otherwise one Linear each.
  bool one_launch = n <= 8 && !ws.empty() && ws.size() <= static_cast<size_t>(cuda::kMaxGemvParts);
  std::array<cuda::GemvPart, cuda::kMaxGemvParts> parts{};
  int bias_dtype = -1;
  for (size_t i = 0; one_launch && i < ws.size(); ++i) {
    const LinearWeight& w = ws[i];
    FATHOM_CHECK_EQ(w.in_features(), k);
    FATHOM_CHECK_EQ(outs[i].dim(1), w.out_features());
    CheckFormat(w);
    parts[i] = cuda::GemvPart{w.weight.raw(),
                              w.weight.stride(0),
                              w.out_features(),
                              w.bias.empty() ? nullptr : w.bias.raw(),
                              w.bias.empty() ? 0 : Dt(w.bias),
                              outs[i].data<float>(),
                              outs[i].stride(0)};
    const bool has_gemv = Kernels(w.format).GemvPartOf(w, &parts[i]);
    const bool bias_ok = w.bias.empty() || bias_dtype < 0 || Dt(w.bias) == bias_dtype;
    if (!w.bias.empty()) bias_dtype = Dt(w.bias);
    one_launch = has_gemv && bias_ok && outs[i].stride(1) == 1 &&
                 cuda::GemvFanOutFits(x.data<float>(), x.stride(0), n, k, parts[i]);
  }
  if (!one_launch || options_.generic_linear || x.stride(1) != 1) {
    // Prefill-sized: x is rounded to bf16 once for all the weights that go to cuBLASLt; the others (float32
    // inputs, other dtypes and formats) take Linear, first: Linear may use the workspace (f8's W8A8 path) that holds
    // the staged x, which must then stay untouched until the last GEMM that reads it.
    auto to_cublas = [&](size_t i) {
      return Kernels(ws[i].format).TakesStagedGemm(n, ws[i]) && ws[i].in_features() == k && x.stride(1) == 1;
    };
    for (size_t i = 0; i < ws.size(); ++i) {
      FATHOM_CHECK_EQ(outs[i].dim(1), ws[i].out_features());
      if (!to_cublas(i)) Linear(x, ws[i], outs[i]);
    }
    void* xb = nullptr;
    for (size_t i = 0; i < ws.size(); ++i) {
      if (!to_cublas(i)) continue;
      if (xb == nullptr) xb = cuda::StageBf16(*this, x.data<float>(), x.stride(0), n, k);
      if (xb == nullptr) return;
      cuda::GemmFromStaged(*this, xb, n, k, ws[i], outs[i]);
    }
    return;
  }
  Launch("LinearFanOut", [&] {
    return cuda::LaunchGemvFanOut(x.data<float>(), x.stride(0), n, k, parts.data(), static_cast<int>(ws.size()),
                                  sm_count_, stream_, static_cast<int>(options_.gemv_prefetch_bytes));
  });
}

void CudaBackend::HeadLinear(const TensorView& x, const TensorView& w, const TensorView& out) {
  FATHOM_CHECK(x.ndim() == 3 && w.ndim() == 3 && out.ndim() == 3 && w.is_contiguous());
  FATHOM_CHECK_EQ(x.dim(1), w.dim(0));
  FATHOM_CHECK_EQ(x.dim(2), w.dim(2));
  FATHOM_CHECK_EQ(out.dim(2), w.dim(1));
  FATHOM_CHECK(x.stride(2) == 1 && out.stride(2) == 1);
  const int64_t n = x.dim(0), heads = x.dim(1), in = x.dim(2), m = w.dim(1);
  // Prefill-sized batches of bf16 weights: x rounded to bf16 as [n * heads, in] rows (one launch; needs the heads of
  // a token at a fixed stride), then one strided-batched cuBLASLt GEMM over the heads.
  LinearWeight as_linear;
  as_linear.weight = w;
  if (x.stride(0) == heads * x.stride(1) && cuda::DenseTakesGemm(*this, n, as_linear)) {
    void* xb = cuda::StageBf16(*this, x.data<float>(), x.stride(1), n * heads, in);  // [n, heads, in] bf16
    if (xb == nullptr) return;
    void* t0 = ProfileStart();
    const Status st = gemm_->RunBatched(xb, heads * in, in, n, in, w.raw(), m, out.data<float>(), out.stride(0),
                                        out.stride(1), heads);
    ProfileEnd("HeadGemmBf16", t0);
    RecordError(st);
    return;
  }
  Launch("HeadLinear", [&] {
    return cuda::LaunchHeadLinear(x.data<float>(), x.stride(0), x.stride(1), x.dim(0), x.dim(1), x.dim(2), w.raw(),
                                  Dt(w), w.dim(1), out.data<float>(), out.stride(0), out.stride(1), stream_);
  });
}

}  // namespace fathom
