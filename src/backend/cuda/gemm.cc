#include "backend/cuda/gemm.h"

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <fmt/format.h>

namespace fathom {

namespace {

Status LtStatus(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return OkStatus();
  return InternalError(fmt::format("cuBLASLt {}: status {}", what, static_cast<int>(s)));
}

}  // namespace

struct CublasLtGemm::Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
  ~Plan() {
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
};

CublasLtGemm::~CublasLtGemm() {
  for (auto& [key, plan] : plans_) delete plan;
  for (auto& [key, plan] : fp8_plans_) delete plan;
  if (workspace_) cudaFree(workspace_);
  if (handle_) cublasLtDestroy(static_cast<cublasLtHandle_t>(handle_));
}

Status CublasLtGemm::Init(void* stream) {
  stream_ = stream;
  cublasLtHandle_t h = nullptr;
  FATHOM_RETURN_IF_ERROR(LtStatus(cublasLtCreate(&h), "create"));
  handle_ = h;
  workspace_bytes_ = 32u << 20;
  if (cudaMalloc(&workspace_, workspace_bytes_) != cudaSuccess) {
    return ResourceExhaustedError("cannot allocate the 32 MiB cuBLASLt workspace");
  }
  return OkStatus();
}

StatusOr<int> CublasLtGemm::PickFastest(const Plan& p, const void* results_v, int found, const void* x, const void* w,
                                        float* out) {
  const auto* results = static_cast<const cublasLtMatmulHeuristicResult_t*>(results_v);
  cudaStream_t s = static_cast<cudaStream_t>(stream_);
  cudaEvent_t start = nullptr, end = nullptr;
  if (cudaEventCreate(&start) != cudaSuccess || cudaEventCreate(&end) != cudaSuccess) {
    return InternalError("cudaEventCreate failed");
  }
  const float alpha = 1.0f, beta = 0.0f;
  int best = 0;
  float best_ms = 0.0f;
  for (int i = 0; i < found; ++i) {
    float ms = 0.0f;
    bool ok = true;
    for (int rep = 0; rep < 3 && ok; ++rep) {  // the first run warms up; the last two are timed
      if (rep == 1) cudaEventRecord(start, s);
      ok = cublasLtMatmul(static_cast<cublasLtHandle_t>(handle_), p.desc, &alpha, w, p.a, x, p.b, &beta, out, p.d, out,
                          p.d, &results[i].algo, workspace_, workspace_bytes_, s) == CUBLAS_STATUS_SUCCESS;
    }
    cudaEventRecord(end, s);
    if (cudaEventSynchronize(end) != cudaSuccess || !ok) continue;
    cudaEventElapsedTime(&ms, start, end);
    if (i == 0 || ms < best_ms) {
      best = i;
      best_ms = ms;
    }
  }
  cudaEventDestroy(start);
  cudaEventDestroy(end);
  return best;
}

Status CublasLtGemm::Run(const void* x, int64_t n, int64_t k, const void* w, int64_t w_stride, int64_t m, float* out,
                         int64_t out_stride, const void* bias, int bias_dtype, bool* bias_added) {
  // Column-major view: W row-major [m, k] is Wc (k x m, ld w_stride); x row-major [n, k] is Xc (k x n, ld k);
  // out row-major [n, m] is Oc (m x n, ld out_stride). Oc = Wc^T Xc (+ bias per row of Oc, i.e. per output feature).
  if (bias_added != nullptr) *bias_added = false;
  // fathom's DType codes 0 (f32), 1 (f16), 2 (bf16) -> the epilogue's bias type.
  const cudaDataType_t bias_type = bias_dtype == 0 ? CUDA_R_32F : bias_dtype == 1 ? CUDA_R_16F : CUDA_R_16BF;
  if (bias != nullptr && bias_dtype >= 0 && bias_dtype <= 2) {
    const PlanKey with_bias{n, k, m, w_stride, out_stride, bias_dtype, 1, k, 0, 0};
    auto it = plans_.find(with_bias);
    if (it == plans_.end() || it->second != nullptr) {  // not known to lack an algorithm
      FATHOM_RETURN_IF_ERROR(RunPlan(with_bias, x, w, out, bias, bias_type));
      if (plans_.at(with_bias) != nullptr) {
        if (bias_added != nullptr) *bias_added = true;
        return OkStatus();
      }
    }
  }
  return RunPlan(PlanKey{n, k, m, w_stride, out_stride, -1, 1, k, 0, 0}, x, w, out, nullptr, CUDA_R_32F);
}

Status CublasLtGemm::RunBatched(const void* x, int64_t x_ld, int64_t x_batch_stride, int64_t n, int64_t k,
                                const void* w, int64_t m, float* out, int64_t out_stride, int64_t out_batch_stride,
                                int64_t batch) {
  return RunPlan(PlanKey{n, k, m, k, out_stride, -1, batch, x_ld, x_batch_stride, out_batch_stride}, x, w, out, nullptr,
                 CUDA_R_32F);
}

Status CublasLtGemm::CreateDesc(Plan& p) {
  FATHOM_RETURN_IF_ERROR(LtStatus(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "desc"));
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  FATHOM_RETURN_IF_ERROR(
      LtStatus(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)), "transa"));
  return LtStatus(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)), "transb");
}

Status CublasLtGemm::ChooseAlgo(Plan& p, int64_t n, const void* x, const void* w, float* out, bool* found) {
  *found = false;
  cublasLtMatmulPreference_t pref = nullptr;
  FATHOM_RETURN_IF_ERROR(LtStatus(cublasLtMatmulPreferenceCreate(&pref), "preference"));
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes_,
                                       sizeof(workspace_bytes_));
  constexpr int kCandidates = 8;
  cublasLtMatmulHeuristicResult_t results[kCandidates] = {};
  int count = 0;
  const cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(static_cast<cublasLtHandle_t>(handle_), p.desc, p.a, p.b,
                                                           p.d, p.d, pref, kCandidates, results, &count);
  cublasLtMatmulPreferenceDestroy(pref);
  FATHOM_RETURN_IF_ERROR(LtStatus(hs, "heuristic"));
  if (count == 0) return OkStatus();
  *found = true;
  p.algo = results[0].algo;
  // The first heuristic is not always the fastest. With tune_ (KernelOptions::gemm_tune), prefill-sized GEMMs time
  // the candidates once (two runs each, on the real operands) and keep the best. Off by default: on the H200 the best
  // of 8 gained 0-3% at the R1-Distill-Qwen-7B shapes (a measurement of 2026-11-30 whose file was never committed),
  // while tuning costs milliseconds per new shape, and chunked prefill brings many.
  if (tune_ && count > 1 && n >= kTuneMinRows) {
    FATHOM_ASSIGN_OR_RETURN(const int best, PickFastest(p, results, count, x, w, out));
    p.algo = results[best].algo;
  }
  return OkStatus();
}

Status CublasLtGemm::RunPlan(const PlanKey& key, const void* x, const void* w, float* out, const void* bias,
                             int bias_type) {
  const auto [n, k, m, w_stride, out_stride, bias_dtype, batch, x_ld, x_batch_stride, out_batch_stride] = key;
  Plan* plan = nullptr;
  auto it = plans_.find(key);
  if (it != plans_.end()) {
    plan = it->second;
    if (plan == nullptr) return OkStatus();  // a bias epilogue known to be unavailable: the caller falls back
  } else {
    auto p = std::make_unique<Plan>();
    FATHOM_RETURN_IF_ERROR(CreateDesc(*p));
    if (bias_dtype >= 0) {
      const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
      const cudaDataType_t bt = static_cast<cudaDataType_t>(bias_type);
      FATHOM_RETURN_IF_ERROR(LtStatus(
          cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)), "epilogue"));
      FATHOM_RETURN_IF_ERROR(LtStatus(
          cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof(bt)), "bias type"));
      FATHOM_RETURN_IF_ERROR(LtStatus(
          cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)), "bias"));
    }
    FATHOM_RETURN_IF_ERROR(LtStatus(cublasLtMatrixLayoutCreate(&p->a, CUDA_R_16BF, k, m, w_stride), "layout A"));
    FATHOM_RETURN_IF_ERROR(LtStatus(cublasLtMatrixLayoutCreate(&p->b, CUDA_R_16BF, k, n, x_ld), "layout B"));
    FATHOM_RETURN_IF_ERROR(LtStatus(cublasLtMatrixLayoutCreate(&p->d, CUDA_R_32F, m, n, out_stride), "layout D"));
    if (batch > 1) {  // strided batches: W_b, x_b and out_b at fixed offsets
      const int32_t count = static_cast<int32_t>(batch);
      const int64_t offsets[3] = {m * k, x_batch_stride, out_batch_stride};
      cublasLtMatrixLayout_t layouts[3] = {p->a, p->b, p->d};
      for (int i = 0; i < 3; ++i) {
        FATHOM_RETURN_IF_ERROR(LtStatus(
            cublasLtMatrixLayoutSetAttribute(layouts[i], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)),
            "batch count"));
        FATHOM_RETURN_IF_ERROR(
            LtStatus(cublasLtMatrixLayoutSetAttribute(layouts[i], CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                      &offsets[i], sizeof(offsets[i])),
                     "batch offset"));
      }
    }
    bool found = false;
    const Status hs = ChooseAlgo(*p, n, x, w, out, &found);
    if (bias_dtype >= 0 && (!hs.ok() || !found)) {
      plans_[key] = nullptr;  // no bias epilogue here: the caller adds the bias
      return OkStatus();
    }
    FATHOM_RETURN_IF_ERROR(hs);
    if (!found) return InternalError(fmt::format("cuBLASLt has no bf16 algorithm for n={} k={} m={}", n, k, m));
    plan = p.release();
    plans_[key] = plan;
  }
  if (bias_dtype >= 0) {  // the pointer changes from layer to layer
    FATHOM_RETURN_IF_ERROR(LtStatus(
        cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)), "bias"));
  }
  const float alpha = 1.0f, beta = 0.0f;
  return LtStatus(cublasLtMatmul(static_cast<cublasLtHandle_t>(handle_), plan->desc, &alpha, w, plan->a, x, plan->b,
                                 &beta, out, plan->d, out, plan->d, &plan->algo, workspace_, workspace_bytes_,
                                 static_cast<cudaStream_t>(stream_)),
                  "matmul");
}

Status CublasLtGemm::RunFp8(const void* xq, const float* x_scales, int64_t n, int64_t k, const void* w,
                            int64_t w_stride, const float* w_scales, int64_t m, float* out, int64_t out_stride) {
  if (n % 4 != 0 || k % 128 != 0 || m % 128 != 0) {
    return InvalidArgumentError(
        fmt::format("block-scaled FP8 GEMM needs n % 4, k % 128 and m % 128 to be 0 (n={} "
                    "k={} m={})",
                    n, k, m));
  }
  // Column-major view as in Run: A = W (k x m, ld w_stride) with 128 x 128 block scales, B = xq (k x n, ld k) with
  // 1 x 128 scales, D = out (m x n, ld out_stride). Measured on the H200 with cuBLASLt 13.1 (A/B role swapped as
  // well): W's scales are read as [m / 128] rows of the K blocks, each row padded to a multiple of 4 blocks (with
  // k / 128 = 1, 2 or 3 the checkpoint's unpadded rows gave wrong results), xq's as [k / 128][n] with the tokens
  // contiguous, and n must be a multiple of 4 (no algorithm otherwise).
  const auto key = std::make_tuple(n, k, m, w_stride, out_stride);
  Plan* plan = nullptr;
  if (auto it = fp8_plans_.find(key); it != fp8_plans_.end()) {
    plan = it->second;
  } else {
    auto p = std::make_unique<Plan>();
    FATHOM_RETURN_IF_ERROR(CreateDesc(*p));
    const cublasLtMatmulMatrixScale_t a_mode = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F,
                                      b_mode = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    FATHOM_RETURN_IF_ERROR(LtStatus(
        cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &a_mode, sizeof(a_mode)), "A mode"));
    FATHOM_RETURN_IF_ERROR(LtStatus(
        cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &b_mode, sizeof(b_mode)), "B mode"));
    FATHOM_RETURN_IF_ERROR(SetFp8Scales(p->desc, w_scales, x_scales));
    FATHOM_RETURN_IF_ERROR(LtStatus(cublasLtMatrixLayoutCreate(&p->a, CUDA_R_8F_E4M3, k, m, w_stride), "layout A"));
    FATHOM_RETURN_IF_ERROR(LtStatus(cublasLtMatrixLayoutCreate(&p->b, CUDA_R_8F_E4M3, k, n, k), "layout B"));
    FATHOM_RETURN_IF_ERROR(LtStatus(cublasLtMatrixLayoutCreate(&p->d, CUDA_R_32F, m, n, out_stride), "layout D"));
    bool found = false;
    const Status hs = ChooseAlgo(*p, n, xq, w, out, &found);
    if (!hs.ok() || !found) {
      fp8_plans_[key] = nullptr;
      return UnimplementedError(fmt::format("cuBLASLt has no block-scaled FP8 algorithm for n={} k={} m={}", n, k, m));
    }
    plan = p.release();
    fp8_plans_[key] = plan;
  }
  if (plan == nullptr) {
    return UnimplementedError(fmt::format("cuBLASLt has no block-scaled FP8 algorithm for n={} k={} m={}", n, k, m));
  }
  FATHOM_RETURN_IF_ERROR(SetFp8Scales(plan->desc, w_scales, x_scales));  // they change from layer to layer
  const float alpha = 1.0f, beta = 0.0f;
  return LtStatus(cublasLtMatmul(static_cast<cublasLtHandle_t>(handle_), plan->desc, &alpha, w, plan->a, xq, plan->b,
                                 &beta, out, plan->d, out, plan->d, &plan->algo, workspace_, workspace_bytes_,
                                 static_cast<cudaStream_t>(stream_)),
                  "fp8 matmul");
}

Status CublasLtGemm::SetFp8Scales(void* desc, const float* a_scales, const float* b_scales) {
  auto d = static_cast<cublasLtMatmulDesc_t>(desc);
  FATHOM_RETURN_IF_ERROR(LtStatus(
      cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &a_scales, sizeof(a_scales)), "A scale"));
  return LtStatus(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &b_scales, sizeof(b_scales)),
                  "B scale");
}

}  // namespace fathom
