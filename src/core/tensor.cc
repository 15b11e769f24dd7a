#include "core/tensor.h"

#include <fmt/format.h>

#include <cstdlib>
#include <cstring>

namespace fathom {

TensorView::TensorView(void* data, DType dtype, std::span<const int64_t> shape, Device device)
    : data_(data), dtype_(dtype), device_(device), ndim_(static_cast<int>(shape.size())) {
  FATHOM_CHECK_LE(shape.size(), static_cast<size_t>(kMaxDims));
  int64_t stride = 1;
  for (int i = ndim_ - 1; i >= 0; --i) {
    FATHOM_CHECK_GE(shape[i], 0);
    shape_[i] = shape[i];
    strides_[i] = stride;
    stride *= shape[i];
  }
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int i = 0; i < ndim_; ++i) n *= shape_[i];
  return n;
}

bool TensorView::is_contiguous() const {
  int64_t stride = 1;
  for (int i = ndim_ - 1; i >= 0; --i) {
    if (shape_[i] != 1 && strides_[i] != stride) return false;
    stride *= shape_[i];
  }
  return true;
}

TensorView TensorView::Slice(int d, int64_t begin, int64_t end) const {
  FATHOM_CHECK(d >= 0 && d < ndim_, "slice dim {} of a {}-d tensor", d, ndim_);
  FATHOM_CHECK(0 <= begin && begin <= end && end <= shape_[d], "slice [{}, {}) of dim {} with size {}", begin, end, d,
               shape_[d]);
  TensorView out = *this;
  out.data_ = static_cast<char*>(data_) + static_cast<int64_t>(DTypeSize(dtype_)) * begin * strides_[d];
  out.shape_[d] = end - begin;
  return out;
}

TensorView TensorView::Select(int d, int64_t index) const {
  TensorView out = Slice(d, index, index + 1);
  for (int i = d; i + 1 < ndim_; ++i) {
    out.shape_[i] = out.shape_[i + 1];
    out.strides_[i] = out.strides_[i + 1];
  }
  --out.ndim_;
  out.shape_[out.ndim_] = 0;
  out.strides_[out.ndim_] = 0;
  return out;
}

TensorView TensorView::Reshape(std::span<const int64_t> shape) const {
  FATHOM_CHECK(is_contiguous(), "reshape of a non-contiguous view {}", ShapeString());
  TensorView out(data_, dtype_, shape, device_);
  FATHOM_CHECK_EQ(out.numel(), numel());
  return out;
}

std::string TensorView::ShapeString() const {
  std::string s(DTypeName(dtype_));
  s += "[";
  for (int i = 0; i < ndim_; ++i) {
    if (i) s += ", ";
    s += std::to_string(shape_[i]);
  }
  s += "]";
  return s;
}

Tensor Tensor::Empty(DType dtype, std::span<const int64_t> shape) {
  Tensor t;
  TensorView probe(nullptr, dtype, shape);
  size_t bytes = probe.nbytes();
  size_t alloc = (bytes + 63) / 64 * 64;
  if (alloc == 0) alloc = 64;
  void* p = std::aligned_alloc(64, alloc);
  FATHOM_CHECK(p != nullptr, "out of host memory allocating {} bytes", alloc);
  std::memset(p, 0, alloc);
  t.storage_ = std::shared_ptr<void>(p, [](void* q) { std::free(q); });
  t.view_ = TensorView(p, dtype, shape, Device::kCpu);
  return t;
}

Tensor Tensor::Adopt(void* data, DType dtype, std::span<const int64_t> shape, Device device,
                     std::function<void(void*)> deleter) {
  Tensor t;
  t.storage_ = std::shared_ptr<void>(data, std::move(deleter));
  t.view_ = TensorView(data, dtype, shape, device);
  return t;
}

}  // namespace fathom
