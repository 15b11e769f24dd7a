// The CUDA backend: the Backend ops on one GPU and one stream, float32 activations over f32/f16/bf16 weights and
// block-scaled f8 e4m3 ones (LinearFormat::kFp8Block) and 4-bit AWQ/GPTQ ones (kAwq, kGptq). Its kernels sit behind
// launchers, one header and .cu file per op family (norm.h, rope_kv.h, linear.h, attention.h, mla.h, moe.h, sampling.h,
// fp8.h, int4.h, gather.h, elementwise.h), with cuBLASLt's GEMMs in gemm.h. Each weight format is a provider that owns
// its kernels and state (linear_format.h: linear_dense.cc, linear_fp8.cc, linear_int4.cc), and so is each attention
// layout (attention_layout.h: attention_gqa.cc, attention_mla.cc); this class keeps device memory, the stream,
// graphs, the profiler and the error latch (cuda_backend.cc), lends them to the providers as a cuda::OpContext,
// dispatches the linear ops on the weight's format (linear_dense.cc) and hands out the layouts' providers. Which kernel
// variant an op takes is KernelOptions' (kernel_options.h), read from the FATHOM_CUDA_* environment by Create and
// changeable with set_kernel_options.
//
//   FATHOM_ASSIGN_OR_RETURN(auto gpu, CudaBackend::Create(/*device=*/0));
//   FATHOM_ASSIGN_OR_RETURN(auto model, LoadModel(dir, cfg, options, *gpu));
//
// Indices (token ids, slots, block tables) are trusted: ForwardBatch::Validate checks them on the host first.
// Launch errors are recorded and returned by Synchronize().
#pragma once

#include <array>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "backend/cuda/attention_layout.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/kernel_options.h"
#include "backend/cuda/linear_format.h"
#include "model/backend.h"

namespace fathom {

// A CUDA error code (cudaError_t; 0: success) as a Status naming `what`: ResourceExhausted for an allocation failure,
// Internal otherwise.
Status CudaStatus(int cuda_error, std::string_view what);

class CudaBackend final : public Backend, private cuda::OpContext {
 public:
  // Kernel options from the environment (KernelOptions::FromEnvironment), or the given ones.
  static StatusOr<std::unique_ptr<CudaBackend>> Create(int device);
  static StatusOr<std::unique_ptr<CudaBackend>> Create(int device, const cuda::KernelOptions& options);
  ~CudaBackend() override;

  // The kernel variants the ops take from now on (tests and benchmarks switch them; turning `profile` on or off
  // starts or ends the timing). Not while a graph is being captured.
  const cuda::KernelOptions& kernel_options() const override { return options_; }
  void set_kernel_options(const cuda::KernelOptions& options);
  int sm_count() const override { return sm_count_; }  // the GPU's multiprocessors (132 on an H200)
  std::string device_model() const override { return device_model_; }

  std::string_view name() const override { return "cuda"; }
  Device device() const override { return Device::kCuda; }
  DType activation_dtype() const override { return DType::kF32; }
  // Half the bytes of f32 per cached token, and the tensor-core decode attention reads 16-bit caches.
  DType kv_cache_dtype() const override { return DType::kBF16; }
  // f32, f16, bf16 and f8 e4m3 with scales (f8: every attention kernel; the tensor-core and MLA ones widen its codes
  // to bf16).
  bool SupportsKvCacheDtype(DType dtype) const override { return IsKvCacheDtype(dtype); }
  // Each attention layout's provider (attention_layout.h: attention_gqa.cc, attention_mla.cc); null for a layout
  // with none here yet (mla_sparse: the engine refuses such a model by name).
  AttentionOps* attention_ops(AttentionLayout layout) override {
    const auto& l = layouts_[static_cast<size_t>(layout)];
    return l ? &l->ops() : nullptr;
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
  // The weight's format provider's Prepare (the 4-bit tile layout, FP8's padded GEMM scales).
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
  // cuda::OpContext, for the providers (linear_format.h says what each does).
  cuda::Stream cuda_stream() const override { return stream_; }
  bool capturing() const override { return capturing_; }
  bool has_graphs() const override { return !graphs_.empty(); }
  CublasLtGemm* gemm() const override { return gemm_.get(); }
  const void* DerivedCopy(const void* block, bool can_make, size_t bytes,
                          const std::function<void(void*)>& make) override;
  std::shared_ptr<void> DerivedState(const void* p) override;
  void SetDerivedState(const void* p, std::shared_ptr<void> state) override;
  void* ProfileStart() override { return profile_ ? RecordStart() : nullptr; }
  void ProfileEnd(const char* op, void* start) override {
    if (start != nullptr) RecordEnd(op, start);
  }

  void Check(int err, const char* op) override;
  void RecordError(const Status& st) override;  // keeps the first error, which Synchronize returns
  void Launch(const char* op, const std::function<int()>& launch) override;
  void CollectProfile();
  void* RecordStart();
  void RecordEnd(const char* op, void* start);
  std::unique_ptr<CublasLtGemm> gemm_;
  std::unique_ptr<Profile> profile_;
  // Scratch memory for kernels that need it (split-K attention partials); grows on demand, never shrinks.
  void* Workspace(size_t bytes) override;
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
  // The weight formats' providers, by LinearFormat (kAwq and kGptq share one).
  cuda::LinearFormatTable formats_;
  cuda::LinearFormatKernels& Kernels(LinearFormat f) const { return *formats_[static_cast<size_t>(f)]; }
  // The attention layouts' providers, by AttentionLayout.
  cuda::AttentionLayoutTable layouts_;
  std::mutex mu_;
  Status first_error_;
};

}  // namespace fathom
