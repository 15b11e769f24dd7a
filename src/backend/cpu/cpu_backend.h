// The CPU backend: float32 compute over f32/f16/bf16 weights (converted inside the kernels), multi-threaded
// with the default ThreadPool. It is the correctness reference that every other backend is tested against.
//
//   CpuBackend cpu;
//   FATHOM_ASSIGN_OR_RETURN(auto model, LoadModel(dir, cfg, options, cpu));
#pragma once

#include <array>
#include <memory>
#include <mutex>

#include "model/backend.h"

namespace fathom {

class CpuBackend : public Backend {
 public:
  CpuBackend();
  ~CpuBackend() override;

  std::string_view name() const override { return "cpu"; }
  Device device() const override { return Device::kCpu; }
  DType activation_dtype() const override { return DType::kF32; }
  // f32, f16, bf16 and FP8 e4m3 with scales (the reference quantization, backend.h's KvLayerView).
  bool SupportsKvCacheDtype(DType dtype) const override { return IsKvCacheDtype(dtype); }
  // GQA's paged K and V (attention_gqa.cc) and MLA's latent rows (attention_mla.cc): the reference providers.
  AttentionOps* attention_ops(AttentionLayout layout) override { return layouts_[static_cast<size_t>(layout)].get(); }

  using Backend::Alloc;
  Tensor Alloc(DType dtype, std::span<const int64_t> shape) override;
  StatusOr<Tensor> Upload(const TensorView& host) override;
  Status CopyToHost(const TensorView& src, void* dst) override;
  Status CopyFromHost(const void* src, const TensorView& dst) override;
  Status CopyOnDevice(const TensorView& src, const TensorView& dst) override;

  void Embedding(const TensorView& ids, const TensorView& table, const TensorView& out) override;
  void RmsNorm(const TensorView& x, const TensorView& weight, float eps, const TensorView& out) override;
  void AddRmsNorm(const TensorView& residual, const TensorView& x, const TensorView& weight, float eps,
                  const TensorView& out) override;
  void Linear(const TensorView& x, const LinearWeight& w, const TensorView& out) override;
  void AddInPlace(const TensorView& a, const TensorView& b) override;
  void SiluMul(const TensorView& gate, const TensorView& up, const TensorView& out) override;
  void ClampedSiluMul(const TensorView& gate, const TensorView& up, float limit, const TensorView& out) override;
  void RopeCosSin(const TensorView& positions, const TensorView& inv_freq, float scale, const TensorView& cos,
                  const TensorView& sin) override;
  void ApplyRope(const TensorView& x, const TensorView& cos, const TensorView& sin, bool interleaved) override;
  void WriteKv(const TensorView& k, const TensorView& v, const AttentionMetadata& meta,
               const KvLayerView& cache) override;
  void GatherRows(const TensorView& x, const TensorView& indices, const TensorView& out) override;
  void ScatterAddRows(const TensorView& x, const TensorView& indices, const TensorView& weights,
                      const TensorView& out) override;
  void ArgMax(const TensorView& logits, const TensorView& ids) override;
  Status MaskLogits(const TensorView& logits, std::span<const int32_t> rows, std::span<const uint32_t> masks,
                    int64_t words_per_row) override;
  void Copy(const TensorView& src, const TensorView& dst) override;
  Status Synchronize() override;

  // Keeps the first error of an op (its own, or an attention provider's), which Synchronize returns.
  void RecordError(Status s);

 private:
  std::array<std::unique_ptr<AttentionOps>, kNumAttentionLayouts> layouts_;
  std::mutex mu_;
  Status first_error_;
};

}  // namespace fathom
