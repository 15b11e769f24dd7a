// Quick measurements of what this CPU can do, for the roofline of `fathom bench --offline --device cpu`. The probes
// are compiled with -O3 whatever the build type, and the FMA loop picks AVX-512, AVX2+FMA or SSE2 code at run
// time.
//
//   double bw = MeasureReadBandwidth(DefaultThreadPool(), int64_t{256} << 20);   // bytes/s, best of 3
//   ProbeResult f = MeasureFmaFlops(DefaultThreadPool());                        // f.flops FLOP/s, f.isa "avx2+fma"
#pragma once

#include <cstdint>
#include <string>

#include "core/thread_pool.h"

namespace fathom::bench {

// Reads `bytes` of memory on every thread of `pool` (best of three passes).
double MeasureReadBandwidth(ThreadPool& pool, int64_t bytes);

struct ProbeResult {
  double flops = 0;
  std::string isa;
};
// Independent f32 multiply-add chains in registers on every thread of `pool` (best of three passes).
ProbeResult MeasureFmaFlops(ThreadPool& pool);

}  // namespace fathom::bench
