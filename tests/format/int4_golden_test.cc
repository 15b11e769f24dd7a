// Each INT4 fixture (tests/data/quant: AWQ and GPTQ checkpoints as AutoAWQ and AutoGPTQ/GPTQModel write them) on the
// CPU reference gives the logits of its exact float32 twin: max |dlogit| <= 1e-4 and the same argmax at every
// position, for whole prompts, token by token and uneven chunks. A loader that misreads a nibble order, ignores the
// zero points (some were moved on purpose), the GPTQ v1 zero offset or act-order's g_idx fails here.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "backend/cpu/cpu_backend.h"
#include "io/model_config.h"
#include "model/registry.h"
#include "testing/golden.h"

namespace fathom {
namespace {

constexpr float kTolerance = 1e-4f;
constexpr int32_t kBlock = 16;

struct Loaded {
  std::unique_ptr<Model> model;
  int64_t vocab = 0;
};

Loaded Load(CpuBackend& cpu, const std::string& dir) {
  StatusOr<ModelConfig> cfg = LoadModelConfig(dir);
  FATHOM_CHECK(cfg.ok(), "{}", cfg.status().ToString());
  LoadOptions opts;
  opts.show_progress = false;
  StatusOr<std::unique_ptr<Model>> m = LoadModel(dir, *cfg, opts, cpu);
  FATHOM_CHECK(m.ok(), "{}: {}", dir, m.status().ToString());
  return {std::move(m).value(), cfg->vocab_size};
}

// Every position's logits of each prompt, the prompts run together in chunks whose sizes cycle through `pattern`
// (0: the whole rest), through the paged cache.
std::vector<std::vector<float>> Logits(CpuBackend& cpu, const Loaded& m,
                                       const std::vector<std::vector<int32_t>>& prompts,
                                       const std::vector<int>& pattern) {
  StatusOr<KvCache> kv = KvCache::Allocate(cpu, m.model->kv_cache_spec(), DType::kF32, 32, kBlock);
  FATHOM_CHECK(kv.ok());
  std::vector<std::vector<int32_t>> tables(prompts.size());
  int32_t next_block = 0;
  for (size_t p = 0; p < prompts.size(); ++p) {
    for (size_t b = 0; b < (prompts[p].size() + kBlock - 1) / kBlock; ++b) tables[p].push_back(next_block++);
  }
  std::vector<int32_t> done(prompts.size(), 0);
  std::vector<std::vector<float>> out(prompts.size());
  for (size_t step = 0;; ++step) {
    ForwardBatch batch(kBlock);
    std::vector<std::pair<size_t, int32_t>> rows;
    for (size_t p = 0; p < prompts.size(); ++p) {
      const int32_t left = static_cast<int32_t>(prompts[p].size()) - done[p];
      if (left == 0) continue;
      const int want = pattern[(step + p) % pattern.size()];
      const int32_t take = want == 0 ? left : std::min<int32_t>(left, want);
      batch.AddSequence(std::span<const int32_t>(prompts[p].data() + done[p], static_cast<size_t>(take)), done[p],
                        tables[p], LogitsMode::kAll);
      rows.emplace_back(p, take);
      done[p] += take;
    }
    if (rows.empty()) return out;
    Tensor logits;
    const Status s = m.model->Forward(batch, *kv, &logits);
    FATHOM_CHECK(s.ok(), "{}", s.ToString());
    std::vector<float> h(static_cast<size_t>(logits.numel()));
    FATHOM_CHECK(cpu.CopyToHost(logits, h.data()).ok());
    size_t r = 0;
    for (auto [p, count] : rows) {
      out[p].insert(out[p].end(), h.begin() + static_cast<int64_t>(r) * m.vocab,
                    h.begin() + static_cast<int64_t>(r + static_cast<size_t>(count)) * m.vocab);
      r += static_cast<size_t>(count);
    }
  }
}

class Int4GoldenTest : public ::testing::TestWithParam<std::string> {};

TEST_P(Int4GoldenTest, QuantizedCheckpointGivesItsTwinsLogits) {
  const std::string dir = std::string(FATHOM_QUANT_TEST_DATA) + "/" + GetParam();
  CpuBackend cpu;
  const Loaded quant = Load(cpu, dir + "/quant");
  const Loaded twin = Load(cpu, dir + "/twin");
  ASSERT_EQ(quant.vocab, twin.vocab);
  // Three prompts of deterministic ids, one longer than a KV block.
  std::vector<std::vector<int32_t>> prompts;
  uint64_t x = 12345;
  for (int len : {7, 19, 33}) {
    std::vector<int32_t> p;
    for (int i = 0; i < len; ++i) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      p.push_back(static_cast<int32_t>((x >> 33) % static_cast<uint64_t>(quant.vocab)));
    }
    prompts.push_back(std::move(p));
  }
  const auto want = Logits(cpu, twin, prompts, {0});
  for (const auto& [how, pattern] : std::vector<std::pair<std::string, std::vector<int>>>{
           {"whole prompts", {0}}, {"token by token", {1}}, {"uneven chunks", {3, 5, 2}}}) {
    const auto got = Logits(cpu, quant, prompts, pattern);
    for (size_t p = 0; p < prompts.size(); ++p) {
      ASSERT_EQ(got[p].size(), want[p].size());
      float worst = 0;
      for (size_t t = 0; t < prompts[p].size(); ++t) {
        const float* g = got[p].data() + t * static_cast<size_t>(quant.vocab);
        const float* w = want[p].data() + t * static_cast<size_t>(quant.vocab);
        worst = std::max(worst, testing::MaxAbsDiff(g, w, quant.vocab));
        EXPECT_EQ(std::max_element(g, g + quant.vocab) - g, std::max_element(w, w + quant.vocab) - w)
            << how << ": prompt " << p << " position " << t;
      }
      EXPECT_LE(worst, kTolerance) << how << ": prompt " << p;
    }
  }
}

// --load-format dummy with a 4-bit config makes random packed weights (valid zeros and group indices) that run.
TEST(Int4DummyTest, DummyWeightsOfA4BitConfigRun) {
  for (const char* name : {"llama3-distill-tiny-awq", "qwen2-distill-tiny-gptq-actorder"}) {
    const std::string dir = std::string(FATHOM_QUANT_TEST_DATA) + "/" + name + "/quant";
    StatusOr<ModelConfig> cfg = LoadModelConfig(dir);
    ASSERT_TRUE(cfg.ok());
    CpuBackend cpu;
    LoadOptions opts;
    opts.show_progress = false;
    opts.format = LoadFormat::kDummy;
    StatusOr<std::unique_ptr<Model>> m = LoadModel(dir, *cfg, opts, cpu);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    const Loaded loaded{std::move(m).value(), cfg->vocab_size};
    const auto logits = Logits(cpu, loaded, {{1, 2, 3, 4, 5}}, {0});
    ASSERT_EQ(logits[0].size(), static_cast<size_t>(5 * cfg->vocab_size));
    float spread = 0;
    for (float v : logits[0]) {
      ASSERT_TRUE(std::isfinite(v)) << name;
      spread = std::max(spread, std::abs(v - logits[0][0]));
    }
    EXPECT_GT(spread, 0.0f) << name;  // not a constant: the random nibbles reach the output
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Int4GoldenTest,
                         ::testing::Values("llama3-distill-tiny-awq", "qwen2-tied-tiny-awq-legacy",
                                           "deepseek-v2-lite-tiny-awq", "qwen2-distill-tiny-gptq-actorder",
                                           "llama-coder-tiny-gptq-perchannel", "deepseek-v3-tiny-gptq-v2"),
                         [](const ::testing::TestParamInfo<std::string>& i) {
                           std::string n = i.param;
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

}  // namespace
}  // namespace fathom
