// The backend-neutral ops that model code is written against. backend/cpu implements them as the reference;
// backend/cuda implements the same contract on the GPU.
//
//   Backend& be = ...;                                   // CpuBackend, later CudaBackend
//   Tensor x = be.Alloc(be.activation_dtype(), {n, hidden});
//   be.Embedding(ids, table, x);                         // x: [n_tokens, hidden]
//   be.Linear(x, w_q, q);                                // q: [n_tokens, n_heads * head_dim]
//   FATHOM_RETURN_IF_ERROR(be.Synchronize());            // first error of any op since the last call
//
// Contract for every op: outputs are allocated by the caller, inputs and outputs live on device(), ops never
// allocate device memory and never throw. Compute ops record the first failure; Synchronize() returns it (CUDA
// launch errors become a Status there). The ops that can fail on input a kernel cannot serve, or that copy to the
// host, return a Status of their own (MoeExperts, SampleRows, MaskLogits), as do the memory, load-time and graph
// calls. Shapes are documented per op as comments.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "core/check.h"
#include "core/status.h"
#include "core/tensor.h"
#include "format/linear_weight.h"
#include "model/attention.h"
#include "model/moe_route.h"
#include "model/sample_rows.h"

namespace fathom {

// The routed experts of one MoE layer: expert e computes down[e](silu(gate[e](x)) * up[e](x)). `device_state` is the
// backend's (PrepareExperts), e.g. the GPU's tables of the experts' weight pointers. Under expert parallelism a rank
// holds experts [first, first + gate.size()) of `total`; routed ids outside that range belong to other ranks.
struct ExpertSet {
  std::vector<LinearWeight> gate, up, down;  // [local experts] each
  std::shared_ptr<void> device_state;
  float swiglu_limit = 0.0f;  // > 0: each expert's SwiGLU is clamped by it (Backend::ClampedSiluMul; DeepSeek-V4)
  int64_t first = 0;          // the expert id of gate[0]
  int64_t total = 0;          // the layer's routed experts; 0: gate.size() (every expert is here)

  int64_t num_local() const { return static_cast<int64_t>(gate.size()); }
  int64_t num_total() const { return total > 0 ? total : num_local(); }
  bool all_local() const { return first == 0 && num_total() == num_local(); }
};

// A device's memory: zero totals mean host memory, which fathom does not plan.
struct DeviceMemoryInfo {
  int64_t free_bytes = 0;
  int64_t total_bytes = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual std::string_view name() const = 0;
  virtual Device device() const = 0;
  // The dtype of activations between ops (f32 on the CPU reference).
  virtual DType activation_dtype() const = 0;
  // The KV cache's default dtype (--kv-cache-dtype auto): the activations' on the CPU, bf16 on the GPU.
  virtual DType kv_cache_dtype() const { return activation_dtype(); }
  // Whether this backend's attention ops read and write a KV cache of `dtype` (one IsKvCacheDtype allows).
  virtual bool SupportsKvCacheDtype(DType dtype) const {
    return dtype == DType::kF32 || dtype == DType::kF16 || dtype == DType::kBF16;
  }
  // The provider of attention layout `layout` on this backend (model/attention.h: its ops, switches and per-step
  // plan), or null where this backend does not serve that layout. Owned by the backend.
  virtual AttentionOps* attention_ops(AttentionLayout layout) = 0;

  // The device's free and total memory now (zeros on the CPU).
  virtual DeviceMemoryInfo MemoryInfo() { return {}; }
  // The device's model as its driver names it ("NVIDIA H200"; empty on the CPU): benchmarks pick its peaks by it.
  virtual std::string device_model() const { return {}; }
  // The native stream every op runs on (CUDA: a cudaStream_t), for a communicator that must enqueue on it; null on
  // the CPU.
  virtual void* native_stream() const { return nullptr; }
  // Per-op kernel times since profiling started or was reset (CUDA with FATHOM_CUDA_PROFILE), as a table; empty
  // where nothing is profiled.
  virtual std::string ProfileReport() { return {}; }
  virtual void ResetProfile() {}

  // Memory. Alloc returns zeroed memory on device().
  virtual Tensor Alloc(DType dtype, std::span<const int64_t> shape) = 0;
  Tensor Alloc(DType dtype, std::initializer_list<int64_t> shape) {
    return Alloc(dtype, std::span<const int64_t>(shape.begin(), shape.size()));
  }
  // Makes a host tensor usable on device(). The CPU backend returns a view of `host` without copying; the
  // caller keeps `host` alive for as long as the result is used.
  virtual StatusOr<Tensor> Upload(const TensorView& host) = 0;
  // Copies `src` (contiguous, on device()) into host memory of src.nbytes() bytes.
  virtual Status CopyToHost(const TensorView& src, void* dst) = 0;

  // out[t, :] = table[ids[t], :].   ids i32 [n]; table [vocab, hidden] (any float dtype); out [n, hidden]
  virtual void Embedding(const TensorView& ids, const TensorView& table, const TensorView& out) = 0;

  // out = x / rms(x) * weight.   x, out [n, hidden]; weight [hidden]
  virtual void RmsNorm(const TensorView& x, const TensorView& weight, float eps, const TensorView& out) = 0;

  // residual += x; out = RmsNorm(residual).   residual, x, out [n, hidden]
  virtual void AddRmsNorm(const TensorView& residual, const TensorView& x, const TensorView& weight, float eps,
                          const TensorView& out) = 0;

  // Prepares a linear layer's weights for this backend's kernels, once, at model load (a repacked layout, padded
  // scales), kept in w.device_state. The default needs nothing.
  virtual Status PrepareLinear(LinearWeight& /*w*/) { return OkStatus(); }

  // out = x W^T + b, for W in any LinearFormat.   x [n, in]; out [n, out]
  virtual void Linear(const TensorView& x, const LinearWeight& w, const TensorView& out) = 0;

  // outs[i] = x W_i^T + b_i for several weights that share one input (q/k/v, gate/up). The GPU runs them as one
  // launch at decode sizes; the default runs Linear once per weight.   x [n, in]; outs[i] [n, out_i]
  virtual void LinearFanOut(const TensorView& x, std::span<const LinearWeight> ws, std::span<const TensorView> outs) {
    for (size_t i = 0; i < ws.size(); ++i) Linear(x, ws[i], outs[i]);
  }

  // out[:, h, :] = x[:, h, :] W[h]^T for every head h (MLA's absorbed W_UK and W_UV; a grouped per-head projection
  // such as V4's grouped output projection): one launch on the GPU.
  // x [n, heads, in]; w [heads, out, in] (f32, f16 or bf16, contiguous); out [n, heads, out]; x and out may be strided
  // views with unit inner stride. The default runs Linear once per head.
  virtual void HeadLinear(const TensorView& x, const TensorView& w, const TensorView& out) {
    for (int64_t h = 0; h < w.dim(0); ++h) {
      LinearWeight lw;
      lw.weight = w.Select(0, h);
      Linear(x.Select(1, h), lw, out.Select(1, h));
    }
  }

  // a += b.   a, b [n, d]
  virtual void AddInPlace(const TensorView& a, const TensorView& b) = 0;

  // out = silu(gate) * up.   gate, up, out [n, d]
  virtual void SiluMul(const TensorView& gate, const TensorView& up, const TensorView& out) = 0;

  // out = silu(min(gate, limit)) * clamp(up, -limit, limit): DeepSeek-V4's clamped SwiGLU; limit 0 is SiluMul.
  // gate, up, out [n, d]. The default serves limit 0 only: a backend without the op is never given a model that needs
  // it (DeepSeek-V4 needs the v4_hybrid attention layout's provider, which such a backend lacks).
  virtual void ClampedSiluMul(const TensorView& gate, const TensorView& up, float limit, const TensorView& out) {
    FATHOM_CHECK(limit <= 0.0f, "{} has no clamped SwiGLU", name());
    SiluMul(gate, up, out);
  }

  // out = silu(gate) * up, then out W^T + b: a gated MLP's down projection with its input. `gate` may be overwritten
  // (the default computes the product into it). The GPU can round the product to bf16 straight into its GEMM's input
  // (KernelOptions::fused_silu_staging), the same values the two ops give.
  //   gate, up [n, inter]; out [n, w.out_features()]
  virtual void SiluMulLinear(const TensorView& gate, const TensorView& up, const LinearWeight& w,
                             const TensorView& out) {
    SiluMul(gate, up, gate);
    Linear(gate, w, out);
  }

  // cos/sin tables for the batch: angle = positions[t] * inv_freq[i]; cos, sin [n, rot_dim / 2], times `scale`.
  virtual void RopeCosSin(const TensorView& positions, const TensorView& inv_freq, float scale, const TensorView& cos,
                          const TensorView& sin) = 0;
  // Rotates the first rot_dim = 2 * cos.dim(1) values of each head in place. x [n, heads, head_dim] (strided
  // views allowed). interleaved=false rotates halves (NeoX); true rotates pairs (x[2i], x[2i+1]).
  virtual void ApplyRope(const TensorView& x, const TensorView& cos, const TensorView& sin, bool interleaved) = 0;

  // Writes each new token's K and V into its slot. k [n, kv_heads, k_dim], v [n, kv_heads, v_dim].
  virtual void WriteKv(const TensorView& k, const TensorView& v, const AttentionMetadata& meta,
                       const KvLayerView& cache) = 0;

  // ApplyRope on q and k, then WriteKv(k, v): one kernel on the GPU.   q [n, heads, head_dim];
  // k [n, kv_heads, k_dim]; v [n, kv_heads, v_dim]. Both q and k are rotated in place, as by ApplyRope.
  virtual void RopeWriteKv(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& cos,
                           const TensorView& sin, bool interleaved, const AttentionMetadata& meta,
                           const KvLayerView& cache) {
    ApplyRope(q, cos, sin, interleaved);
    ApplyRope(k, cos, sin, interleaved);
    WriteKv(k, v, meta, cache);
  }

  // out[i, :] = x[indices[i], :].   x [n, d]; indices i32 [m]; out [m, d]
  virtual void GatherRows(const TensorView& x, const TensorView& indices, const TensorView& out) = 0;

  // out[indices[i], :] += weights[i] * x[i, :], in order of i.   x [m, d]; indices i32 [m]; weights f32 [m];
  // out [n, d]. The MoE combine step.
  virtual void ScatterAddRows(const TensorView& x, const TensorView& indices, const TensorView& weights,
                              const TensorView& out) = 0;

  // Expert choice per token by DeepSeek's rule (model/moe_route.h): logits f32 [n, n_experts]; bias f32 [n_experts] or
  // empty; ids i32 [n, top_k]; weights f32 [n, top_k]. The default routes in host memory (the CPU backend).
  virtual void MoeRoute(const TensorView& logits, const TensorView& bias, const moe_route::Params& p,
                        const TensorView& ids, const TensorView& weights);

  // Prepares a MoE layer's experts for MoeExperts (called once, at model load).
  virtual Status PrepareExperts(ExpertSet& /*experts*/) { return OkStatus(); }

  // out[t] += sum_j weights[t, j] * expert_{ids[t, j]}(x[t]).   x, out [n, hidden]; ids i32 [n, top_k]; weights f32
  // [n, top_k]. Under expert parallelism only the pairs whose expert this rank holds (ExpertSet::first) count. The
  // default reads ids on the host, sorts the (token, expert) pairs by expert, then runs GatherRows, Linear, SiluMul
  // and Linear per expert and one ScatterAddRows (the pairs in expert order).
  virtual Status MoeExperts(const TensorView& x, const ExpertSet& experts, const TensorView& ids,
                            const TensorView& weights, const TensorView& out);

  // ids[r] = the index of the largest value of row r, the lowest index among equal maxima (std::max_element's
  // choice). Greedy decoding reads ids instead of copying whole logits rows to the host.
  // logits f32 [n, vocab]; ids i32 [n]
  virtual void ArgMax(const TensorView& logits, const TensorView& ids) = 0;

  // One token per row of `logits` f32 [n, vocab] (host memory in `rows`, `adjust` and `out`; out.size() == n), by
  // the host sampler's rule (engine/sampler.cc Sample(), the reference this op is tested against): the row's
  // LogitAdjust entries, then greedy, or temperature, top-k, top-p, min-p and the inverse CDF in id order at the
  // Philox draw; logprobs from the raw logits. May change `logits`. Synchronizes; returns the first error.
  virtual bool SupportsSampling() const { return false; }
  virtual Status SampleRows(const TensorView& /*logits*/, std::span<const SampleRowSpec> /*rows*/,
                            std::span<const LogitAdjust> /*adjust*/, std::span<SampledToken> /*out*/) {
    return UnimplementedError(std::string(name()) + " samples on the host");
  }

  // Structured output's token masks, in place: for each i, every logit of row rows[i] whose bit is clear in
  // masks[i * words_per_row, (i + 1) * words_per_row) (bit t of word t / 32 set = token t allowed) becomes -inf; the
  // allowed logits keep their bits, and rows not listed are untouched. logits f32 [n, vocab] on device() (unit inner
  // stride); rows in [0, n); masks in HOST memory [rows.size(), words_per_row], words_per_row = ceil(vocab / 32) (bits
  // past vocab are ignored). Stream-ordered: the masks are copied before the call returns (the caller may reuse them
  // at once) and the op runs after the ops before it, e.g. the forward pass that made the logits. Sizes that do not
  // agree are a FATHOM_CHECK; a failed copy is the returned status, a failed launch Synchronize()'s.
  //   be.MaskLogits(logits, /*rows=*/{0, 3}, masks /* [2, ceil(vocab / 32)] */, (vocab + 31) / 32);
  virtual Status MaskLogits(const TensorView& logits, std::span<const int32_t> rows, std::span<const uint32_t> masks,
                            int64_t words_per_row) = 0;

  // dst = src for same-shaped 2-d or 3-d views (strided, unit inner stride).
  virtual void Copy(const TensorView& src, const TensorView& dst) = 0;

  // Returns (and clears) the first error recorded by an op since the last call; waits for queued work.
  virtual Status Synchronize() = 0;
  // Makes this backend's device the calling thread's (CUDA: cudaSetDevice); a thread that runs a tensor-parallel
  // rank calls it once before its first op.
  virtual Status MakeCurrent() { return OkStatus(); }

  // Copies `src` (dst.nbytes() bytes of host memory) into `dst` (contiguous, on device()) in stream order: the host
  // memory must stay unchanged until the next Synchronize(). The CPU backend copies at once.
  virtual Status CopyFromHost(const void* src, const TensorView& dst) = 0;
  // dst = src, both contiguous on device() with the same dtype and size (KV blocks for copy-on-write), in stream
  // order.
  virtual Status CopyOnDevice(const TensorView& src, const TensorView& dst) = 0;

  // Dummy weights made where they live (model/weights.cc, FillDummy, defines the values): every element of `out`
  // (contiguous) is `constant` when set, else element i of the uniform pattern `key` with half-width `scale`.
  // Unimplemented (the default, and for dtypes a backend lacks) means: fill host memory and upload it instead.
  virtual Status FillDummy(const TensorView& /*out*/, uint64_t /*key*/, float /*scale*/,
                           std::optional<float> /*constant*/) {
    return UnimplementedError("no device-side dummy weights");
  }

  // Graphs (CUDA graphs): the ops issued between BeginCapture() and EndCapture() are recorded, not run, and
  // ReplayGraph() runs them again with the same pointers. Tensors that Alloc returns while capturing come from an
  // arena that all graphs share (a graph's outputs are valid until the next replay or capture) and need not be kept.
  //   FATHOM_RETURN_IF_ERROR(be.BeginCapture());
  //   model.ForwardOnDevice(static_inputs, kv, &logits);   // recorded
  //   FATHOM_ASSIGN_OR_RETURN(int64_t graph, be.EndCapture());
  //   be.CopyFromHost(host_inputs, static_inputs_buffer);  // new inputs, same addresses
  //   FATHOM_RETURN_IF_ERROR(be.ReplayGraph(graph));        // logits now hold this step's values
  virtual bool SupportsGraphs() const { return false; }
  virtual Status BeginCapture() { return UnimplementedError(std::string(name()) + " has no graphs"); }
  virtual StatusOr<int64_t> EndCapture() { return UnimplementedError(std::string(name()) + " has no graphs"); }
  virtual Status ReplayGraph(int64_t /*graph*/) { return UnimplementedError(std::string(name()) + " has no graphs"); }

 protected:
  // MaskLogits' shape contract (above), FATHOM_CHECKed: every backend's implementation calls it first.
  static void CheckMaskLogitsArgs(const TensorView& logits, std::span<const int32_t> rows,
                                  std::span<const uint32_t> masks, int64_t words_per_row);
};

// The provider of layout Ops::kLayout on `be`, as its ops interface; a backend that does not serve it is a
// FATHOM_CHECK (the engine refuses such a model before any step: engine/engine_builder.cc).
//   AttentionOpsOf<PagedAttentionOps>(be).Run(plan, q, cache, meta, scale, out);
template <class Ops>
Ops& AttentionOpsOf(Backend& be) {
  AttentionOps* ops = be.attention_ops(Ops::kLayout);
  FATHOM_CHECK(ops != nullptr, "no provider of this attention layout on this backend");
  return static_cast<Ops&>(*ops);
}

}  // namespace fathom
