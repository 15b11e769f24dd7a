#include "bench/peak_probe.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <vector>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace fathom::bench {

namespace {

using Clock = std::chrono::steady_clock;

// Twelve independent multiply-add chains in registers: enough to cover the FMA latency on both ports of current
// x86 cores. Returns the sum so that nothing is optimized away.
#define FATHOM_FMA_CHAINS(T, FMA, SET1, ADD, STORE, LANES)                                                  \
  const T m = SET1(0.999999f), a = SET1(1e-6f);                                                             \
  T c0 = SET1(0.1f), c1 = SET1(0.2f), c2 = SET1(0.3f), c3 = SET1(0.4f), c4 = SET1(0.5f), c5 = SET1(0.6f);   \
  T c6 = SET1(0.7f), c7 = SET1(0.8f), c8 = SET1(0.9f), c9 = SET1(1.0f), c10 = SET1(1.1f), c11 = SET1(1.2f); \
  for (int64_t i = 0; i < iters; ++i) {                                                                     \
    c0 = FMA(c0, m, a);                                                                                     \
    c1 = FMA(c1, m, a);                                                                                     \
    c2 = FMA(c2, m, a);                                                                                     \
    c3 = FMA(c3, m, a);                                                                                     \
    c4 = FMA(c4, m, a);                                                                                     \
    c5 = FMA(c5, m, a);                                                                                     \
    c6 = FMA(c6, m, a);                                                                                     \
    c7 = FMA(c7, m, a);                                                                                     \
    c8 = FMA(c8, m, a);                                                                                     \
    c9 = FMA(c9, m, a);                                                                                     \
    c10 = FMA(c10, m, a);                                                                                   \
    c11 = FMA(c11, m, a);                                                                                   \
  }                                                                                                         \
  T s = ADD(ADD(ADD(c0, c1), ADD(c2, c3)), ADD(ADD(c4, c5), ADD(c6, c7)));                                  \
  s = ADD(s, ADD(ADD(c8, c9), ADD(c10, c11)));                                                              \
  float lanes[LANES];                                                                                       \
  STORE(lanes, s);                                                                                          \
  float sum = 0;                                                                                            \
  for (float v : lanes) sum += v;                                                                           \
  return sum;

constexpr double kChains = 12;

struct Kernel {
  float (*fn)(int64_t iters);
  double flops_per_iter;
  const char* isa;
};

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
__attribute__((target("avx512f"))) float Fma512(int64_t iters) {
  FATHOM_FMA_CHAINS(__m512, _mm512_fmadd_ps, _mm512_set1_ps, _mm512_add_ps, _mm512_storeu_ps, 16)
}
__attribute__((target("avx2,fma"))) float Fma256(int64_t iters) {
  FATHOM_FMA_CHAINS(__m256, _mm256_fmadd_ps, _mm256_set1_ps, _mm256_add_ps, _mm256_storeu_ps, 8)
}
inline __m128 MulAdd128(__m128 x, __m128 y, __m128 z) {
  return _mm_add_ps(_mm_mul_ps(x, y), z);
}
float Fma128(int64_t iters){FATHOM_FMA_CHAINS(__m128, MulAdd128, _mm_set1_ps, _mm_add_ps, _mm_storeu_ps, 4)} Kernel
    PickKernel() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) return {Fma512, kChains * 16 * 2, "avx512"};
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return {Fma256, kChains * 8 * 2, "avx2+fma"};
  return {Fma128, kChains * 4 * 2, "sse2 mul+add"};
}
#else
inline float MulAddScalar(float x, float y, float z) {
  return x * y + z;
}
inline float Set1(float v) {
  return v;
}
inline float Add(float x, float y) {
  return x + y;
}
inline void Store(float* out, float v) {
  out[0] = v;
}
float FmaScalar(int64_t iters){FATHOM_FMA_CHAINS(float, MulAddScalar, Set1, Add, Store, 1)} Kernel PickKernel() {
  return {FmaScalar, kChains * 2, "scalar"};
}
#endif

uint64_t SumRange(const uint64_t* p, int64_t n) {
  uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    s0 += p[i];
    s1 += p[i + 1];
    s2 += p[i + 2];
    s3 += p[i + 3];
  }
  for (; i < n; ++i) s0 += p[i];
  return s0 + s1 + s2 + s3;
}

}  // namespace

double MeasureReadBandwidth(ThreadPool& pool, int64_t bytes) {
  const int64_t n = std::max<int64_t>(bytes / 8, 1 << 16);
  std::unique_ptr<uint64_t[]> buf(new uint64_t[static_cast<size_t>(n)]);
  pool.ParallelFor(n, 1 << 16, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) buf[static_cast<size_t>(i)] = static_cast<uint64_t>(i);
  });
  std::atomic<uint64_t> sink{0};
  double best = 0;
  for (int pass = 0; pass < 3; ++pass) {
    const auto t0 = Clock::now();
    pool.ParallelFor(n, 1 << 16, [&](int64_t b, int64_t e) {
      sink.fetch_add(SumRange(buf.get() + b, e - b), std::memory_order_relaxed);
    });
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    if (s > 0) best = std::max(best, static_cast<double>(n) * 8 / s);
  }
  return sink.load() == 42 ? best + 1 : best;  // keeps the sums alive
}

ProbeResult MeasureFmaFlops(ThreadPool& pool) {
  const Kernel k = PickKernel();
  const int threads = pool.num_threads();
  constexpr int64_t kIters = 4'000'000;
  std::vector<float> sink(static_cast<size_t>(threads));
  double best = 0;
  for (int pass = 0; pass < 3; ++pass) {
    const auto t0 = Clock::now();
    pool.ParallelFor(threads, 1, [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) sink[static_cast<size_t>(t)] = k.fn(kIters);
    });
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    if (s > 0) best = std::max(best, k.flops_per_iter * static_cast<double>(kIters) * threads / s);
  }
  ProbeResult r;
  r.flops = best + (sink[0] == 42.0f ? 1 : 0);
  r.isa = k.isa;
  return r;
}

}  // namespace fathom::bench
