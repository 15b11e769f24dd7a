// KernelAttrCache: a kernel's shared-memory limit is set once per (device, kernel), only grows, and a refused set is
// tried again. No GPU needed: the CUDA call is the injected setter.
#include "backend/cuda/kernel_attr.h"

#include <gtest/gtest.h>

#include <vector>

namespace fathom::cuda {
namespace {

int kernel_a = 0, kernel_b = 0;  // stand-ins for two kernels' addresses

// A cache whose setter records the sizes it was asked for and returns `result`.
class KernelAttrCacheTest : public ::testing::Test {
 protected:
  int Ensure(int device, const void* kernel, int bytes) {
    return cache_.Ensure(device, kernel, bytes, [this](int b) {
      calls_.push_back(b);
      return result_;
    });
  }
  KernelAttrCache cache_;
  std::vector<int> calls_;
  int result_ = 0;
};

TEST_F(KernelAttrCacheTest, SetsOncePerDeviceAndKernel) {
  EXPECT_EQ(Ensure(0, &kernel_a, 100 << 10), 0);
  EXPECT_EQ(Ensure(0, &kernel_a, 100 << 10), 0);
  EXPECT_EQ(calls_.size(), 1u);
  // The second GPU of a tensor-parallel process: the limit set on device 0 does not hold there.
  EXPECT_EQ(Ensure(1, &kernel_a, 100 << 10), 0);
  EXPECT_EQ(calls_.size(), 2u);
  EXPECT_EQ(Ensure(1, &kernel_b, 100 << 10), 0);
  EXPECT_EQ(calls_.size(), 3u);
  EXPECT_EQ(Ensure(1, &kernel_a, 100 << 10), 0);
  EXPECT_EQ(calls_.size(), 3u);
}

TEST_F(KernelAttrCacheTest, LimitOnlyGrows) {
  ASSERT_EQ(Ensure(0, &kernel_a, 64 << 10), 0);
  ASSERT_EQ(Ensure(0, &kernel_a, 50 << 10), 0);  // fits under the limit already set: no call, no lowering
  ASSERT_EQ(Ensure(0, &kernel_a, 90 << 10), 0);
  ASSERT_EQ(Ensure(0, &kernel_a, 80 << 10), 0);
  EXPECT_EQ(calls_, (std::vector<int>{64 << 10, 90 << 10}));
}

TEST_F(KernelAttrCacheTest, RefusedSetIsReturnedAndTriedAgain) {
  result_ = 1;  // cudaErrorInvalidValue
  EXPECT_EQ(Ensure(0, &kernel_a, 300 << 10), 1);
  EXPECT_EQ(Ensure(0, &kernel_a, 300 << 10), 1);
  EXPECT_EQ(calls_.size(), 2u);
  result_ = 0;
  EXPECT_EQ(Ensure(0, &kernel_a, 200 << 10), 0);
  EXPECT_EQ(Ensure(0, &kernel_a, 200 << 10), 0);
  EXPECT_EQ(calls_.size(), 3u);
}

}  // namespace
}  // namespace fathom::cuda
