// The CUDA backend's 4-bit linears (backend/cuda/linear_int4.cc, int4.cu) against the CPU reference: random AWQ and
// GPTQ layers of every setting (groups of 16 to the whole row, GPTQ v1 zeros, act-order, f16/bf16/f32 scales, shapes
// the tile layout does not fit) at decode and prefill token counts, each path the dispatch can take; then the INT4
// fixtures on the GPU against their float32 twins on the CPU, and real-size 2-layer AWQ/GPTQ models (dummy weights)
// on both backends.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <numeric>
#include <random>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/int4.h"
#include "backend/cuda/moe.h"
#include "backend/cuda/require_gpu.h"
#include "format/int4.h"
#include "io/model_config.h"
#include "model/registry.h"
#include "testing/golden.h"

namespace fathom {
namespace {

using testing::SetKernelOptions;

struct Int4Case {
  LinearFormat format;
  int64_t m, k, group;  // group -1: one group over the row (GPTQ)
  bool act_order = false;
  int zero_offset = 0;  // GPTQ v1: 1
  DType scales = DType::kF16;
  bool bias = false;
  const char* expect_path = "tiled";  // "tiled" or "generic" (a shape or dtype the tile layout does not take)
};

std::string Name(const Int4Case& c) {
  return fmt::format("{} [{}, {}] group {}{}{} scales {}", c.format == LinearFormat::kAwq ? "awq" : "gptq", c.m, c.k,
                     c.group, c.act_order ? " act-order" : "", c.zero_offset ? " v1" : "", DTypeName(c.scales));
}

// A random 4-bit layer in its checkpoint's layout (host tensors) and its LinearWeight.
struct HostInt4 {
  Tensor qweight, qzeros, scales, g_idx, bias;
  LinearWeight w;
};

HostInt4 MakeInt4(const Int4Case& c, uint32_t seed) {
  std::mt19937 rng(seed);
  const bool awq = c.format == LinearFormat::kAwq;
  const int64_t gs = c.group < 0 ? c.k : c.group, groups = (c.k + gs - 1) / gs;
  HostInt4 h;
  h.qweight = Tensor::Empty(
      DType::kI32, awq ? std::initializer_list<int64_t>{c.k, c.m / 8} : std::initializer_list<int64_t>{c.k / 8, c.m});
  for (int64_t i = 0; i < h.qweight.numel(); ++i) h.qweight.data<int32_t>()[i] = static_cast<int32_t>(rng());
  h.qzeros = Tensor::Empty(DType::kI32, {groups, c.m / 8});
  for (int64_t i = 0; i < h.qzeros.numel(); ++i) h.qzeros.data<int32_t>()[i] = static_cast<int32_t>(rng());
  h.scales = Tensor::Empty(c.scales, {groups, c.m});
  std::uniform_real_distribution<float> sd(0.001f, 0.02f);
  for (int64_t i = 0; i < h.scales.numel(); ++i) {
    const float v = sd(rng);
    if (c.scales == DType::kF32) {
      h.scales.data<float>()[i] = v;
    } else {
      h.scales.data<uint16_t>()[i] = c.scales == DType::kF16 ? F32ToF16(v) : F32ToBf16(v);
    }
  }
  Int4Payload p;
  p.qzeros = h.qzeros;
  p.scales = h.scales;
  p.group_size = gs;
  p.zero_offset = c.zero_offset;
  if (!awq) {
    // GPTQ's g_idx: groups of gs consecutive inputs, or under act-order gs consecutive inputs of a random order.
    std::vector<int32_t> order(static_cast<size_t>(c.k));
    std::iota(order.begin(), order.end(), 0);
    if (c.act_order) std::shuffle(order.begin(), order.end(), rng);
    h.g_idx = Tensor::Empty(DType::kI32, {c.k});
    for (int64_t i = 0; i < c.k; ++i)
      h.g_idx.data<int32_t>()[order[static_cast<size_t>(i)]] = static_cast<int32_t>(i / gs);
    p.g_idx = h.g_idx;
  }
  h.w = Int4Weight(c.format, h.qweight, c.m, c.k, std::move(p));
  if (c.bias) {
    h.bias = Tensor::Empty(DType::kBF16, {c.m});
    std::uniform_real_distribution<float> bd(-0.5f, 0.5f);
    for (int64_t i = 0; i < c.m; ++i) h.bias.data<uint16_t>()[i] = F32ToBf16(bd(rng));
    h.w.bias = h.bias;
  }
  return h;
}

// The same layer on the device (its own copies of the tensors), prepared.
struct DeviceInt4 {
  std::vector<Tensor> keep;
  LinearWeight w;
};

DeviceInt4 Upload(CudaBackend& gpu, const HostInt4& h) {
  DeviceInt4 d;
  StatusOr<LinearWeight> w = MapTensors(h.w, [&](const TensorView& t) -> StatusOr<TensorView> {
    FATHOM_ASSIGN_OR_RETURN(Tensor up, gpu.Upload(t));
    d.keep.push_back(std::move(up));
    return d.keep.back().view();
  });
  FATHOM_CHECK(w.ok());
  d.w = *std::move(w);
  return d;
}

std::vector<float> Host(Backend& be, const TensorView& t) {
  std::vector<float> h(static_cast<size_t>(t.numel()));
  EXPECT_TRUE(be.CopyToHost(t, h.data()).ok());
  return h;
}

Tensor RandomX(int64_t n, int64_t k, uint32_t seed) {
  Tensor x = Tensor::Empty(DType::kF32, {n, k});
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = d(rng);
  return x;
}

struct Error {
  double max_rel = 0;  // max |err| over the largest |reference|
  double rms_rel = 0;  // rms err over rms reference
};

Error Compare(const std::vector<float>& got, const float* ref, size_t count) {
  double max_ref = 0, sq_ref = 0, sq_err = 0, max_err = 0;
  for (size_t i = 0; i < count; ++i) {
    max_ref = std::max(max_ref, std::fabs(static_cast<double>(ref[i])));
    sq_ref += static_cast<double>(ref[i]) * ref[i];
    const double e = static_cast<double>(got[i]) - ref[i];
    sq_err += e * e;
    max_err = std::max(max_err, std::fabs(e));
  }
  return {max_err / std::max(max_ref, 1e-30), std::sqrt(sq_err / std::max(sq_ref, 1e-30))};
}

const std::vector<Int4Case>& Cases() {
  static const std::vector<Int4Case> cases = {
      {LinearFormat::kAwq, 256, 512, 128, false, 0, DType::kF16, true},
      {LinearFormat::kAwq, 96, 128, 32},                                             // groups inside a 64-input chunk
      {LinearFormat::kGptq, 128, 256, 64, true, 1, DType::kF16, true},               // act-order, v1 zeros
      {LinearFormat::kGptq, 64, 192, -1, false, 0, DType::kF32},                     // one group, f32 scales
      {LinearFormat::kGptq, 48, 128, 16, true, 0},                                   // groups of 16, act-order
      {LinearFormat::kGptq, 40, 344, -1, false, 1, DType::kF16, false, "generic"},   // 344 inputs: no tiles
      {LinearFormat::kAwq, 128, 256, 128, false, 0, DType::kBF16, true, "generic"},  // bf16 scales
      {LinearFormat::kAwq, 3584, 3584, 128, false, 0, DType::kF16, true},            // R1-Distill-Qwen-7B q/o_proj
      {LinearFormat::kGptq, 512, 18944, 128, true, 1},                               // its down_proj, split-K
  };
  return cases;
}

// Every path of LinearInt4 against the CPU: the tensor-core kernel (decode counts, then up to int4_gemm_tokens),
// the bf16 GEMM (above it), the float32 kernel on the tile layout (f32_gemm; an unaligned input), each into the left
// part of a wider output. The bf16 paths round x (and for the GEMM W) to bf16: within 1% of the largest output and
// 0.5% rms; the float32 ones within 1e-5 of the largest output.
TEST(CudaInt4Test, LinearMatchesCpuOnEveryPath) {
  REQUIRE_GPU(gpu);
  CpuBackend cpu;
  uint32_t seed = 100;
  for (const Int4Case& c : Cases()) {
    const HostInt4 h = MakeInt4(c, seed++);
    DeviceInt4 d = Upload(*gpu, h);
    ASSERT_TRUE(gpu->PrepareLinear(d.w).ok()) << Name(c);
    const bool tiled = std::string(c.expect_path) == "tiled";
    EXPECT_EQ(tiled, cuda::Int4TileFits(c.m, c.k, h.scales.dim(0), h.w.payload<Int4Payload>().group_size) &&
                         c.scales != DType::kBF16)
        << Name(c);
    const bool big = c.m * c.k > (1 << 22);
    for (int64_t n : big ? std::vector<int64_t>{1, 8, 64, 130} : std::vector<int64_t>{1, 3, 8, 9, 33, 64, 65, 200}) {
      Tensor x = RandomX(n, c.k, static_cast<uint32_t>(n) + seed);
      Tensor ref = cpu.Alloc(DType::kF32, {n, c.m});
      cpu.Linear(x, h.w, ref);
      for (const char* path : {"default", "f32", "unaligned"}) {
        SetKernelOptions(*gpu, [&](cuda::KernelOptions& o) { o.f32_gemm = std::string(path) == "f32"; });
        // unaligned: x as columns 1..k of [n, k + 4] rows (a 4-byte offset: no 16-byte loads).
        Tensor wide_x = RandomX(n, c.k + 4, 1);
        for (int64_t t = 0; t < n; ++t) {
          std::copy_n(x.data<float>() + t * c.k, c.k, wide_x.data<float>() + t * (c.k + 4) + 1);
        }
        const bool unaligned = std::string(path) == "unaligned";
        Tensor xd = *gpu->Upload(unaligned ? wide_x : x);
        const TensorView xv = unaligned ? xd.view().Slice(1, 1, c.k + 1) : xd.view();
        Tensor wide = gpu->Alloc(DType::kF32, {n, c.m + 16});
        gpu->Linear(xv, d.w, wide.view().Slice(1, 0, c.m));
        Tensor y = gpu->Alloc(DType::kF32, {n, c.m});
        gpu->Copy(wide.view().Slice(1, 0, c.m), y);
        ASSERT_TRUE(gpu->Synchronize().ok()) << Name(c);
        const Error e = Compare(Host(*gpu, y), ref.data<float>(), static_cast<size_t>(n * c.m));
        const bool exact = !tiled || std::string(path) != "default";
        const std::string what = fmt::format("{} n={} path {}", Name(c), n, path);
        if (exact) {
          EXPECT_LE(e.max_rel, 1e-5) << what;
        } else {
          EXPECT_LE(e.max_rel, 1e-2) << what;
          EXPECT_LE(e.rms_rel, 5e-3) << what;
        }
        if (!exact && (n == 1 || n == 130 || n == 200)) {
          std::cout << what << ": max err " << e.max_rel << " of the largest output, rms " << e.rms_rel << "\n";
        }
      }
    }
    SetKernelOptions(*gpu, [](cuda::KernelOptions& o) { o.f32_gemm = false; });
  }
}

// LinearFanOut of 4-bit weights that share x (q/k/v with biases, gate/up): one W4A16 launch for all of them whose
// outputs each match the CPU's Linear as LinearMatchesCpuOnEveryPath's tiled default path does, at decode and
// graph-sized counts; act-order weights (each with its own input order) take one launch each and match too.
TEST(CudaInt4Test, LinearFanOutMatchesCpu) {
  REQUIRE_GPU(gpu);
  CpuBackend cpu;
  struct Set {
    std::vector<Int4Case> parts;
  };
  const std::vector<Set> sets = {
      {{{LinearFormat::kAwq, 384, 512, 128, false, 0, DType::kF16, true},
        {LinearFormat::kAwq, 64, 512, 128, false, 0, DType::kF16, true},
        {LinearFormat::kAwq, 64, 512, 128, false, 0, DType::kF16, true}}},
      {{{LinearFormat::kAwq, 3584, 3584, 128, false, 0, DType::kF16, true},  // R1-Distill-Qwen-7B q/k/v
        {LinearFormat::kAwq, 512, 3584, 128, false, 0, DType::kF16, true},
        {LinearFormat::kAwq, 512, 3584, 128, false, 0, DType::kF16, true}}},
      {{{LinearFormat::kGptq, 1408, 2048, 128, false, 1}, {LinearFormat::kGptq, 1408, 2048, 128, false, 1}}},
      {{{LinearFormat::kGptq, 256, 256, 32, false, 0}, {LinearFormat::kGptq, 96, 256, 32, false, 0}}},
      {{{LinearFormat::kGptq, 256, 512, 64, true, 1}, {LinearFormat::kGptq, 128, 512, 64, true, 1}}},  // act-order
  };
  uint32_t seed = 500;
  for (const Set& set : sets) {
    std::vector<HostInt4> hs;
    std::vector<DeviceInt4> ds;
    std::vector<LinearWeight> lws;
    std::string name;
    for (const Int4Case& c : set.parts) {
      hs.push_back(MakeInt4(c, seed++));
      ds.push_back(Upload(*gpu, hs.back()));
      ASSERT_TRUE(gpu->PrepareLinear(ds.back().w).ok()) << Name(c);
      lws.push_back(ds.back().w);
      name += (name.empty() ? "" : " + ") + Name(c);
    }
    const int64_t k = set.parts[0].k;
    for (int64_t n : {1, 8, 16, 40, 64, 256}) {
      Tensor x = RandomX(n, k, static_cast<uint32_t>(n) + seed);
      Tensor xd = *gpu->Upload(x);
      std::vector<Tensor> ys;
      std::vector<TensorView> views;
      for (const Int4Case& c : set.parts) {
        ys.push_back(gpu->Alloc(DType::kF32, {n, c.m}));
        views.push_back(ys.back().view());
      }
      gpu->LinearFanOut(xd, lws, views);
      ASSERT_TRUE(gpu->Synchronize().ok()) << name;
      for (size_t i = 0; i < set.parts.size(); ++i) {
        Tensor ref = cpu.Alloc(DType::kF32, {n, set.parts[i].m});
        cpu.Linear(x, hs[i].w, ref);
        const Error e = Compare(Host(*gpu, ys[i]), ref.data<float>(), static_cast<size_t>(n * set.parts[i].m));
        EXPECT_LE(e.max_rel, 1e-2) << name << " part " << i << " n=" << n;
        EXPECT_LE(e.rms_rel, 5e-3) << name << " part " << i << " n=" << n;
      }
    }
  }
}

// The repack is in place, so a second LinearWeight bound to the same memory must find it done (not repack the tiles
// again), and one bound after the memory was freed and reused must be repacked afresh.
TEST(CudaInt4Test, PrepareLinearRepacksEachWeightOnce) {
  REQUIRE_GPU(gpu);
  CpuBackend cpu;
  const Int4Case c{LinearFormat::kAwq, 128, 256, 64};
  const HostInt4 h = MakeInt4(c, 7);
  Tensor x = RandomX(3, c.k, 8);
  Tensor ref = cpu.Alloc(DType::kF32, {3, c.m});
  cpu.Linear(x, h.w, ref);
  Tensor xd = *gpu->Upload(x);
  for (int round = 0; round < 2; ++round) {  // round 1 may get round 0's freed blocks back from the pool
    DeviceInt4 d = Upload(*gpu, h);
    LinearWeight again = d.w;
    ASSERT_TRUE(gpu->PrepareLinear(d.w).ok());
    ASSERT_TRUE(gpu->PrepareLinear(again).ok());
    for (const LinearWeight* w : {&d.w, &again}) {
      Tensor y = gpu->Alloc(DType::kF32, {3, c.m});
      gpu->Linear(xd, *w, y);
      ASSERT_TRUE(gpu->Synchronize().ok());
      EXPECT_LE(Compare(Host(*gpu, y), ref.data<float>(), static_cast<size_t>(3 * c.m)).max_rel, 1e-2)
          << "round " << round;
    }
  }
}

// A g_idx naming a group that does not exist is an error at load, not an out-of-bounds read.
TEST(CudaInt4Test, PrepareLinearRefusesAGroupIndexOutOfRange) {
  REQUIRE_GPU(gpu);
  HostInt4 h = MakeInt4({LinearFormat::kGptq, 64, 128, 64}, 9);
  h.g_idx.data<int32_t>()[5] = 2;  // 2 groups: 0 and 1
  DeviceInt4 d = Upload(*gpu, h);
  const Status st = gpu->PrepareLinear(d.w);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
  EXPECT_NE(st.message().find("input 5 is in group 2"), std::string::npos) << st.ToString();
}

// MoE layers of 4-bit experts: those the grouped W4A16 kernels take (hidden and inter multiples of 64, one group size
// or one group a row, f16 or f32 scales, no act-order) get PrepareExperts' device table; the others stay on the host
// path. Either way MoeExperts adds what the CPU adds (the device path rounds x and silu(gate) * up to bf16: within 1%
// of the largest output and 0.5% rms; the host path's float32 kernels under f32_gemm within 1e-5), at batch sizes
// that take each tile height and, past cuda::kMaxMoePairs pairs, slices.
TEST(CudaInt4Test, MoeExpertsMatchCpu) {
  REQUIRE_GPU(gpu);
  CpuBackend cpu;
  struct Set {
    Int4Case gate;  // m = inter, k = hidden; down is [hidden, inter] of the same settings
    int64_t experts, top_k;
    bool device;
  };
  const std::vector<Set> sets = {
      {{LinearFormat::kAwq, 128, 256, 128}, 16, 4, true},
      {{LinearFormat::kGptq, 192, 512, 32, false, 1, DType::kF32}, 8, 2, true},  // groups inside a chunk, f32 scales
      {{LinearFormat::kGptq, 128, 256, -1}, 8, 2, true},                         // one group a row
      {{LinearFormat::kAwq, 1408, 2048, 128}, 64, 6, true},                      // DeepSeek-V2-Lite
      {{LinearFormat::kGptq, 128, 256, 64, true}, 4, 2, false},                  // act-order: the host path
      {{LinearFormat::kAwq, 176, 256, 16}, 4, 2, false},                         // inter 176: no device kernels
  };
  uint32_t seed = 900;
  for (const Set& set : sets) {
    const Int4Case& gc = set.gate;
    Int4Case dc = gc;
    std::swap(dc.m, dc.k);
    const int64_t hidden = gc.k, inter = gc.m;
    ExpertSet cs, gs;
    std::vector<HostInt4> hosts;  // the LinearWeights view their tensors
    std::vector<DeviceInt4> devices;
    for (int64_t e = 0; e < set.experts; ++e) {
      for (auto [list, dlist, c] :
           {std::tuple{&cs.gate, &gs.gate, gc}, std::tuple{&cs.up, &gs.up, gc}, std::tuple{&cs.down, &gs.down, dc}}) {
        hosts.push_back(MakeInt4(c, seed++));
        devices.push_back(Upload(*gpu, hosts.back()));
        ASSERT_TRUE(gpu->PrepareLinear(devices.back().w).ok()) << Name(c);
        list->push_back(hosts.back().w);
        dlist->push_back(devices.back().w);
      }
    }
    ASSERT_TRUE(gpu->PrepareExperts(gs).ok());
    const std::string name = fmt::format("{} experts of {} (top {})", set.experts, Name(gc), set.top_k);
    EXPECT_EQ(gs.device_state != nullptr, set.device) << name;
    const bool big = hidden * inter > (1 << 20);
    const int64_t over = cuda::kMaxMoePairs / set.top_k + 3;
    for (int64_t n : big ? std::vector<int64_t>{1, 8, 64, over} : std::vector<int64_t>{1, 3, 8, 40, 300, over}) {
      std::mt19937 rng(static_cast<uint32_t>(n) + seed);
      Tensor x = RandomX(n, hidden, static_cast<uint32_t>(n) + 1);
      Tensor ids = Tensor::Empty(DType::kI32, {n, set.top_k}), wt = Tensor::Empty(DType::kF32, {n, set.top_k});
      std::vector<int32_t> perm(static_cast<size_t>(set.experts));
      std::uniform_real_distribution<float> wd(0.0f, 1.0f);
      for (int64_t t = 0; t < n; ++t) {
        std::iota(perm.begin(), perm.end(), 0);
        std::shuffle(perm.begin(), perm.end(), rng);
        for (int64_t j = 0; j < set.top_k; ++j) {
          ids.data<int32_t>()[t * set.top_k + j] = perm[static_cast<size_t>(j)];
          wt.data<float>()[t * set.top_k + j] = wd(rng);
        }
      }
      Tensor zeros = Tensor::Empty(DType::kF32, {n, hidden});
      std::fill_n(zeros.data<float>(), n * hidden, 0.0f);
      Tensor ref = cpu.Alloc(DType::kF32, {n, hidden});
      std::fill_n(ref.data<float>(), n * hidden, 0.0f);
      ASSERT_TRUE(cpu.MoeExperts(x, cs, ids, wt, ref).ok());
      for (const bool f32 : {false, true}) {
        SetKernelOptions(*gpu, [&](cuda::KernelOptions& o) { o.f32_gemm = f32; });
        Tensor xd = *gpu->Upload(x), idd = *gpu->Upload(ids), wdd = *gpu->Upload(wt);
        Tensor out = *gpu->Upload(zeros);
        ASSERT_TRUE(gpu->MoeExperts(xd, gs, idd, wdd, out).ok()) << name;
        ASSERT_TRUE(gpu->Synchronize().ok()) << name;
        const Error err = Compare(Host(*gpu, out), ref.data<float>(), static_cast<size_t>(n * hidden));
        const std::string what = fmt::format("{} n={}{}", name, n, f32 ? " f32_gemm" : "");
        if (f32) {
          EXPECT_LE(err.max_rel, 1e-5) << what;
        } else {
          EXPECT_LE(err.max_rel, 1e-2) << what;
          EXPECT_LE(err.rms_rel, 5e-3) << what;
        }
      }
    }
  }
  SetKernelOptions(*gpu, [](cuda::KernelOptions& o) { o.f32_gemm = false; });
}

struct Loaded {
  ModelConfig cfg;
  std::unique_ptr<Model> model;
};

Loaded Load(Backend& be, const std::string& dir, const ModelConfig* config = nullptr, bool dummy = false) {
  Loaded l;
  if (config != nullptr) {
    l.cfg = *config;
  } else {
    StatusOr<ModelConfig> cfg = LoadModelConfig(dir);
    FATHOM_CHECK(cfg.ok(), "{}", cfg.status().ToString());
    l.cfg = *cfg;
  }
  LoadOptions opts;
  opts.show_progress = false;
  if (dummy) {
    opts.format = LoadFormat::kDummy;
    opts.seed = 5;
  }
  StatusOr<std::unique_ptr<Model>> m = LoadModel(dir, l.cfg, opts, be);
  FATHOM_CHECK(m.ok(), "{}: {}", dir, m.status().ToString());
  l.model = std::move(m).value();
  return l;
}

// Logits of a 40-token prompt (prefill) and of one decode step after it.
std::vector<std::vector<float>> PrefillAndDecode(Backend& be, const Loaded& m) {
  StatusOr<KvCache> kv = KvCache::Allocate(be, m.model->kv_cache_spec(), DType::kF32, 8, 16);
  FATHOM_CHECK(kv.ok());
  const int64_t vocab = m.cfg.vocab_size;
  std::vector<int32_t> prompt;
  for (int32_t i = 0; i < 40; ++i) prompt.push_back(static_cast<int32_t>((i * 7919 + 100) % vocab));
  const std::vector<int32_t> table = {5, 1, 6, 2};
  std::vector<std::vector<float>> out;
  for (int pass = 0; pass < 2; ++pass) {
    ForwardBatch b(16);
    const std::vector<int32_t> next = {static_cast<int32_t>(42 % vocab)};
    if (pass == 0) {
      b.AddSequence(prompt, 0, table, LogitsMode::kAll);
    } else {
      b.AddSequence(next, 40, table, LogitsMode::kLast);
    }
    Tensor logits;
    const Status st = m.model->Forward(b, *kv, &logits);
    FATHOM_CHECK(st.ok(), "{}", st.ToString());
    out.push_back(Host(be, logits));
  }
  return out;
}

int64_t ArgMax(const float* row, int64_t n) {
  return std::max_element(row, row + n) - row;
}

// got's rows against want's: max |dlogit| within `tol` of the largest |logit|, and the same argmax wherever want's
// top-1 leads by more than `margin` of it.
void ExpectLogitsAgree(const std::vector<std::vector<float>>& got, const std::vector<std::vector<float>>& want,
                       int64_t vocab, double tol, double margin, const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t pass = 0; pass < got.size(); ++pass) {
    ASSERT_EQ(got[pass].size(), want[pass].size()) << what;
    const size_t count = want[pass].size();
    double scale = 0;
    for (float v : want[pass]) scale = std::max(scale, std::fabs(static_cast<double>(v)));
    const float diff = testing::MaxAbsDiff(got[pass].data(), want[pass].data(), static_cast<int64_t>(count));
    EXPECT_LE(diff, tol * scale) << what << (pass ? " decode" : " prefill") << " (largest logit " << scale << ")";
    for (size_t r = 0; r < count / static_cast<size_t>(vocab); ++r) {
      const float* w = want[pass].data() + r * static_cast<size_t>(vocab);
      std::vector<float> sorted(w, w + vocab);
      std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<>());
      if (sorted[0] - sorted[1] <= margin * scale) continue;
      EXPECT_EQ(ArgMax(got[pass].data() + r * static_cast<size_t>(vocab), vocab), ArgMax(w, vocab))
          << what << (pass ? " decode" : " prefill") << " row " << r;
    }
    std::cout << what << (pass ? " decode" : " prefill") << ": max |dlogit| " << diff << " (largest " << scale << ")\n";
  }
}

// Each INT4 fixture on the GPU gives its float32 twin's logits on the CPU: within float32 rounding on the float32
// paths (f32_gemm), within bf16 rounding by default.
TEST(CudaInt4Test, QuantFixturesOnTheGpuMatchTheirTwinsOnTheCpu) {
  REQUIRE_GPU(gpu);
  CpuBackend cpu;
  for (const char* name :
       {"llama3-distill-tiny-awq", "qwen2-tied-tiny-awq-legacy", "deepseek-v2-lite-tiny-awq",
        "qwen2-distill-tiny-gptq-actorder", "llama-coder-tiny-gptq-perchannel", "deepseek-v3-tiny-gptq-v2"}) {
    const std::string dir = std::string(FATHOM_QUANT_TEST_DATA) + "/" + name;
    const Loaded twin = Load(cpu, dir + "/twin");
    const auto want = PrefillAndDecode(cpu, twin);
    // MoE fixtures on float32 paths only: bf16 rounding may swap a near-tied expert, which moves logits by O(1).
    for (const bool f32 : twin.cfg.is_moe() ? std::vector<bool>{true} : std::vector<bool>{true, false}) {
      SetKernelOptions(*gpu, [&](cuda::KernelOptions& o) { o.f32_gemm = f32; });
      const Loaded quant = Load(*gpu, dir + "/quant");
      const auto got = PrefillAndDecode(*gpu, quant);
      ExpectLogitsAgree(got, want, twin.cfg.vocab_size, f32 ? 1e-4 : 2e-2, f32 ? 1e-3 : 0.05,
                        fmt::format("{} {}", name, f32 ? "float32" : "default"));
    }
  }
  SetKernelOptions(*gpu, [](cuda::KernelOptions& o) { o.f32_gemm = false; });
}

// Two layers of the real AWQ/GPTQ configs (dummy 4-bit weights made on each device, bit-identical) on the GPU against
// the CPU.
TEST(CudaInt4Test, RealSizeTwoLayerModelsMatchCpu) {
  REQUIRE_GPU(gpu);
  CpuBackend cpu;
  for (const char* name : {"deepseek-r1-distill-qwen-7b-awq", "deepseek-r1-distill-llama-8b-gptq",
                           "deepseek-coder-6.7b-instruct-awq", "deepseek-v2-lite-awq"}) {
    StatusOr<ModelConfig> cfg = LoadModelConfig(testing::DataDir() + "/configs/" + name + ".json");
    ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
    cfg->num_layers = 2;
    if (cfg->is_moe()) cfg->moe.first_k_dense_replace = 1;
    const Loaded c = Load(cpu, "", &*cfg, /*dummy=*/true);
    const auto want = PrefillAndDecode(cpu, c);
    // float32 paths (f32_gemm) within float32 rounding; the default ones (dense models: see above) within bf16's.
    for (const bool f32 : cfg->is_moe() ? std::vector<bool>{true} : std::vector<bool>{true, false}) {
      SetKernelOptions(*gpu, [&](cuda::KernelOptions& o) { o.f32_gemm = f32; });
      const Loaded g = Load(*gpu, "", &*cfg, /*dummy=*/true);
      ExpectLogitsAgree(PrefillAndDecode(*gpu, g), want, cfg->vocab_size, f32 ? 1e-4 : 2e-2, f32 ? 1e-3 : 0.05,
                        fmt::format("{} {}", name, f32 ? "float32" : "default"));
    }
  }
  SetKernelOptions(*gpu, [](cuda::KernelOptions& o) { o.f32_gemm = false; });
}

}  // namespace
}  // namespace fathom
