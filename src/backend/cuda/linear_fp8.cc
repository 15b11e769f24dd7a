// The block-scaled FP8 format on the GPU (LinearFormat::kFp8Block: f8 e4m3 weights with float32 scale_inv per
// 128 x 128 block, DeepSeek-V3; format/fp8_block.h), linear_format.h's provider: Linear's three paths (the f8 GEMV or
// generic kernel for decode batches, W8A16 dequantize-then-bf16-GEMM for larger ones, and the opt-in W8A8 cuBLASLt
// block-scaled FP8 GEMM on quantized activations), the padded scales that GEMM reads (made by Prepare, or at the first
// use), its part of the fan-out GEMV, and the table of f8 experts. Its kernels are fp8.h's and linear.h's.
//
// Linears on f8 weights are W8A16 by default: decode batches (n <= 8) stream the f8 weights through the GEMV on
// float32 activations; larger ones dequantize the weight to bf16 in the workspace and take the bf16 cuBLASLt GEMM, as
// bf16 weights do. Both keep a token's result independent of its batch and follow the dequantized-weight oracle to
// bf16 tolerance. KernelOptions::fp8_gemm_tokens = N (FATHOM_CUDA_FP8_GEMM_TOKENS, opt-in) runs batches of N tokens or
// more as cuBLASLt's block-scaled FP8 GEMM on activations quantized per token and 128 columns (W8A8, DeepSeek's own
// inference recipe): 1.7-1.9x the bf16 GEMM's TFLOP/s at V3's prefill shapes on the H200, and about 2.5% rms error
// per linear.
#include <cuda_runtime.h>
#include <fmt/format.h>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/fp8.h"
#include "backend/cuda/gather.h"
#include "backend/cuda/linear.h"
#include "backend/cuda/linear_format.h"
#include "backend/cuda/moe.h"
#include "format/fp8_block.h"

namespace fathom::cuda {

namespace {

int Dt(const TensorView& t) {
  return static_cast<int>(t.dtype());
}

// What Prepare keeps in a kFp8Block weight's device_state.
struct Fp8LinearState {
  // The W8A8 GEMM's scales: scale_inv's rows zero-padded to a multiple of 4 K blocks (device memory), or null.
  float* gemm_scales = nullptr;
  ~Fp8LinearState() {
    if (gemm_scales != nullptr) cudaFree(gemm_scales);
  }
};

// dst [mb][kb4] = scale_inv [mb][kb] with rows zero-padded to kb4 floats, on stream s: the first error, or 0.
int PadScales(const TensorView& scale_inv, int64_t kb4, void* dst, cudaStream_t s) {
  const int64_t mb = scale_inv.dim(0), kb = scale_inv.dim(1);
  const cudaError_t e0 = cudaMemsetAsync(dst, 0, static_cast<size_t>(mb * kb4) * sizeof(float), s);
  const cudaError_t e1 =
      cudaMemcpy2DAsync(dst, static_cast<size_t>(kb4) * sizeof(float), scale_inv.raw(),
                        static_cast<size_t>(scale_inv.stride(0)) * sizeof(float),
                        static_cast<size_t>(kb) * sizeof(float), static_cast<size_t>(mb), cudaMemcpyDeviceToDevice, s);
  return static_cast<int>(e0 != cudaSuccess ? e0 : e1);
}

// The W8A8 GEMM's conditions on the weight alone: 128 x 128 blocks, m and k multiples of 128, contiguous scales.
bool Fp8GemmFits(const LinearWeight& w) {
  const Fp8BlockPayload& p = w.payload<Fp8BlockPayload>();
  const int64_t m = w.out_features(), k = w.in_features();
  return m % 128 == 0 && k % 128 == 0 && p.block_n == 128 && p.block_k == 128 && p.scale_inv.ndim() == 2 &&
         p.scale_inv.dim(0) == m / 128 && p.scale_inv.dim(1) == k / 128 && p.scale_inv.is_contiguous() &&
         w.weight.stride(1) == 1;
}

// Whether an expert's f8 block scales take the device MoE path: 128 x 128 blocks, contiguous f32
// [ceil(out / 128), ceil(in / 128)].
bool ExpertScalesFit(const Fp8BlockPayload& p, int64_t out, int64_t in) {
  return p.block_n == 128 && p.block_k == 128 && p.scale_inv.ndim() == 2 && p.scale_inv.dim(0) == (out + 127) / 128 &&
         p.scale_inv.dim(1) == (in + 127) / 128 && p.scale_inv.is_contiguous() && p.scale_inv.dtype() == DType::kF32;
}

class Fp8BlockKernels final : public LinearFormatKernels {
 public:
  explicit Fp8BlockKernels(OpContext& ctx) : ctx_(ctx) {}

  // Only the W8A8 GEMM needs a form of its own (when the option is on and the weight fits it).
  Status Prepare(LinearWeight& w) override {
    if (!GemmOn(w) || !Fp8GemmFits(w) || w.device_state != nullptr) return OkStatus();
    const TensorView& scale_inv = w.payload<Fp8BlockPayload>().scale_inv;
    const int64_t mb = scale_inv.dim(0), kb = scale_inv.dim(1), kb4 = (kb + 3) / 4 * 4;
    if (kb == kb4) return OkStatus();  // the GEMM reads scale_inv itself
    if (ctx_.capturing()) return FailedPreconditionError("PrepareLinear cannot run while a graph is captured");
    auto state = std::make_shared<Fp8LinearState>();
    const size_t bytes = static_cast<size_t>(mb * kb4) * sizeof(float);
    if (cudaMalloc(&state->gemm_scales, bytes) != cudaSuccess) {
      cudaGetLastError();
      state->gemm_scales = nullptr;
      return ResourceExhaustedError(fmt::format("PrepareLinear: cudaMalloc of {} bytes for the FP8 scales", bytes));
    }
    ctx_.Check(PadScales(scale_inv, kb4, state->gemm_scales, static_cast<cudaStream_t>(ctx_.cuda_stream())),
               "fp8 scale copy");
    w.device_state = std::move(state);
    return OkStatus();
  }

  void Linear(const TensorView& x, const LinearWeight& w, const TensorView& out) override {
    const int64_t n = x.dim(0), k = x.dim(1), m = w.out_features();
    if (UseFp8Gemm(n, w) && LinearFp8(x, w, out)) return;
    if (UseDequantGemm(n, w) && LinearDequantF8(x, w, out)) return;
    const Fp8BlockPayload& p = w.payload<Fp8BlockPayload>();
    const KernelOptions& o = ctx_.kernel_options();
    ctx_.Launch("Linear", [&] {
      return LaunchLinear(x.data<float>(), x.stride(0), n, k, w.weight.raw(), Dt(w.weight), w.weight.stride(0), m,
                          p.scale_inv.data<float>(), p.scale_inv.stride(0), p.block_n, p.block_k,
                          w.bias.empty() ? nullptr : w.bias.raw(), w.bias.empty() ? 0 : Dt(w.bias), out.data<float>(),
                          out.stride(0), o.generic_linear, ctx_.sm_count(), ctx_.cuda_stream(),
                          static_cast<int>(o.gemv_prefetch_bytes));
    });
  }

  bool GemvPartOf(const LinearWeight& w, GemvPart* part) const override {
    const Fp8BlockPayload& p = w.payload<Fp8BlockPayload>();
    part->scale = p.scale_inv.data<float>();
    part->scale_stride = p.scale_inv.stride(0);
    part->block_n = p.block_n;
    part->block_k = p.block_k;
    return true;
  }

  // f8 e4m3 experts of one shape with contiguous 128 x 128 block scales (DeepSeek-V3): the weights' pointers, then
  // the scales'.
  Status PrepareExperts(ExpertSet& experts) override {
    const size_t e = experts.gate.size();
    const int64_t inter = experts.gate[0].out_features(), hidden = experts.gate[0].in_features();
    if (inter % 16 != 0 || hidden % 16 != 0) return OkStatus();  // 16 values per 16-byte load
    const auto fits = [&](const LinearWeight& w, int64_t out, int64_t in) {
      return w.format == LinearFormat::kFp8Block && w.weight.dtype() == DType::kF8E4M3 && w.weight.is_contiguous() &&
             w.bias.empty() && w.weight.dim(0) == out && w.weight.dim(1) == in &&
             reinterpret_cast<uintptr_t>(w.weight.raw()) % 16 == 0 &&
             ExpertScalesFit(w.payload<Fp8BlockPayload>(), out, in);
    };
    std::vector<const void*> table(6 * e);
    for (size_t i = 0; i < e; ++i) {
      const LinearWeight* parts[3] = {&experts.gate[i], &experts.up[i], &experts.down[i]};
      if (!fits(*parts[0], inter, hidden) || !fits(*parts[1], inter, hidden) || !fits(*parts[2], hidden, inter)) {
        return OkStatus();
      }
      for (size_t p = 0; p < 3; ++p) {
        table[p * e + i] = parts[p]->weight.raw();
        table[(3 + p) * e + i] = parts[p]->payload<Fp8BlockPayload>().scale_inv.raw();
      }
    }
    return UploadExpertTable(table, &experts);
  }

  bool SetExpertArgs(const ExpertSet& /*experts*/, MoeExpertsArgs* a) const override {
    a->fp8 = true;
    return true;
  }

 private:
  // The W8A8 GEMM is opt-in (KernelOptions::fp8_gemm_tokens), and never for float32 inputs.
  bool GemmOn(const LinearWeight& w) const {
    const KernelOptions& o = ctx_.kernel_options();
    return !w.float32_inputs && ctx_.gemm() != nullptr && !gemm_unavailable_ && !o.f32_gemm && o.fp8_gemm_tokens > 0;
  }
  bool UseFp8Gemm(int64_t n, const LinearWeight& w) const {
    return GemmOn(w) && n >= ctx_.kernel_options().fp8_gemm_tokens && Fp8GemmFits(w);
  }
  bool UseDequantGemm(int64_t n, const LinearWeight& w) const {
    return n > 8 && !w.float32_inputs && ctx_.gemm() != nullptr && !ctx_.kernel_options().f32_gemm &&
           w.weight.stride(1) == 1;
  }

  // The W8A16 prefill path; false when the workspace cannot grow (the caller falls back).
  bool LinearDequantF8(const TensorView& x, const LinearWeight& w, const TensorView& out) {
    const Fp8BlockPayload& p = w.payload<Fp8BlockPayload>();
    const int64_t n = x.dim(0), k = x.dim(1), m = w.out_features();
    const size_t xb_bytes = static_cast<size_t>((n * k * 2 + 255) / 256 * 256);
    char* ws = static_cast<char*>(ctx_.Workspace(xb_bytes + static_cast<size_t>(m * k * 2)));
    if (ws == nullptr) return false;
    const Stream s = ctx_.cuda_stream();
    ctx_.Launch("ToBf16", [&] { return LaunchToBf16(x.data<float>(), x.stride(0), n, k, ws, s); });
    ctx_.Launch("DequantF8", [&] {
      return LaunchDequantF8ToBf16(w.weight.raw(), w.weight.stride(0), m, k, p.scale_inv.data<float>(),
                                   p.scale_inv.stride(0), p.block_n, p.block_k, ws + xb_bytes, s);
    });
    GemmFromStaged(ctx_, ws, n, k, w, out, ws + xb_bytes);
    return true;
  }

  // The W8A8 path; false when it could not run (no workspace, no cuBLASLt algorithm): the caller falls back.
  bool LinearFp8(const TensorView& x, const LinearWeight& w, const TensorView& out) {
    const int64_t n = x.dim(0), k = x.dim(1), m = w.out_features();
    const float* w_scales = GemmScales(w);
    if (w_scales == nullptr) return false;
    const int64_t n_pad = (n + 3) / 4 * 4;  // cuBLASLt's block-scaled GEMM needs whole groups of 4 tokens
    const size_t xq_bytes = static_cast<size_t>((n_pad * k + 255) / 256 * 256);
    const size_t scale_bytes = static_cast<size_t>((n_pad * (k / 128) * 4 + 255) / 256 * 256);
    // cuBLASLt writes whole groups of 4 rows m apart here; other outputs (padded rows, or rows of a wider tensor) go
    // through the workspace and a copy, the case Fp8LinearMatchesCpuAtV3Sizes checks (a direct write with a larger
    // leading dimension has not been tried on the GPU).
    const bool padded = n_pad != n || out.stride(0) != m;
    const size_t out_bytes = padded ? static_cast<size_t>(n_pad * m * 4) : 0;
    char* ws = static_cast<char*>(ctx_.Workspace(xq_bytes + scale_bytes + out_bytes));
    if (ws == nullptr) return false;  // the GEMV path needs no workspace
    float* scales = reinterpret_cast<float*>(ws + xq_bytes);
    float* dst = padded ? reinterpret_cast<float*>(ws + xq_bytes + scale_bytes) : out.data<float>();
    const int64_t dst_stride = padded ? m : out.stride(0);
    const Stream s = ctx_.cuda_stream();
    ctx_.Launch("QuantizeF8",
                [&] { return LaunchQuantizeF8(x.data<float>(), x.stride(0), n, n_pad, k, ws, scales, s); });
    void* t0 = ctx_.ProfileStart();
    const Status st =
        ctx_.gemm()->RunFp8(ws, scales, n_pad, k, w.weight.raw(), w.weight.stride(0), w_scales, m, dst, dst_stride);
    ctx_.ProfileEnd("GemmFp8", t0);
    if (st.code() == StatusCode::kUnimplemented) {  // no block-scaled FP8 in this cuBLASLt: the GEMV path from now on
      gemm_unavailable_ = true;
      return false;
    }
    if (!st.ok()) {
      ctx_.RecordError(st);
      return true;
    }
    if (padded) {
      ctx_.Launch("Copy",
                  [&] { return LaunchCopy(dst, dst_stride, 0, out.data<float>(), out.stride(0), 0, n, 1, m, s); });
    }
    if (!w.bias.empty()) {
      ctx_.Launch("AddBias",
                  [&] { return LaunchAddBias(out.data<float>(), out.stride(0), w.bias.raw(), Dt(w.bias), n, m, s); });
    }
    return true;
  }

  // w's block scales as the FP8 GEMM reads them: rows of a multiple of 4 K blocks (where DeepSeek's [m / 128][k / 128]
  // rows are shorter: the zero-padded copy of Prepare, or one made at the first use and freed with the scales'
  // memory block); null while capturing a graph before the copy exists.
  const float* GemmScales(const LinearWeight& w) {
    const TensorView& scale_inv = w.payload<Fp8BlockPayload>().scale_inv;
    const int64_t mb = scale_inv.dim(0), kb = scale_inv.dim(1), kb4 = (kb + 3) / 4 * 4;
    if (kb == kb4) return scale_inv.data<float>();
    if (w.device_state != nullptr) {  // Prepare's copy
      const float* prepared = static_cast<const Fp8LinearState*>(w.device_state.get())->gemm_scales;
      if (prepared != nullptr) return prepared;
    }
    const size_t bytes = static_cast<size_t>(mb * kb4) * sizeof(float);
    return static_cast<const float*>(ctx_.DerivedCopy(scale_inv.raw(), true, bytes, [&](void* p) {
      ctx_.Check(PadScales(scale_inv, kb4, p, static_cast<cudaStream_t>(ctx_.cuda_stream())), "fp8 scale copy");
    }));
  }

  OpContext& ctx_;
  bool gemm_unavailable_ = false;  // this cuBLASLt has no block-scaled FP8 GEMM
};

}  // namespace

std::unique_ptr<LinearFormatKernels> MakeFp8BlockKernels(OpContext& ctx) {
  return std::make_unique<Fp8BlockKernels>(ctx);
}

}  // namespace fathom::cuda
