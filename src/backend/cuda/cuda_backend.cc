#include "backend/cuda/cuda_backend.h"

#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <set>

#include "backend/cuda/attention_layout.h"
#include "backend/cuda/elementwise.h"
#include "backend/cuda/gather.h"
#include "backend/cuda/moe.h"
#include "backend/cuda/norm.h"
#include "backend/cuda/rope_kv.h"
#include "backend/cuda/sampling.h"
#include "core/bytes.h"

namespace fathom {

Status CudaStatus(int err, std::string_view what) {
  const cudaError_t e = static_cast<cudaError_t>(err);
  if (e == cudaSuccess) return OkStatus();
  const StatusCode code = e == cudaErrorMemoryAllocation ? StatusCode::kResourceExhausted : StatusCode::kInternal;
  return Status(code, fmt::format("{}: CUDA error {} ({})", what, cudaGetErrorName(e), cudaGetErrorString(e)));
}

namespace {

int Dt(const TensorView& t) {
  return static_cast<int>(t.dtype());
}

}  // namespace

StatusOr<std::unique_ptr<CudaBackend>> CudaBackend::Create(int device) {
  FATHOM_ASSIGN_OR_RETURN(const cuda::KernelOptions options, cuda::KernelOptions::FromEnvironment());
  FATHOM_ASSIGN_OR_RETURN(std::unique_ptr<CudaBackend> be, Create(device, options));
  // Each attention layout's own switches (attention_mla.h's MlaKernelOptions).
  for (const auto& l : be->layouts_) {
    if (l) FATHOM_RETURN_IF_ERROR(l->ReadEnvironment());
  }
  return be;
}

StatusOr<std::unique_ptr<CudaBackend>> CudaBackend::Create(int device, const cuda::KernelOptions& options) {
  int count = 0;
  FATHOM_RETURN_IF_ERROR(CudaStatus(cudaGetDeviceCount(&count), "cudaGetDeviceCount"));
  if (device < 0 || device >= count) {
    return InvalidArgumentError(fmt::format("CUDA device {} does not exist ({} found)", device, count));
  }
  FATHOM_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device), "cudaSetDevice"));
  int sm_count = 0;
  FATHOM_RETURN_IF_ERROR(CudaStatus(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, device),
                                    "cudaDeviceGetAttribute(multiprocessors)"));
  cudaDeviceProp prop{};
  FATHOM_RETURN_IF_ERROR(CudaStatus(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties"));
  std::unique_ptr<CudaBackend> be(new CudaBackend());
  be->device_ = device;
  be->sm_count_ = sm_count;
  be->device_model_ = prop.name;
  be->options_ = options;
  be->pool_ = std::make_shared<Pool>();
  cudaStream_t s = nullptr;
  FATHOM_RETURN_IF_ERROR(CudaStatus(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate"));
  be->stream_ = s;
  cuda::SetProgrammaticLaunch(s, options.pdl);
  if (options.profile) be->profile_ = std::make_unique<Profile>();
  be->gemm_ = std::make_unique<CublasLtGemm>();
  FATHOM_RETURN_IF_ERROR(be->gemm_->Init(s));
  be->gemm_->set_tune(options.gemm_tune);
  be->formats_ = cuda::MakeLinearFormatKernels(*be);
  for (const auto& f : be->formats_) FATHOM_CHECK(f != nullptr, "a weight format without a CUDA provider");
  be->layouts_ = cuda::MakeAttentionLayouts(*be);
  // A layout without a provider here is null: attention_ops answers null, and
  // KvCache::Allocate and the engine builder refuse a model that needs it, naming the layout.
  return be;
}

void CudaBackend::set_kernel_options(const cuda::KernelOptions& options) {
  FATHOM_CHECK(!capturing_, "kernel options cannot change while a graph is captured");
  if (options.profile && !profile_) profile_ = std::make_unique<Profile>();
  if (!options.profile && profile_) {  // the pending events are read (and destroyed) once the stream is done
    Check(static_cast<int>(cudaStreamSynchronize(static_cast<cudaStream_t>(stream_))), "cudaStreamSynchronize");
    CollectProfile();
    profile_.reset();
  }
  if (gemm_) gemm_->set_tune(options.gemm_tune);
  cuda::SetProgrammaticLaunch(stream_, options.pdl);
  options_ = options;
}

struct CudaBackend::Pool {
  std::mutex mu;
  std::map<size_t, std::vector<void*>> free;  // size class -> blocks
  std::set<void*> live;                       // blocks handed out
  // live block -> a copy derived from it (a float32 bias: F32Bias; padded FP8 scales: Fp8GemmScales)
  std::map<void*, void*> f32_copies;
  // Pointers into live blocks -> a backend state made from the memory there (a 4-bit weight's tile layout:
  // linear_int4.cc), dropped when the block is freed.
  std::map<const void*, std::shared_ptr<void>> states;
  ~Pool() {
    for (auto& [bytes, blocks] : free) {
      for (void* p : blocks) cudaFree(p);
    }
    for (auto& [block, copy] : f32_copies) cudaFree(copy);
  }
  // Size classes: powers of two from 4 KiB, with four steps per doubling above 1 MiB (at most 19% slack).
  static size_t Class(size_t bytes) {
    size_t c = 4096;
    while (c < bytes && c < (1u << 20)) c *= 2;
    if (c >= bytes) return c;
    size_t p = 1u << 20;
    while (p * 2 < bytes) p *= 2;
    const size_t step = p / 4;
    return (bytes + step - 1) / step * step;
  }
  void* Take(size_t cls) {
    std::lock_guard<std::mutex> lock(mu);
    auto it = free.find(cls);
    if (it == free.end() || it->second.empty()) return nullptr;
    void* p = it->second.back();
    it->second.pop_back();
    live.insert(p);
    return p;
  }
  void Give(size_t cls, void* p) {
    std::lock_guard<std::mutex> lock(mu);
    live.erase(p);
    if (auto c = f32_copies.find(p); c != f32_copies.end()) {  // the block's derived copy dies with it
      cudaFree(c->second);
      f32_copies.erase(c);
    }
    Forget(p, cls);
    free[cls].push_back(p);
  }
  // Drops the states of pointers into [p, p + bytes) (mu held).
  void Forget(void* p, size_t bytes) {
    states.erase(states.lower_bound(p), states.lower_bound(static_cast<char*>(p) + bytes));
  }
  // Frees every cached block (when a cudaMalloc fails, to retry with what they held).
  void Trim() {
    std::lock_guard<std::mutex> lock(mu);
    for (auto& [bytes, blocks] : free) {
      for (void* p : blocks) cudaFree(p);
      blocks.clear();
    }
  }
};

StatusOr<Tensor> CudaBackend::NewDeviceTensor(DType dtype, std::span<const int64_t> shape) {
  TensorView probe(nullptr, dtype, shape);
  const size_t bytes = std::max<size_t>(probe.nbytes(), 16);
  if (capturing_) {
    void* p = ArenaTake(bytes);
    if (p == nullptr) return ResourceExhaustedError(arena_error_);
    return Tensor::Adopt(p, dtype, shape, Device::kCuda, [](void*) {});
  }
  const bool pooled = bytes <= kMaxPooledBytes;
  const size_t cls = pooled ? Pool::Class(bytes) : bytes;
  void* p = pooled ? pool_->Take(cls) : nullptr;
  if (p == nullptr) {
    cudaError_t e = cudaMalloc(&p, cls);
    if (e == cudaErrorMemoryAllocation) {
      cudaGetLastError();  // an allocation failure is not sticky: clear it and retry after trimming the pool
      pool_->Trim();
      e = cudaMalloc(&p, cls);
    }
    FATHOM_RETURN_IF_ERROR(CudaStatus(e, fmt::format("cudaMalloc of {} bytes", cls)));
    if (pooled) {
      std::lock_guard<std::mutex> lock(pool_->mu);
      pool_->live.insert(p);
    }
  }
  std::shared_ptr<Pool> pool = pool_;
  if (!pooled) {
    return Tensor::Adopt(p, dtype, shape, Device::kCuda, [pool, cls](void* q) {
      {
        std::lock_guard<std::mutex> lock(pool->mu);
        pool->Forget(q, cls);
      }
      cudaFree(q);
    });
  }
  return Tensor::Adopt(p, dtype, shape, Device::kCuda, [pool, cls](void* q) { pool->Give(cls, q); });
}

const void* CudaBackend::DerivedCopy(const void* block, bool can_make, size_t bytes,
                                     const std::function<void(void*)>& make) {
  std::lock_guard<std::mutex> lock(pool_->mu);
  if (auto it = pool_->f32_copies.find(const_cast<void*>(block)); it != pool_->f32_copies.end()) return it->second;
  if (!can_make || capturing_ || !pool_->live.contains(const_cast<void*>(block))) return nullptr;
  void* p = nullptr;
  if (cudaMalloc(&p, bytes) != cudaSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  make(p);
  pool_->f32_copies[const_cast<void*>(block)] = p;
  return p;
}

std::shared_ptr<void> CudaBackend::DerivedState(const void* p) {
  std::lock_guard<std::mutex> lock(pool_->mu);
  auto it = pool_->states.find(p);
  return it == pool_->states.end() ? nullptr : it->second;
}

void CudaBackend::SetDerivedState(const void* p, std::shared_ptr<void> state) {
  std::lock_guard<std::mutex> lock(pool_->mu);
  pool_->states[p] = std::move(state);
}

CudaBackend::~CudaBackend() {
  for (void* g : graphs_) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(g));
  for (const auto& [p, bytes] : arena_.chunks) cudaFree(p);
  for (auto& f : formats_) f.reset();
  gemm_.reset();
  if (workspace_ != nullptr) cudaFree(workspace_);
  for (void* p : graph_workspaces_) cudaFree(p);
  if (mask_copied_ != nullptr) {
    cudaEventSynchronize(static_cast<cudaEvent_t>(mask_copied_));  // the copy out of the staging buffer is done
    cudaEventDestroy(static_cast<cudaEvent_t>(mask_copied_));
  }
  if (mask_staging_ != nullptr) cudaFreeHost(mask_staging_);
  if (stream_ != nullptr) {
    cuda::ForgetProgrammaticLaunch(stream_);
    cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
  }
}

void* CudaBackend::Workspace(size_t bytes) {
  if (capturing_) {
    // A captured kernel keeps its pointer, so never the growable buffer below (it may be freed); but one op's
    // workspace is dead once the next op starts (one stream, replayed in order), as in eager mode, so every op of
    // every graph shares one capture workspace. It grows by new buffers, the old ones kept for the graphs that use
    // them: not per op from the arena, which cost a graph (layers) x (attention's and the experts' scratch).
    // Its buffers are not the arena's, which the next capture hands out again from its start.
    if (!graph_workspaces_.empty() && bytes <= graph_workspace_bytes_) return graph_workspaces_.back();
    // Doubling keeps the growth steps few; when that much is not free, exactly what is asked for.
    for (const size_t size : {std::max(bytes, 2 * graph_workspace_bytes_), std::max<size_t>(bytes, 1)}) {
      void* p = nullptr;
      if (const cudaError_t e = cudaMalloc(&p, size); e != cudaSuccess) {  // relaxed capture mode allows it
        cudaGetLastError();
        arena_error_ = fmt::format("graph workspace: cudaMalloc of {} bytes failed: {}", size, cudaGetErrorString(e));
        continue;
      }
      graph_workspaces_.push_back(p);
      graph_workspace_bytes_ = size;
      return p;
    }
    // The callers skip their kernels on null: the capture must fail rather than leave them out of the graph.
    RecordError(ResourceExhaustedError(arena_error_));
    return nullptr;
  }
  if (bytes <= workspace_bytes_) return workspace_;
  // Grows (rarely): the stream must be done with the old buffer before it is freed.
  Check(static_cast<int>(cudaStreamSynchronize(static_cast<cudaStream_t>(stream_))), "workspace");
  if (workspace_ != nullptr) cudaFree(workspace_);
  workspace_ = nullptr;
  workspace_bytes_ = 0;
  const cudaError_t e = cudaMalloc(&workspace_, bytes);
  if (e != cudaSuccess) {
    Check(static_cast<int>(e), "workspace cudaMalloc");
    workspace_ = nullptr;
    return nullptr;
  }
  workspace_bytes_ = bytes;
  return workspace_;
}

void* CudaBackend::ArenaTake(size_t bytes) {
  bytes = (bytes + 255) / 256 * 256;
  while (arena_.chunk < arena_.chunks.size()) {
    if (arena_.offset + bytes <= arena_.chunks[arena_.chunk].second) {
      void* p = static_cast<char*>(arena_.chunks[arena_.chunk].first) + arena_.offset;
      arena_.offset += bytes;
      return p;
    }
    ++arena_.chunk;
    arena_.offset = 0;
  }
  // Relaxed capture mode allows cudaMalloc; the chunk outlives every graph that uses it.
  const size_t size = std::max(bytes, kArenaChunkBytes);
  void* p = nullptr;
  if (const cudaError_t e = cudaMalloc(&p, size); e != cudaSuccess) {
    cudaGetLastError();
    size_t free = 0, total = 0;
    cudaMemGetInfo(&free, &total);
    cudaGetLastError();
    arena_error_ = fmt::format("graph arena: cudaMalloc of {} bytes failed: {} ({} free of {} on the device)", size,
                               cudaGetErrorString(e), FormatBytes(static_cast<int64_t>(free)),
                               FormatBytes(static_cast<int64_t>(total)));
    return nullptr;
  }
  arena_.chunks.emplace_back(p, size);
  arena_.chunk = arena_.chunks.size() - 1;
  arena_.offset = bytes;
  return p;
}

Status CudaBackend::BeginCapture() {
  if (capturing_) return FailedPreconditionError("a graph capture is already in progress");
  FATHOM_RETURN_IF_ERROR(Synchronize());
  arena_.chunk = 0;
  arena_.offset = 0;
  FATHOM_RETURN_IF_ERROR(CudaStatus(
      cudaStreamBeginCapture(static_cast<cudaStream_t>(stream_), cudaStreamCaptureModeRelaxed), "begin capture"));
  capturing_ = true;
  return OkStatus();
}

StatusOr<int64_t> CudaBackend::EndCapture() {
  if (!capturing_) return FailedPreconditionError("no graph capture is in progress");
  capturing_ = false;
  cudaGraph_t graph = nullptr;
  const cudaError_t e = cudaStreamEndCapture(static_cast<cudaStream_t>(stream_), &graph);
  Status recorded;
  {
    std::lock_guard<std::mutex> lock(mu_);
    recorded = first_error_;
    first_error_ = OkStatus();
  }
  if (e != cudaSuccess || !recorded.ok()) {
    if (graph != nullptr) cudaGraphDestroy(graph);
    cudaGetLastError();
    return recorded.ok() ? CudaStatus(e, "end capture") : recorded;
  }
  cudaGraphExec_t exec = nullptr;
  const cudaError_t ie = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  FATHOM_RETURN_IF_ERROR(CudaStatus(ie, "graph instantiate"));
  graphs_.push_back(exec);
  return static_cast<int64_t>(graphs_.size()) - 1;
}

Status CudaBackend::ReplayGraph(int64_t graph) {
  if (capturing_ || graph < 0 || graph >= static_cast<int64_t>(graphs_.size())) {
    return InvalidArgumentError(fmt::format("no graph {} to replay", graph));
  }
  Check(static_cast<int>(cudaGraphLaunch(static_cast<cudaGraphExec_t>(graphs_[static_cast<size_t>(graph)]),
                                         static_cast<cudaStream_t>(stream_))),
        "cudaGraphLaunch");
  return OkStatus();
}

Status CudaBackend::CopyFromHost(const void* src, const TensorView& dst) {
  if (!dst.is_contiguous()) return InvalidArgumentError("CopyFromHost needs a contiguous tensor");
  if (dst.nbytes() == 0) return OkStatus();
  return CudaStatus(
      cudaMemcpyAsync(dst.raw(), src, dst.nbytes(), cudaMemcpyHostToDevice, static_cast<cudaStream_t>(stream_)),
      "copy from host");
}

Status CudaBackend::FillDummy(const TensorView& out, uint64_t key, float scale, std::optional<float> constant) {
  const DType dt = out.dtype();
  if ((dt != DType::kF32 && dt != DType::kBF16 && dt != DType::kF16 && dt != DType::kF8E4M3 && dt != DType::kI32) ||
      !out.is_contiguous()) {
    return UnimplementedError(fmt::format("no device-side dummy weights of dtype {}", DTypeName(dt)));
  }
  uint32_t bits = 0;
  if (constant) {
    bits = dt == DType::kF32    ? std::bit_cast<uint32_t>(*constant)
           : dt == DType::kBF16 ? F32ToBf16(*constant)
           : dt == DType::kF16  ? F32ToF16(*constant)
           : dt == DType::kI32  ? static_cast<uint32_t>(static_cast<int32_t>(*constant))
                                : F32ToF8E4M3(*constant);
  }
  Launch("FillDummy", [&] {
    return cuda::LaunchFillDummy(out.raw(), Dt(out), out.numel(), key, scale, constant.has_value(), bits, sm_count_,
                                 stream_);
  });
  return Synchronize();
}

Status CudaBackend::CopyOnDevice(const TensorView& src, const TensorView& dst) {
  if (!src.is_contiguous() || !dst.is_contiguous() || src.dtype() != dst.dtype() || src.numel() != dst.numel()) {
    return InvalidArgumentError("CopyOnDevice needs contiguous tensors of one dtype and size");
  }
  if (src.nbytes() == 0) return OkStatus();
  return CudaStatus(
      cudaMemcpyAsync(dst.raw(), src.raw(), src.nbytes(), cudaMemcpyDeviceToDevice, static_cast<cudaStream_t>(stream_)),
      "copy on device");
}

CudaBackend::Profile::~Profile() = default;

void CudaBackend::Launch(const char* op, const std::function<int()>& launch) {
  if (!profile_) {
    Check(launch(), op);
    return;
  }
  cudaEvent_t start = nullptr, end = nullptr;
  cudaEventCreate(&start);
  cudaEventCreate(&end);
  cudaEventRecord(start, static_cast<cudaStream_t>(stream_));
  Check(launch(), op);
  cudaEventRecord(end, static_cast<cudaStream_t>(stream_));
  profile_->pending.push_back({op, start, end});
}

void* CudaBackend::RecordStart() {
  cudaEvent_t start = nullptr;
  cudaEventCreate(&start);
  cudaEventRecord(start, static_cast<cudaStream_t>(stream_));
  return start;
}

void CudaBackend::RecordEnd(const char* op, void* start) {
  cudaEvent_t end = nullptr;
  cudaEventCreate(&end);
  cudaEventRecord(end, static_cast<cudaStream_t>(stream_));
  profile_->pending.push_back({op, start, end});
}

void CudaBackend::CollectProfile() {
  if (!profile_) return;
  for (const auto& p : profile_->pending) {
    float ms = 0.0f;
    cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(p.start), static_cast<cudaEvent_t>(p.end));
    auto& row = profile_->totals[p.op];
    row.first += ms;
    row.second += 1;
    cudaEventDestroy(static_cast<cudaEvent_t>(p.start));
    cudaEventDestroy(static_cast<cudaEvent_t>(p.end));
  }
  profile_->pending.clear();
}

std::string CudaBackend::ProfileReport() {
  if (!profile_) return "";
  CollectProfile();
  double total = 0.0;
  std::vector<std::pair<std::string, std::pair<double, int64_t>>> rows(profile_->totals.begin(),
                                                                       profile_->totals.end());
  for (const auto& r : rows) total += r.second.first;
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.first > b.second.first; });
  std::string out = fmt::format("{:<16} {:>10} {:>8} {:>10} {:>7}\n", "op", "total ms", "calls", "us/call", "share");
  for (const auto& [op, v] : rows) {
    out += fmt::format("{:<16} {:>10.2f} {:>8} {:>10.1f} {:>6.1f}%\n", op, v.first, v.second,
                       1e3 * v.first / static_cast<double>(std::max<int64_t>(v.second, 1)),
                       total > 0 ? 100.0 * v.first / total : 0.0);
  }
  out += fmt::format("{:<16} {:>10.2f}\n", "all kernels", total);
  return out;
}

void CudaBackend::ResetProfile() {
  if (!profile_) return;
  CollectProfile();
  profile_->totals.clear();
}

void CudaBackend::Check(int err, const char* op) {
  if (err != 0) RecordError(CudaStatus(static_cast<cudaError_t>(err), op));
}

void CudaBackend::RecordError(const Status& st) {
  if (st.ok()) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (first_error_.ok()) first_error_ = st;
}

Status CudaBackend::MakeCurrent() {
  return CudaStatus(cudaSetDevice(device_), "cudaSetDevice");
}

Status CudaBackend::Synchronize() {
  if (capturing_) {  // nothing has run yet: report what failed to be recorded
    std::lock_guard<std::mutex> lock(mu_);
    return first_error_;
  }
  Check(static_cast<int>(cudaStreamSynchronize(static_cast<cudaStream_t>(stream_))), "cudaStreamSynchronize");
  CollectProfile();
  std::lock_guard<std::mutex> lock(mu_);
  Status s = first_error_;
  first_error_ = OkStatus();
  return s;
}

DeviceMemoryInfo CudaBackend::MemoryInfo() {
  size_t free_b = 0, total_b = 0;
  if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) {
    cudaGetLastError();
    return {};
  }
  // Blocks cached by the pool are free for fathom's purposes too.
  int64_t cached = 0;
  {
    std::lock_guard<std::mutex> lock(pool_->mu);
    for (const auto& [cls, blocks] : pool_->free) cached += static_cast<int64_t>(cls * blocks.size());
  }
  return {static_cast<int64_t>(free_b) + cached, static_cast<int64_t>(total_b)};
}

Tensor CudaBackend::Alloc(DType dtype, std::span<const int64_t> shape) {
  StatusOr<Tensor> t = NewDeviceTensor(dtype, shape);
  FATHOM_CHECK(t.ok(), "{}", t.status().ToString());
  const size_t bytes = t->nbytes();
  if (bytes > 0) {
    Check(static_cast<int>(cudaMemsetAsync(t->view().raw(), 0, bytes, static_cast<cudaStream_t>(stream_))),
          "cudaMemsetAsync");
  }
  return std::move(t).value();
}

StatusOr<Tensor> CudaBackend::Upload(const TensorView& host) {
  if (host.device() != Device::kCpu || !host.is_contiguous()) {
    return InvalidArgumentError("CudaBackend::Upload needs a contiguous host tensor");
  }
  if (capturing_) return FailedPreconditionError("Upload synchronizes and cannot be captured in a graph");
  const std::vector<int64_t> shape = host.shape();
  FATHOM_ASSIGN_OR_RETURN(Tensor t, NewDeviceTensor(host.dtype(), shape));
  void* p = t.view().raw();
  if (host.nbytes() > 0) {
    FATHOM_RETURN_IF_ERROR(CudaStatus(
        cudaMemcpyAsync(p, host.raw(), host.nbytes(), cudaMemcpyHostToDevice, static_cast<cudaStream_t>(stream_)),
        "upload"));
    // The host buffer may be freed by the caller right after; finish the copy first.
    FATHOM_RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(static_cast<cudaStream_t>(stream_)), "upload"));
  }
  return t;
}

Status CudaBackend::CopyToHost(const TensorView& src, void* dst) {
  if (!src.is_contiguous()) return InvalidArgumentError("CopyToHost needs a contiguous tensor");
  if (capturing_) return FailedPreconditionError("CopyToHost synchronizes and cannot be captured in a graph");
  FATHOM_RETURN_IF_ERROR(Synchronize());
  return CudaStatus(cudaMemcpy(dst, src.raw(), src.nbytes(), cudaMemcpyDeviceToHost), "copy to host");
}

void CudaBackend::Embedding(const TensorView& ids, const TensorView& table, const TensorView& out) {
  Launch("Embedding", [&] {
    return cuda::LaunchEmbedding(ids.data<int32_t>(), ids.dim(0), table.raw(), Dt(table), table.stride(0), table.dim(1),
                                 out.data<float>(), out.stride(0), stream_);
  });
}

void CudaBackend::RmsNorm(const TensorView& x, const TensorView& weight, float eps, const TensorView& out) {
  Launch("RmsNorm", [&] {
    return cuda::LaunchRmsNorm(x.data<float>(), x.stride(0), nullptr, 0, weight.raw(), Dt(weight), eps,
                               out.data<float>(), out.stride(0), x.dim(0), x.dim(1), stream_);
  });
}

void CudaBackend::AddRmsNorm(const TensorView& residual, const TensorView& x, const TensorView& weight, float eps,
                             const TensorView& out) {
  Launch("AddRmsNorm", [&] {
    return cuda::LaunchRmsNorm(residual.data<float>(), residual.stride(0), x.data<float>(), x.stride(0), weight.raw(),
                               Dt(weight), eps, out.data<float>(), out.stride(0), residual.dim(0), residual.dim(1),
                               stream_);
  });
}

void CudaBackend::AddInPlace(const TensorView& a, const TensorView& b) {
  Launch("AddInPlace", [&] {
    return cuda::LaunchAddInPlace(a.data<float>(), a.stride(0), b.data<float>(), b.stride(0), a.dim(0), a.dim(1),
                                  stream_);
  });
}

void CudaBackend::SiluMul(const TensorView& gate, const TensorView& up, const TensorView& out) {
  Launch("SiluMul", [&] {
    return cuda::LaunchSiluMul(gate.data<float>(), gate.stride(0), up.data<float>(), up.stride(0), out.data<float>(),
                               out.stride(0), gate.dim(0), gate.dim(1), stream_);
  });
}

void CudaBackend::RopeCosSin(const TensorView& positions, const TensorView& inv_freq, float scale,
                             const TensorView& cos, const TensorView& sin) {
  Launch("RopeCosSin", [&] {
    return cuda::LaunchRopeCosSin(positions.data<int32_t>(), positions.dim(0), inv_freq.data<float>(), inv_freq.dim(0),
                                  scale, cos.data<float>(), sin.data<float>(), stream_);
  });
}

void CudaBackend::ApplyRope(const TensorView& x, const TensorView& cos, const TensorView& sin, bool interleaved) {
  FATHOM_CHECK_EQ(x.stride(2), 1);
  Launch("ApplyRope", [&] {
    return cuda::LaunchApplyRope(x.data<float>(), x.dim(0), x.dim(1), x.stride(0), x.stride(1), cos.data<float>(),
                                 sin.data<float>(), cos.dim(1), interleaved, stream_);
  });
}

void CudaBackend::WriteKv(const TensorView& k, const TensorView& v, const AttentionMetadata& meta,
                          const KvLayerView& cache) {
  Launch("WriteKv(k)", [&] {
    return cuda::LaunchWriteCache(k.data<float>(), k.dim(0), k.dim(1), k.dim(2), k.stride(0), k.stride(1),
                                  meta.slot_mapping.data<int32_t>(), meta.block_size,
                                  cuda::CacheOf(cache.k, cache.k_scale), stream_);
  });
  if (!v.empty()) {
    Launch("WriteKv(v)", [&] {
      return cuda::LaunchWriteCache(v.data<float>(), v.dim(0), v.dim(1), v.dim(2), v.stride(0), v.stride(1),
                                    meta.slot_mapping.data<int32_t>(), meta.block_size,
                                    cuda::CacheOf(cache.v, cache.v_scale), stream_);
    });
  }
}

void CudaBackend::RopeWriteKv(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& cos,
                              const TensorView& sin, bool interleaved, const AttentionMetadata& meta,
                              const KvLayerView& cache) {
  if (cache.fp8()) {
    // An f8 cache: the rotations, then WriteKv's quantizing kernel (three launches; a fused form is future work).
    Backend::RopeWriteKv(q, k, v, cos, sin, interleaved, meta, cache);
    return;
  }
  FATHOM_CHECK_EQ(q.stride(2), 1);
  FATHOM_CHECK_EQ(k.stride(2), 1);
  FATHOM_CHECK(v.empty() || v.stride(2) == 1);
  cuda::RopeWriteArgs a{};
  a.q = q.data<float>();
  a.q_s0 = q.stride(0);
  a.q_s1 = q.stride(1);
  a.heads = q.dim(1);
  a.k = k.data<float>();
  a.k_s0 = k.stride(0);
  a.k_s1 = k.stride(1);
  a.kv_heads = k.dim(1);
  a.k_dim = k.dim(2);
  if (!v.empty()) {
    a.v = v.data<float>();
    a.v_s0 = v.stride(0);
    a.v_s1 = v.stride(1);
    a.v_dim = v.dim(2);
    a.v_cache = cuda::CacheOf(cache.v);
  }
  a.cos = cos.data<float>();
  a.sin = sin.data<float>();
  a.half = cos.dim(1);
  a.interleaved = interleaved;
  a.slot_mapping = meta.slot_mapping.data<int32_t>();
  a.block_size = meta.block_size;
  a.k_cache = cuda::CacheOf(cache.k);
  a.n = q.dim(0);
  Launch("RopeWriteKv", [&] { return cuda::LaunchRopeWriteCache(a, stream_); });
}

void CudaBackend::GatherRows(const TensorView& x, const TensorView& indices, const TensorView& out) {
  Launch("GatherRows", [&] {
    return cuda::LaunchGatherRows(x.data<float>(), x.stride(0), indices.data<int32_t>(), indices.dim(0), x.dim(1),
                                  out.data<float>(), out.stride(0), stream_);
  });
}

void CudaBackend::ScatterAddRows(const TensorView& x, const TensorView& indices, const TensorView& weights,
                                 const TensorView& out) {
  Launch("ScatterAddRows", [&] {
    return cuda::LaunchScatterAddRows(x.data<float>(), x.stride(0), indices.data<int32_t>(), weights.data<float>(),
                                      indices.dim(0), x.dim(1), out.data<float>(), out.stride(0), out.dim(0), stream_);
  });
}

void CudaBackend::MoeRoute(const TensorView& logits, const TensorView& bias, const moe_route::Params& p,
                           const TensorView& ids, const TensorView& weights) {
  FATHOM_CHECK(logits.stride(1) == 1 && ids.is_contiguous() && weights.is_contiguous());
  FATHOM_CHECK(logits.dim(1) == p.n_experts && ids.dim(1) == p.top_k && weights.dim(1) == p.top_k);
  Launch("MoeRoute", [&] {
    return cuda::LaunchMoeRoute(logits.data<float>(), logits.stride(0), logits.dim(0),
                                bias.empty() ? nullptr : bias.data<float>(), p, ids.data<int32_t>(),
                                weights.data<float>(), stream_);
  });
}

// The device path of MoeExperts needs every expert's gate, up and down in one format, one shape, in the device table
// that the format's provider makes (linear_format.h: bf16; f8 e4m3 with contiguous 128 x 128 block scales; 4-bit
// tiles). Other experts take the host-sorted path, and so do a rank's share of the experts under expert parallelism
// (the device kernels index every expert of the layer; teaching them an id range is the multi-GPU issue's).
Status CudaBackend::PrepareExperts(ExpertSet& experts) {
  const size_t e = experts.gate.size();
  if (e == 0 || !experts.all_local() || experts.up.size() != e || experts.down.size() != e ||
      static_cast<int64_t>(e) > moe_route::kMaxExperts) {
    return OkStatus();
  }
  return Kernels(experts.gate[0].format).PrepareExperts(experts);
}

Status CudaBackend::MoeExperts(const TensorView& x, const ExpertSet& experts, const TensorView& ids,
                               const TensorView& weights, const TensorView& out) {
  const int64_t n = x.dim(0), k = ids.dim(1);
  // KernelOptions::host_moe forces the host-sorted path (for measurements); moe_mma_tokens = N moves the switch from
  // grouped GEMVs to grouped tensor-core GEMMs (default: batches of kMoeMmaTokens tokens or more).
  const bool device_path = experts.device_state != nullptr && k <= cuda::kMaxMoePairs && !options_.host_moe &&
                           ids.is_contiguous() && weights.is_contiguous() && x.stride(1) == 1 && x.stride(0) % 4 == 0 &&
                           reinterpret_cast<uintptr_t>(x.raw()) % 16 == 0 && out.stride(1) == 1;
  if (!device_path) {
    ++host_fallbacks_;
    return Backend::MoeExperts(x, experts, ids, weights, out);
  }
  cuda::MoeExpertsArgs a{};
  a.xs = x.stride(0);
  a.hidden = x.dim(1);
  a.inter = experts.gate[0].out_features();
  a.top_k = k;
  a.n_experts = static_cast<int64_t>(experts.gate.size());
  a.table = static_cast<const void* const*>(experts.device_state.get());
  a.os = out.stride(0);
  if (!Kernels(experts.gate[0].format).SetExpertArgs(experts, &a)) {
    ++host_fallbacks_;
    return Backend::MoeExperts(x, experts, ids, weights, out);
  }
  // KernelOptions::f32_gemm keeps the float32-input GEMVs for every batch.
  a.tensor_cores = !a.int4 && n >= options_.moe_mma_tokens && cuda::MoeTensorCoresFit(a) && !options_.f32_gemm;
  // The GEMV path takes up to kMaxMoePairs pairs in one launch; the tensor-core and 4-bit paths take any batch, in
  // slices of that many pairs.
  if (!a.tensor_cores && !a.int4 && n * k > cuda::kMaxMoePairs) {
    ++host_fallbacks_;
    return Backend::MoeExperts(x, experts, ids, weights, out);
  }
  const int64_t slice = cuda::kMaxMoePairs / k;
  a.n = std::min(n, slice);
  void* ws = Workspace(static_cast<size_t>(cuda::MoeExpertsWorkspaceBytes(a)));
  if (ws == nullptr) {
    return ResourceExhaustedError(fmt::format("MoeExperts: no device memory for its {}-byte workspace{}",
                                              cuda::MoeExpertsWorkspaceBytes(a),
                                              capturing_ ? "; " + arena_error_ : std::string()));
  }
  for (int64_t t0 = 0; t0 < n; t0 += slice) {
    a.n = std::min(slice, n - t0);
    a.x = x.data<float>() + t0 * x.stride(0);
    a.ids = ids.data<int32_t>() + t0 * k;
    a.weights = weights.data<float>() + t0 * k;
    a.out = out.data<float>() + t0 * out.stride(0);
    Launch("MoeExperts", [&] { return cuda::LaunchMoeExperts(a, ws, stream_); });
  }
  return OkStatus();
}

void CudaBackend::ArgMax(const TensorView& logits, const TensorView& ids) {
  FATHOM_CHECK_EQ(logits.dim(0), ids.dim(0));
  Launch("ArgMax", [&] {
    return cuda::LaunchArgMax(logits.data<float>(), logits.stride(0), logits.dim(0), logits.dim(1), ids.data<int32_t>(),
                              stream_);
  });
}

Status CudaBackend::SampleRows(const TensorView& logits, std::span<const SampleRowSpec> rows,
                               std::span<const LogitAdjust> adjust, std::span<SampledToken> out) {
  const int64_t n = logits.dim(0), vocab = logits.dim(1);
  if (logits.dtype() != DType::kF32 || logits.stride(1) != 1 || static_cast<int64_t>(rows.size()) != n ||
      out.size() != rows.size()) {
    return InvalidArgumentError(fmt::format(
        "SampleRows: {} rows of f32 logits with unit inner stride, {} specs, {} outputs", n, rows.size(), out.size()));
  }
  if (vocab >= (int64_t{1} << 31)) return InvalidArgumentError("SampleRows: the vocabulary exceeds 2^31 ids");
  if (capturing_) return FailedPreconditionError("SampleRows synchronizes and cannot be captured in a graph");
  for (const SampleRowSpec& r : rows) {
    if (r.adjust_begin < 0 || r.adjust_count < 0 ||
        static_cast<int64_t>(r.adjust_begin) + r.adjust_count > static_cast<int64_t>(adjust.size()) ||
        r.top_logprobs < 0 || r.top_logprobs > kMaxTopLogprobs) {
      return InvalidArgumentError("SampleRows: a row's adjustments or top_logprobs are out of range");
    }
  }
  for (const LogitAdjust& a : adjust) {
    if (a.id < 0 || a.id >= vocab)
      return InvalidArgumentError(fmt::format("SampleRows: adjusted id {} >= vocab", a.id));
  }
  if (n == 0) return OkStatus();
  // Device copies of the host arrays, in 4-byte words (every struct is a multiple of 4 bytes).
  const auto words = [](size_t bytes) { return static_cast<int64_t>(std::max<size_t>(bytes, 4) / 4); };
  Tensor d_rows = Alloc(DType::kI32, {words(rows.size_bytes())});
  Tensor d_adjust = Alloc(DType::kI32, {words(adjust.size_bytes())});
  Tensor d_saved = Alloc(DType::kF32, {std::max<int64_t>(static_cast<int64_t>(adjust.size()), 1)});
  Tensor d_out = Alloc(DType::kI32, {words(out.size_bytes())});
  FATHOM_RETURN_IF_ERROR(CopyFromHost(rows.data(), d_rows.view()));
  if (!adjust.empty()) FATHOM_RETURN_IF_ERROR(CopyFromHost(adjust.data(), d_adjust.view()));
  Launch("SampleRows", [&] {
    return cuda::LaunchSampleRows(
        logits.data<float>(), logits.stride(0), n, vocab, reinterpret_cast<const SampleRowSpec*>(d_rows.view().raw()),
        reinterpret_cast<const LogitAdjust*>(d_adjust.view().raw()), d_saved.view().data<float>(),
        reinterpret_cast<SampledToken*>(d_out.view().raw()), stream_);
  });
  return CopyToHost(d_out.view(), out.data());
}

Status CudaBackend::MaskLogits(const TensorView& logits, std::span<const int32_t> rows, std::span<const uint32_t> masks,
                               int64_t words_per_row) {
  CheckMaskLogitsArgs(logits, rows, masks, words_per_row);
  if (rows.empty()) return OkStatus();
  if (capturing_) return FailedPreconditionError("MaskLogits copies host memory and cannot be captured in a graph");
  const cudaStream_t stream = static_cast<cudaStream_t>(stream_);
  if (mask_copied_ == nullptr) {
    cudaEvent_t e = nullptr;
    FATHOM_RETURN_IF_ERROR(CudaStatus(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "MaskLogits event"));
    mask_copied_ = e;
  }
  // The last call's copy must have left the staging buffer before it is rewritten or freed (an event never recorded
  // counts as done). In the engine the sampling after it synchronized long ago, so this does not wait.
  FATHOM_RETURN_IF_ERROR(
      CudaStatus(cudaEventSynchronize(static_cast<cudaEvent_t>(mask_copied_)), "MaskLogits staging wait"));
  // One transfer: the row ids, then the masks (4-byte words both).
  const size_t bytes = rows.size_bytes() + masks.size_bytes();
  if (bytes > mask_staging_bytes_) {
    const size_t size = std::max({bytes, 2 * mask_staging_bytes_, kMaskStagingBytes});
    if (mask_staging_ != nullptr) cudaFreeHost(mask_staging_);
    mask_staging_ = nullptr;
    mask_staging_bytes_ = 0;
    void* p = nullptr;
    FATHOM_RETURN_IF_ERROR(
        CudaStatus(cudaHostAlloc(&p, size, cudaHostAllocDefault), fmt::format("MaskLogits: pinned {} bytes", size)));
    mask_staging_ = p;
    mask_staging_bytes_ = size;
  }
  char* host = static_cast<char*>(mask_staging_);
  std::memcpy(host, rows.data(), rows.size_bytes());
  std::memcpy(host + rows.size_bytes(), masks.data(), masks.size_bytes());
  // Pooled device memory without Alloc's memset; freed at the end of this call and reused in stream order.
  const int64_t words[] = {static_cast<int64_t>(bytes / 4)};
  FATHOM_ASSIGN_OR_RETURN(Tensor dev, NewDeviceTensor(DType::kI32, words));
  int32_t* d_rows = dev.view().data<int32_t>();
  FATHOM_RETURN_IF_ERROR(
      CudaStatus(cudaMemcpyAsync(d_rows, host, bytes, cudaMemcpyHostToDevice, stream), "MaskLogits copy"));
  FATHOM_RETURN_IF_ERROR(
      CudaStatus(cudaEventRecord(static_cast<cudaEvent_t>(mask_copied_), stream), "MaskLogits event record"));
  const auto* d_masks = reinterpret_cast<const uint32_t*>(d_rows + rows.size());
  Launch("MaskLogits", [&] {
    return cuda::LaunchMaskLogits(logits.data<float>(), logits.stride(0), logits.dim(1), d_rows,
                                  static_cast<int64_t>(rows.size()), d_masks, words_per_row, stream_);
  });
  return OkStatus();
}

void CudaBackend::Copy(const TensorView& src, const TensorView& dst) {
  const bool three = src.ndim() == 3;
  Launch("Copy", [&] {
    return cuda::LaunchCopy(src.data<float>(), src.stride(0), three ? src.stride(1) : 0, dst.data<float>(),
                            dst.stride(0), three ? dst.stride(1) : 0, src.dim(0), three ? src.dim(1) : 1,
                            src.dim(src.ndim() - 1), stream_);
  });
}

}  // namespace fathom
