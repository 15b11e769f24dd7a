// Tensors: a non-owning TensorView (pointer, dtype, shape, strides, device) and an owning Tensor.
//
//   Tensor x = Tensor::Empty(DType::kF32, {n_tokens, hidden});   // [n_tokens, hidden]
//   float* p = x.data<float>();
//   TensorView row = x.view().Slice(0, 3, 4);                      // [1, hidden]
//   TensorView w = checkpoint_tensor;                               // views into an mmap'ed file
//
// Strides are in elements. Views never free memory; Tensor frees its buffer when the last copy goes.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/check.h"
#include "core/dtype.h"

namespace fathom {

enum class Device : uint8_t { kCpu, kCuda };

inline constexpr int kMaxDims = 6;

class TensorView {
 public:
  TensorView() = default;
  // A contiguous view of `shape` at `data`.
  TensorView(void* data, DType dtype, std::span<const int64_t> shape, Device device = Device::kCpu);
  TensorView(void* data, DType dtype, std::initializer_list<int64_t> shape, Device device = Device::kCpu)
      : TensorView(data, dtype, std::span<const int64_t>(shape.begin(), shape.size()), device) {}

  void* raw() const { return data_; }
  template <typename T>
  T* data() const {
    return static_cast<T*>(data_);
  }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  int ndim() const { return ndim_; }
  int64_t dim(int i) const {
    FATHOM_CHECK(i >= 0 && i < ndim_, "dim {} of a {}-d tensor", i, ndim_);
    return shape_[i];
  }
  int64_t stride(int i) const {
    FATHOM_CHECK(i >= 0 && i < ndim_, "stride {} of a {}-d tensor", i, ndim_);
    return strides_[i];
  }
  std::vector<int64_t> shape() const { return {shape_.begin(), shape_.begin() + ndim_}; }
  int64_t numel() const;
  size_t nbytes() const { return static_cast<size_t>(numel()) * DTypeSize(dtype_); }
  bool empty() const { return data_ == nullptr; }
  bool is_contiguous() const;

  // Rows [begin, end) of dimension `d`.
  TensorView Slice(int d, int64_t begin, int64_t end) const;
  // The view at `index` of dimension `d`, with that dimension removed: [a, b, c].Select(1, i) -> [a, c].
  TensorView Select(int d, int64_t index) const;
  // Same data, new contiguous shape with the same element count. Requires a contiguous view.
  TensorView Reshape(std::span<const int64_t> shape) const;
  TensorView Reshape(std::initializer_list<int64_t> shape) const {
    return Reshape(std::span<const int64_t>(shape.begin(), shape.size()));
  }

  // "bf16[512, 128]"
  std::string ShapeString() const;

 private:
  void* data_ = nullptr;
  DType dtype_ = DType::kF32;
  Device device_ = Device::kCpu;
  int ndim_ = 0;
  std::array<int64_t, kMaxDims> shape_{};
  std::array<int64_t, kMaxDims> strides_{};
};

// An owning, contiguous tensor. Copies share the buffer (like a shared_ptr).
class Tensor {
 public:
  Tensor() = default;

  // Host memory, 64-byte aligned, zero-filled.
  static Tensor Empty(DType dtype, std::span<const int64_t> shape);
  static Tensor Empty(DType dtype, std::initializer_list<int64_t> shape) {
    return Empty(dtype, std::span<const int64_t>(shape.begin(), shape.size()));
  }
  // Wraps memory from another allocator (a device allocator, for one); `deleter` frees it.
  static Tensor Adopt(void* data, DType dtype, std::span<const int64_t> shape, Device device,
                      std::function<void(void*)> deleter);

  const TensorView& view() const { return view_; }
  operator const TensorView&() const { return view_; }  // NOLINT: a Tensor is usable wherever a view is.
  template <typename T>
  T* data() const {
    return view_.data<T>();
  }
  DType dtype() const { return view_.dtype(); }
  int64_t dim(int i) const { return view_.dim(i); }
  int64_t numel() const { return view_.numel(); }
  size_t nbytes() const { return view_.nbytes(); }
  bool empty() const { return view_.empty(); }

 private:
  std::shared_ptr<void> storage_;
  TensorView view_;
};

}  // namespace fathom
