// Random test data on the host: uniform floats from a seed, and a host tensor of any float dtype holding them.
//
//   Tensor w = testing::FromVector(testing::Random(out * in, /*seed=*/2), {out, in}, DType::kBF16);
#pragma once

#include <cstdint>
#include <initializer_list>
#include <random>
#include <vector>

#include "core/check.h"
#include "core/dtype.h"
#include "core/tensor.h"

namespace fathom::testing {

inline std::vector<float> Random(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-scale, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

inline Tensor FromVector(const std::vector<float>& v, std::initializer_list<int64_t> shape, DType dtype = DType::kF32) {
  Tensor t = Tensor::Empty(dtype, shape);
  for (size_t i = 0; i < v.size(); ++i) {
    switch (dtype) {
      case DType::kF32:
        t.data<float>()[i] = v[i];
        break;
      case DType::kBF16:
        t.data<uint16_t>()[i] = F32ToBf16(v[i]);
        break;
      case DType::kF16:
        t.data<uint16_t>()[i] = F32ToF16(v[i]);
        break;
      case DType::kF8E4M3:
        t.data<uint8_t>()[i] = F32ToF8E4M3(v[i]);
        break;
      default:
        FATHOM_CHECK(false);
    }
  }
  return t;
}

}  // namespace fathom::testing
