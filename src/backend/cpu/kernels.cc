#include "backend/cpu/kernels.h"

#include "core/check.h"

namespace fathom::cpu {

// Compiled twice: for AVX2+FMA machines and for baseline x86-64; the loader picks one at run time.
#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__)
#define FATHOM_CLONES [[gnu::target_clones("arch=x86-64-v3", "default")]]
#else
#define FATHOM_CLONES
#endif

FATHOM_CLONES float DotF32(const float* a, const float* b, int64_t n) {
  float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
  for (int64_t i = 0; i < n; ++i) acc += a[i] * b[i];
  return acc;
}

}  // namespace fathom::cpu
