// CudaBackend's linear layers on dense weights (LinearFormat::kDense: f32, f16, bf16), and the dispatch on the
// weight's format: kFp8Block weights go to linear_fp8.cc, kAwq and kGptq ones to linear_int4.cc. Prefill-sized batches
// of bf16 weights run on cuBLASLt (gemm.h) on activations rounded to bf16; the rest on the GEMV and generic kernels
// (linear.h).
#include <cuda_runtime.h>

#include <array>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/elementwise.h"
#include "backend/cuda/linear.h"

namespace fathom {

namespace {

int Dt(const TensorView& t) {
  return static_cast<int>(t.dtype());
}

// The weight's dtype is its format's: f8 e4m3 exactly for kFp8Block, which has its block scales.
void CheckFormat(const LinearWeight& w) {
  FATHOM_CHECK(w.fp8_block() == (w.weight.dtype() == DType::kF8E4M3), "a {} weight in format {}",
               DTypeName(w.weight.dtype()), w.fp8_block() ? "kFp8Block" : "kDense");
  FATHOM_CHECK(!w.fp8_block() || w.scale_inv.ndim() == 2, "an fp8 weight without scale_inv");
}

}  // namespace

bool CudaBackend::UseCublasLt(int64_t n, const LinearWeight& w) const {
  return n > 8 && w.format == LinearFormat::kDense && w.weight.dtype() == DType::kBF16 && !options_.f32_gemm &&
         !w.float32_inputs && gemm_ != nullptr;
}

void CudaBackend::SiluMulLinear(const TensorView& gate, const TensorView& up, const LinearWeight& w,
                                const TensorView& out) {
  const int64_t n = gate.dim(0), k = gate.dim(1);
  if (!options_.fused_silu_staging || !UseCublasLt(n, w) || w.in_features() != k || gate.stride(1) != 1 ||
      up.stride(1) != 1) {
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
  GemmFromStaged(xb, n, k, w, out);
}

void* CudaBackend::StageBf16(const TensorView& x) {
  return StageBf16(x.data<float>(), x.stride(0), x.dim(0), x.dim(1));
}

void* CudaBackend::StageBf16(const float* x, int64_t xs, int64_t rows, int64_t cols) {
  void* xb = Workspace(static_cast<size_t>(rows * cols) * 2);
  if (xb == nullptr) return nullptr;
  Launch("ToBf16", [&] { return cuda::LaunchToBf16(x, xs, rows, cols, xb, stream_); });
  return xb;
}

void CudaBackend::GemmFromStaged(const void* xb, int64_t n, int64_t k, const LinearWeight& w, const TensorView& out,
                                 const void* w_bf16) {
  const int64_t m = w.out_features();
  const auto t0 = profile_ ? RecordStart() : nullptr;
  bool bias_added = false;
  const float* bias = w.bias.empty() ? nullptr : F32Bias(w.bias);
  Status st = gemm_->Run(xb, n, k, w_bf16 != nullptr ? w_bf16 : w.weight.raw(),
                         w_bf16 != nullptr ? k : w.weight.stride(0), m, out.data<float>(), out.stride(0), bias,
                         bias != nullptr ? static_cast<int>(DType::kF32) : -1, &bias_added);
  if (profile_) RecordEnd("GemmBf16", t0);
  if (!st.ok()) {
    RecordError(st);
    return;
  }
  if (!w.bias.empty() && !bias_added) {  // no epilogue for this shape and bias type
    Launch("AddBias", [&] {
      return cuda::LaunchAddBias(out.data<float>(), out.stride(0), w.bias.raw(), Dt(w.bias), n, m, stream_);
    });
  }
}

const float* CudaBackend::F32Bias(const TensorView& bias) {
  if (bias.dtype() == DType::kF32 && bias.is_contiguous()) return bias.data<float>();
  const int64_t m = bias.ndim() == 1 ? bias.dim(0) : 0;
  return static_cast<const float*>(
      DerivedCopy(bias.raw(), bias.ndim() == 1, static_cast<size_t>(m) * sizeof(float), [&](void* p) {
        cudaStream_t s = static_cast<cudaStream_t>(stream_);
        Check(static_cast<int>(cudaMemsetAsync(p, 0, static_cast<size_t>(m) * sizeof(float), s)), "bias copy");
        Check(cuda::LaunchAddBias(static_cast<float*>(p), m, bias.raw(), Dt(bias), 1, m, stream_), "bias copy");
      }));
}

void CudaBackend::Linear(const TensorView& x, const LinearWeight& w, const TensorView& out) {
  FATHOM_CHECK_EQ(w.in_features(), x.dim(1));
  FATHOM_CHECK_EQ(out.dim(1), w.out_features());
  CheckFormat(w);
  if (w.fp8_block()) {
    LinearFp8Block(x, w, out);
    return;
  }
  if (w.int4()) {
    LinearInt4(x, w, out);
    return;
  }
  const int64_t n = x.dim(0), k = x.dim(1), m = w.out_features();
  if (UseCublasLt(n, w)) {
    void* xb = StageBf16(x);
    if (xb != nullptr) GemmFromStaged(xb, n, k, w, out);
    return;
  }
  Launch("Linear", [&] {
    return cuda::LaunchLinear(
        x.data<float>(), x.stride(0), n, k, w.weight.raw(), Dt(w.weight), w.weight.stride(0), m, nullptr, 0, w.block_n,
        w.block_k, w.bias.empty() ? nullptr : w.bias.raw(), w.bias.empty() ? 0 : Dt(w.bias), out.data<float>(),
        out.stride(0), options_.generic_linear, sm_count_, stream_, static_cast<int>(options_.gemv_prefetch_bytes));
  });
}

void CudaBackend::LinearFanOut(const TensorView& x, std::span<const LinearWeight> ws,
                               std::span<const TensorView> outs) {
  FATHOM_CHECK_EQ(ws.size(), outs.size());
  const int64_t n = x.dim(0), k = x.dim(1);
  if (!ws.empty() && ws[0].int4() && LinearInt4FanOut(x, ws, outs)) return;
  // Decode-sized batches with bf16, f16 or f8 weights (and biases of one dtype): one GEMV launch for all the weights.
  // Otherwise one Linear each.
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
    if (w.fp8_block()) SetFp8GemvScales(w, &parts[i]);
    parts[i].f16 = w.weight.dtype() == DType::kF16;
    const bool bias_ok = w.bias.empty() || bias_dtype < 0 || Dt(w.bias) == bias_dtype;
    if (!w.bias.empty()) bias_dtype = Dt(w.bias);
    one_launch = (w.weight.dtype() == DType::kBF16 || w.weight.dtype() == DType::kF16 || w.fp8_block()) && bias_ok &&
                 outs[i].stride(1) == 1 && cuda::GemvFanOutFits(x.data<float>(), x.stride(0), n, k, parts[i]);
  }
  if (!one_launch || options_.generic_linear || x.stride(1) != 1) {
    // Prefill-sized: x is rounded to bf16 once for all the weights that go to cuBLASLt; the others (float32
    // inputs, other dtypes and formats) take Linear, first: Linear may use the workspace (f8's W8A8 path) that holds
    // the staged x, which must then stay untouched until the last GEMM that reads it.
    auto to_cublas = [&](size_t i) { return UseCublasLt(n, ws[i]) && ws[i].in_features() == k && x.stride(1) == 1; };
    for (size_t i = 0; i < ws.size(); ++i) {
      FATHOM_CHECK_EQ(outs[i].dim(1), ws[i].out_features());
      if (!to_cublas(i)) Linear(x, ws[i], outs[i]);
    }
    void* xb = nullptr;
    for (size_t i = 0; i < ws.size(); ++i) {
      if (!to_cublas(i)) continue;
      if (xb == nullptr) xb = StageBf16(x);
      if (xb == nullptr) return;
      GemmFromStaged(xb, n, k, ws[i], outs[i]);
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
  if (x.stride(0) == heads * x.stride(1) && UseCublasLt(n, as_linear)) {
    void* xb = StageBf16(x.data<float>(), x.stride(1), n * heads, in);  // [n, heads, in] bf16
    if (xb == nullptr) return;
    const auto t0 = profile_ ? RecordStart() : nullptr;
    const Status st = gemm_->RunBatched(xb, heads * in, in, n, in, w.raw(), m, out.data<float>(), out.stride(0),
                                        out.stride(1), heads);
    if (profile_) RecordEnd("HeadGemmBf16", t0);
    RecordError(st);
    return;
  }
  Launch("HeadLinear", [&] {
    return cuda::LaunchHeadLinear(x.data<float>(), x.stride(0), x.stride(1), x.dim(0), x.dim(1), x.dim(2), w.raw(),
                                  Dt(w), w.dim(1), out.data<float>(), out.stride(0), out.stride(1), stream_);
  });
}

}  // namespace fathom
