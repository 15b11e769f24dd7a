// CudaBackend against the CPU reference op by op, and the reference models against the oracle on the GPU.
#include "backend/cuda/cuda_backend.h"

#include <gtest/gtest.h>

#include <random>

#include "backend/cpu/cpu_backend.h"
#include "io/model_config.h"
#include "model/registry.h"
#include "testing/golden.h"

namespace fathom {
namespace {

std::unique_ptr<CudaBackend> MakeGpu() {
  auto gpu = CudaBackend::Create(0);
  return gpu.ok() ? std::move(gpu).value() : nullptr;
}

#define REQUIRE_GPU(gpu)                                 \
  auto gpu = MakeGpu();                                  \
  if (!gpu) GTEST_SKIP() << "no CUDA device on this machine"

Tensor RandomHost(DType dtype, std::initializer_list<int64_t> shape, uint32_t seed, float scale = 1.0f) {
  Tensor t = Tensor::Empty(dtype, shape);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-scale, scale);
  for (int64_t i = 0; i < t.numel(); ++i) {
    const float v = d(rng);
    switch (dtype) {
      case DType::kF32: t.data<float>()[i] = v; break;
      case DType::kBF16: t.data<uint16_t>()[i] = F32ToBf16(v); break;
      case DType::kF8E4M3: t.data<uint8_t>()[i] = F32ToF8E4M3(v); break;
      default: FATHOM_CHECK(false);
    }
  }
  return t;
}

std::vector<float> Host(Backend& be, const Tensor& t) {
  std::vector<float> h(static_cast<size_t>(t.numel()));
  EXPECT_TRUE(be.CopyToHost(t, h.data()).ok());
  return h;
}

TEST(CudaBackendTest, LinearUnalignedShapesMatchCpu) {
  REQUIRE_GPU(gpu);
  CpuBackend cpu;
  const int64_t n = 3, in = 301, out = 5;  // the generic path
  Tensor x = RandomHost(DType::kF32, {n, in}, 5);
  Tensor w = RandomHost(DType::kBF16, {out, in}, 6);
  LinearWeight lw;
  lw.weight = w;
  Tensor y_cpu = cpu.Alloc(DType::kF32, {n, out});
  cpu.Linear(x, lw, y_cpu);
  Tensor xd = *gpu->Upload(x), wdv = *gpu->Upload(w);
  LinearWeight gw;
  gw.weight = wdv;
  Tensor y = gpu->Alloc(DType::kF32, {n, out});
  gpu->Linear(xd, gw, y);
  auto h = Host(*gpu, y);
  EXPECT_LE(testing::MaxAbsDiff(h.data(), y_cpu.data<float>(), n * out), 1e-4f);
}

TEST(CudaBackendTest, LinearMatchesCpu) {
  REQUIRE_GPU(gpu);
  CpuBackend cpu;
  for (auto [wd, n] : std::vector<std::pair<DType, int64_t>>{
           {DType::kBF16, 1}, {DType::kBF16, 2}, {DType::kBF16, 3}, {DType::kBF16, 11}, {DType::kF32, 11},
           {DType::kF8E4M3, 11}}) {
    const int64_t in = 304, out = 77;  // in % 8 == 0: the vectorized bf16 path, 1 to 8 tokens per pass
    Tensor x = RandomHost(DType::kF32, {n, in}, 1);
    Tensor w = RandomHost(wd, {out, in}, 2);
    Tensor b = RandomHost(DType::kBF16, {out}, 3);
    Tensor sc = RandomHost(DType::kF32, {1, 3}, 4);
    LinearWeight lw;
    lw.weight = w;
    lw.bias = b;
    if (wd == DType::kF8E4M3) lw.scale_inv = sc;
    Tensor y_cpu = cpu.Alloc(DType::kF32, {n, out});
    cpu.Linear(x, lw, y_cpu);
    Tensor xd = *gpu->Upload(x), wdv = *gpu->Upload(w), bd = *gpu->Upload(b), sd = *gpu->Upload(sc);
    LinearWeight gw;
    gw.weight = wdv;
    gw.bias = bd;
    if (wd == DType::kF8E4M3) gw.scale_inv = sd;
    Tensor y = gpu->Alloc(DType::kF32, {n, out});
    gpu->Linear(xd, gw, y);
    ASSERT_TRUE(gpu->Synchronize().ok());
    auto h = Host(*gpu, y);
    EXPECT_LE(testing::MaxAbsDiff(h.data(), y_cpu.data<float>(), n * out), 1e-4f) << DTypeName(wd) << " n=" << n;
  }
}

// Paged attention on the GPU (split-K for decode, one block per (token, head) otherwise) against the CPU backend,
// with scattered blocks, GQA, contexts across many chunks, and a bf16 cache.
TEST(CudaBackendTest, PagedAttentionMatchesCpu) {
  REQUIRE_GPU(gpu);
  CpuBackend cpu;
  for (int mode = 0; mode < 4; ++mode) {
    const DType cache_dtype = mode % 2 ? DType::kBF16 : DType::kF32;
    if (mode / 2) {
      setenv("FATHOM_CUDA_NO_SPLIT_ATTENTION", "1", 1);  // the one-block-per-(token, head) kernel
    } else {
      unsetenv("FATHOM_CUDA_NO_SPLIT_ATTENTION");
    }
    const int64_t heads = 8, kv_heads = 2, d = 64, bs = 16;
    const std::vector<int32_t> cached = {0, 300, 1000};
    const std::vector<int32_t> fresh = {40, 1, 3};
    KvCacheSpec spec{1, kv_heads, d, d, false};
    auto kv_cpu = KvCache::Allocate(cpu, spec, cache_dtype, 128, bs);
    auto kv_gpu = KvCache::Allocate(*gpu, spec, cache_dtype, 128, bs);
    ASSERT_TRUE(kv_cpu.ok() && kv_gpu.ok());
    testing::ScatteredBlocks blocks(128, 5);
    std::vector<std::vector<int32_t>> tables;
    ForwardBatch fill(bs), step(bs);
    for (size_t s = 0; s < 3; ++s) {
      tables.push_back(blocks.Take((cached[s] + fresh[s] + bs - 1) / bs));
      std::vector<int32_t> a(static_cast<size_t>(cached[s]), 0), b(static_cast<size_t>(fresh[s]), 0);
      fill.AddSequence(a, 0, tables.back(), LogitsMode::kNone);
      step.AddSequence(b, cached[s], tables.back(), LogitsMode::kNone);
    }
    for (ForwardBatch* fb : {&fill, &step}) {
      const int64_t n = fb->num_tokens();
      Tensor k = RandomHost(DType::kF32, {n, kv_heads, d}, 11), v = RandomHost(DType::kF32, {n, kv_heads, d}, 12);
      Tensor q = RandomHost(DType::kF32, {n, heads, d}, 13);
      auto mc = BatchOnDevice::Upload(*fb, cpu);
      auto mg = BatchOnDevice::Upload(*fb, *gpu);
      ASSERT_TRUE(mc.ok() && mg.ok());
      cpu.WriteKv(k, v, mc->meta(), kv_cpu->layer(0));
      Tensor kd = *gpu->Upload(k), vd = *gpu->Upload(v), qd = *gpu->Upload(q);
      gpu->WriteKv(kd, vd, mg->meta(), kv_gpu->layer(0));
      if (fb == &fill) continue;
      Tensor out_cpu = cpu.Alloc(DType::kF32, {n, heads, d});
      Tensor out_gpu = gpu->Alloc(DType::kF32, {n, heads, d});
      cpu.PagedAttention(q, kv_cpu->layer(0), mc->meta(), 0.125f, out_cpu);
      gpu->PagedAttention(qd, kv_gpu->layer(0), mg->meta(), 0.125f, out_gpu);
      ASSERT_TRUE(gpu->Synchronize().ok());
      auto h = Host(*gpu, out_gpu);
      EXPECT_LE(testing::MaxAbsDiff(h.data(), out_cpu.data<float>(), n * heads * d), 1e-5f) << "mode " << mode;
    }
  }
  unsetenv("FATHOM_CUDA_NO_SPLIT_ATTENTION");
}

class CudaGoldenTest : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaGoldenTest, WholePromptTokenByTokenAndGreedy) {
  REQUIRE_GPU(gpu);
  const std::string dir = testing::ModelDir(GetParam());
  auto cfg = LoadModelConfig(dir);
  ASSERT_TRUE(cfg.ok());
  LoadOptions opts;
  opts.show_progress = false;
  auto model = LoadModel(dir, *cfg, opts, *gpu);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  auto golden = testing::LoadGolden(dir);
  ASSERT_TRUE(golden.ok());
  const int64_t vocab = cfg->vocab_size;
  constexpr int32_t kBs = 16;
  for (size_t c = 0; c < golden->cases.size(); ++c) {
    const auto& gc = golden->cases[c];
    // Whole prompt, scattered blocks.
    auto kv = KvCache::Allocate(*gpu, (*model)->kv_cache_spec(), DType::kF32, 16, kBs);
    ASSERT_TRUE(kv.ok());
    testing::ScatteredBlocks blocks(16, static_cast<uint32_t>(c));
    std::vector<int32_t> table = blocks.Take(7);
    ForwardBatch b(kBs);
    b.AddSequence(gc.input_ids, 0, table, LogitsMode::kAll);
    Tensor logits;
    ASSERT_TRUE((*model)->Forward(b, *kv, &logits).ok());
    auto h = Host(*gpu, logits);
    for (size_t t = 0; t < gc.input_ids.size(); ++t) {
      EXPECT_LE(testing::MaxAbsDiff(h.data() + t * vocab, gc.row(static_cast<int64_t>(t)), vocab), 2e-3f)
          << "case" << c << " position " << t;
    }
    // Greedy continuation, one token per step through the cache.
    std::vector<int32_t> step = {static_cast<int32_t>(std::max_element(h.end() - vocab, h.end()) - (h.end() - vocab))};
    std::vector<int32_t> generated = step;
    int32_t cached = static_cast<int32_t>(gc.input_ids.size());
    while (generated.size() < gc.greedy.size()) {
      ForwardBatch d(kBs);
      d.AddSequence(step, cached, table, LogitsMode::kLast);
      ASSERT_TRUE((*model)->Forward(d, *kv, &logits).ok());
      auto row = Host(*gpu, logits);
      cached += 1;
      step = {static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin())};
      generated.push_back(step[0]);
    }
    EXPECT_EQ(generated, gc.greedy) << "case" << c;
  }
}

INSTANTIATE_TEST_SUITE_P(DenseFixtures, CudaGoldenTest,
                         ::testing::Values("llama-coder-tiny", "llama3-distill-tiny", "qwen2-distill-tiny",
                                           "qwen2-tied-tiny"),
                         [](const ::testing::TestParamInfo<std::string>& param_info) {
                           std::string s = param_info.param;
                           std::replace(s.begin(), s.end(), '-', '_');
                           return s;
                         });

}  // namespace
}  // namespace fathom
