// CudaBackend's host side of the block-scaled FP8 format (LinearFormat::kFp8Block: f8 e4m3 weights with float32
// scale_inv per 128 x 128 block, DeepSeek-V3), all in one place: Linear's three paths (the f8 GEMV or generic kernel
// for decode batches, W8A16 dequantize-then-bf16-GEMM for larger ones, and the opt-in W8A8 cuBLASLt block-scaled FP8
// GEMM on quantized activations), the padded scales that GEMM reads (made by PrepareLinear, or at the first use), the
// f8 fields of a fan-out GEMV part, and the scale check of f8 experts. The format's kernels are fp8.h's and
// linear.h's; the dense paths are linear_dense.cc's.
#include <cuda_runtime.h>
#include <fmt/format.h>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/fp8.h"
#include "backend/cuda/gather.h"
#include "backend/cuda/linear.h"
#include "format/linear_method.h"

namespace fathom {

namespace {

int Dt(const TensorView& t) {
  return static_cast<int>(t.dtype());
}

// What PrepareLinear keeps in a kFp8Block weight's device_state.
struct Fp8LinearState {
  // The W8A8 GEMM's scales: scale_inv's rows zero-padded to a multiple of 4 K blocks (device memory), or null.
  float* gemm_scales = nullptr;
  ~Fp8LinearState() {
    if (gemm_scales != nullptr) cudaFree(gemm_scales);
  }
};

// dst [mb][kb4] = w's scale_inv [mb][kb] with rows zero-padded to kb4 floats, on stream s: the first error, or 0.
int PadScales(const LinearWeight& w, int64_t kb4, void* dst, cudaStream_t s) {
  const int64_t mb = w.scale_inv.dim(0), kb = w.scale_inv.dim(1);
  const cudaError_t e0 = cudaMemsetAsync(dst, 0, static_cast<size_t>(mb * kb4) * sizeof(float), s);
  const cudaError_t e1 =
      cudaMemcpy2DAsync(dst, static_cast<size_t>(kb4) * sizeof(float), w.scale_inv.raw(),
                        static_cast<size_t>(w.scale_inv.stride(0)) * sizeof(float),
                        static_cast<size_t>(kb) * sizeof(float), static_cast<size_t>(mb), cudaMemcpyDeviceToDevice, s);
  return static_cast<int>(e0 != cudaSuccess ? e0 : e1);
}

}  // namespace

void CudaBackend::LinearFp8Block(const TensorView& x, const LinearWeight& w, const TensorView& out) {
  const int64_t n = x.dim(0), k = x.dim(1), m = w.out_features();
  if (UseFp8Gemm(n, w) && LinearFp8(x, w, out)) return;
  if (UseDequantGemm(n, w) && LinearDequantF8(x, w, out)) return;
  Launch("Linear", [&] {
    return cuda::LaunchLinear(x.data<float>(), x.stride(0), n, k, w.weight.raw(), Dt(w.weight), w.weight.stride(0), m,
                              w.scale_inv.data<float>(), w.scale_inv.stride(0), w.block_n, w.block_k,
                              w.bias.empty() ? nullptr : w.bias.raw(), w.bias.empty() ? 0 : Dt(w.bias),
                              out.data<float>(), out.stride(0), options_.generic_linear, sm_count_, stream_,
                              static_cast<int>(options_.gemv_prefetch_bytes));
  });
}

bool CudaBackend::Fp8GemmFits(const LinearWeight& w) {
  const int64_t m = w.out_features(), k = w.in_features();
  return m % 128 == 0 && k % 128 == 0 && w.block_n == 128 && w.block_k == 128 && w.scale_inv.ndim() == 2 &&
         w.scale_inv.dim(0) == m / 128 && w.scale_inv.dim(1) == k / 128 && w.scale_inv.is_contiguous() &&
         w.weight.stride(1) == 1;
}

bool CudaBackend::UseFp8Gemm(int64_t n, const LinearWeight& w) const {
  if (!w.fp8_block() || w.float32_inputs || gemm_ == nullptr || fp8_gemm_unavailable_) return false;
  if (options_.f32_gemm || options_.fp8_gemm_tokens <= 0) return false;  // W8A8 is opt-in
  return n >= options_.fp8_gemm_tokens && Fp8GemmFits(w);
}

bool CudaBackend::UseDequantGemm(int64_t n, const LinearWeight& w) const {
  return n > 8 && w.fp8_block() && !w.float32_inputs && gemm_ != nullptr && !options_.f32_gemm &&
         w.weight.stride(1) == 1;
}

bool CudaBackend::LinearDequantF8(const TensorView& x, const LinearWeight& w, const TensorView& out) {
  const int64_t n = x.dim(0), k = x.dim(1), m = w.out_features();
  const size_t xb_bytes = static_cast<size_t>((n * k * 2 + 255) / 256 * 256);
  char* ws = static_cast<char*>(Workspace(xb_bytes + static_cast<size_t>(m * k * 2)));
  if (ws == nullptr) return false;
  Launch("ToBf16", [&] { return cuda::LaunchToBf16(x.data<float>(), x.stride(0), n, k, ws, stream_); });
  Launch("DequantF8", [&] {
    return cuda::LaunchDequantF8ToBf16(w.weight.raw(), w.weight.stride(0), m, k, w.scale_inv.data<float>(),
                                       w.scale_inv.stride(0), w.block_n, w.block_k, ws + xb_bytes, stream_);
  });
  GemmFromStaged(ws, n, k, w, out, ws + xb_bytes);
  return true;
}

bool CudaBackend::LinearFp8(const TensorView& x, const LinearWeight& w, const TensorView& out) {
  const int64_t n = x.dim(0), k = x.dim(1), m = w.out_features();
  const float* w_scales = Fp8GemmScales(w);
  if (w_scales == nullptr) return false;
  const int64_t n_pad = (n + 3) / 4 * 4;  // cuBLASLt's block-scaled GEMM needs whole groups of 4 tokens
  const size_t xq_bytes = static_cast<size_t>((n_pad * k + 255) / 256 * 256);
  const size_t scale_bytes = static_cast<size_t>((n_pad * (k / 128) * 4 + 255) / 256 * 256);
  // cuBLASLt writes whole groups of 4 rows m apart here; other outputs (padded rows, or rows of a wider tensor) go
  // through the workspace and a copy, the case Fp8LinearMatchesCpuAtV3Sizes checks (a direct write with a larger
  // leading dimension has not been tried on the GPU).
  const bool padded = n_pad != n || out.stride(0) != m;
  const size_t out_bytes = padded ? static_cast<size_t>(n_pad * m * 4) : 0;
  char* ws = static_cast<char*>(Workspace(xq_bytes + scale_bytes + out_bytes));
  if (ws == nullptr) return false;  // the GEMV path needs no workspace
  float* scales = reinterpret_cast<float*>(ws + xq_bytes);
  float* dst = padded ? reinterpret_cast<float*>(ws + xq_bytes + scale_bytes) : out.data<float>();
  const int64_t dst_stride = padded ? m : out.stride(0);
  Launch("QuantizeF8",
         [&] { return cuda::LaunchQuantizeF8(x.data<float>(), x.stride(0), n, n_pad, k, ws, scales, stream_); });
  const auto t0 = profile_ ? RecordStart() : nullptr;
  const Status st =
      gemm_->RunFp8(ws, scales, n_pad, k, w.weight.raw(), w.weight.stride(0), w_scales, m, dst, dst_stride);
  if (profile_) RecordEnd("GemmFp8", t0);
  if (st.code() == StatusCode::kUnimplemented) {  // no block-scaled FP8 in this cuBLASLt: the GEMV path from now on
    fp8_gemm_unavailable_ = true;
    return false;
  }
  if (!st.ok()) {
    RecordError(st);
    return true;
  }
  if (padded) {
    Launch("Copy",
           [&] { return cuda::LaunchCopy(dst, dst_stride, 0, out.data<float>(), out.stride(0), 0, n, 1, m, stream_); });
  }
  if (!w.bias.empty()) {
    Launch("AddBias", [&] {
      return cuda::LaunchAddBias(out.data<float>(), out.stride(0), w.bias.raw(), Dt(w.bias), n, m, stream_);
    });
  }
  return true;
}

const float* CudaBackend::Fp8GemmScales(const LinearWeight& w) {
  const int64_t mb = w.scale_inv.dim(0), kb = w.scale_inv.dim(1), kb4 = (kb + 3) / 4 * 4;
  if (kb == kb4) return w.scale_inv.data<float>();
  if (w.device_state != nullptr) {  // PrepareLinear's copy
    const float* prepared = static_cast<const Fp8LinearState*>(w.device_state.get())->gemm_scales;
    if (prepared != nullptr) return prepared;
  }
  const size_t bytes = static_cast<size_t>(mb * kb4) * sizeof(float);
  return static_cast<const float*>(DerivedCopy(w.scale_inv.raw(), true, bytes, [&](void* p) {
    Check(PadScales(w, kb4, p, static_cast<cudaStream_t>(stream_)), "fp8 scale copy");
  }));
}

Status CudaBackend::PrepareLinear(LinearWeight& w) {
  if (w.int4()) return PrepareInt4(w);
  // Only the W8A8 GEMM needs a form of its own (when the option is on and the weight fits it).
  if (!w.fp8_block() || w.float32_inputs || gemm_ == nullptr || options_.f32_gemm || options_.fp8_gemm_tokens <= 0 ||
      !Fp8GemmFits(w) || w.device_state != nullptr) {
    return OkStatus();
  }
  const int64_t mb = w.scale_inv.dim(0), kb = w.scale_inv.dim(1), kb4 = (kb + 3) / 4 * 4;
  if (kb == kb4) return OkStatus();  // the GEMM reads scale_inv itself
  if (capturing_) return FailedPreconditionError("PrepareLinear cannot run while a graph is captured");
  auto state = std::make_shared<Fp8LinearState>();
  const size_t bytes = static_cast<size_t>(mb * kb4) * sizeof(float);
  if (cudaMalloc(&state->gemm_scales, bytes) != cudaSuccess) {
    cudaGetLastError();
    state->gemm_scales = nullptr;
    return ResourceExhaustedError(fmt::format("PrepareLinear: cudaMalloc of {} bytes for the FP8 scales", bytes));
  }
  Check(PadScales(w, kb4, state->gemm_scales, static_cast<cudaStream_t>(stream_)), "fp8 scale copy");
  w.device_state = std::move(state);
  return OkStatus();
}

void CudaBackend::SetFp8GemvScales(const LinearWeight& w, cuda::GemvPart* part) {
  part->scale = w.scale_inv.data<float>();
  part->scale_stride = w.scale_inv.stride(0);
  part->block_n = w.block_n;
  part->block_k = w.block_k;
}

bool CudaBackend::Fp8ExpertScalesFit(const LinearWeight& w, int64_t out, int64_t in) {
  return w.block_n == 128 && w.block_k == 128 && w.scale_inv.ndim() == 2 && w.scale_inv.dim(0) == (out + 127) / 128 &&
         w.scale_inv.dim(1) == (in + 127) / 128 && w.scale_inv.is_contiguous() && w.scale_inv.dtype() == DType::kF32;
}

}  // namespace fathom
