// Weight formats on the GPU as providers: one LinearFormatKernels per format (linear_dense.cc, linear_fp8.cc,
// linear_int4.cc) owns that format's device form of a weight (Prepare), its Linear paths, its one-launch fan-out and
// its share of the MoE experts' kernels (the expert table and MoeExpertsArgs' fields), with whatever per-backend state
// its kernels keep (the 4-bit kernel's counters and staging, the FP8 GEMM's availability). CudaBackend keeps memory,
// the stream, graphs and the profiler, lends them to the providers as an OpContext, and dispatches each op on the
// weight's LinearFormat. Adding a format: docs/ARCHITECTURE.md, "Adding a weight format".
//
//   cuda::LinearFormatTable formats = cuda::MakeLinearFormatKernels(ctx);     // CudaBackend::Create
//   cuda::LinearFormatKernels& f = *formats[static_cast<size_t>(w.format)];
//   FATHOM_RETURN_IF_ERROR(f.Prepare(w));                                    // once, at model load
//   f.Linear(x, w, out);                                                     // x [n, in]; out [n, out]
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "backend/cuda/gemm.h"
#include "backend/cuda/kernel_options.h"
#include "backend/cuda/launcher.h"
#include "model/backend.h"

namespace fathom::cuda {

struct GemvPart;        // linear.h
struct MoeExpertsArgs;  // moe.h

// What CudaBackend lends the providers that own kernels: its stream and options, the workspace, launch bookkeeping
// (errors, profiling) and memory derived from a weight's memory. Implemented by CudaBackend alone; one thread at a
// time (the backend's).
class OpContext {
 public:
  virtual Stream cuda_stream() const = 0;
  virtual const KernelOptions& kernel_options() const = 0;
  virtual int sm_count() const = 0;
  virtual bool capturing() const = 0;      // a graph is being captured: no allocation, no host copy
  virtual bool has_graphs() const = 0;     // a graph was captured: device pointers it holds must not move
  virtual CublasLtGemm* gemm() const = 0;  // null without cuBLASLt
  // Runs `launch` (a launcher's call) as op `op`: its error recorded, its time profiled.
  virtual void Launch(const char* op, const std::function<int()>& launch) = 0;
  virtual void Check(int err, const char* op) = 0;  // records a CUDA error code (0: none)
  virtual void RecordError(const Status& st) = 0;   // keeps the first error, which Synchronize returns
  // Scratch for one op (dead when the next op starts); null, error recorded, when it cannot grow.
  virtual void* Workspace(size_t bytes) = 0;
  // Profiling of a span that is not one launch (a cuBLASLt call): start is null when not profiling.
  virtual void* ProfileStart() = 0;
  virtual void ProfileEnd(const char* op, void* start) = 0;
  // A copy derived from the pooled memory block at `block` (a float32 bias, padded scales): made once by `make` into
  // `bytes` of new device memory, freed with the block. Null when it does not exist and cannot be made (!can_make,
  // while capturing, memory that is not a pooled block of its own, a failed allocation).
  virtual const void* DerivedCopy(const void* block, bool can_make, size_t bytes,
                                  const std::function<void(void*)>& make) = 0;
  // A state made from the device memory at p (a repacked weight's), dropped when p's block is freed; null if none.
  virtual std::shared_ptr<void> DerivedState(const void* p) = 0;
  virtual void SetDerivedState(const void* p, std::shared_ptr<void> state) = 0;
  virtual Status CopyToHost(const TensorView& src, void* dst) = 0;
  // The backend's Linear, dispatched on w's format (a fan-out's weights that take no shared launch).
  virtual void Linear(const TensorView& x, const LinearWeight& w, const TensorView& out) = 0;

 protected:
  ~OpContext() = default;
};

class LinearFormatKernels {
 public:
  virtual ~LinearFormatKernels() = default;
  // Once per weight, at model load: its device form (repacked tiles, padded scales), kept in w.device_state.
  virtual Status Prepare(LinearWeight& /*w*/) { return OkStatus(); }
  // out = x W^T + b.   x [n, in]; out [n, out]
  virtual void Linear(const TensorView& x, const LinearWeight& w, const TensorView& out) = 0;
  // LinearFanOut whose first weight is of this format, in this format's own one-launch form; false (nothing done)
  // when they do not fit it: the backend then runs the shared fan-out below.
  virtual bool FanOut(const TensorView& /*x*/, std::span<const LinearWeight> /*ws*/,
                      std::span<const TensorView> /*outs*/) {
    return false;
  }
  // w as a part of the shared fan-out GEMV (linear.h's GemvPart, out fields left to the caller); false where this
  // format has no GEMV form.
  virtual bool GemvPartOf(const LinearWeight& /*w*/, GemvPart* /*part*/) const { return false; }
  // Whether Linear on n tokens of w is one bf16 cuBLASLt GEMM on x staged as bf16 (StageBf16), so that a fan-out
  // stages x once for every such weight.
  virtual bool TakesStagedGemm(int64_t /*n*/, const LinearWeight& /*w*/) const { return false; }
  // A MoE layer's experts, all of this format (the gate's): their device table for moe.h's kernels in
  // experts.device_state. Nothing set: they take the host-sorted path.
  virtual Status PrepareExperts(ExpertSet& /*experts*/) { return OkStatus(); }
  // This format's fields of the experts' kernel arguments at this call; false: the host-sorted path this time.
  virtual bool SetExpertArgs(const ExpertSet& /*experts*/, MoeExpertsArgs* /*a*/) const { return true; }
};

// Every format's provider, by LinearFormat (linear_formats.cc, the registry, from format/linear_weight.h's table: a
// family's provider is Make<family>Kernels; kAwq and kGptq share the 4-bit one):
// made by CudaBackend::Create and owned by it. A format without one is a programmer error there.
using LinearFormatTable = std::array<std::shared_ptr<LinearFormatKernels>, kNumLinearFormats>;
LinearFormatTable MakeLinearFormatKernels(OpContext& ctx);

// The bf16 GEMM path that every format's prefill may end in (linear_dense.cc).
// Whether a dense weight takes it at n tokens: bf16 weights, n > 8, float32 activations allowed to round.
bool DenseTakesGemm(const OpContext& ctx, int64_t n, const LinearWeight& w);
// x (float32 [rows, cols], rows xs apart) rounded to bf16 in the workspace; null (error recorded) when it cannot grow.
void* StageBf16(OpContext& ctx, const float* x, int64_t xs, int64_t rows, int64_t cols);
// out = xb W^T + b on cuBLASLt: xb bf16 [n, k] staged; W w's bf16 weight, or w_bf16 (a contiguous bf16 [out, k]
// dequantized copy) when given; w's bias in the epilogue or by a kernel.
void GemmFromStaged(OpContext& ctx, const void* xb, int64_t n, int64_t k, const LinearWeight& w, const TensorView& out,
                    const void* w_bf16 = nullptr);
// A MoE layer's expert table (moe.h's MoeExpertsArgs::table) in new device memory, kept in experts->device_state.
Status UploadExpertTable(const std::vector<const void*>& table, ExpertSet* experts);

}  // namespace fathom::cuda
