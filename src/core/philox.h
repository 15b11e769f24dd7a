// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11): a counter-based random
// function, the same bits on the host and in CUDA kernels. Written here because the sampler needs one function that
// both sides compute: the n-th draw of a seeded request is PhiloxUniform(seed, n), whichever backend samples.
//
//   PhiloxBlock r = Philox4x32(PhiloxBlock{0, 0, 0, 0}, /*key0=*/0, /*key1=*/0);  // 4 x 32 random bits
//   double u = PhiloxUniform(/*seed=*/42, /*counter=*/7);                           // in [0, 1), 53 bits
//
// Pinned by the Random123 known-answer vectors (tests/core/philox_test.cc) and by cuRAND's curand_Philox4x32_10 on
// the GPU (tests/backend/cuda).
#pragma once

#include <cstdint>

#include "core/host_device.h"

namespace fathom {

struct PhiloxBlock {
  uint32_t x, y, z, w;
};

FATHOM_HOST_DEVICE PhiloxBlock Philox4x32(PhiloxBlock c, uint32_t k0, uint32_t k1) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;  // round multipliers
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;  // Weyl key increments
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(kM0) * c.x;
    const uint64_t p1 = static_cast<uint64_t>(kM1) * c.z;
    const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    c = PhiloxBlock{hi1 ^ c.y ^ k0, lo1, hi0 ^ c.w ^ k1, lo0};
    k0 += kW0;
    k1 += kW1;
  }
  return c;
}

// The counter-th uniform double in [0, 1) of the stream `seed`: 53 bits of Philox4x32(counter, seed).
FATHOM_HOST_DEVICE double PhiloxUniform(uint64_t seed, uint64_t counter) {
  const PhiloxBlock r =
      Philox4x32(PhiloxBlock{static_cast<uint32_t>(counter), static_cast<uint32_t>(counter >> 32), 0, 0},
                 static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
  const uint64_t bits = (static_cast<uint64_t>(r.x) << 21) | (r.y >> 11);  // 32 + 21 = 53 bits
  return static_cast<double>(bits) * 0x1.0p-53;
}

}  // namespace fathom
