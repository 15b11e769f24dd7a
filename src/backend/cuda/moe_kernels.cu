// The MoE kernels (see moe_kernels.h).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "backend/cuda/moe_kernels.h"

namespace fathom::cuda {

namespace {

// One thread per token; its scores and selection values live in shared memory ([threads][2][n_experts]), not in a
// large per-thread stack frame (local memory is reserved for every resident thread of the GPU).
__global__ void MoeRouteKernel(const float* logits, int64_t ls, int64_t n, const float* bias, moe_route::Params p,
                               int32_t* ids, float* weights) {
  extern __shared__ float scratch[];
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= n) return;
  float* scores = scratch + static_cast<int64_t>(threadIdx.x) * 2 * p.n_experts;
  moe_route::RouteToken(p, logits + t * ls, bias, scores, scores + p.n_experts, ids + t * p.top_k,
                        weights + t * p.top_k);
}

// The workspace: per-expert pair ranges, the active experts, each pair's sorted position, and the intermediate
// activations of every pair.
struct MoeWorkspace {
  int32_t* start;        // [n_experts + 1]: expert e's pairs are sorted positions [start[e], start[e + 1])
  int32_t* active;       // [n_experts]: the experts with pairs, in index order
  int32_t* num_active;   // [1]
  int32_t* sorted_pair;  // [pairs]: the pair (t * top_k + j) at each sorted position
  int32_t* pair_pos;     // [pairs]: the sorted position of each pair
  float* h;              // [pairs, inter]: silu(gate) * up
  float* y;              // [pairs, hidden]: the expert outputs
};

int64_t Align(int64_t bytes) {
  return (bytes + 255) / 256 * 256;
}

MoeWorkspace Carve(const MoeExpertsArgs& a, void* base, int64_t* total) {
  const int64_t pairs = a.n * a.top_k;
  char* p = static_cast<char*>(base);
  int64_t off = 0;
  auto take = [&](int64_t bytes) {
    char* r = p == nullptr ? nullptr : p + off;
    off += Align(bytes);
    return r;
  };
  MoeWorkspace w{};
  w.start = reinterpret_cast<int32_t*>(take(4 * (a.n_experts + 1)));
  w.active = reinterpret_cast<int32_t*>(take(4 * a.n_experts));
  w.num_active = reinterpret_cast<int32_t*>(take(4));
  w.sorted_pair = reinterpret_cast<int32_t*>(take(4 * pairs));
  w.pair_pos = reinterpret_cast<int32_t*>(take(4 * pairs));
  w.h = reinterpret_cast<float*>(take(4 * pairs * a.inter));
  w.y = reinterpret_cast<float*>(take(4 * pairs * a.hidden));
  *total = off;
  return w;
}

// A stable counting sort of the pairs by expert, in one block: each thread counts (then places) the pairs of its
// experts, so expert e's pairs keep their order t * top_k + j.
__global__ void __launch_bounds__(1024)
    MoeSortKernel(const int32_t* ids, int32_t pairs, int32_t experts, MoeWorkspace w) {
  __shared__ int32_t sid[kMaxMoePairs];
  __shared__ int32_t first[moe_route::kMaxExperts];
  for (int32_t i = threadIdx.x; i < pairs; i += blockDim.x) sid[i] = ids[i];
  __syncthreads();
  for (int32_t e = threadIdx.x; e < experts; e += blockDim.x) {
    int32_t c = 0;
    for (int32_t p = 0; p < pairs; ++p) c += sid[p] == e;
    first[e] = c;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int32_t run = 0, na = 0;
    for (int32_t e = 0; e < experts; ++e) {
      const int32_t c = first[e];
      w.start[e] = run;
      first[e] = run;
      if (c > 0) w.active[na++] = e;
      run += c;
    }
    w.start[experts] = run;
    *w.num_active = na;
  }
  __syncthreads();
  for (int32_t e = threadIdx.x; e < experts; e += blockDim.x) {
    int32_t pos = first[e];
    for (int32_t p = 0; p < pairs; ++p) {
      if (sid[p] == e) {
        w.sorted_pair[pos] = p;
        w.pair_pos[p] = pos;
        ++pos;
      }
    }
  }
}

constexpr int kMoeWarps = 8;  // one output row per warp

__device__ __forceinline__ float WarpSum32(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ void Bf16x8(const uint4& raw, float* f) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const float2 v = __bfloat1622float2(h[e]);
    f[2 * e] = v.x;
    f[2 * e + 1] = v.y;
  }
}

__device__ __forceinline__ float Dot8(const float* wf, const float* x) {
  const float4 a = *reinterpret_cast<const float4*>(x), b = *reinterpret_cast<const float4*>(x + 4);
  return a.x * wf[0] + a.y * wf[1] + a.z * wf[2] + a.w * wf[3] + b.x * wf[4] + b.y * wf[5] + b.z * wf[6] + b.w * wf[7];
}

// What a warp of a grouped kernel works on: block (active expert slot, tile of kMoeWarps weight rows), one row per
// warp. False when the slot has no expert or the row is past `rows`.
struct ExpertRow {
  int32_t e, s0, cnt;  // the expert and its pairs' sorted positions [s0, s0 + cnt)
  int64_t r;           // the weight row
  int32_t lane;
};
__device__ __forceinline__ bool FindExpertRow(const MoeWorkspace& w, int64_t rows, ExpertRow* out) {
  if (static_cast<int32_t>(blockIdx.x) >= *w.num_active) return false;
  out->e = w.active[blockIdx.x];
  out->lane = static_cast<int32_t>(threadIdx.x % 32);
  out->r = static_cast<int64_t>(blockIdx.y) * kMoeWarps + threadIdx.x / 32;
  out->s0 = w.start[out->e];
  out->cnt = w.start[out->e + 1] - out->s0;
  return out->r < rows;
}

// Row x.r (of `len` bf16 values) of part 0 (gate), 1 (up) or 2 (down) of expert x.e, as 16-byte pieces.
__device__ __forceinline__ const uint4* WeightRow(const MoeExpertsArgs& a, int part, const ExpertRow& x, int64_t len) {
  return reinterpret_cast<const uint4*>(static_cast<const __nv_bfloat16*>(a.table[part * a.n_experts + x.e]) +
                                        x.r * len);
}

// Block (active expert slot, tile of kMoeWarps rows of gate and up): each warp streams its gate and up rows once per
// kT pairs of the expert and writes h = silu(gate . x) * (up . x) for them.
template <int kT>
__global__ void __launch_bounds__(kMoeWarps * 32) MoeGateUpKernel(MoeExpertsArgs a, MoeWorkspace w) {
  ExpertRow x;
  if (!FindExpertRow(w, a.inter, &x)) return;
  const uint4 *gw = WeightRow(a, 0, x, a.hidden), *uw = WeightRow(a, 1, x, a.hidden);
  const int32_t s0 = x.s0, cnt = x.cnt, lane = x.lane;
  const int64_t r = x.r;
  const int64_t chunks = a.hidden / 8;
  for (int32_t c0 = 0; c0 < cnt; c0 += kT) {
    const int32_t tn = min(kT, cnt - c0);
    const float* xr[kT];
    float ag[kT], au[kT];
#pragma unroll
    for (int j = 0; j < kT; ++j) {
      const int32_t pair = w.sorted_pair[s0 + c0 + min(j, tn - 1)];
      xr[j] = a.x + static_cast<int64_t>(pair / a.top_k) * a.xs;
      ag[j] = au[j] = 0.0f;
    }
    for (int64_t k = lane; k < chunks; k += 32) {
      float gf[8], uf[8];
      Bf16x8(gw[k], gf);
      Bf16x8(uw[k], uf);
#pragma unroll
      for (int j = 0; j < kT; ++j) {
        if (j < tn) {
          ag[j] += Dot8(gf, xr[j] + k * 8);
          au[j] += Dot8(uf, xr[j] + k * 8);
        }
      }
    }
#pragma unroll
    for (int j = 0; j < kT; ++j) {
      const float g = WarpSum32(ag[j]), u = WarpSum32(au[j]);
      if (lane == 0 && j < tn) w.h[static_cast<int64_t>(s0 + c0 + j) * a.inter + r] = g / (1.0f + expf(-g)) * u;
    }
  }
}

// Block (active expert slot, tile of kMoeWarps rows of down): y = down . h for the expert's pairs.
template <int kT>
__global__ void __launch_bounds__(kMoeWarps * 32) MoeDownKernel(MoeExpertsArgs a, MoeWorkspace w) {
  ExpertRow x;
  if (!FindExpertRow(w, a.hidden, &x)) return;
  const uint4* dw = WeightRow(a, 2, x, a.inter);
  const int32_t s0 = x.s0, cnt = x.cnt, lane = x.lane;
  const int64_t r = x.r;
  const int64_t chunks = a.inter / 8;
  for (int32_t c0 = 0; c0 < cnt; c0 += kT) {
    const int32_t tn = min(kT, cnt - c0);
    float acc[kT];
#pragma unroll
    for (int j = 0; j < kT; ++j) acc[j] = 0.0f;
    const float* hr = w.h + static_cast<int64_t>(s0 + c0) * a.inter;
    for (int64_t k = lane; k < chunks; k += 32) {
      float df[8];
      Bf16x8(dw[k], df);
#pragma unroll
      for (int j = 0; j < kT; ++j) {
        if (j < tn) acc[j] += Dot8(df, hr + j * a.inter + k * 8);
      }
    }
#pragma unroll
    for (int j = 0; j < kT; ++j) {
      const float v = WarpSum32(acc[j]);
      if (lane == 0 && j < tn) w.y[static_cast<int64_t>(s0 + c0 + j) * a.hidden + r] = v;
    }
  }
}

// One block per token: out[t] += sum_j weights[t, j] * y[pair_pos[t * top_k + j]], j in order.
__global__ void MoeCombineKernel(MoeExpertsArgs a, MoeWorkspace w) {
  const int64_t t = blockIdx.x;
  for (int64_t c = threadIdx.x; c < a.hidden; c += blockDim.x) {
    float acc = 0.0f;
    for (int64_t j = 0; j < a.top_k; ++j) {
      const int64_t p = t * a.top_k + j;
      acc += a.weights[p] * w.y[static_cast<int64_t>(w.pair_pos[p]) * a.hidden + c];
    }
    a.out[t * a.os + c] += acc;
  }
}

template <int kT>
void LaunchGrouped(const MoeExpertsArgs& a, const MoeWorkspace& w, unsigned slots, cudaStream_t s) {
  MoeGateUpKernel<kT>
      <<<dim3(slots, static_cast<unsigned>((a.inter + kMoeWarps - 1) / kMoeWarps)), kMoeWarps * 32, 0, s>>>(a, w);
  MoeDownKernel<kT>
      <<<dim3(slots, static_cast<unsigned>((a.hidden + kMoeWarps - 1) / kMoeWarps)), kMoeWarps * 32, 0, s>>>(a, w);
}

}  // namespace

int LaunchMoeRoute(const float* logits, int64_t ls, int64_t n, const float* bias, const moe_route::Params& p,
                   int32_t* ids, float* weights, Stream s) {
  if (n == 0) return 0;
  if (p.n_experts > moe_route::kMaxExperts || p.n_group > moe_route::kMaxGroups) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  // 32 KiB of scratch per block: 16 threads at V3's 256 experts, 64 at V2-Lite's 64.
  const int64_t per_thread = 2 * static_cast<int64_t>(p.n_experts) * static_cast<int64_t>(sizeof(float));
  const int64_t threads = std::max<int64_t>(1, std::min<int64_t>(64, (32 << 10) / per_thread));
  MoeRouteKernel<<<static_cast<unsigned>((n + threads - 1) / threads), static_cast<unsigned>(threads),
                   static_cast<size_t>(threads * per_thread), static_cast<cudaStream_t>(s)>>>(logits, ls, n, bias, p,
                                                                                              ids, weights);
  return static_cast<int>(cudaGetLastError());
}

int64_t MoeExpertsWorkspaceBytes(const MoeExpertsArgs& a) {
  int64_t total = 0;
  Carve(a, nullptr, &total);
  return total;
}

int LaunchMoeExperts(const MoeExpertsArgs& a, void* workspace, Stream s) {
  const int64_t pairs = a.n * a.top_k;
  if (pairs == 0) return 0;
  if (pairs > kMaxMoePairs || a.n_experts > moe_route::kMaxExperts || a.hidden % 8 != 0 || a.inter % 8 != 0 ||
      a.xs % 4 != 0 || reinterpret_cast<uintptr_t>(a.x) % 16 != 0) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  int64_t total = 0;
  const MoeWorkspace w = Carve(a, workspace, &total);
  cudaStream_t st = static_cast<cudaStream_t>(s);
  MoeSortKernel<<<1, 1024, 0, st>>>(a.ids, static_cast<int32_t>(pairs), static_cast<int32_t>(a.n_experts), w);
  // Blocks for every expert that can be active; those past num_active return at once. Pairs per weight read: one at
  // batch 1, more when experts share tokens.
  const unsigned slots = static_cast<unsigned>(std::min(a.n_experts, pairs));
  if (pairs <= a.n_experts) {
    LaunchGrouped<1>(a, w, slots, st);
  } else if (pairs <= 4 * a.n_experts) {
    LaunchGrouped<4>(a, w, slots, st);
  } else {
    LaunchGrouped<8>(a, w, slots, st);
  }
  MoeCombineKernel<<<static_cast<unsigned>(a.n), 256, 0, st>>>(a, w);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace fathom::cuda
