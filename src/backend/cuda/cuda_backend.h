// The CUDA backend: the Backend ops on one GPU and one stream, float32 activations over f32/f16/bf16 weights and
// block-scaled f8 e4m3 ones (LinearFormat::kFp8Block) and 4-bit AWQ/GPTQ ones (kAwq, kGptq). Its kernels sit behind
// launchers, one header and .cu file per op family (norm.h, rope_kv.h, linear.h, attention.h, mla.h, moe.h, sampling.h,
// fp8.h, int4.h, gather.h, elementwise.h), with cuBLASLt's GEMMs in gemm.h. This class is defined in cuda_backend.cc
// (device memory, graphs, profiling and the non-linear ops), linear_dense.cc (Linear, LinearFanOut and HeadLinear on
// dense weights), linear_fp8.cc (every FP8-specific host path) and linear_int4.cc (the 4-bit ones). Which kernel
// variant an op takes is KernelOptions' (kernel_options.h), read from the FATHOM_CUDA_* environment by Create and
// changeable with set_kernel_options.
//
//   FATHOM_ASSIGN_OR_RETURN(auto gpu, CudaBackend::Create(/*device=*/0));
//   FATHOM_ASSIGN_OR_RETURN(auto model, LoadModel(dir, cfg, options, *gpu));
//
// Indices (token ids, slots, block tables) are trusted: ForwardBatch::Validate checks them on the host first.
// Launch errors are recorded and returned by Synchronize().
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "backend/cuda/gemm.h"
#include "backend/cuda/kernel_options.h"
#include "model/backend.h"

namespace fathom {

namespace cuda {
struct GemvPart;     // linear.h
struct Int4MmaPart;  // int4.h
}  // namespace cuda

// A CUDA error code (cudaError_t; 0: success) as a Status naming `what`: ResourceExhausted for an allocation failure,
// Internal otherwise.
Status CudaStatus(int cuda_error, std::string_view what);

class CudaBackend final : public Backend {
 public:
  // Kernel options from the environment (KernelOptions::FromEnvironment), or the given ones.
  static StatusOr<std::unique_ptr<CudaBackend>> Create(int device);
  static StatusOr<std::unique_ptr<CudaBackend>> Create(int device, const cuda::KernelOptions& options);
  ~CudaBackend() override;

  // The kernel variants the ops take from now on (tests and benchmarks switch them; turning `profile` on or off
  // starts or ends the timing). Not while a graph is being captured.
  const cuda::KernelOptions& kernel_options() const { return options_; }
  void set_kernel_options(const cuda::KernelOptions& options);
  int sm_count() const { return sm_count_; }  // the GPU's multiprocessors (132 on an H200)
  std::string device_model() const override { return device_model_; }

  std::string_view name() const override { return "cuda"; }
  Device device() const override { return Device::kCuda; }
  DType activation_dtype() const override { return DType::kF32; }
  // Half the bytes of f32 per cached token, and the tensor-core decode attention reads 16-bit caches.
  DType kv_cache_dtype() const override { return DType::kBF16; }
  // f32, f16, bf16 and f8 e4m3 with scales (f8: every attention kernel; the tensor-core and MLA ones widen its codes
  // to bf16).
  bool SupportsKvCacheDtype(DType dtype) const override { return IsKvCacheDtype(dtype); }
  // An f8 latent cache only with the MLA kernel's f8 form (KernelOptions::mla_fp8, on by default, and the MLA kernel
  // on): the generic kernels read the latent row once per head, and past their workspace cannot hold long contexts.
  bool ServesMlaKvCacheDtype(DType dtype) const override {
    return dtype != DType::kF8E4M3 || (options_.mla_fp8 && options_.mla_attention);
  }

  DeviceMemoryInfo MemoryInfo() override;
  using Backend::Alloc;
  Tensor Alloc(DType dtype, std::span<const int64_t> shape) override;
  StatusOr<Tensor> Upload(const TensorView& host) override;
  Status CopyToHost(const TensorView& src, void* dst) override;

  void Embedding(const TensorView& ids, const TensorView& table, const TensorView& out) override;
  void RmsNorm(const TensorView& x, const TensorView& weight, float eps, const TensorView& out) override;
  void AddRmsNorm(const TensorView& residual, const TensorView& x, const TensorView& weight, float eps,
                  const TensorView& out) override;
  // kFp8Block weights with the W8A8 GEMM on (KernelOptions::fp8_gemm_tokens): the scales' zero-padded copy that
  // cuBLASLt reads, kept in w.device_state (otherwise made at the first W8A8 Linear). Nothing for other weights.
  Status PrepareLinear(LinearWeight& w) override;
  void Linear(const TensorView& x, const LinearWeight& w, const TensorView& out) override;
  void LinearFanOut(const TensorView& x, std::span<const LinearWeight> ws, std::span<const TensorView> outs) override;
  void HeadLinear(const TensorView& x, const TensorView& w, const TensorView& out) override;
  void AddInPlace(const TensorView& a, const TensorView& b) override;
  void SiluMul(const TensorView& gate, const TensorView& up, const TensorView& out) override;
  void SiluMulLinear(const TensorView& gate, const TensorView& up, const LinearWeight& w,
                     const TensorView& out) override;
  void RopeCosSin(const TensorView& positions, const TensorView& inv_freq, float scale, const TensorView& cos,
                  const TensorView& sin) override;
  void ApplyRope(const TensorView& x, const TensorView& cos, const TensorView& sin, bool interleaved) override;
  void WriteKv(const TensorView& k, const TensorView& v, const AttentionMetadata& meta,
               const KvLayerView& cache) override;
  void RopeWriteKv(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& cos,
                   const TensorView& sin, bool interleaved, const AttentionMetadata& meta,
                   const KvLayerView& cache) override;
  void PagedAttention(const TensorView& q, const KvLayerView& cache, const AttentionMetadata& meta, float scale,
                      const TensorView& out) override;
  void GatherContext(const KvLayerView& cache, const AttentionMetadata& meta, const TensorView& out) override;
  void MlaContextAttention(const TensorView& q, const TensorView& k_nope, const TensorView& k_rope, const TensorView& v,
                           const AttentionMetadata& meta, float scale, const TensorView& out) override;
  void GatherRows(const TensorView& x, const TensorView& indices, const TensorView& out) override;
  void ScatterAddRows(const TensorView& x, const TensorView& indices, const TensorView& weights,
                      const TensorView& out) override;
  void MoeRoute(const TensorView& logits, const TensorView& bias, const moe_route::Params& p, const TensorView& ids,
                const TensorView& weights) override;
  Status PrepareExperts(ExpertSet& experts) override;
  Status MoeExperts(const TensorView& x, const ExpertSet& experts, const TensorView& ids, const TensorView& weights,
                    const TensorView& out) override;
  void ArgMax(const TensorView& logits, const TensorView& ids) override;
  bool SupportsSampling() const override { return true; }
  Status SampleRows(const TensorView& logits, std::span<const SampleRowSpec> rows, std::span<const LogitAdjust> adjust,
                    std::span<SampledToken> out) override;
  // The masks go through a pinned staging buffer (kMaskStagingBytes at first, grown as needed) into pooled device
  // memory with one async copy on the stream, then one kernel: the CPU waits for neither the forward pass queued
  // before nor the copy (only, when the buffer is reused, for the previous call's copy out of it). Not while a graph
  // is being captured.
  Status MaskLogits(const TensorView& logits, std::span<const int32_t> rows, std::span<const uint32_t> masks,
                    int64_t words_per_row) override;
  static constexpr size_t kMaskStagingBytes = 64u << 10;
  void Copy(const TensorView& src, const TensorView& dst) override;
  Status Synchronize() override;
  Status MakeCurrent() override;
  Status CopyFromHost(const void* src, const TensorView& dst) override;
  Status CopyOnDevice(const TensorView& src, const TensorView& dst) override;
  // f32, bf16 and f8 e4m3 (f16 and others: Unimplemented, filled on the host).
  Status FillDummy(const TensorView& out, uint64_t key, float scale, std::optional<float> constant) override;

  // CUDA graphs: captured in relaxed mode on the backend's stream; not while profiling (KernelOptions::profile: its
  // events would be captured too).
  bool SupportsGraphs() const override { return profile_ == nullptr; }
  // cudaStream_t: the stream every op runs on (NCCL's ranks enqueue on it; tests and benchmarks launch on it directly).
  void* native_stream() const override { return stream_; }
  Status BeginCapture() override;
  StatusOr<int64_t> EndCapture() override;
  Status ReplayGraph(int64_t graph) override;

  // With KernelOptions::profile (FATHOM_CUDA_PROFILE), every launch is timed with CUDA events; this returns the
  // per-op table (total time, calls, time per call, share) since profiling started. Empty when profiling is off.
  std::string ProfileReport() override;
  // Forgets what was timed so far (to time decode steps apart from the prefill).
  void ResetProfile() override;

  // How many ops since this backend was made took a path through the host instead of their device kernels (today:
  // MoeExperts' host-sorted path, where a batch, a layout or KernelOptions::host_moe rules the device path out). It
  // synchronizes the stream and cannot be captured; backend_ops_test's strict mode (FATHOM_OPS_STRICT_DEVICE=1)
  // fails a GPU row that took one.
  int64_t host_fallbacks() const { return host_fallbacks_; }

  // By default (KernelOptions::moe_mma_tokens) batches of this many tokens or more run their routed experts as
  // grouped tensor-core GEMMs, smaller ones as grouped GEMVs on float32 activations (bench/cuda_kernel_bench --moe 1
  // on the H200, V2-Lite's experts: at 8 tokens 186 us against 278, at 1 token even, 54 against 53).
  static constexpr int64_t kMoeMmaTokens = cuda::KernelOptions::kDefaultMoeMmaTokens;

  // Linears on block-scaled f8 weights (DeepSeek-V3) are W8A16 by default: decode batches (n <= 8) stream the f8
  // weights through the GEMV on float32 activations; larger ones dequantize the weight to bf16 in the workspace and
  // take the bf16 cuBLASLt GEMM, as bf16 weights do. Both keep a token's result independent of its batch and follow
  // the dequantized-weight oracle to bf16 tolerance. KernelOptions::fp8_gemm_tokens = N (FATHOM_CUDA_FP8_GEMM_TOKENS,
  // opt-in) runs batches of N tokens or more as cuBLASLt's block-scaled FP8 GEMM on activations quantized per token
  // and 128 columns (W8A8, DeepSeek's own inference recipe): 1.7-1.9x the bf16 GEMM's TFLOP/s at V3's prefill shapes
  // on the H200, and about 2.5% rms error per linear. All of it lives in linear_fp8.cc.

 private:
  struct Profile {
    struct Pending {
      const char* op;
      void* start;  // cudaEvent_t
      void* end;
    };
    ~Profile();
    std::vector<Pending> pending;
    std::map<std::string, std::pair<double, int64_t>> totals;  // op -> (ms, calls)
  };

  // Device memory for Alloc/Upload: blocks of up to kMaxPooledBytes are kept on free lists by size class and reused
  // (in stream order, on the backend's one stream), so a forward pass costs no cudaMalloc/cudaFree, which would
  // synchronize the device. Larger blocks (KV caches, weights) go straight to cudaMalloc. Shared with the tensors'
  // deleters so that a tensor may outlive the backend.
  struct Pool;
  static constexpr size_t kMaxPooledBytes = 256ull << 20;

  // Device memory for the tensors and workspaces of captured graphs: chunks that are never freed while the backend
  // lives, handed out in order from the start again at each capture (graphs replay one at a time on one stream, so
  // they may share it).
  struct Arena {
    std::vector<std::pair<void*, size_t>> chunks;
    size_t chunk = 0;
    size_t offset = 0;
  };
  static constexpr size_t kArenaChunkBytes = 64ull << 20;
  void* ArenaTake(size_t bytes);  // null when cudaMalloc fails: arena_error_ says why
  std::string arena_error_;
  // Workspace() while capturing: one buffer shared by every captured op (the last of these; the earlier, smaller ones
  // stay allocated for the graphs that point into them).
  std::vector<void*> graph_workspaces_;
  size_t graph_workspace_bytes_ = 0;

  CudaBackend() = default;
  StatusOr<Tensor> NewDeviceTensor(DType dtype, std::span<const int64_t> shape);
  std::shared_ptr<Pool> pool_;
  // A copy derived from the pooled memory block at `block` (a float32 bias, padded FP8 scales): made once, by `make`
  // into `bytes` of new device memory (on the stream), and freed with the block. Null when it does not exist yet and
  // cannot be made: !can_make, while capturing a graph, for memory that is not a pooled block of its own, or when the
  // allocation fails.
  const void* DerivedCopy(const void* block, bool can_make, size_t bytes, const std::function<void(void*)>& make);
  // A state made from the device memory at p (a 4-bit weight's tile layout), dropped when p's block is freed; null
  // when there is none.
  std::shared_ptr<void> DerivedState(const void* p);
  void SetDerivedState(const void* p, std::shared_ptr<void> state);

  // Dense weights (linear_dense.cc). Prefill-shaped GEMMs (n > 8) on bf16 weights go to cuBLASLt's tensor cores: x
  // rounded to bf16 once into the workspace (StageBf16), float32 accumulation and output, the bias in cuBLASLt's
  // epilogue (a kernel where it has none for the shape). Decode-shaped ones stay on the float32-input GEMV, which is
  // memory-bound anyway. KernelOptions::f32_gemm keeps every GEMM on float32 inputs (the exact reference path).
  bool UseCublasLt(int64_t n, const LinearWeight& w) const;
  void* StageBf16(const TensorView& x);  // null (error recorded) when the workspace cannot grow
  void* StageBf16(const float* x, int64_t xs, int64_t rows, int64_t cols);  // rows xs apart
  // w_bf16: a contiguous bf16 copy of w's weight to use instead (dequantized f8), or null.
  void GemmFromStaged(const void* xb, int64_t n, int64_t k, const LinearWeight& w, const TensorView& out,
                      const void* w_bf16 = nullptr);
  // A float32 copy of a 16-bit bias, made once (cuBLASLt's bias epilogue with float32 output takes float32 biases)
  // and freed with the bias's memory block (Pool); null for a bias that is not a pooled block of its own, or while
  // capturing a graph before the copy exists: the caller then adds the bias with a kernel.
  const float* F32Bias(const TensorView& bias);

  // Block-scaled f8 weights (linear_fp8.cc).
  // Linear on a kFp8Block weight: W8A8 (opt-in), W8A16 prefill or the f8 GEMV / generic kernel.
  void LinearFp8Block(const TensorView& x, const LinearWeight& w, const TensorView& out);
  // The W8A8 GEMM's conditions on the weight alone: 128 x 128 blocks, m and k multiples of 128, contiguous scales.
  static bool Fp8GemmFits(const LinearWeight& w);
  bool UseFp8Gemm(int64_t n, const LinearWeight& w) const;
  bool UseDequantGemm(int64_t n, const LinearWeight& w) const;
  // The W8A16 prefill path of Linear on f8 weights; false when the workspace cannot grow (the caller falls back).
  bool LinearDequantF8(const TensorView& x, const LinearWeight& w, const TensorView& out);
  // The W8A8 path of Linear; false when it could not run (no workspace, no cuBLASLt algorithm): the caller falls back.
  bool LinearFp8(const TensorView& x, const LinearWeight& w, const TensorView& out);
  bool fp8_gemm_unavailable_ = false;
  // w's block scales as the FP8 GEMM reads them: rows of a multiple of 4 K blocks (where DeepSeek's [m / 128][k / 128]
  // rows are shorter: the zero-padded copy of PrepareLinear, or one made at the first use and freed with the scales'
  // memory block); null while capturing a graph before the copy exists.
  const float* Fp8GemmScales(const LinearWeight& w);
  // The f8 fields of a GEMV part (its scales and blocks) for a kFp8Block weight.
  static void SetFp8GemvScales(const LinearWeight& w, cuda::GemvPart* part);
  // Whether an expert's f8 block scales take the device MoE path: 128 x 128 blocks, contiguous f32
  // [ceil(out / 128), ceil(in / 128)].
  static bool Fp8ExpertScalesFit(const LinearWeight& w, int64_t out, int64_t in);

  // 4-bit weights (linear_int4.cc): the tile layout made in place at PrepareLinear (or the checkpoint's layout where a
  // shape does not fit it); Linear on the W4A16 tensor-core kernel up to KernelOptions::int4_gemm_tokens tokens, on
  // dequantize-then-cuBLASLt above.
  Status PrepareInt4(LinearWeight& w);
  // PrepareExperts for 4-bit experts: the device table of their tiled weights, scales and zeros (moe.h) where every
  // expert was tiled without an act-order permutation and shares the gate's group, scales dtype and zero offset.
  Status PrepareInt4Experts(ExpertSet& experts);
  void LinearInt4(const TensorView& x, const LinearWeight& w, const TensorView& out);
  // 4-bit weights of one x in one W4A16 launch; false (nothing done) when they do not fit it.
  bool LinearInt4FanOut(const TensorView& x, std::span<const LinearWeight> ws, std::span<const TensorView> outs);
  void Int4Mma(const TensorView& x, const int32_t* perm, const cuda::Int4MmaPart* parts, int count);
  int* int4_counters_ = nullptr;   // cuda::kInt4MaxCounters zeroed ints for the W4A16 kernel's partial sums
  float* int4_scratch_ = nullptr;  // cuda::kInt4MmaScratchFloats: its partial sums
  void* int4_stage_ = nullptr;     // x as bf16 for its batches past kInt4StageMinTokens
  size_t int4_stage_bytes_ = 0;
  static constexpr int64_t kInt4StageMinTokens = 16;

  void Check(int err, const char* op);
  void RecordError(const Status& st);  // keeps the first error, which Synchronize returns
  void Launch(const char* op, const std::function<int()>& launch);
  void CollectProfile();
  void* RecordStart();
  void RecordEnd(const char* op, void* start);
  std::unique_ptr<CublasLtGemm> gemm_;
  std::unique_ptr<Profile> profile_;
  // Scratch memory for kernels that need it (split-K attention partials); grows on demand, never shrinks.
  void* Workspace(size_t bytes);
  static constexpr int64_t kMaxAttentionWorkspace = 256ll << 20;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  // MaskLogits' pinned host staging (cudaHostAlloc) and the event after its last copy out of it (cudaEvent_t).
  void* mask_staging_ = nullptr;
  size_t mask_staging_bytes_ = 0;
  void* mask_copied_ = nullptr;
  Arena arena_;
  bool capturing_ = false;
  int64_t host_fallbacks_ = 0;  // host_fallbacks()
  std::vector<void*> graphs_;   // cudaGraphExec_t, by graph id
  int device_ = 0;
  int sm_count_ = 0;
  std::string device_model_;  // cudaDeviceProp::name
  cuda::KernelOptions options_;
  void* stream_ = nullptr;  // cudaStream_t
  std::mutex mu_;
  Status first_error_;
};

}  // namespace fathom
