// The CUDA backend: the Backend ops on one GPU and one stream, float32 activations over f32/f16/bf16/fp8 weights.
// This first version is the correctness baseline (simple kernels, checked against CpuBackend and the oracle);
// cuBLASLt GEMMs, fused kernels, bf16 activations and CUDA graphs replace its kernels behind the same launchers.
//
//   FATHOM_ASSIGN_OR_RETURN(auto gpu, CudaBackend::Create(/*device=*/0));
//   FATHOM_ASSIGN_OR_RETURN(auto model, LoadModel(dir, cfg, options, *gpu));
//
// Indices (token ids, slots, block tables) are trusted: ForwardBatch::Validate checks them on the host first.
// Launch errors are recorded and returned by Synchronize().
#pragma once

#include <memory>
#include <mutex>

#include "model/backend.h"

namespace fathom {

class CudaBackend final : public Backend {
 public:
  static StatusOr<std::unique_ptr<CudaBackend>> Create(int device);
  ~CudaBackend() override;

  std::string_view name() const override { return "cuda"; }
  Device device() const override { return Device::kCuda; }
  DType activation_dtype() const override { return DType::kF32; }

  using Backend::Alloc;
  Tensor Alloc(DType dtype, std::span<const int64_t> shape) override;
  StatusOr<Tensor> Upload(const TensorView& host) override;
  Status CopyToHost(const TensorView& src, void* dst) override;

  void Embedding(const TensorView& ids, const TensorView& table, const TensorView& out) override;
  void RmsNorm(const TensorView& x, const TensorView& weight, float eps, const TensorView& out) override;
  void AddRmsNorm(const TensorView& residual, const TensorView& x, const TensorView& weight, float eps,
                  const TensorView& out) override;
  void Linear(const TensorView& x, const LinearWeight& w, const TensorView& out) override;
  void AddInPlace(const TensorView& a, const TensorView& b) override;
  void SiluMul(const TensorView& gate, const TensorView& up, const TensorView& out) override;
  void RopeCosSin(const TensorView& positions, const TensorView& inv_freq, float scale, const TensorView& cos,
                  const TensorView& sin) override;
  void ApplyRope(const TensorView& x, const TensorView& cos, const TensorView& sin, bool interleaved) override;
  void WriteKv(const TensorView& k, const TensorView& v, const AttentionMetadata& meta,
               const KvLayerView& cache) override;
  void PagedAttention(const TensorView& q, const KvLayerView& cache, const AttentionMetadata& meta, float scale,
                      const TensorView& out) override;
  void GatherRows(const TensorView& x, const TensorView& indices, const TensorView& out) override;
  void ScatterAddRows(const TensorView& x, const TensorView& indices, const TensorView& weights,
                      const TensorView& out) override;
  void Copy(const TensorView& src, const TensorView& dst) override;
  Status Synchronize() override;

 private:
  CudaBackend() = default;
  void Check(int err, const char* op);
  int device_ = 0;
  void* stream_ = nullptr;  // cudaStream_t
  std::mutex mu_;
  Status first_error_;
};

}  // namespace fathom
