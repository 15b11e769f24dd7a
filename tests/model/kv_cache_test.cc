// model/model.h's KvCache helpers: FillKvCacheRandom (the bench's synthetic prefill).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "model/model.h"

namespace fathom {
namespace {

std::vector<float> Values(const TensorView& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  if (t.dtype() == DType::kF8E4M3) {
    for (int64_t i = 0; i < t.numel(); ++i) v[static_cast<size_t>(i)] = F8E4M3ToF32(t.data<uint8_t>()[i]);
  } else {
    ConvertToF32(t.raw(), t.dtype(), 0, t.numel(), v.data());
  }
  return v;
}

// Every row part of every layer gets values spread over [-1, 1] (none NaN, not one value repeated), an f8 cache's
// scales 1, and layers differ.
TEST(FillKvCacheRandomTest, FillsEveryLayersRowsAndScales) {
  CpuBackend cpu;
  for (const DType dtype : {DType::kBF16, DType::kF8E4M3}) {
    const KvCacheSpec spec{
        .num_layers = 2, .num_kv_heads = 1, .k_dim = 40, .v_dim = 32, .v_in_k = true, .side_dim = 32};
    StatusOr<KvCache> kv = KvCache::Allocate(cpu, spec, dtype, 3, 4);
    ASSERT_TRUE(kv.ok()) << kv.status().ToString();
    ASSERT_TRUE(FillKvCacheRandom(cpu, *kv, 7).ok());
    std::vector<float> first;
    for (int64_t l = 0; l < 2; ++l) {
      const KvLayerView layer = kv->layer(l);
      for (const TensorView& t : {layer.k, layer.side}) {
        const std::vector<float> v = Values(t);
        float lo = 1.0f, hi = -1.0f;
        int64_t zeros = 0;
        for (float x : v) {
          ASSERT_FALSE(std::isnan(x));
          lo = std::min(lo, x);
          hi = std::max(hi, x);
          zeros += x == 0.0f ? 1 : 0;
        }
        EXPECT_GE(lo, -1.0f);
        EXPECT_LE(hi, 1.0f);
        EXPECT_LT(lo, -0.5f) << DTypeName(dtype);
        EXPECT_GT(hi, 0.5f) << DTypeName(dtype);
        EXPECT_LT(zeros, static_cast<int64_t>(v.size()) / 10);
        if (l == 0 && t.raw() == layer.k.raw()) first = v;
        if (l == 1 && t.raw() == layer.k.raw()) {
          EXPECT_NE(v, first);
        }
      }
      if (dtype == DType::kF8E4M3) {
        for (const TensorView& s : {layer.k_scale, layer.side_scale}) {
          ASSERT_FALSE(s.empty());
          for (float x : Values(s)) EXPECT_EQ(x, 1.0f);
        }
      }
    }
  }
}

}  // namespace
}  // namespace fathom
