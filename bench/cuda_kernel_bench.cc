// Kernel-level benchmark of the CUDA backend on real model shapes (R1-Distill-Qwen-7B by default), each figure next
// to the alternative it has to beat:
//   - decode GEMV (bf16 weights, one token): fathom's fan-out GEMV against cuBLASLt (bf16 in, f32 out), in TB/s;
//   - prefill GEMM (bf16 tensor cores) at 512 and 8192 tokens: cuBLASLt's first heuristic against the fastest of its
//     top candidates, f32 and bf16 output, in TFLOP/s;
//   - paged decode attention (the default kernel choice), in GB/s of KV read;
//   - with --mla 1 instead: MLA decode attention over a bf16 latent cache (576 values a token, V its first 512), the
//     MLA kernel against the generic split kernel, in GB/s of latent cache read, at V2-Lite's 16 and V3's 128 heads;
//   - with --moe 1 instead: the router and the routed experts (device sort, grouped GEMVs or grouped tensor-core
//     GEMMs, combine) at V2-Lite's shape (64 experts of 2048 x 1408, top 6) for decode and prefill batches, with
//     uniform and skewed routing, in TB/s of expert weights read and TFLOP/s;
//   - with --fp8 1 instead: DeepSeek-V3's block-scaled FP8 weights: the W8A8 GEMM (activation quantization plus
//     cuBLASLt's block-scaled FP8) against our bf16 GEMM at V3's prefill shapes in TFLOP/s, the f8 GEMV against the
//     bf16 one at V3's decode shapes in TB/s, and the routed experts with V3's 256 f8 experts (2048 x 7168, top 8).
//   - with --int4 1 instead: the 4-bit W4A16 kernel at Qwen-7B, Llama-8B and V2-Lite expert shapes (group 128) from
//     1 to 256 tokens in GB/s and TFLOP/s, and dequantize + cuBLASLt from 256 to 4096 tokens, next to bf16.
//   - with --sample 1 instead: sampling at DeepSeek-V3's 129k vocabulary, per step of 1-256 rows: the device sampler
//     (sampling.h) against the host path it replaces (the logits rows copied to the host, then engine/sampler's
//     Sample() on the thread pool, as the engine does), in ms.
//   - with --ops 1 instead: every row of the op table (tests/backend/ops/op_cases.h, the rows backend_ops_test checks;
//     --filter SUBSTRING keeps the rows whose description or name contains it) on the CudaBackend with its kernel
//     variant: microseconds a run, and GB/s and TFLOP/s from the row's bytes and FLOPs.
// Weights rotate through enough copies (>= 512 MiB) that no timing is served from L2.
//
//   cuda_kernel_bench [--hidden 3584 --inter 18944 --heads 28 --kv-heads 4 --head-dim 128 --vocab 152064]
//   cuda_kernel_bench --mla 1 [--block-size 64]
//   cuda_kernel_bench --moe 1
//   cuda_kernel_bench --fp8 1
//   cuda_kernel_bench --int4 1
//   cuda_kernel_bench --sample 1
//   cuda_kernel_bench --ops 1 [--filter "PagedAttention"]
// Prints one JSON object per line.
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "backend/cuda/attention.h"
#include "backend/cuda/attention_mla.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/elementwise.h"
#include "backend/cuda/fp8.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/int4.h"
#include "backend/cuda/kernel_options.h"
#include "backend/cuda/linear.h"
#include "backend/cuda/moe.h"
#include "backend/cuda/sampling.h"
#include "backend/ops/cuda_variants.h"
#include "backend/ops/op_cases.h"
#include "core/thread_pool.h"
#include "engine/sampler.h"

namespace {

#define CK(x)                                                                                       \
  do {                                                                                              \
    cudaError_t e_ = (x);                                                                           \
    if (e_ != cudaSuccess) {                                                                        \
      fmt::print(stderr, "{}:{}: {} failed: {}\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                                 \
    }                                                                                               \
  } while (0)
#define LK(x)                                                                        \
  do {                                                                               \
    cublasStatus_t s_ = (x);                                                         \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                               \
      fmt::print(stderr, "{}:{}: {} failed: {}\n", __FILE__, __LINE__, #x, int(s_)); \
      std::exit(1);                                                                  \
    }                                                                                \
  } while (0)

constexpr int kBf16 = 2, kF32 = 0, kF8 = 3;  // fathom::DType values

struct Shape {
  int64_t hidden = 3584, inter = 18944, heads = 28, kv_heads = 4, head_dim = 128, vocab = 152064;
  int64_t mla = 0, block_size = 64, moe = 0, fp8 = 0, sample = 0, ops = 0, int4 = 0;
  std::string filter;  // --ops: the rows whose description or name (OpCase::Name) contains it
};

// Device buffer filled with small random bf16 (as uint16) or f32 values.
void* RandomDevice(size_t elems, bool bf16, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-0.05f, 0.05f);
  void* p = nullptr;
  CK(cudaMalloc(&p, elems * (bf16 ? 2 : 4)));
  if (bf16) {
    std::vector<uint16_t> h(elems);
    for (auto& v : h) {
      float f = d(rng);
      uint32_t u;
      std::memcpy(&u, &f, 4);
      v = static_cast<uint16_t>(u >> 16);
    }
    CK(cudaMemcpy(p, h.data(), elems * 2, cudaMemcpyHostToDevice));
  } else {
    std::vector<float> h(elems);
    for (auto& v : h) v = d(rng);
    CK(cudaMemcpy(p, h.data(), elems * 4, cudaMemcpyHostToDevice));
  }
  return p;
}

// Median-free simple timing: warm-up, then the mean of `iters` runs between two events.
double TimeUs(cudaStream_t s, int iters, const std::function<void(int)>& run) {
  for (int i = 0; i < 3; ++i) run(i);
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  CK(cudaEventRecord(a, s));
  for (int i = 0; i < iters; ++i) run(i);
  CK(cudaEventRecord(b, s));
  CK(cudaEventSynchronize(b));
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, a, b));
  CK(cudaGetLastError());
  return 1e3 * ms / iters;
}

struct Lt {
  cublasLtHandle_t h = nullptr;
  void* ws = nullptr;
  size_t ws_bytes = 32u << 20;
  cudaStream_t s = nullptr;
  int sm_count = 0;  // the GPU's multiprocessors, which size some launchers' grids
  // The kernel switches of the FATHOM_CUDA_* environment (kernel_options.h), as a CudaBackend would read them.
  fathom::cuda::KernelOptions options = [] {
    auto o = fathom::cuda::KernelOptions::FromEnvironment();
    if (!o.ok()) {  // a switch with a value it does not take: say so rather than measure something else
      std::fprintf(stderr, "%s\n", o.status().ToString().c_str());
      std::exit(2);
    }
    return *o;
  }();
  // MLA's provider's switches (attention_mla.h), likewise.
  fathom::cuda::MlaKernelOptions mla_options = [] {
    auto o = fathom::cuda::MlaKernelOptions::FromEnvironment();
    if (!o.ok()) {
      std::fprintf(stderr, "%s\n", o.status().ToString().c_str());
      std::exit(2);
    }
    return *o;
  }();
  fathom::cuda::SplitAttentionKernels split_kernels() const { return {options.mma_attention, options.gqa_attention}; }
};

struct LtGemm {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  std::vector<cublasLtMatmulHeuristicResult_t> algos;
};

// out [n, m] (f32 or bf16) = x [n, k] (bf16) W^T, W [m, k] (bf16): the layout CublasLtGemm uses.
LtGemm MakeGemm(Lt& lt, int64_t n, int64_t k, int64_t m, bool out_bf16, int want) {
  LtGemm g;
  LK(cublasLtMatmulDescCreate(&g.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  LK(cublasLtMatmulDescSetAttribute(g.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  LK(cublasLtMatmulDescSetAttribute(g.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  LK(cublasLtMatrixLayoutCreate(&g.a, CUDA_R_16BF, k, m, k));
  LK(cublasLtMatrixLayoutCreate(&g.b, CUDA_R_16BF, k, n, k));
  LK(cublasLtMatrixLayoutCreate(&g.d, out_bf16 ? CUDA_R_16BF : CUDA_R_32F, m, n, m));
  cublasLtMatmulPreference_t pref;
  LK(cublasLtMatmulPreferenceCreate(&pref));
  LK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &lt.ws_bytes,
                                          sizeof(lt.ws_bytes)));
  g.algos.resize(static_cast<size_t>(want));
  int found = 0;
  LK(cublasLtMatmulAlgoGetHeuristic(lt.h, g.desc, g.a, g.b, g.d, g.d, pref, want, g.algos.data(), &found));
  g.algos.resize(static_cast<size_t>(found));
  cublasLtMatmulPreferenceDestroy(pref);
  return g;
}

void RunGemm(Lt& lt, const LtGemm& g, size_t algo, const void* x, const void* w, void* out) {
  const float alpha = 1, beta = 0;
  LK(cublasLtMatmul(lt.h, g.desc, &alpha, w, g.a, x, g.b, &beta, out, g.d, out, g.d, &g.algos[algo].algo, lt.ws,
                    lt.ws_bytes, lt.s));
}

// Copies of a weight so that cycling through them defeats L2 (>= 512 MiB in all).
std::vector<void*> WeightCopies(size_t elems, uint32_t seed) {
  const size_t bytes = elems * 2;
  const size_t copies = std::max<size_t>(1, (512ull << 20) / bytes + 1);
  std::vector<void*> v;
  void* first = RandomDevice(elems, true, seed);
  v.push_back(first);
  for (size_t i = 1; i < copies; ++i) {
    void* p = nullptr;
    CK(cudaMalloc(&p, bytes));
    CK(cudaMemcpy(p, first, bytes, cudaMemcpyDeviceToDevice));
    v.push_back(p);
  }
  return v;
}

void Gemv(Lt& lt, const char* name, int64_t k, const std::vector<int64_t>& ms) {
  // ours: all parts in one launch; cuBLASLt: one GEMM per part (bf16 x, f32 out).
  std::vector<std::vector<void*>> w;
  int64_t m_total = 0;
  for (size_t i = 0; i < ms.size(); ++i) {
    w.push_back(WeightCopies(static_cast<size_t>(ms[i] * k), 100 + static_cast<uint32_t>(i)));
    m_total += ms[i];
  }
  const size_t copies = w[0].size();
  float* x = static_cast<float*>(RandomDevice(static_cast<size_t>(k), false, 1));
  void* xb = RandomDevice(static_cast<size_t>(k), true, 2);
  std::vector<float*> out;
  for (int64_t m : ms) out.push_back(static_cast<float*>(RandomDevice(static_cast<size_t>(m), false, 3)));
  const double bytes = 2.0 * static_cast<double>(m_total * k);
  const double ours = TimeUs(lt.s, 50, [&](int it) {
    std::vector<fathom::cuda::GemvPart> parts;
    for (size_t i = 0; i < ms.size(); ++i) {
      parts.push_back({w[i][static_cast<size_t>(it) % copies], k, ms[i], nullptr, 0, out[i], ms[i]});
    }
    const int e =
        fathom::cuda::LaunchGemvFanOut(x, k, 1, k, parts.data(), static_cast<int>(parts.size()), lt.sm_count, lt.s);
    if (e != 0) std::exit(2);
  });
  std::vector<LtGemm> g;
  for (int64_t m : ms) g.push_back(MakeGemm(lt, 1, k, m, false, 8));
  double best_lt = 1e30, first_lt = 0;
  for (size_t a = 0; a < g[0].algos.size(); ++a) {
    bool ok = true;
    for (auto& gi : g) ok = ok && a < gi.algos.size();
    if (!ok) break;
    const double t = TimeUs(lt.s, 50, [&](int it) {
      for (size_t i = 0; i < ms.size(); ++i) RunGemm(lt, g[i], a, xb, w[i][static_cast<size_t>(it) % copies], out[i]);
    });
    if (a == 0) first_lt = t;
    best_lt = std::min(best_lt, t);
  }
  fmt::print(
      "{{\"kernel\": \"gemv\", \"shape\": \"{}\", \"k\": {}, \"m\": {}, \"weight_mb\": {:.1f}, \"fathom_us\": {:.1f}, "
      "\"fathom_tb_s\": {:.2f}, \"cublaslt_first_us\": {:.1f}, \"cublaslt_best_us\": {:.1f}, \"cublaslt_best_tb_s\": "
      "{:.2f}}}\n",
      name, k, m_total, bytes / 1e6, ours, bytes / ours / 1e6, first_lt, best_lt, bytes / best_lt / 1e6);
  for (auto& v : w)
    for (void* p : v) cudaFree(p);
  cudaFree(x);
  cudaFree(xb);
  for (float* o : out) cudaFree(o);
}

void Gemm(Lt& lt, int64_t n, int64_t k, int64_t m) {
  void* x = RandomDevice(static_cast<size_t>(n * k), true, 5);
  void* w = RandomDevice(static_cast<size_t>(m * k), true, 6);
  void* out = nullptr;
  CK(cudaMalloc(&out, static_cast<size_t>(n * m) * 4));
  const double flop = 2.0 * static_cast<double>(n) * static_cast<double>(k) * static_cast<double>(m);
  for (bool bf16_out : {false, true}) {
    LtGemm g = MakeGemm(lt, n, k, m, bf16_out, 16);
    double first = 0, best = 1e30;
    size_t best_i = 0;
    for (size_t a = 0; a < g.algos.size(); ++a) {
      const double t = TimeUs(lt.s, 10, [&](int) { RunGemm(lt, g, a, x, w, out); });
      if (a == 0) first = t;
      if (t < best) {
        best = t;
        best_i = a;
      }
    }
    fmt::print(
        "{{\"kernel\": \"gemm\", \"n\": {}, \"k\": {}, \"m\": {}, \"out\": \"{}\", \"candidates\": {}, \"first_us\": "
        "{:.1f}, \"first_tflop_s\": {:.0f}, \"best_us\": {:.1f}, \"best_tflop_s\": {:.0f}, \"best_index\": {}}}\n",
        n, k, m, bf16_out ? "bf16" : "f32", g.algos.size(), first, flop / first / 1e6, best, flop / best / 1e6, best_i);
  }
  cudaFree(x);
  cudaFree(w);
  cudaFree(out);
}

int32_t* Upload(const std::vector<int32_t>& v) {
  void* p = nullptr;
  CK(cudaMalloc(&p, v.size() * 4));
  CK(cudaMemcpy(p, v.data(), v.size() * 4, cudaMemcpyHostToDevice));
  return static_cast<int32_t*>(p);
}

// A decode batch's tables in `a`: `batch` sequences of `ctx` tokens, one query each, their blocks of `bs` tokens
// shuffled over the cache. FreeDecodeTables releases them.
void DecodeTables(int64_t batch, int64_t ctx, int64_t bs, fathom::cuda::AttentionArgs* a) {
  const int64_t blocks_per = (ctx + bs - 1) / bs, num_blocks = batch * blocks_per;
  std::vector<int32_t> pos(static_cast<size_t>(batch), static_cast<int32_t>(ctx - 1)), qs, bts;
  std::vector<int32_t> perm(static_cast<size_t>(num_blocks));
  for (int64_t i = 0; i < num_blocks; ++i) perm[static_cast<size_t>(i)] = static_cast<int32_t>(i);
  std::shuffle(perm.begin(), perm.end(), std::mt19937(3));
  for (int64_t b = 0; b <= batch; ++b) {
    qs.push_back(static_cast<int32_t>(b));
    bts.push_back(static_cast<int32_t>(b * blocks_per));
  }
  a->n = batch;
  a->positions = Upload(pos);
  a->query_start = Upload(qs);
  a->block_table_start = Upload(bts);
  a->block_tables = Upload(perm);
  a->num_seqs = batch;
  a->block_size = bs;
  a->max_seq_len = ctx;
}

void FreeDecodeTables(const fathom::cuda::AttentionArgs& a) {
  for (const void* p : {static_cast<const void*>(a.positions), static_cast<const void*>(a.query_start),
                        static_cast<const void*>(a.block_table_start), static_cast<const void*>(a.block_tables)}) {
    cudaFree(const_cast<void*>(p));
  }
}

void Attention(Lt& lt, const Shape& s, int64_t batch, int64_t ctx, bool bf16_cache) {
  const int64_t bs = 16, blocks_per = (ctx + bs - 1) / bs, num_blocks = batch * blocks_per;
  const int64_t row = s.kv_heads * s.head_dim;
  const size_t cache_elems = static_cast<size_t>(num_blocks * bs * row);
  void* kc = RandomDevice(cache_elems, bf16_cache, 7);
  void* vc = RandomDevice(cache_elems, bf16_cache, 8);
  float* q = static_cast<float*>(RandomDevice(static_cast<size_t>(batch * s.heads * s.head_dim), false, 9));
  float* out = static_cast<float*>(RandomDevice(static_cast<size_t>(batch * s.heads * s.head_dim), false, 10));
  fathom::cuda::AttentionArgs a{};
  DecodeTables(batch, ctx, bs, &a);
  a.q = q;
  a.q_s0 = s.heads * s.head_dim;
  a.q_s1 = s.head_dim;
  a.out = out;
  a.o_s0 = a.q_s0;
  a.o_s1 = a.q_s1;
  a.heads = s.heads;
  a.kv_heads = s.kv_heads;
  a.k_dim = a.v_dim = s.head_dim;
  const int dt = bf16_cache ? kBf16 : kF32;
  a.k = {kc, dt, bs * row, row, s.head_dim};
  a.v = {vc, dt, bs * row, row, s.head_dim};
  a.scale = 0.088f;
  const double kv_bytes = 2.0 * static_cast<double>(batch * ctx * row) * (bf16_cache ? 2 : 4);
  const fathom::cuda::SplitAttentionKind kind = fathom::cuda::ChooseSplitAttention(a, lt.split_kernels());
  const int64_t ws = fathom::cuda::SplitAttentionWorkspaceBytes(a, kind, lt.sm_count);
  void* w = nullptr;
  if (ws > 0) CK(cudaMalloc(&w, static_cast<size_t>(ws)));
  const double us = TimeUs(lt.s, 50, [&](int) {
    if (fathom::cuda::LaunchSplitAttention(a, kind, lt.sm_count, w, lt.s) != 0) std::exit(3);
  });
  cudaFree(w);
  fmt::print(
      "{{\"kernel\": \"decode_attention\", \"batch\": {}, \"context\": {}, \"heads\": {}, \"kv_heads\": {}, "
      "\"head_dim\": {}, \"cache\": \"{}\", \"kv_mb\": {:.1f}, \"us\": {:.1f}, \"gb_s\": {:.0f}}}\n",
      batch, ctx, s.heads, s.kv_heads, s.head_dim, bf16_cache ? "bf16" : "f32", kv_bytes / 1e6, us,
      kv_bytes / us / 1e3);
  FreeDecodeTables(a);
  cudaFree(kc);
  cudaFree(vc);
  cudaFree(q);
  cudaFree(out);
}

// Decode attention of `batch` sequences of `ctx` tokens over one bf16 latent cache (blocks shuffled): MLA's decode
// kernel (with MlaKernelOptions::decode from the environment), and the paged split kernel that serves the latent
// cache with it off (FATHOM_CUDA_NO_MLA_ATTENTION).
void MlaAttention(Lt& lt, int64_t heads, int64_t batch, int64_t ctx, int64_t bs) {
  constexpr int64_t kK = 576, kV = 512;
  const int64_t blocks_per = (ctx + bs - 1) / bs, num_blocks = batch * blocks_per;
  void* cache = RandomDevice(static_cast<size_t>(num_blocks * bs * kK), true, 7);
  float* q = static_cast<float*>(RandomDevice(static_cast<size_t>(batch * heads * kK), false, 9));
  float* out = static_cast<float*>(RandomDevice(static_cast<size_t>(batch * heads * kV), false, 10));
  fathom::cuda::AttentionArgs a{};
  DecodeTables(batch, ctx, bs, &a);
  a.q = q;
  a.q_s0 = heads * kK;
  a.q_s1 = kK;
  a.out = out;
  a.o_s0 = heads * kV;
  a.o_s1 = kV;
  a.heads = heads;
  a.kv_heads = 1;
  a.k_dim = kK;
  a.v_dim = kV;
  a.k = {cache, kBf16, bs * kK, kK, kK};
  a.v = a.k;
  a.scale = 0.0625f;
  const double bytes = static_cast<double>(batch * ctx * kK) * 2;
  const fathom::cuda::MlaDecodeOptions& mo = lt.mla_options.decode;
  for (bool mla : {false, true}) {
    if (mla && !fathom::cuda::MlaDecodeFits(a, mo)) continue;
    const fathom::cuda::SplitAttentionKind kind = fathom::cuda::ChooseSplitAttention(a, lt.split_kernels());
    const int64_t ws = mla ? fathom::cuda::MlaDecodeWorkspaceBytes(a, mo, lt.sm_count)
                           : fathom::cuda::SplitAttentionWorkspaceBytes(a, kind, lt.sm_count);
    void* w = nullptr;
    if (ws > 0) CK(cudaMalloc(&w, static_cast<size_t>(ws)));
    const double us = TimeUs(lt.s, mla ? 50 : 5, [&](int) {
      const int err = mla ? fathom::cuda::LaunchMlaDecodeSplit(a, mo, lt.sm_count, w, lt.s)
                          : fathom::cuda::LaunchSplitAttention(a, kind, lt.sm_count, w, lt.s);
      if (err != 0) std::exit(3);
    });
    cudaFree(w);
    fmt::print(
        "{{\"kernel\": \"mla_decode_attention\", \"impl\": \"{}\", \"batch\": {}, \"context\": {}, \"heads\": {}, "
        "\"block_size\": {}, \"cache_mb\": {:.1f}, \"us\": {:.1f}, \"gb_s\": {:.0f}}}\n",
        mla ? "mla" : "generic", batch, ctx, heads, bs, bytes / 1e6, us, bytes / us / 1e3);
  }
  FreeDecodeTables(a);
  cudaFree(cache);
  cudaFree(q);
  cudaFree(out);
}

// Routed experts at V2-Lite's shape. Every iteration routes a different batch (8 id sets rotate) so that the expert
// weights (1.1 GB in all) come from HBM, not L2. Skewed: three of every four pairs go to experts 0..7.
// `count` routings of n tokens to top_k of `experts` each (uniform, or skewed: up to 3/4 of a token's picks among
// experts 0..7), uploaded; *mean_distinct gets the mean number of experts they touch.
std::vector<int32_t*> RoutingSets(int64_t n, int64_t experts, int64_t top_k, int count, uint32_t seed, bool skew,
                                  double* mean_distinct) {
  std::mt19937 rng(seed);
  std::vector<int32_t*> sets;
  *mean_distinct = 0;
  for (int s = 0; s < count; ++s) {
    std::vector<int32_t> ids;
    std::vector<bool> used(static_cast<size_t>(experts), false);
    for (int64_t t = 0; t < n; ++t) {
      std::vector<int32_t> perm(static_cast<size_t>(experts));
      for (int64_t e = 0; e < experts; ++e) perm[static_cast<size_t>(e)] = static_cast<int32_t>(e);
      std::shuffle(perm.begin(), perm.end(), rng);
      if (skew) {
        std::vector<int32_t> hot(8);
        for (int e = 0; e < 8; ++e) hot[static_cast<size_t>(e)] = e;
        std::shuffle(hot.begin(), hot.end(), rng);
        for (int64_t j = 0; j < top_k * 3 / 4; ++j) {
          auto it = std::find(perm.begin(), perm.end(), hot[static_cast<size_t>(j)]);
          std::iter_swap(perm.begin() + j, it);
        }
      }
      for (int64_t j = 0; j < top_k; ++j) {
        ids.push_back(perm[static_cast<size_t>(j)]);
        used[static_cast<size_t>(perm[static_cast<size_t>(j)])] = true;
      }
    }
    sets.push_back(Upload(ids));
    *mean_distinct += static_cast<double>(std::count(used.begin(), used.end(), true)) / count;
  }
  return sets;
}

// The routed experts' launch arguments over device buffers (routing ids set per run).
fathom::cuda::MoeExpertsArgs ExpertArgs(float* x, int64_t n, int64_t hidden, int64_t inter, int64_t top_k,
                                        int64_t experts, const float* weights, const void* table, float* out) {
  fathom::cuda::MoeExpertsArgs a{};
  a.x = x;
  a.xs = hidden;
  a.n = n;
  a.hidden = hidden;
  a.inter = inter;
  a.top_k = top_k;
  a.n_experts = experts;
  a.weights = weights;
  a.table = static_cast<const void* const*>(table);
  a.out = out;
  a.os = hidden;
  return a;
}

// Microseconds per LaunchMoeExperts, cycling through the routings in `sets`.
double TimeExperts(Lt& lt, fathom::cuda::MoeExpertsArgs a, const std::vector<int32_t*>& sets, int iters) {
  void* ws = nullptr;
  CK(cudaMalloc(&ws, static_cast<size_t>(fathom::cuda::MoeExpertsWorkspaceBytes(a))));
  const double us = TimeUs(lt.s, iters, [&](int it) {
    a.ids = sets[static_cast<size_t>(it) % sets.size()];
    if (fathom::cuda::LaunchMoeExperts(a, ws, lt.s) != 0) std::exit(6);
  });
  cudaFree(ws);
  return us;
}

void MoeBench(Lt& lt) {
  constexpr int64_t kExperts = 64, kTopK = 6, kHidden = 2048, kInter = 1408;
  std::vector<const void*> table(3 * kExperts);
  for (int64_t i = 0; i < 3 * kExperts; ++i) {
    void* p = nullptr;
    CK(cudaMalloc(&p, static_cast<size_t>(kHidden * kInter) * 2));
    if (fathom::cuda::LaunchFillDummy(p, kBf16, kHidden * kInter, 1000 + static_cast<uint64_t>(i), 0.02f, false, 0,
                                      lt.sm_count, lt.s) != 0) {
      std::exit(4);
    }
    table[static_cast<size_t>(i)] = p;
  }
  void* dtable = nullptr;
  CK(cudaMalloc(&dtable, table.size() * sizeof(void*)));
  CK(cudaMemcpy(dtable, table.data(), table.size() * sizeof(void*), cudaMemcpyHostToDevice));
  constexpr int64_t kMaxN = fathom::cuda::kMaxMoePairs / kTopK, kSets = 8;
  float* x = static_cast<float*>(RandomDevice(static_cast<size_t>(kMaxN * kHidden), false, 11));
  float* out = static_cast<float*>(RandomDevice(static_cast<size_t>(kMaxN * kHidden), false, 12));
  float* wts = static_cast<float*>(RandomDevice(static_cast<size_t>(kMaxN * kTopK), false, 13));
  float* logits = static_cast<float*>(RandomDevice(static_cast<size_t>(kMaxN * kExperts), false, 14));
  int32_t* ids_out = nullptr;
  float* w_out = nullptr;
  CK(cudaMalloc(&ids_out, static_cast<size_t>(kMaxN * kTopK) * 4));
  CK(cudaMalloc(&w_out, static_cast<size_t>(kMaxN * kTopK) * 4));
  fathom::moe_route::Params rp;
  rp.n_experts = kExperts;
  rp.top_k = kTopK;
  for (int64_t n : {1, 64, 512}) {
    const double us = TimeUs(lt.s, 50, [&](int) {
      if (fathom::cuda::LaunchMoeRoute(logits, kExperts, n, nullptr, rp, ids_out, w_out, lt.s) != 0) std::exit(5);
    });
    fmt::print("{{\"kernel\": \"moe_route\", \"experts\": {}, \"top_k\": {}, \"tokens\": {}, \"us\": {:.1f}}}\n",
               kExperts, kTopK, n, us);
  }
  const double expert_bytes = 3.0 * kHidden * kInter * 2;
  for (int skew = 0; skew < 2; ++skew) {
    const std::vector<int64_t> sizes =
        skew ? std::vector<int64_t>{64, kMaxN} : std::vector<int64_t>{1, 8, 32, 64, 256, kMaxN};
    for (int64_t n : sizes) {
      double mean_distinct = 0;
      const std::vector<int32_t*> sets =
          RoutingSets(n, kExperts, kTopK, kSets, static_cast<uint32_t>(n + 7 * skew), skew != 0, &mean_distinct);
      // GEMV; tensor cores with tiles of 16 or 64 rows
      for (int path = 0; path < 3; ++path) {
        const bool tc = path > 0;
        const int rows = path == 1 ? 16 : 64;
        fathom::cuda::MoeExpertsArgs a = ExpertArgs(x, n, kHidden, kInter, kTopK, kExperts, wts, dtable, out);
        a.tensor_cores = tc;
        a.mma_rows = rows;
        const double us = TimeExperts(lt, a, sets, 40);
        const double bytes = mean_distinct * expert_bytes,
                     flop = 2.0 * static_cast<double>(n * kTopK) * expert_bytes / 2;
        fmt::print(
            "{{\"kernel\": \"moe_experts\", \"path\": \"{}\", \"tile_rows\": {}, "
            "\"routing\": \"{}\", "
            "\"tokens\": {}, "
            "\"active_experts\": {:.1f}, \"us\": {:.1f}, \"weight_tb_s\": {:.2f}, \"tflop_s\": {:.1f}}}\n",
            tc ? "tensor_cores" : "gemv", tc ? rows : 0, skew ? "skewed" : "uniform", n, mean_distinct, us,
            bytes / us / 1e6, flop / us / 1e6);
      }
      for (int32_t* p : sets) cudaFree(p);
    }
  }
  for (const void* p : table) cudaFree(const_cast<void*>(p));
  for (void* p : {static_cast<void*>(x), static_cast<void*>(out), static_cast<void*>(wts), static_cast<void*>(logits),
                  static_cast<void*>(ids_out), static_cast<void*>(w_out), dtable}) {
    cudaFree(p);
  }
}

// Device memory of `elems` dummy values of `dtype` (the model loader's FillDummy).
void* DummyDevice(const Lt& lt, int dtype, int64_t elems, uint64_t key) {
  void* p = nullptr;
  CK(cudaMalloc(&p, static_cast<size_t>(elems) * (dtype == kF8 ? 1 : dtype == kBf16 ? 2 : 4)));
  if (fathom::cuda::LaunchFillDummy(p, dtype, elems, key, dtype == kF8 ? 400.0f : 0.05f, false, 0, lt.sm_count, lt.s) !=
      0) {
    std::exit(7);
  }
  return p;
}

void SampleBench(Lt& lt) {
  constexpr int64_t kVocab = 129280;
  struct Mode {
    const char* name;
    fathom::SamplingParams p;
  };
  const std::vector<Mode> modes = {
      {"temperature", {.temperature = 0.7f}},
      {"top_p", {.temperature = 1.0f, .top_p = 0.9f}},
      {"top_k_top_p", {.temperature = 0.7f, .top_k = 50, .top_p = 0.95f}},
      {"min_p", {.temperature = 1.0f, .min_p = 0.05f}},
      {"top_p_logprobs", {.temperature = 0.7f, .top_p = 0.9f, .logprobs = true, .top_logprobs = 5}},
  };
  std::mt19937 rng(5);
  std::normal_distribution<float> d(0.0f, 3.0f);
  for (int64_t rows : {1, 16, 64, 256}) {
    std::vector<float> host(static_cast<size_t>(rows * kVocab));
    for (float& v : host) v = d(rng);
    float* logits = nullptr;
    CK(cudaMalloc(&logits, host.size() * 4));
    CK(cudaMemcpy(logits, host.data(), host.size() * 4, cudaMemcpyHostToDevice));
    for (const Mode& m : modes) {
      std::vector<fathom::SampleRowSpec> specs;
      std::vector<fathom::LogitAdjust> adjust;
      std::vector<fathom::SamplerRng> rngs;
      for (int64_t r = 0; r < rows; ++r) {
        rngs.emplace_back(static_cast<uint64_t>(r));
        specs.push_back(fathom::DeviceSampleRow(m.p, {}, rngs.back(), kVocab, adjust));
      }
      void *d_specs = nullptr, *d_out = nullptr;
      float* d_saved = nullptr;
      CK(cudaMalloc(&d_specs, specs.size() * sizeof(fathom::SampleRowSpec)));
      CK(cudaMalloc(&d_out, static_cast<size_t>(rows) * sizeof(fathom::SampledToken)));
      CK(cudaMalloc(&d_saved, 4));
      CK(cudaMemcpy(d_specs, specs.data(), specs.size() * sizeof(fathom::SampleRowSpec), cudaMemcpyHostToDevice));
      const auto launch = [&](int) {
        if (fathom::cuda::LaunchSampleRows(logits, kVocab, rows, kVocab,
                                           static_cast<const fathom::SampleRowSpec*>(d_specs), nullptr, d_saved,
                                           static_cast<fathom::SampledToken*>(d_out), lt.s) != 0) {
          std::exit(9);
        }
      };
      const double device_ms = TimeUs(lt.s, 20, launch) / 1e3;
      // The host path: the rows to pageable host memory, then Sample() per row on the thread pool.
      std::vector<float> copy(host.size());
      const auto t0 = std::chrono::steady_clock::now();
      constexpr int kHostReps = 3;
      for (int rep = 0; rep < kHostReps; ++rep) {
        CK(cudaMemcpy(copy.data(), logits, copy.size() * 4, cudaMemcpyDeviceToHost));
        fathom::DefaultThreadPool().ParallelFor(rows, 1, [&](int64_t lo, int64_t hi) {
          for (int64_t r = lo; r < hi; ++r) {
            fathom::SamplerRng rr(static_cast<uint64_t>(r));
            fathom::Sample(std::span<const float>(copy.data() + r * kVocab, kVocab), m.p, {}, rr);
          }
        });
      }
      const double host_ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / kHostReps;
      fmt::print(
          "{{\"bench\": \"sample\", \"mode\": \"{}\", \"rows\": {}, \"vocab\": {}, \"device_ms\": {:.4f}, "
          "\"host_path_ms\": {:.3f}, \"host_threads\": {}, \"speedup\": {:.1f}}}\n",
          m.name, rows, kVocab, device_ms, host_ms, fathom::DefaultThreadPool().num_threads(), host_ms / device_ms);
      std::fflush(stdout);
      CK(cudaFree(d_specs));
      CK(cudaFree(d_out));
      CK(cudaFree(d_saved));
    }
    CK(cudaFree(logits));
  }
}

// The W4A16 kernel (int4.h) at the 4-bit linears of R1-Distill-Qwen-7B, R1-Distill-Llama-8B and V2-Lite's experts
// (group 128, f16 scales): per token count, the kernel's time, GB/s of 4-bit weights, scales and zeros read, and
// TFLOP/s, next to the bf16 path (fathom's GEMV at one token, cuBLASLt otherwise) and, from 256 tokens, next to
// dequantize-to-bf16 plus cuBLASLt, the prefill path. Weights rotate through >= 512 MiB of copies.
void Int4Bench(Lt& lt) {
  fathom::CublasLtGemm gemm;
  if (!gemm.Init(lt.s).ok()) std::exit(8);
  struct Sh {
    const char* name;
    int64_t k, m;
  };
  constexpr int kF16 = 1, kGroup = 128;
  int* counters = nullptr;
  float* scratch = nullptr;
  CK(cudaMalloc(&counters, fathom::cuda::kInt4MaxCounters * sizeof(int)));
  CK(cudaMemset(counters, 0, fathom::cuda::kInt4MaxCounters * sizeof(int)));
  CK(cudaMalloc(&scratch, fathom::cuda::kInt4MmaScratchFloats * sizeof(float)));
  for (const Sh& sh : std::vector<Sh>{{"qwen7b.qkv", 3584, 4608},
                                      {"qwen7b.o_proj", 3584, 3584},
                                      {"qwen7b.gate_up", 3584, 37888},
                                      {"qwen7b.down", 18944, 3584},
                                      {"llama8b.qkv", 4096, 6144},
                                      {"llama8b.o_proj", 4096, 4096},
                                      {"llama8b.gate_up", 4096, 28672},
                                      {"llama8b.down", 14336, 4096},
                                      {"v2lite.expert_gate_up", 2048, 2816},
                                      {"v2lite.expert_down", 1408, 2048}}) {
    const int64_t groups = sh.k / kGroup;
    const int64_t w_words = sh.m * sh.k / 8, s_elems = sh.m * groups, z_words = sh.m / 8 * groups;
    const double bytes =
        4.0 * static_cast<double>(w_words) + 2.0 * static_cast<double>(s_elems) + 4.0 * static_cast<double>(z_words);
    const int64_t copies = std::max<int64_t>(1, static_cast<int64_t>((512ll << 20) / bytes) + 1);
    std::vector<fathom::cuda::Int4Tiled> ws;
    std::vector<void*> owned;
    for (int64_t c = 0; c < copies; ++c) {
      fathom::cuda::Int4Tiled t;
      void* w = DummyDevice(lt, kF32, w_words, 60 + static_cast<uint64_t>(c));  // random bits: any codes
      void* sc = DummyDevice(lt, kBf16, s_elems, 61);                           // as f16: small scales
      void* z = DummyDevice(lt, kF32, z_words, 62);
      owned.insert(owned.end(), {w, sc, z});
      t.weights = static_cast<const uint32_t*>(w);
      t.scales = sc;
      t.scales_dtype = kF16;
      t.zeros = static_cast<const uint32_t*>(z);
      t.m = sh.m;
      t.k = sh.k;
      t.groups = groups;
      t.group = kGroup;
      ws.push_back(t);
    }
    void* w16 = DummyDevice(lt, kBf16, sh.m * sh.k, 63);
    void* deq = nullptr;
    CK(cudaMalloc(&deq, static_cast<size_t>(sh.m * sh.k) * 2));
    for (int64_t n : {1, 8, 16, 64, 256, 512, 4096}) {
      float* x = static_cast<float*>(DummyDevice(lt, kF32, n * sh.k, 64));
      void* xb = DummyDevice(lt, kBf16, n * sh.k, 65);
      float* out = nullptr;
      CK(cudaMalloc(&out, static_cast<size_t>(n * sh.m) * 4));
      const double flop = 2.0 * static_cast<double>(n) * static_cast<double>(sh.k) * static_cast<double>(sh.m);
      double mma_us = 0;
      if (n <= 256) {
        mma_us = TimeUs(lt.s, 50, [&](int it) {
          const bool staged = n > 16;  // as CudaBackend::LinearInt4 does
          if (staged && fathom::cuda::LaunchToBf16(x, sh.k, n, sh.k, xb, lt.s) != 0) std::exit(13);
          if (fathom::cuda::LaunchInt4Mma(staged ? xb : static_cast<const void*>(x), staged, sh.k, n,
                                          ws[static_cast<size_t>(it) % ws.size()], nullptr, 0, out, sh.m, scratch,
                                          fathom::cuda::kInt4MmaScratchFloats, counters, lt.sm_count, lt.s) != 0) {
            std::exit(13);
          }
        });
      }
      double dequant_us = 0;
      if (n >= 256) {
        dequant_us = TimeUs(lt.s, 10, [&](int it) {
          if (fathom::cuda::LaunchToBf16(x, sh.k, n, sh.k, xb, lt.s) != 0) std::exit(14);
          if (fathom::cuda::LaunchDequantInt4(ws[static_cast<size_t>(it) % ws.size()], deq, lt.s) != 0) std::exit(14);
          if (!gemm.Run(xb, n, sh.k, deq, sh.k, sh.m, out, sh.m).ok()) std::exit(14);
        });
      }
      double bf16_us = 0;
      if (n == 1) {
        fathom::cuda::GemvPart part{w16, sh.k, sh.m, nullptr, 0, out, sh.m};
        bf16_us = TimeUs(lt.s, 50, [&](int) {
          if (fathom::cuda::LaunchGemvFanOut(x, sh.k, 1, sh.k, &part, 1, lt.sm_count, lt.s) != 0) std::exit(15);
        });
      } else {
        bf16_us = TimeUs(lt.s, 10, [&](int) {
          if (!gemm.Run(xb, n, sh.k, w16, sh.k, sh.m, out, sh.m).ok()) std::exit(15);
        });
      }
      const double best = mma_us > 0 && (dequant_us == 0 || mma_us < dequant_us) ? mma_us : dequant_us;
      fmt::print(
          "{{\"kernel\": \"int4\", \"shape\": \"{}\", \"k\": {}, \"m\": {}, \"tokens\": {}, \"weight_mb\": {:.1f}, "
          "\"w4a16_us\": {:.1f}, \"w4a16_gb_s\": {:.0f}, \"w4a16_tflop_s\": {:.1f}, \"dequant_gemm_us\": {:.1f}, "
          "\"dequant_gemm_tflop_s\": {:.1f}, \"bf16_us\": {:.1f}, \"bf16_note\": \"{}\", \"speedup_vs_bf16\": "
          "{:.2f}}}\n",
          sh.name, sh.k, sh.m, n, bytes / 1e6, mma_us, mma_us > 0 ? bytes / mma_us / 1e3 : 0.0,
          mma_us > 0 ? flop / mma_us / 1e6 : 0.0, dequant_us, dequant_us > 0 ? flop / dequant_us / 1e6 : 0.0, bf16_us,
          n == 1 ? "fathom GEMV" : "cuBLASLt", bf16_us / best);
      std::fflush(stdout);
      for (void* p : {static_cast<void*>(x), xb, static_cast<void*>(out)}) cudaFree(p);
    }
    cudaFree(w16);
    cudaFree(deq);
    for (void* p : owned) cudaFree(p);
  }
  cudaFree(counters);
  cudaFree(scratch);
}

void Fp8Bench(Lt& lt) {
  fathom::CublasLtGemm gemm;
  if (!gemm.Init(lt.s).ok()) std::exit(8);
  gemm.set_tune(lt.options.gemm_tune);
  // Prefill GEMMs: W8A8 (quantize + block-scaled FP8) against bf16 x bf16 (both float32 out, first heuristic).
  struct Mk {
    int64_t k, m;
  };
  for (const Mk& sh : std::vector<Mk>{{7168, 2048}, {7168, 18432}, {1536, 24576}}) {
    void* w8 = DummyDevice(lt, kF8, sh.m * sh.k, 21);
    void* w16 = DummyDevice(lt, kBf16, sh.m * sh.k, 22);
    float* wsc = static_cast<float*>(DummyDevice(lt, kF32, (sh.m / 128) * (sh.k / 128), 23));
    for (int64_t n : {64, 512, 4096, 8192}) {
      float* x = static_cast<float*>(DummyDevice(lt, kF32, n * sh.k, 24));
      void* xb = DummyDevice(lt, kBf16, n * sh.k, 25);
      void* xq = nullptr;
      float *xs = nullptr, *out = nullptr;
      CK(cudaMalloc(&xq, static_cast<size_t>(n * sh.k)));
      CK(cudaMalloc(&xs, static_cast<size_t>(n * sh.k / 128) * 4));
      CK(cudaMalloc(&out, static_cast<size_t>(n * sh.m) * 4));
      const double flop = 2.0 * static_cast<double>(n) * static_cast<double>(sh.k) * static_cast<double>(sh.m);
      const double bf16_us = TimeUs(lt.s, 10, [&](int) {
        if (!gemm.Run(xb, n, sh.k, w16, sh.k, sh.m, out, sh.m).ok()) std::exit(9);
      });
      const double gemm_us = TimeUs(lt.s, 10, [&](int) {
        if (!gemm.RunFp8(xq, xs, n, sh.k, w8, sh.k, wsc, sh.m, out, sh.m).ok()) std::exit(10);
      });
      const double w8a8_us = TimeUs(lt.s, 10, [&](int) {
        if (fathom::cuda::LaunchQuantizeF8(x, sh.k, n, n, sh.k, xq, xs, lt.s) != 0) std::exit(11);
        if (!gemm.RunFp8(xq, xs, n, sh.k, w8, sh.k, wsc, sh.m, out, sh.m).ok()) std::exit(10);
      });
      fmt::print(
          "{{\"kernel\": \"fp8_gemm\", \"n\": {}, \"k\": {}, \"m\": {}, \"bf16_us\": {:.1f}, \"bf16_tflop_s\": {:.0f}, "
          "\"fp8_gemm_us\": {:.1f}, \"fp8_gemm_tflop_s\": {:.0f}, \"w8a8_with_quantize_us\": {:.1f}, "
          "\"w8a8_tflop_s\": {:.0f}, \"speedup_gemm\": {:.2f}, \"speedup_with_quantize\": {:.2f}}}\n",
          n, sh.k, sh.m, bf16_us, flop / bf16_us / 1e6, gemm_us, flop / gemm_us / 1e6, w8a8_us, flop / w8a8_us / 1e6,
          bf16_us / gemm_us, bf16_us / w8a8_us);
      for (void* p : {static_cast<void*>(x), xb, xq, static_cast<void*>(xs), static_cast<void*>(out)}) cudaFree(p);
    }
    for (void* p : {w8, w16, static_cast<void*>(wsc)}) cudaFree(p);
  }
  // Decode GEMVs: f8 (with scales) against bf16, weights rotating through >= 512 MiB of copies.
  struct Gv {
    const char* name;
    int64_t k;
    std::vector<int64_t> ms;
  };
  for (const Gv& g : std::vector<Gv>{{"q_a+kv_a", 7168, {1536, 576}},
                                     {"shared_gate_up", 7168, {2048, 2048}},
                                     {"o_proj", 16384, {7168}},
                                     {"dense_gate_up", 7168, {18432, 18432}}}) {
    for (int64_t n : {1, 4, 8}) {
      double us[2] = {0, 0}, bytes[2] = {0, 0};
      for (int f8 = 0; f8 < 2; ++f8) {
        const int dt = f8 ? kF8 : kBf16;
        int64_t per_copy = 0;
        for (int64_t m : g.ms) per_copy += m * g.k * (f8 ? 1 : 2);
        const int64_t copies = std::max<int64_t>(1, (512ll << 20) / per_copy + 1);
        std::vector<std::vector<fathom::cuda::GemvPart>> sets(static_cast<size_t>(copies));
        std::vector<void*> owned;
        float* x = static_cast<float*>(DummyDevice(lt, kF32, n * g.k, 31));
        owned.push_back(x);
        for (int64_t c = 0; c < copies; ++c) {
          for (int64_t m : g.ms) {
            void* w = DummyDevice(lt, dt, m * g.k, 40 + static_cast<uint64_t>(c));
            float* out = static_cast<float*>(DummyDevice(lt, kF32, n * m, 41));
            fathom::cuda::GemvPart part{w, g.k, m, nullptr, 0, out, m};
            if (f8) {
              part.scale = static_cast<float*>(DummyDevice(lt, kF32, ((m + 127) / 128) * (g.k / 128), 42));
              part.scale_stride = g.k / 128;
              owned.push_back(const_cast<float*>(part.scale));
            }
            owned.push_back(w);
            owned.push_back(out);
            sets[static_cast<size_t>(c)].push_back(part);
          }
        }
        us[f8] = TimeUs(lt.s, 50, [&](int it) {
          const auto& parts = sets[static_cast<size_t>(it) % sets.size()];
          if (fathom::cuda::LaunchGemvFanOut(x, g.k, n, g.k, parts.data(), static_cast<int>(parts.size()), lt.sm_count,
                                             lt.s) != 0) {
            std::exit(12);
          }
        });
        bytes[f8] = static_cast<double>(per_copy);
        for (void* p : owned) cudaFree(p);
      }
      fmt::print(
          "{{\"kernel\": \"fp8_gemv\", \"shape\": \"{}\", \"tokens\": {}, \"bf16_us\": {:.1f}, \"bf16_tb_s\": {:.2f}, "
          "\"fp8_us\": {:.1f}, \"fp8_tb_s\": {:.2f}, \"speedup\": {:.2f}}}\n",
          g.name, n, us[0], bytes[0] / us[0] / 1e6, us[1], bytes[1] / us[1] / 1e6, us[0] / us[1]);
    }
  }
  // Routed experts: V3's 256 f8 experts (gate/up 2048 x 7168, down 7168 x 2048), top 8, uniform routing.
  constexpr int64_t kExperts = 256, kTopK = 8, kHidden = 7168, kInter = 2048;
  std::vector<const void*> table(6 * kExperts);
  for (int64_t i = 0; i < 3 * kExperts; ++i) {
    table[static_cast<size_t>(i)] = DummyDevice(lt, kF8, kHidden * kInter, 2000 + static_cast<uint64_t>(i));
    const bool down = i >= 2 * kExperts;
    table[static_cast<size_t>(3 * kExperts + i)] =
        DummyDevice(lt, kF32, down ? (kHidden / 128) * (kInter / 128) : (kInter / 128) * (kHidden / 128), 9);
  }
  void* dtable = nullptr;
  CK(cudaMalloc(&dtable, table.size() * sizeof(void*)));
  CK(cudaMemcpy(dtable, table.data(), table.size() * sizeof(void*), cudaMemcpyHostToDevice));
  constexpr int64_t kMaxN = fathom::cuda::kMaxMoePairs / kTopK;
  float* x = static_cast<float*>(DummyDevice(lt, kF32, kMaxN * kHidden, 51));
  float* out = static_cast<float*>(DummyDevice(lt, kF32, kMaxN * kHidden, 52));
  float* wts = static_cast<float*>(DummyDevice(lt, kF32, kMaxN * kTopK, 53));
  const double expert_bytes = 3.0 * kHidden * kInter;
  for (int64_t n : {int64_t{1}, int64_t{8}, int64_t{64}, int64_t{256}, kMaxN}) {
    double mean_distinct = 0;
    const std::vector<int32_t*> sets =
        RoutingSets(n, kExperts, kTopK, 8, static_cast<uint32_t>(n), false, &mean_distinct);
    for (int tc = 0; tc < 2; ++tc) {
      if (!tc && n > 64) continue;
      fathom::cuda::MoeExpertsArgs a = ExpertArgs(x, n, kHidden, kInter, kTopK, kExperts, wts, dtable, out);
      a.fp8 = true;
      a.tensor_cores = tc != 0;
      const double us = TimeExperts(lt, a, sets, 20);
      const double bytes = mean_distinct * expert_bytes, flop = 2.0 * static_cast<double>(n * kTopK) * expert_bytes;
      fmt::print(
          "{{\"kernel\": \"moe_experts_fp8\", \"path\": \"{}\", \"experts\": {}, \"top_k\": {}, \"tokens\": {}, "
          "\"active_experts\": {:.1f}, \"us\": {:.1f}, \"weight_tb_s\": {:.2f}, \"tflop_s\": {:.1f}}}\n",
          tc ? "tensor_cores" : "gemv", kExperts, kTopK, n, mean_distinct, us, bytes / us / 1e6, flop / us / 1e6);
    }
    for (int32_t* p : sets) cudaFree(p);
  }
  for (const void* p : table) cudaFree(const_cast<void*>(p));
  for (void* p : {static_cast<void*>(x), static_cast<void*>(out), static_cast<void*>(wts), dtable}) cudaFree(p);
}

// `s` as a JSON string's contents.
std::string JsonEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out;
}

// --ops 1: the op table's rows on a CudaBackend, each with its kernel variant set first (as backend_ops_test does): a
// warm-up run, one timed run to size the loop, then enough runs for about 50 ms (3 to 1000) between two CUDA events on
// the backend's stream. Rows whose op updates a tensor in place keep updating it; ops that synchronize inside (the
// host-sorted MoE path, SampleRows, the host copies) are timed with their synchronization.
int OpsBench(const std::string& filter) {
  auto made = fathom::CudaBackend::Create(0, fathom::cuda::KernelOptions{});
  if (!made.ok()) {
    fmt::print(stderr, "no CUDA backend: {}\n", made.status().ToString());
    return 1;
  }
  fathom::CudaBackend& gpu = **made;
  const cudaStream_t s = static_cast<cudaStream_t>(gpu.native_stream());
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  // Runs the op `iters` times between the events: ms a run, or a negative number on an error (printed).
  const auto timed = [&](fathom::ops::OpRun& run, int iters, fathom::Status* st) {
    CK(cudaEventRecord(a, s));
    for (int i = 0; i < iters && st->ok(); ++i) *st = run.Run();
    CK(cudaEventRecord(b, s));
    CK(cudaEventSynchronize(b));
    if (st->ok()) *st = gpu.Synchronize();
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    return static_cast<double>(ms) / iters;
  };
  for (const fathom::ops::OpCase& c : fathom::ops::AllOpCases()) {
    const std::string what = c.Describe();
    if (!filter.empty() && what.find(filter) == std::string::npos && c.Name().find(filter) == std::string::npos)
      continue;
    const std::string head = fmt::format(
        "{{\"kernel\": \"op\", \"name\": \"{}\", \"op\": \"{}\", \"shape\": \"{}\", \"dtypes\": \"{}\", "
        "\"variant\": \"{}\", \"gpu_only\": {}",
        JsonEscape(c.Name()), JsonEscape(c.op), JsonEscape(c.shape), JsonEscape(c.dtypes), JsonEscape(c.variant),
        c.gpu_only);
    const auto options = fathom::ops::OptionsForVariant(c.variant);
    fathom::Status st = options.status();
    if (st.ok()) options->ApplyTo(gpu);
    std::unique_ptr<fathom::ops::OpRun> run = st.ok() ? c.prepare(gpu) : nullptr;
    if (st.ok()) st = run->Run();  // warm-up
    if (st.ok()) st = gpu.Synchronize();
    double ms = st.ok() ? timed(*run, 1, &st) : 0.0;
    const int iters = ms > 0 ? static_cast<int>(std::clamp(50.0 / ms, 3.0, 1000.0)) : 3;
    if (st.ok()) ms = timed(*run, iters, &st);
    run.reset();
    if (!st.ok()) {
      fmt::print("{}, \"error\": \"{}\"}}\n", head, JsonEscape(st.ToString()));
      continue;
    }
    const double us = 1e3 * ms;
    fmt::print("{}, \"iters\": {}, \"us\": {:.2f}, \"gb_s\": {:.1f}, \"tflop_s\": {:.2f}}}\n", head, iters, us,
               c.bytes / us / 1e3, c.flops / us / 1e6);
    std::fflush(stdout);
  }
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Shape s;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string f = argv[i];
    if (f == "--filter") {
      s.filter = argv[i + 1];
      continue;
    }
    const int64_t v = std::atoll(argv[i + 1]);
    if (f == "--hidden")
      s.hidden = v;
    else if (f == "--inter")
      s.inter = v;
    else if (f == "--heads")
      s.heads = v;
    else if (f == "--kv-heads")
      s.kv_heads = v;
    else if (f == "--head-dim")
      s.head_dim = v;
    else if (f == "--vocab")
      s.vocab = v;
    else if (f == "--mla")
      s.mla = v;
    else if (f == "--block-size")
      s.block_size = v;
    else if (f == "--moe")
      s.moe = v;
    else if (f == "--fp8")
      s.fp8 = v;
    else if (f == "--sample")
      s.sample = v;
    else if (f == "--ops")
      s.ops = v;
    else if (f == "--int4")
      s.int4 = v;
    else {
      fmt::print(stderr, "unknown flag {}\n", f);
      return 1;
    }
  }
  if (s.ops != 0) {
    fmt::print(stderr, "the op table's rows ...\n");
    return OpsBench(s.filter);
  }
  Lt lt;
  LK(cublasLtCreate(&lt.h));
  CK(cudaMalloc(&lt.ws, lt.ws_bytes));
  CK(cudaStreamCreate(&lt.s));
  int device = 0;
  CK(cudaGetDevice(&device));
  CK(cudaDeviceGetAttribute(&lt.sm_count, cudaDevAttrMultiProcessorCount, device));
  if (s.sample != 0) {
    fmt::print(stderr, "sampling at a 129k vocabulary ...\n");
    SampleBench(lt);
    return 0;
  }
  if (s.int4 != 0) {
    fmt::print(stderr, "4-bit (W4A16) linears at Qwen-7B, Llama-8B and V2-Lite expert shapes ...\n");
    Int4Bench(lt);
    return 0;
  }
  if (s.fp8 != 0) {
    fmt::print(stderr, "FP8 GEMM, GEMV and experts at DeepSeek-V3 shapes ...\n");
    Fp8Bench(lt);
    return 0;
  }
  if (s.moe != 0) {
    fmt::print(stderr, "MoE router and experts ...\n");
    MoeBench(lt);
    return 0;
  }
  if (s.mla != 0) {
    fmt::print(stderr, "MLA decode attention ...\n");
    for (int64_t heads : {16, 128}) {
      for (int64_t batch : {1, 64}) MlaAttention(lt, heads, batch, 4096, s.block_size);
    }
    MlaAttention(lt, 16, 256, 1024, s.block_size);
    return 0;
  }
  const int64_t q = s.heads * s.head_dim, kv = s.kv_heads * s.head_dim;
  fmt::print(stderr, "decode GEMV ...\n");
  Gemv(lt, "qkv", s.hidden, {q, kv, kv});
  Gemv(lt, "o_proj", q, {s.hidden});
  Gemv(lt, "gate_up", s.hidden, {s.inter, s.inter});
  Gemv(lt, "down", s.inter, {s.hidden});
  Gemv(lt, "lm_head", s.hidden, {s.vocab});
  fmt::print(stderr, "prefill GEMM ...\n");
  for (int64_t n : {512, 8192}) {
    Gemm(lt, n, s.hidden, q + 2 * kv);
    Gemm(lt, n, s.hidden, s.inter);
    Gemm(lt, n, s.inter, s.hidden);
  }
  fmt::print(stderr, "decode attention ...\n");
  for (bool bf16 : {false, true}) {
    Attention(lt, s, 1, 512, bf16);
    Attention(lt, s, 1, 4096, bf16);
    Attention(lt, s, 64, 1024, bf16);
    Attention(lt, s, 256, 1024, bf16);
  }
  return 0;
}
