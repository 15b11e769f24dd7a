#include "core/tensor.h"

#include <gtest/gtest.h>

namespace fathom {
namespace {

TEST(TensorTest, ContiguousStridesAndSlice) {
  Tensor t = Tensor::Empty(DType::kF32, {4, 3, 2});  // [4, 3, 2]
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.nbytes(), 96u);
  EXPECT_EQ(t.view().stride(0), 6);
  EXPECT_EQ(t.view().stride(1), 2);
  EXPECT_TRUE(t.view().is_contiguous());
  for (int i = 0; i < 24; ++i) t.data<float>()[i] = static_cast<float>(i);
  TensorView rows = t.view().Slice(0, 1, 3);  // [2, 3, 2]
  EXPECT_EQ(rows.dim(0), 2);
  EXPECT_EQ(rows.data<float>()[0], 6.0f);
  EXPECT_TRUE(rows.is_contiguous());
  TensorView cols = t.view().Slice(2, 1, 2);  // [4, 3, 1], strided
  EXPECT_EQ(cols.data<float>()[0], 1.0f);
  EXPECT_EQ(cols.stride(1), 2);
  EXPECT_EQ(cols.ShapeString(), "f32[4, 3, 1]");
  TensorView flat = t.view().Reshape({24});
  EXPECT_EQ(flat.dim(0), 24);
}

TEST(TensorDeathTest, BadSliceAndReshapeAbort) {
  Tensor t = Tensor::Empty(DType::kBF16, {2, 3});
  EXPECT_DEATH(t.view().Slice(0, 1, 3), "slice \\[1, 3\\) of dim 0 with size 2");
  EXPECT_DEATH(t.view().Reshape({7}), "numel");
  EXPECT_DEATH(t.view().Slice(1, 0, 2).Reshape({4}), "non-contiguous");
}

TEST(TensorTest, AdoptRunsDeleterOnce) {
  int calls = 0;
  static float buf[4];
  {
    Tensor a = Tensor::Adopt(buf, DType::kF32, std::vector<int64_t>{4}, Device::kCpu, [&](void*) { ++calls; });
    Tensor b = a;  // shares
    EXPECT_EQ(b.data<float>(), buf);
  }
  EXPECT_EQ(calls, 1);
}

}  // namespace
}  // namespace fathom
