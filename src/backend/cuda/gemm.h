// bf16 GEMMs through cuBLASLt: out[n, m] (float32) = x[n, k] (bf16) W[m, k]^T (bf16) (+ bias[m]), float32
// accumulation, with the algorithm chosen once per shape and cached: cuBLASLt's first heuristic, or with set_tune(true)
// (KernelOptions::gemm_tune, FATHOM_CUDA_GEMM_TUNE=1) for prefill-sized GEMMs (n >= 64) the fastest of its top 8
// candidates, timed on the first call. A bias is added in cuBLASLt's epilogue where it has an algorithm for it.
//
//   CublasLtGemm gemm;
//   FATHOM_RETURN_IF_ERROR(gemm.Init(stream));
//   bool bias_added = false;
//   FATHOM_RETURN_IF_ERROR(gemm.Run(x_bf16, n, k, w_bf16, w_stride, m, out, out_stride, bias, bias_dtype,
//   &bias_added)); if (!bias_added) ...add it yourself...
//
// RunFp8 is the block-scaled FP8 GEMM of DeepSeek-V3 checkpoints (cuBLASLt 12.9+ on sm_90): e4m3 weights with
// 128 x 128 block scales against e4m3 activations quantized per token and 128-column group (LaunchQuantizeF8).
#pragma once

#include <cstdint>
#include <map>
#include <tuple>

#include "core/status.h"

namespace fathom {

class CublasLtGemm {
 public:
  CublasLtGemm() = default;
  ~CublasLtGemm();
  CublasLtGemm(const CublasLtGemm&) = delete;
  CublasLtGemm& operator=(const CublasLtGemm&) = delete;

  Status Init(void* stream);
  // Whether shapes planned from now on time cuBLASLt's candidates (off by default).
  void set_tune(bool tune) { tune_ = tune; }
  // x: contiguous bf16 [n, k]; w: bf16 [m, k] with row stride w_stride; out: float32 [n, m] with row stride out_stride.
  // bias: [m] of dtype bias_dtype (fathom's DType code: f32, f16 or bf16), or null. *bias_added says whether the
  // epilogue added it.
  Status Run(const void* x, int64_t n, int64_t k, const void* w, int64_t w_stride, int64_t m, float* out,
             int64_t out_stride, const void* bias = nullptr, int bias_dtype = -1, bool* bias_added = nullptr);
  // `batch` independent GEMMs in one launch: out_b[n, m] = x_b[n, k] W_b^T for b < batch. x_b: bf16 rows x_ld apart,
  // starting at x + b * x_batch_stride; W_b: bf16 [m, k] contiguous at w + b * m * k; out_b: float32 rows out_stride
  // apart, starting at out + b * out_batch_stride (all strides in elements).
  Status RunBatched(const void* x, int64_t x_ld, int64_t x_batch_stride, int64_t n, int64_t k, const void* w, int64_t m,
                    float* out, int64_t out_stride, int64_t out_batch_stride, int64_t batch);
  // out[n, m] (float32, rows out_stride apart) = dequant(xq) dequant(W)^T. xq: e4m3 [n, k] contiguous with x_scales
  // f32 [k / 128][n] (tokens contiguous); W: e4m3 [m, k], rows w_stride apart, with w_scales f32 [m / 128] rows of
  // round_up(k / 128, 4) values (DeepSeek's scale_inv, rows zero-padded to 4 blocks where they are shorter). Needs n %
  // 4 == 0, k % 128 == 0 and m % 128 == 0 (InvalidArgument otherwise); Unimplemented where cuBLASLt has no algorithm
  // (before 12.9, or not on sm_90).
  Status RunFp8(const void* xq, const float* x_scales, int64_t n, int64_t k, const void* w, int64_t w_stride,
                const float* w_scales, int64_t m, float* out, int64_t out_stride);

 private:
  struct Plan;
  // (n, k, m, w_stride, out_stride, bias dtype or -1, batch, x_ld, x_batch_stride, out_batch_stride)
  using PlanKey = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int, int64_t, int64_t, int64_t, int64_t>;
  // Runs (creating on first use) the plan of `key`; with a bias dtype in the key and no algorithm for it, records a
  // null plan and returns OK without running.
  Status RunPlan(const PlanKey& key, const void* x, const void* w, float* out, const void* bias, int bias_type);
  static constexpr int64_t kTuneMinRows = 64;
  // Index of the fastest of `found` heuristic results (cublasLtMatmulHeuristicResult_t[]) on these operands.
  Status SetFp8Scales(void* desc, const float* a_scales, const float* b_scales);
  // p.desc: float32 compute and scale, A (the weight) transposed, B (the input) not: every GEMM here.
  Status CreateDesc(Plan& p);
  // Sets p.algo to cuBLASLt's first heuristic for p's descriptors (with tune_ and n >= kTuneMinRows, the fastest of its
  // top 8 on these operands); *found is false when it has none.
  Status ChooseAlgo(Plan& p, int64_t n, const void* x, const void* w, float* out, bool* found);
  StatusOr<int> PickFastest(const Plan& p, const void* results, int found, const void* x, const void* w, float* out);
  bool tune_ = false;
  void* handle_ = nullptr;  // cublasLtHandle_t
  void* stream_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  // A null plan: no bias epilogue for that shape.
  std::map<PlanKey, Plan*> plans_;
  // (n, k, m, w_stride, out_stride) -> plan; null: cuBLASLt has no algorithm for it.
  std::map<std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t>, Plan*> fp8_plans_;
};

}  // namespace fathom
