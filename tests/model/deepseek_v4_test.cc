// DeepSeek-V4 on the CPU reference against the oracle (transformers 5.17's deepseek_v4, float32): every fixture's
// five prompts (1 to 250 tokens: window slides, CSA entries selected by the indexer, an HCA entry) whole, batched,
// token by token, in chunks that end inside compression windows, greedily continued, and prefix-cached; the FP8 + MXFP4
// checkpoint against its own float32 twin.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "backend/cpu/cpu_backend.h"
#include "format/linear_method.h"
#include "io/model_config.h"
#include "io/safetensors.h"
#include "model/registry.h"
#include "model/v4_hybrid.h"
#include "testing/fixtures.h"
#include "testing/golden.h"
#include "testing/temp_dir.h"

namespace fathom {
namespace {

using testing::GoldenSet;
using testing::MaxAbsDiff;
using testing::ModelDir;

constexpr float kTolerance = 2e-3f;
constexpr int32_t kBlockSize = 16;

class DeepseekV4GoldenTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    const std::string dir = ModelDir(GetParam());
    StatusOr<ModelConfig> cfg = LoadModelConfig(dir);
    ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
    LoadOptions opts;
    opts.show_progress = false;
    StatusOr<std::unique_ptr<Model>> m = LoadModel(dir, *cfg, opts, cpu_);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    model_ = std::move(m).value();
    StatusOr<GoldenSet> g = testing::LoadGolden(dir);
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    golden_ = std::move(g).value();
    ASSERT_EQ(golden_.cases.size(), 5u);
    vocab_ = model_->config().vocab_size;
  }

  void ExpectMatchesOracle(const std::vector<std::vector<float>>& got, const std::string& how) {
    ASSERT_EQ(got.size(), golden_.cases.size()) << how;
    for (size_t c = 0; c < got.size(); ++c) {
      const auto& gc = golden_.cases[c];
      ASSERT_EQ(got[c].size(), gc.logits.size()) << how << " case" << c;
      for (size_t t = 0; t < gc.input_ids.size(); ++t) {
        const float d = MaxAbsDiff(got[c].data() + t * vocab_, gc.row(static_cast<int64_t>(t)), vocab_);
        ASSERT_LE(d, kTolerance) << how << ": case" << c << " position " << t;
      }
    }
  }

  void ExpectGreedyMatchesOracle() {
    std::vector<std::vector<int32_t>> prompts;
    for (const auto& c : golden_.cases) prompts.push_back(c.input_ids);
    const testing::GreedyRun run = testing::GreedyTogether(*model_, cpu_, prompts, 16, vocab_);
    ASSERT_EQ(run.tokens.size(), prompts.size());
    for (size_t c = 0; c < prompts.size(); ++c) {
      EXPECT_EQ(run.tokens[c], golden_.cases[c].greedy) << "case" << c;
    }
  }

  std::vector<std::vector<float>> RunChunked(const std::vector<int>& pattern) {
    StatusOr<std::vector<std::vector<float>>> out =
        testing::ForwardCasesChunked(*model_, cpu_, golden_, pattern, /*block_seed=*/23, kBlockSize);
    EXPECT_TRUE(out.ok()) << out.status().ToString();
    return out.ok() ? *std::move(out) : std::vector<std::vector<float>>{};
  }

  CpuBackend cpu_;
  std::unique_ptr<Model> model_;
  GoldenSet golden_;
  int64_t vocab_ = 0;
};

TEST_P(DeepseekV4GoldenTest, WholePromptsBatched) {
  ExpectMatchesOracle(RunChunked({0}), "whole prompts, batched");
}

// The quantized fixtures run through the same cache paths as the float ones (their formats only change the linears'
// weights): whole prompts and greedy continuations against the oracle here, and every path against their float32 twin
// below (DeepseekV4Fp8Test).
using DeepseekV4QuantizedGoldenTest = DeepseekV4GoldenTest;

TEST_P(DeepseekV4QuantizedGoldenTest, WholePromptsBatched) {
  ExpectMatchesOracle(RunChunked({0}), "whole prompts, batched");
}

TEST_P(DeepseekV4GoldenTest, TokenByTokenBatched) {
  ExpectMatchesOracle(RunChunked({1}), "token by token, batched");
}

// Chunks of 3, 5, 2 and 7 tokens end inside CSA windows of 4 and the HCA window of 128, so entries are made from rows
// that earlier steps wrote.
TEST_P(DeepseekV4GoldenTest, UnevenChunksBatched) {
  ExpectMatchesOracle(RunChunked({3, 5, 2, 7}), "uneven chunks, batched");
}

TEST_P(DeepseekV4GoldenTest, GreedyContinuationsEqualTheOracle) {
  ExpectGreedyMatchesOracle();
}

TEST_P(DeepseekV4QuantizedGoldenTest, GreedyContinuationsEqualTheOracle) {
  ExpectGreedyMatchesOracle();
}

// A second request whose first 224 of 250 tokens (90%) are a cached prefix: it shares the first request's 14 blocks
// (the CSA and HCA entries of the windows that end in them) and the window rows of tokens 96..223 (the sliding
// window's keys and the unfinished HCA window's compressor inputs), and computes the rest in blocks of its own. Its
// logits are the oracle's.
TEST_P(DeepseekV4GoldenTest, PrefixCachedSecondRequest) {
  const auto& c = golden_.cases[4];
  ASSERT_EQ(c.input_ids.size(), 250u);
  // The window rows of the shared prefix's last 128 tokens (blocks 6..13) are shared too; the second request's
  // window table starts there (-1 before), as kv::KvCacheManager's does.
  StatusOr<KvCache> kv = KvCache::Allocate(cpu_, model_->kv_cache_spec(), DType::kF32, 64, kBlockSize, 64);
  ASSERT_TRUE(kv.ok()) << kv.status().ToString();
  testing::ScatteredBlocks blocks(64, 5), window_blocks(64, 6);
  const std::vector<int32_t> first = blocks.Take(16), first_window = window_blocks.Take(16);
  {
    ForwardBatch b(kBlockSize);
    b.AddSequence(c.input_ids, 0, first, LogitsMode::kNone, first_window);
    Tensor logits;
    ASSERT_TRUE(model_->Forward(b, *kv, &logits).ok());
  }
  constexpr int32_t kShared = 224;
  std::vector<int32_t> second(first.begin(), first.begin() + kShared / kBlockSize);
  for (int32_t id : blocks.Take(2)) second.push_back(id);
  std::vector<int32_t> second_window(first_window.begin(), first_window.begin() + kShared / kBlockSize);
  for (int32_t b = 0; b < (kShared - 128) / kBlockSize; ++b) second_window[static_cast<size_t>(b)] = -1;
  for (int32_t id : window_blocks.Take(2)) second_window.push_back(id);
  ForwardBatch b(kBlockSize);
  b.AddSequence(std::span<const int32_t>(c.input_ids).subspan(kShared), kShared, second, LogitsMode::kAll,
                second_window);
  Tensor logits;
  ASSERT_TRUE(model_->Forward(b, *kv, &logits).ok());
  std::vector<float> h(static_cast<size_t>(logits.numel()));
  ASSERT_TRUE(cpu_.CopyToHost(logits, h.data()).ok());
  for (int64_t t = kShared; t < 250; ++t) {
    EXPECT_LE(MaxAbsDiff(h.data() + (t - kShared) * vocab_, c.row(t), vocab_), kTolerance) << "position " << t;
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, DeepseekV4GoldenTest,
                         ::testing::ValuesIn(testing::FixtureNames({.format = "bf16", .attention = "v4"})),
                         testing::FixtureName);
INSTANTIATE_TEST_SUITE_P(Fixtures, DeepseekV4QuantizedGoldenTest,
                         ::testing::ValuesIn(testing::FixtureNames({.format = "fp8-block+mxfp4", .attention = "v4"})),
                         testing::FixtureName);

// The FP8 + MXFP4 checkpoint (deepseek-v4-fp8-tiny) against a float32 twin written here: every quantized weight
// replaced by what the formats decode it to (format/linear_method.h DequantizeRow), quantization_config and
// expert_dtype dropped. The two must agree to 1e-4 at every position of every prompt (the quantized one in uneven
// chunks, the twin whole): the formats' CPU paths read exactly the values the twin holds.
TEST(DeepseekV4Fp8Test, QuantizedCheckpointEqualsItsFloat32Twin) {
  const std::string dir = ModelDir("deepseek-v4-fp8-tiny");
  testing::TempDir twin_dir("fathom_v4_twin");
  StatusOr<ModelConfig> cfg = LoadModelConfig(dir);
  ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
  ASSERT_EQ(cfg->quant.expert_dtype, "fp4");
  CpuBackend cpu;
  LoadOptions opts;
  opts.show_progress = false;
  StatusOr<std::unique_ptr<Model>> quantized = LoadModel(dir, *cfg, opts, cpu);
  ASSERT_TRUE(quantized.ok()) << quantized.status().ToString();

  // The twin: each linear of the quantized specs dequantized row by row; every other tensor copied as it is.
  StatusOr<const Architecture*> arch = FindArchitecture(cfg->architecture);
  ASSERT_TRUE(arch.ok());
  StatusOr<std::vector<WeightSpec>> specs = (*arch)->weight_specs(*cfg);
  ASSERT_TRUE(specs.ok()) << specs.status().ToString();
  StatusOr<std::unique_ptr<WeightStore>> store = LoadWeights(dir, *specs, opts, cpu);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::Open(dir);
  ASSERT_TRUE(ckpt.ok());
  std::vector<std::vector<uint8_t>> payloads;  // reserved up front: the items' spans point into it
  payloads.reserve(specs->size() + (*ckpt)->size());
  std::vector<SafetensorsWriteItem> items;
  int quantized_layers = 0, mxfp4_layers = 0;
  std::set<std::string> covered;
  for (const WeightSpec& s : *specs) {
    if (!s.linear) continue;
    const std::string& prefix = s.linear->spec.prefix;
    StatusOr<LinearWeight> w = (*store)->UnpreparedLinear(prefix);
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    if (w->format == LinearFormat::kDense) continue;
    ++quantized_layers;
    mxfp4_layers += w->format == LinearFormat::kMxfp4;
    const int64_t out = w->out_features(), in = w->in_features();
    std::vector<float> values(static_cast<size_t>(out * in));
    for (int64_t r = 0; r < out; ++r) DequantizeRow(*w, r, values.data() + r * in);
    payloads.emplace_back(reinterpret_cast<const uint8_t*>(values.data()),
                          reinterpret_cast<const uint8_t*>(values.data() + values.size()));
    items.push_back({prefix + ".weight", DType::kF32, {out, in}, payloads.back()});
    covered.insert(prefix + ".weight");
    covered.insert(prefix + ".scale");
  }
  EXPECT_GT(mxfp4_layers, 0);
  EXPECT_GT(quantized_layers, mxfp4_layers);
  for (const std::string& name : (*ckpt)->names()) {
    if (covered.count(name)) continue;
    StatusOr<TensorView> t = (*ckpt)->Get(name);
    ASSERT_TRUE(t.ok());
    const auto* p = static_cast<const uint8_t*>(t->raw());
    payloads.emplace_back(p, p + t->nbytes());
    const auto dims = t->shape();
    items.push_back({name, t->dtype(), std::vector<int64_t>(dims.begin(), dims.end()), payloads.back()});
  }
  ASSERT_TRUE(WriteSafetensors(twin_dir.file("model.safetensors"), items).ok());
  nlohmann::json j = nlohmann::json::parse(std::ifstream(dir + "/config.json"));
  j.erase("quantization_config");
  j.erase("expert_dtype");
  std::ofstream(twin_dir.file("config.json")) << j.dump();

  StatusOr<ModelConfig> twin_cfg = LoadModelConfig(twin_dir.file(""));
  ASSERT_TRUE(twin_cfg.ok()) << twin_cfg.status().ToString();
  StatusOr<std::unique_ptr<Model>> twin = LoadModel(twin_dir.file(""), *twin_cfg, opts, cpu);
  ASSERT_TRUE(twin.ok()) << twin.status().ToString();
  StatusOr<GoldenSet> golden = testing::LoadGolden(dir);
  ASSERT_TRUE(golden.ok());
  StatusOr<std::vector<std::vector<float>>> a =
      testing::ForwardCasesChunked(**quantized, cpu, *golden, {3, 5, 2, 7}, 3);
  StatusOr<std::vector<std::vector<float>>> b = testing::ForwardCasesChunked(**twin, cpu, *golden, {0}, 3);
  ASSERT_TRUE(a.ok() && b.ok());
  for (size_t c = 0; c < a->size(); ++c) {
    ASSERT_EQ((*a)[c].size(), (*b)[c].size());
    EXPECT_LE(MaxAbsDiff((*a)[c].data(), (*b)[c].data(), static_cast<int64_t>((*a)[c].size())), 1e-4f) << "case" << c;
  }
}

// Each layer's cache row is as wide as its kind needs (V4RowLayout), not the widest layer's: the spec lists the widths,
// the cache allocates them, and bytes a token (the memory plan's and inspect's) add them up.
TEST(DeepseekV4SpecsTest, EachLayerKeepsRowsOfItsOwnWidth) {
  StatusOr<ModelConfig> cfg = LoadModelConfig(ModelDir("deepseek-v4-tiny"));
  ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
  StatusOr<const Architecture*> arch = FindArchitecture(cfg->architecture);
  ASSERT_TRUE(arch.ok());
  const KvCacheSpec spec = (*arch)->kv_cache_spec(*cfg, ParallelConfig{});
  // deepseek-v4-tiny: head_dim 64, index_head_dim 32, window 8; layers sliding, CSA (4), HCA (128), CSA (4).
  ASSERT_EQ(cfg->v4.attention.size(), 4u);
  EXPECT_EQ(spec.layer_window_dims, (std::vector<int64_t>{64, 448, 192, 448}));  // key; + 2 x 128 + 2 x 64; + 64 + 64
  EXPECT_EQ(spec.layer_k_dims, (std::vector<int64_t>{0, 96, 64, 96}));           // entry (+ the indexer's key of 32)
  EXPECT_EQ(spec.layer_rates, (std::vector<int64_t>{1, 4, 128, 4}));
  EXPECT_EQ(spec.window_tokens, 128);  // the HCA window's rows, beyond the sliding window of 8
  EXPECT_EQ(spec.k_dim, 96);
  EXPECT_EQ(spec.values_per_token(), 96 / 4 + 64 / 128 + 96 / 4);  // 48: an HCA entry is under a value a token
  EXPECT_EQ(spec.window_values_per_token(), 64 + 448 + 192 + 448);
  // A block of 16 tokens: 4 CSA entries a layer, one HCA slot.
  EXPECT_EQ(spec.bytes_per_block(DType::kF32, 16), 4 * (2 * 4 * 96 + 64));
  CpuBackend cpu;
  StatusOr<KvCache> kv = KvCache::Allocate(cpu, spec, DType::kF32, 3, 16, /*window_blocks=*/5);
  ASSERT_TRUE(kv.ok()) << kv.status().ToString();
  EXPECT_EQ(kv->window_blocks(), 5);
  EXPECT_TRUE(kv->layer(0).k.empty());  // a sliding layer keeps window rows only
  for (int64_t l = 0; l < spec.num_layers; ++l) {
    EXPECT_EQ(kv->layer(l).window.shape(), (std::vector<int64_t>{5, 16, 1, spec.layer_window_dims[l]})) << l;
  }
  EXPECT_EQ(kv->layer(1).k.shape(), (std::vector<int64_t>{3, 4, 1, 96}));
  EXPECT_EQ(kv->layer(2).k.shape(), (std::vector<int64_t>{3, 1, 1, 64}));
  // Refused, not allocated: no window blocks, widths that do not fit the layers, FP8, blocks a rate does not tile.
  EXPECT_FALSE(KvCache::Allocate(cpu, spec, DType::kF32, 3, 16).ok());
  KvCacheSpec bad = spec;
  bad.layer_k_dims.pop_back();
  EXPECT_FALSE(KvCache::Allocate(cpu, bad, DType::kF32, 3, 16, 5).ok());
  bad = spec;
  bad.layer_window_dims.pop_back();
  EXPECT_FALSE(KvCache::Allocate(cpu, bad, DType::kF32, 3, 16, 5).ok());
  bad = spec;
  bad.layer_k_dims[1] = spec.k_dim + 1;
  EXPECT_FALSE(KvCache::Allocate(cpu, bad, DType::kF32, 3, 16, 5).ok());
  const StatusOr<KvCache> fp8 = KvCache::Allocate(cpu, spec, DType::kF8E4M3, 3, 16, 5);
  EXPECT_FALSE(fp8.ok());
  const StatusOr<KvCache> odd = KvCache::Allocate(cpu, spec, DType::kF32, 3, 12, 5);
  ASSERT_FALSE(odd.ok());
  EXPECT_NE(odd.status().message().find("every 128 tokens"), std::string::npos) << odd.status().ToString();
}

// One rank only for now: a split is refused by name rather than served wrong.
TEST(DeepseekV4SpecsTest, TensorParallelIsRefused) {
  StatusOr<ModelConfig> cfg = LoadModelConfig(ModelDir("deepseek-v4-tiny"));
  ASSERT_TRUE(cfg.ok());
  StatusOr<const Architecture*> arch = FindArchitecture(cfg->architecture);
  ASSERT_TRUE(arch.ok());
  StatusOr<std::vector<WeightSpec>> specs = (*arch)->weight_specs(*cfg, ParallelConfig{.tp_size = 2});
  ASSERT_FALSE(specs.ok());
  EXPECT_EQ(specs.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(specs.status().message().find("one rank"), std::string::npos) << specs.status().ToString();
}

}  // namespace
}  // namespace fathom
