// The sampling kernels (sampling.h). SampleRows: one block of 1024 threads per logits row, no sort:
//  - Candidates are ranked by a 64-bit key, the logit's order-preserving bits over the complement of the id, so
//    that every key is distinct and descending key order is the host's order (higher logit first, then lower id).
//  - top-k is a radix select of the k-th largest key (8 bits a pass, counts in shared memory); top-p a radix select
//    on probability mass (fixed-point integers, so that the sums do not depend on the order of the atomics). Each
//    leaves a threshold key: the kept ids are those with keys at or above it.
//  - min-p is an element-wise floor; the token is the inverse CDF in id order (block scans in double) at the row's
//    Philox draw.
// Every reduction runs in a fixed order, so that a seeded row gives the same token on every run.
#include <cuda_runtime.h>
// cuRAND's Philox alone (curand_kernel.h would bring its 200 KB of generator tables into the binary).
#define QUALIFIERS static __forceinline__ __device__
#include <curand_philox4x32_x.h>

#include <cstdint>

#include "backend/cuda/launch.cuh"
#include "backend/cuda/sampling.h"
#include "core/philox.h"

namespace fathom::cuda {
namespace {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr uint32_t kFull = 0xffffffffu;
constexpr int32_t kNoId = 0x7fffffff;

struct SampleShared {
  uint32_t count[256];
  unsigned long long mass[256];
  double scratch_d[kWarps];
  unsigned long long scratch_u[kWarps];
  float scratch_f[kWarps];
  int32_t scratch_i[kWarps];
  int32_t bin;
  unsigned long long above;
};

__device__ __forceinline__ uint32_t OrderedBits(float f) {
  const uint32_t u = __float_as_uint(f == 0.0f ? 0.0f : f);  // -0 ranks with +0, as the host's comparisons do
  return (u & 0x80000000u) != 0 ? ~u : (u | 0x80000000u);
}
// Distinct for every id; larger = ranked first.
__device__ __forceinline__ unsigned long long RankKey(float l, int64_t i) {
  return (static_cast<unsigned long long>(OrderedBits(l)) << 32) | (0xffffffffu - static_cast<uint32_t>(i));
}
__device__ __forceinline__ int32_t KeyId(uint64_t key) {
  return static_cast<int32_t>(0xffffffffu - static_cast<uint32_t>(key));
}

struct AddOp {
  template <typename T>
  __device__ T operator()(T a, T b) const {
    return a + b;
  }
};
struct MaxOp {
  template <typename T>
  __device__ T operator()(T a, T b) const {
    return a > b ? a : b;
  }
};
struct MinOp {
  template <typename T>
  __device__ T operator()(T a, T b) const {
    return a < b ? a : b;
  }
};

// Every thread gets op over the block's values. A fixed tree: the same bits on every run and in every thread.
template <typename T, typename Op>
__device__ T BlockReduce(T v, Op op, T* scratch) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(kFull, v, o));
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  __syncthreads();  // the last call's readers are done with scratch
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = scratch[lane];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(kFull, v, o));
  return v;
}

// The sum of the values of the threads before this one; *total gets the block's sum.
__device__ double BlockExclusiveSum(double v, double* scratch, double* total) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  double incl = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const double t = __shfl_up_sync(kFull, incl, o);
    if (lane >= o) incl += t;
  }
  double excl = __shfl_up_sync(kFull, incl, 1);
  if (lane == 0) excl = 0.0;
  __syncthreads();
  if (lane == 31) scratch[warp] = incl;
  __syncthreads();
  double w = scratch[lane];  // warp totals, scanned the same way in every warp
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const double t = __shfl_up_sync(kFull, w, o);
    if (lane >= o) w += t;
  }
  double before = __shfl_sync(kFull, w, warp == 0 ? 0 : warp - 1);
  if (warp == 0) before = 0.0;
  *total = __shfl_sync(kFull, w, 31);
  return before + excl;
}

// Over the bins 255, 254, ..., 0: the first bin b where the running sum reaches `need` (>= 1), and the sum of the
// bins above it. Results in sh.bin (-1 when the bins hold less than need) and sh.above; ends with a barrier.
template <typename T>
__device__ void FindBinFromTop(const T* hist, unsigned long long need, SampleShared& sh) {
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    unsigned long long s = 0;
#pragma unroll
    for (int j = 0; j < 8; ++j) s += hist[255 - 8 * lane - j];
    unsigned long long incl = s;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const unsigned long long t = __shfl_up_sync(kFull, incl, o);
      if (lane >= o) incl += t;
    }
    const unsigned long long excl = incl - s;
    const bool mine = excl < need && need <= incl;
    if (__ballot_sync(kFull, mine) == 0u) {
      if (lane == 0) sh.bin = -1;
    } else if (mine) {
      unsigned long long acc = excl;
      for (int j = 0; j < 8; ++j) {
        const int b = 255 - 8 * lane - j;
        if (acc + hist[b] >= need) {
          sh.bin = b;
          sh.above = acc;
          break;
        }
        acc += hist[b];
      }
    }
  }
  __syncthreads();
}

// A histogram update aggregated per warp: the lanes with the same bin (logits crowd into a few bins of the top
// digits) add through one pair of atomics, by their leader; with a 64-bit atomic per lane, top-p took 2.6x as long.
// bin < 0: nothing to add. Called by every lane of the warp.
__device__ __forceinline__ void WarpAddToBin(int bin, unsigned long long m, uint32_t* count, unsigned long long* mass) {
  if (__ballot_sync(kFull, bin >= 0) == 0u) return;
  const unsigned peers = __match_any_sync(kFull, bin);
  unsigned long long sum = 0;
#pragma unroll
  for (int j = 0; j < 32; ++j) {
    const unsigned long long v = __shfl_sync(kFull, m, j);
    if (((peers >> j) & 1u) != 0) sum += v;
  }
  if (bin >= 0 && static_cast<int>(threadIdx.x % 32) == __ffs(peers) - 1) {
    atomicAdd(&count[bin], __popc(peers));
    if (sum != 0) atomicAdd(&mass[bin], sum);
  }
}

// The key of the k-th ranked id (k in [1, vocab]): ids with keys >= it are the top k.
__device__ uint64_t SelectTopK(const float* x, int64_t vocab, uint64_t k, SampleShared& sh) {
  uint64_t prefix = 0, mask = 0, remaining = k;
  for (int shift = 56; shift >= 0; shift -= 8) {
    for (int b = threadIdx.x; b < 256; b += kThreads) sh.count[b] = 0;
    __syncthreads();
    // Plain 32-bit shared atomics: aggregating them per warp (as SelectTopP does its 64-bit masses) measured slower.
    for (int64_t i = threadIdx.x; i < vocab; i += kThreads) {
      const unsigned long long key = RankKey(x[i], i);
      if ((key & mask) == prefix) atomicAdd(&sh.count[(key >> shift) & 255], 1u);
    }
    __syncthreads();
    FindBinFromTop(sh.count, remaining, sh);
    const int b = sh.bin;
    remaining -= sh.above;
    prefix |= static_cast<uint64_t>(b) << shift;
    mask |= 0xffull << shift;
    const uint32_t in_bin = sh.count[b];
    __syncthreads();
    if (in_bin == remaining) break;  // the whole bin is kept: the prefix alone is the threshold
  }
  return prefix;
}

// Probability mass as an integer (2^-52 units), so that sums are exact and order-free.
__device__ __forceinline__ unsigned long long Fixed(float p) {
  return static_cast<unsigned long long>(static_cast<double>(p) * 0x1p52);
}

// Among ids with keys >= k0: the key of the id at which the mass, in rank order, first reaches `need` (>= 1).
template <typename Prob>
__device__ uint64_t SelectTopP(const float* x, int64_t vocab, uint64_t k0, unsigned long long need, Prob prob,
                               SampleShared& sh) {
  uint64_t prefix = 0, mask = 0;
  for (int shift = 56; shift >= 0; shift -= 8) {
    for (int b = threadIdx.x; b < 256; b += kThreads) {
      sh.count[b] = 0;
      sh.mass[b] = 0;
    }
    __syncthreads();
    for (int64_t base = 0; base < vocab; base += kThreads) {  // the same trip count in every lane
      const int64_t i = base + threadIdx.x;
      int bin = -1;
      unsigned long long m = 0;
      if (i < vocab) {
        const float l = x[i];
        const unsigned long long key = RankKey(l, i);
        if (key >= k0 && (key & mask) == prefix) {
          bin = static_cast<int>((key >> shift) & 255);
          m = Fixed(prob(l));
        }
      }
      WarpAddToBin(bin, m, sh.count, sh.mass);
    }
    __syncthreads();
    FindBinFromTop(sh.mass, need, sh);
    const int b = sh.bin;
    if (b < 0) return k0;  // (not reached: need is at most the kept mass)
    need -= sh.above;
    prefix |= static_cast<uint64_t>(b) << shift;
    mask |= 0xffull << shift;
    const uint32_t in_bin = sh.count[b];
    __syncthreads();
    if (in_bin == 1) break;  // the crossing id alone has this prefix among the candidates
  }
  return prefix > k0 ? prefix : k0;  // ids below k0 may share the prefix
}

// The first id, in id order, whose cumulative kept mass exceeds `target`; the last kept id if rounding leaves none.
template <typename Kept>
__device__ int32_t InverseCdf(const float* x, int64_t vocab, Kept kept, double target, SampleShared& sh) {
  double base = 0.0;
  int32_t last_kept = 0;
  for (int64_t t0 = 0; t0 < vocab; t0 += 4 * kThreads) {
    const int64_t i0 = t0 + 4 * static_cast<int64_t>(threadIdx.x);
    double m[4];
    double local = 0.0;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      m[e] = i0 + e < vocab ? kept(x[i0 + e], i0 + e) : 0.0;
      local += m[e];
    }
    double tile_total = 0.0;
    double c = base + BlockExclusiveSum(local, sh.scratch_d, &tile_total);
    int32_t found = kNoId, last = -1;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      if (m[e] <= 0.0) continue;
      last = static_cast<int32_t>(i0 + e);
      if (found == kNoId && c + m[e] > target) found = static_cast<int32_t>(i0 + e);
      c += m[e];
    }
    found = BlockReduce(found, MinOp{}, sh.scratch_i);
    if (found != kNoId) return found;
    last = BlockReduce(last, MaxOp{}, sh.scratch_i);
    if (last >= 0) last_kept = last;
    base += tile_total;
  }
  return last_kept;
}

__global__ void __launch_bounds__(kThreads)
    SampleRowsKernel(float* logits, int64_t ls, int64_t vocab, const SampleRowSpec* specs, const LogitAdjust* adjust,
                     float* saved, SampledToken* out) {
  PdlPrologue();
  __shared__ SampleShared sh;
  const SampleRowSpec sp = specs[blockIdx.x];
  float* x = logits + static_cast<int64_t>(blockIdx.x) * ls;
  SampledToken* o = out + blockIdx.x;

  // Logprobs come from the raw logits: before the adjustments.
  const bool want_logprob = sp.logprob != 0 || sp.top_logprobs > 0;
  float lse = 0.0f;
  if (want_logprob) {
    float mx = -INFINITY;
    for (int64_t i = threadIdx.x; i < vocab; i += kThreads) mx = fmaxf(mx, x[i]);
    mx = BlockReduce(mx, MaxOp{}, sh.scratch_f);
    double sum = 0.0;
    for (int64_t i = threadIdx.x; i < vocab; i += kThreads) sum += exp(static_cast<double>(x[i]) - mx);
    sum = BlockReduce(sum, AddOp{}, sh.scratch_d);
    lse = mx + static_cast<float>(log(sum));
    const int n = static_cast<int>(sp.top_logprobs < vocab ? sp.top_logprobs : vocab);
    unsigned long long prev = ~0ull;
    for (int j = 0; j < n; ++j) {
      unsigned long long best = 0;
      for (int64_t i = threadIdx.x; i < vocab; i += kThreads) {
        const unsigned long long key = RankKey(x[i], i);
        if (key < prev && key > best) best = key;
      }
      best = BlockReduce(best, MaxOp{}, sh.scratch_u);
      if (threadIdx.x == 0) {
        o->top_ids[j] = KeyId(best);
        o->top_logprobs[j] = x[KeyId(best)] - lse;
      }
      prev = best;
    }
    if (threadIdx.x == 0) o->top_count = n;
  } else if (threadIdx.x == 0) {
    o->top_count = 0;
  }
  __syncthreads();

  // The logits processors: the host's formula (model/sample_rows.h AdjustedLogit). One entry per id.
  for (int j = threadIdx.x; j < sp.adjust_count; j += kThreads) {
    const LogitAdjust a = adjust[sp.adjust_begin + j];
    const float l = x[a.id];
    saved[sp.adjust_begin + j] = l;
    x[a.id] = AdjustedLogit(l, a, sp.repetition_penalty);
  }
  __syncthreads();

  int32_t token = 0;
  if (sp.temperature <= 0.0f) {
    unsigned long long best = 0;
    for (int64_t i = threadIdx.x; i < vocab; i += kThreads) best = max(best, RankKey(x[i], i));
    token = KeyId(BlockReduce(best, MaxOp{}, sh.scratch_u));
  } else {
    // engine/sampler.cc TemperatureProbs: e = exp((l - max) / T) in double, rounded to float; p = e / sum(e).
    float mx = -INFINITY;
    for (int64_t i = threadIdx.x; i < vocab; i += kThreads) mx = fmaxf(mx, x[i]);
    mx = BlockReduce(mx, MaxOp{}, sh.scratch_f);
    const double t = sp.temperature;
    const auto exp_of = [&](float l) { return static_cast<float>(exp((static_cast<double>(l) - mx) / t)); };
    double sum = 0.0;
    for (int64_t i = threadIdx.x; i < vocab; i += kThreads) sum += exp_of(x[i]);
    sum = BlockReduce(sum, AddOp{}, sh.scratch_d);
    const double inv_sum = 1.0 / sum;
    const auto prob = [&](float l) { return static_cast<float>(static_cast<double>(exp_of(l)) * inv_sum); };

    uint64_t k0 = 0;  // the kept ids: keys >= k0, probabilities >= floor
    if (sp.top_k > 0 && sp.top_k < vocab) k0 = SelectTopK(x, vocab, static_cast<uint64_t>(sp.top_k), sh);
    if (sp.top_p < 1.0f) {
      unsigned long long kept = 0;
      for (int64_t i = threadIdx.x; i < vocab; i += kThreads) {
        const float l = x[i];
        if (RankKey(l, i) >= k0) kept += Fixed(prob(l));
      }
      kept = BlockReduce(kept, AddOp{}, sh.scratch_u);
      unsigned long long need = static_cast<unsigned long long>(static_cast<double>(sp.top_p) * kept);
      if (need < 1) need = 1;
      k0 = SelectTopP(x, vocab, k0, need, prob, sh);
    }
    const float floor = sp.min_p > 0.0f ? sp.min_p * static_cast<float>(1.0 / sum) : 0.0f;
    const auto kept_mass = [&](float l, int64_t i) {
      if (RankKey(l, i) < k0) return 0.0;
      const float p = prob(l);
      return p >= floor ? static_cast<double>(p) : 0.0;
    };
    double total = 0.0;
    for (int64_t i = threadIdx.x; i < vocab; i += kThreads) total += kept_mass(x[i], i);
    total = BlockReduce(total, AddOp{}, sh.scratch_d);
    const double u = PhiloxUniform(sp.seed, sp.draw);
    token = InverseCdf(x, vocab, kept_mass, u * total, sh);
  }

  if (sp.logprob != 0) {
    // The chosen token's raw logit: saved, if an adjustment changed it.
    __shared__ float raw;
    if (threadIdx.x == 0) raw = x[token];
    __syncthreads();
    for (int j = threadIdx.x; j < sp.adjust_count; j += kThreads) {
      if (adjust[sp.adjust_begin + j].id == token) raw = saved[sp.adjust_begin + j];  // one entry per id
    }
    __syncthreads();
    if (threadIdx.x == 0) o->logprob = raw - lse;
  }
  if (threadIdx.x == 0) o->token = token;
}

__global__ void CurandPhiloxKernel(const uint32_t* c, const uint32_t* k, int64_t n, uint32_t* r) {
  PdlPrologue();
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const uint4 a = curand_Philox4x32_10(make_uint4(c[4 * i], c[4 * i + 1], c[4 * i + 2], c[4 * i + 3]),
                                       make_uint2(k[2 * i], k[2 * i + 1]));
  const PhiloxBlock b =
      Philox4x32(PhiloxBlock{c[4 * i], c[4 * i + 1], c[4 * i + 2], c[4 * i + 3]}, k[2 * i], k[2 * i + 1]);
  const uint32_t words[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
  for (int j = 0; j < 8; ++j) r[8 * i + j] = words[j];
}

// One block per row: each thread scans a strided slice (float4 loads when aligned), then (value, index) pairs are
// reduced with ties going to the lower index, which matches std::max_element.
__device__ __forceinline__ void ArgMaxPick(float& v, int64_t& i, float ov, int64_t oi) {
  if (ov > v || (ov == v && oi < i)) {
    v = ov;
    i = oi;
  }
}

__global__ void ArgMaxKernel(const float* x, int64_t xs, int64_t cols, int32_t* ids) {
  PdlPrologue();
  const float* row = x + static_cast<int64_t>(blockIdx.x) * xs;
  float best = -INFINITY;
  int64_t best_i = cols;  // loses every tie against a real index
  const bool vec = reinterpret_cast<uintptr_t>(row) % 16 == 0;
  int64_t start = 0;
  if (vec) {
    const int64_t nv = cols / 4;
    const float4* r4 = reinterpret_cast<const float4*>(row);
    for (int64_t j = threadIdx.x; j < nv; j += blockDim.x) {
      const float4 v = r4[j];
      ArgMaxPick(best, best_i, v.x, 4 * j);
      ArgMaxPick(best, best_i, v.y, 4 * j + 1);
      ArgMaxPick(best, best_i, v.z, 4 * j + 2);
      ArgMaxPick(best, best_i, v.w, 4 * j + 3);
    }
    start = nv * 4;
  }
  for (int64_t j = start + threadIdx.x; j < cols; j += blockDim.x) ArgMaxPick(best, best_i, row[j], j);
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, best, o);
    const int64_t oi = __shfl_xor_sync(0xffffffffu, best_i, o);
    ArgMaxPick(best, best_i, ov, oi);
  }
  __shared__ float sv[32];
  __shared__ int64_t si[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) {
    sv[warp] = best;
    si[warp] = best_i;
  }
  __syncthreads();
  if (warp == 0) {
    const int warps = blockDim.x / 32;
    best = lane < warps ? sv[lane] : -INFINITY;
    best_i = lane < warps ? si[lane] : cols;
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, best, o);
      const int64_t oi = __shfl_xor_sync(0xffffffffu, best_i, o);
      ArgMaxPick(best, best_i, ov, oi);
    }
    // A row of NaNs only (no value compares greater): index 0, as std::max_element returns.
    if (lane == 0) ids[blockIdx.x] = static_cast<int32_t>(best_i >= cols ? 0 : best_i);
  }
}

// Block b covers 256 ids of listed row b / chunks; a warp's 32 ids share one mask word. Only disallowed logits are
// written (the allowed ones are not even read).
__global__ void MaskLogitsKernel(float* logits, int64_t ls, int64_t vocab, const int32_t* rows, const uint32_t* masks,
                                 int64_t words, int64_t chunks) {
  PdlPrologue();
  const int64_t b = blockIdx.x;
  const int64_t i = b / chunks;
  const int64_t t = (b - i * chunks) * 256 + threadIdx.x;
  if (t >= vocab) return;
  const uint32_t word = masks[i * words + (t >> 5)];
  if (((word >> (t & 31)) & 1u) == 0) logits[static_cast<int64_t>(rows[i]) * ls + t] = -INFINITY;
}

}  // namespace

int LaunchMaskLogits(float* logits, int64_t ls, int64_t vocab, const int32_t* rows, int64_t n_rows,
                     const uint32_t* masks, int64_t words, Stream s) {
  if (n_rows == 0 || vocab == 0) return 0;
  const int64_t chunks = (vocab + 255) / 256;
  LaunchKernel(MaskLogitsKernel, static_cast<unsigned>(n_rows * chunks), 256, 0, static_cast<cudaStream_t>(s), logits,
               ls, vocab, rows, masks, words, chunks);
  return static_cast<int>(cudaGetLastError());
}

int LaunchSampleRows(float* logits, int64_t ls, int64_t rows, int64_t vocab, const SampleRowSpec* specs,
                     const LogitAdjust* adjust, float* saved, SampledToken* out, Stream s) {
  if (rows == 0) return 0;
  LaunchKernel(SampleRowsKernel, static_cast<unsigned>(rows), kThreads, 0, static_cast<cudaStream_t>(s), logits, ls,
               vocab, specs, adjust, saved, out);
  return static_cast<int>(cudaGetLastError());
}

int LaunchArgMax(const float* x, int64_t xs, int64_t rows, int64_t cols, int32_t* ids, Stream s) {
  if (rows == 0) return 0;
  LaunchKernel(ArgMaxKernel, static_cast<unsigned>(rows), 1024, 0, static_cast<cudaStream_t>(s), x, xs, cols, ids);
  return static_cast<int>(cudaGetLastError());
}

int LaunchCurandPhilox(const uint32_t* c, const uint32_t* k, int64_t n, uint32_t* r, Stream s) {
  if (n == 0) return 0;
  LaunchKernel(CurandPhiloxKernel, static_cast<unsigned>((n + 255) / 256), 256, 0, static_cast<cudaStream_t>(s), c, k,
               n, r);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace fathom::cuda
