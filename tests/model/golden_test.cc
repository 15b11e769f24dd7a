// Every reference fixture against the oracle (HF transformers, float32): the same logits must come out of a
// whole-prompt forward, token-by-token decoding through the paged cache, and uneven chunks, with the four cases
// batched.
#include "testing/golden.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <iostream>
#include <limits>
#include <numeric>

#include "backend/cpu/cpu_backend.h"
#include "io/model_config.h"
#include "model/registry.h"
#include "testing/fixtures.h"

namespace fathom {
namespace {

using testing::GoldenSet;
using testing::MaxAbsDiff;
using testing::ModelDir;
using testing::ScatteredBlocks;

constexpr float kTolerance = 2e-3f;
constexpr int32_t kBlockSize = 16;

class GoldenTest : public ::testing::TestWithParam<std::string> {
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
    // deepseek-v3-tiny: cases 2 and 3 from the oracle's re-run (see OracleRerunTest below and
    // tests/data/models/README.md); expected.safetensors is left as it was delivered.
    StatusOr<GoldenSet> g = testing::LoadGoldenWithReruns(dir);
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    golden_ = std::move(g).value();
    ASSERT_EQ(golden_.cases.size(), 4u);
    vocab_ = model_->config().vocab_size;
    ASSERT_EQ(golden_.cases[0].vocab, vocab_);
  }

  KvCache NewCache(int64_t blocks) {
    StatusOr<KvCache> kv = KvCache::Allocate(cpu_, model_->kv_cache_spec(), DType::kF32, blocks, kBlockSize);
    FATHOM_CHECK(kv.ok());
    return std::move(kv).value();
  }

  std::vector<float> ToHost(const Tensor& t) {
    std::vector<float> h(static_cast<size_t>(t.numel()));
    FATHOM_CHECK(cpu_.CopyToHost(t, h.data()).ok());
    return h;
  }

  // Runs all cases together; each step takes the next chunk of every unfinished case, with sizes cycling through
  // `pattern` (0 = the whole rest). Returns every position's logits per case.
  std::vector<std::vector<float>> RunChunked(const std::vector<int>& pattern) {
    StatusOr<std::vector<std::vector<float>>> out =
        testing::ForwardCasesChunked(*model_, cpu_, golden_, pattern, /*block_seed=*/17, kBlockSize);
    EXPECT_TRUE(out.ok()) << out.status().ToString();
    return out.ok() ? *std::move(out) : std::vector<std::vector<float>>{};
  }

  void ExpectMatchesOracle(const std::vector<std::vector<float>>& got, const std::string& how) {
    ASSERT_EQ(got.size(), golden_.cases.size()) << how;
    for (size_t c = 0; c < got.size(); ++c) {
      const auto& gc = golden_.cases[c];
      ASSERT_EQ(got[c].size(), gc.logits.size()) << how << " case" << c;
      for (size_t t = 0; t < gc.input_ids.size(); ++t) {
        const float d = MaxAbsDiff(got[c].data() + t * vocab_, gc.row(static_cast<int64_t>(t)), vocab_);
        EXPECT_LE(d, kTolerance) << how << ": case" << c << " position " << t;
      }
    }
  }

  CpuBackend cpu_;
  std::unique_ptr<Model> model_;
  GoldenSet golden_;
  int64_t vocab_ = 0;
};

TEST_P(GoldenTest, WholePromptAlone) {
  for (size_t c = 0; c < golden_.cases.size(); ++c) {
    const auto& gc = golden_.cases[c];
    KvCache kv = NewCache(8);
    ScatteredBlocks blocks(8, static_cast<uint32_t>(c));
    std::vector<int32_t> table = blocks.Take(static_cast<int32_t>((gc.input_ids.size() + kBlockSize - 1) / kBlockSize));
    ForwardBatch batch(kBlockSize);
    batch.AddSequence(gc.input_ids, 0, table, LogitsMode::kAll);
    Tensor logits;
    ASSERT_TRUE(model_->Forward(batch, kv, &logits).ok());
    std::vector<float> h = ToHost(logits);
    float worst = 0;
    for (size_t t = 0; t < gc.input_ids.size(); ++t) {
      worst = std::max(worst, MaxAbsDiff(h.data() + t * vocab_, gc.row(static_cast<int64_t>(t)), vocab_));
    }
    EXPECT_LE(worst, kTolerance) << "case" << c;
    RecordProperty("case" + std::to_string(c) + "_max_abs_diff", std::to_string(worst));
  }
}

TEST_P(GoldenTest, WholePromptsBatched) {
  ExpectMatchesOracle(RunChunked({0}), "batched whole prompts");
}

TEST_P(GoldenTest, TokenByTokenBatched) {
  ExpectMatchesOracle(RunChunked({1}), "token by token");
}

TEST_P(GoldenTest, UnevenChunksBatched) {
  ExpectMatchesOracle(RunChunked({3, 1, 7, 2, 5, 11}), "uneven chunks");
}

TEST_P(GoldenTest, GreedyContinuationBatched) {
  const size_t n = golden_.cases.size();
  KvCache kv = NewCache(64);
  ScatteredBlocks blocks(64, 99);
  std::vector<std::vector<int32_t>> tables(n), generated(n), next_input(n);
  std::vector<int32_t> cached(n, 0);
  for (size_t c = 0; c < n; ++c) {
    const int32_t total = static_cast<int32_t>(golden_.cases[c].input_ids.size() + golden_.cases[c].greedy.size());
    tables[c] = blocks.Take((total + kBlockSize - 1) / kBlockSize);
    next_input[c] = golden_.cases[c].input_ids;
  }
  const size_t steps = golden_.cases[0].greedy.size();
  for (size_t step = 0; step < steps; ++step) {
    ForwardBatch batch(kBlockSize);
    for (size_t c = 0; c < n; ++c) batch.AddSequence(next_input[c], cached[c], tables[c], LogitsMode::kLast);
    Tensor logits;
    ASSERT_TRUE(model_->Forward(batch, kv, &logits).ok());
    std::vector<float> h = ToHost(logits);
    for (size_t c = 0; c < n; ++c) {
      cached[c] += static_cast<int32_t>(next_input[c].size());
      const float* row = h.data() + c * vocab_;
      const int32_t best = static_cast<int32_t>(std::max_element(row, row + vocab_) - row);
      generated[c].push_back(best);
      next_input[c] = {best};
    }
  }
  for (size_t c = 0; c < n; ++c) EXPECT_EQ(generated[c], golden_.cases[c].greedy) << "case" << c;
}

// An FP8 KV cache (--kv-cache-dtype fp8: e4m3 values, a float32 scale per token, head and group) against a bf16 one,
// both on the CPU reference, over whole prompts, token by token and in uneven chunks (MLA: the up-projected prefill
// reads the latent rows back through GatherContext, decode steps the absorbed attention). Where bf16's top-1 margin is
// over 0.2 the top-1 token must agree, and no logit may move by more than the fixture's bound below: the measured worst
// case rounded up, quoted in docs/PERFORMANCE.md. e4m3 keeps 3 mantissa bits, so the dense fixtures move about 13
// times as far as with a bf16 cache against float32 (0.21 against 0.015 at worst; qwen2-tied-tiny's logits are about 4
// times larger). The MoE fixtures' larger figures are router steps: deepseek-v3-tiny's layer-1 router has near-ties
// (tests/data/models/README.md), so a bf16 cache already moves its logits by 2.43 against float32 and flips one
// confident top-1. There, and only where that evidence holds (checked below), up to 5% of the confident positions may
// flip (10% for deepseek-v32-tiny, whose 45 compared confident positions hold one, case3 position 2 at a margin of
// 0.285, that flips in each of the three chunkings: a bf16 cache flips 15 of its confident positions against float32).
struct Fp8KvBound {
  const char* fixture;
  float max_delta;
  int max_flip_percent = 5;
};
constexpr Fp8KvBound kFp8KvBounds[] = {
    {"llama-coder-tiny", 0.25f},     {"llama3-distill-tiny", 0.25f},  {"llama3-distill-fp8-tiny", 0.25f},
    {"qwen2-distill-tiny", 0.25f},   {"qwen2-tied-tiny", 0.85f},      {"deepseek-v2-lite-tiny", 0.75f},
    {"deepseek-v3-tiny", 3.5f},      {"deepseek-v3-fp8-tiny", 2.75f}, {"deepseek-v32-tiny", 3.5f, 10},
    {"deepseek-v32-fp8-tiny", 1.0f},
};
constexpr float kFp8KvMargin = 0.2f;

// Positions compared, confident ones (bf16's margin over kFp8KvMargin), their top-1 flips and the largest move.
struct KvCompare {
  int64_t compared = 0, confident = 0, flips = 0;
  float worst = 0.0f;
};

TEST_P(GoldenTest, Fp8KvCacheAgreesWithBf16Kv) {
  float bound = -1.0f;
  int max_flip_percent = 0;
  for (const Fp8KvBound& b : kFp8KvBounds) {
    if (GetParam() == b.fixture) {
      bound = b.max_delta;
      max_flip_percent = b.max_flip_percent;
    }
  }
  ASSERT_GT(bound, 0.0f) << "no FP8 KV bound for " << GetParam();
  // DeepSeek-V3.2's indexer keeps the top index_topk of a token's context, and the tiny fixtures keep 8 of up to 95
  // tokens: past the first 8 positions a change in the cache's precision changes which 8 (a bf16 cache already flips
  // 15 confident top-1 tokens of deepseek-v32-tiny against float32, and moves a logit by 5.4). There the comparison
  // stops at position index_topk, where every token is still selected and the cache's precision moves only the
  // values, as for V3; the FP8 side row's reads are tested against the values it holds (attention_mla_sparse_test).
  const ModelConfig& cfg = model_->config();
  const int64_t compared_positions = cfg.mla.sparse() ? cfg.mla.index_topk : std::numeric_limits<int64_t>::max();
  // ref's logits against got's over the three chunkings.
  auto compare = [&](DType ref_dtype, DType got_dtype, int64_t position_limit) {
    KvCompare r;
    for (const std::vector<int>& pattern : std::vector<std::vector<int>>{{0}, {1}, {3, 1, 7, 2, 5, 11}}) {
      StatusOr<std::vector<std::vector<float>>> ref =
          testing::ForwardCasesChunked(*model_, cpu_, golden_, pattern, 17, kBlockSize, ref_dtype);
      StatusOr<std::vector<std::vector<float>>> got =
          testing::ForwardCasesChunked(*model_, cpu_, golden_, pattern, 17, kBlockSize, got_dtype);
      EXPECT_TRUE(ref.ok() && got.ok()) << ref.status().ToString() << got.status().ToString();
      if (!ref.ok() || !got.ok()) return r;
      for (size_t c = 0; c < ref->size(); ++c) {
        const int64_t positions = std::min(static_cast<int64_t>((*ref)[c].size()) / vocab_, position_limit);
        for (int64_t t = 0; t < positions; ++t) {
          const float* a = (*ref)[c].data() + t * vocab_;
          const float* b = (*got)[c].data() + t * vocab_;
          r.worst = std::max(r.worst, MaxAbsDiff(a, b, vocab_));
          int32_t best_a = 0, best_b = 0;
          const float margin = testing::Margin(a, vocab_, &best_a);
          testing::Margin(b, vocab_, &best_b);
          ++r.compared;
          if (margin > kFp8KvMargin) {
            ++r.confident;
            if (best_a != best_b) ++r.flips;
          }
        }
      }
    }
    return r;
  };
  const KvCompare fp8 = compare(DType::kBF16, DType::kF8E4M3, compared_positions);
  EXPECT_GT(fp8.confident, fp8.compared / 2);  // the top-1 check has positions to bite on
  EXPECT_LE(fp8.worst, bound);
  if (fp8.flips > 0) {
    // Allowed only for a fixture whose routing a bf16 cache already flips against float32.
    // The evidence over every position: the fixture's routing, not the compared stretch.
    const KvCompare bf16 = compare(DType::kF32, DType::kBF16, std::numeric_limits<int64_t>::max());
    EXPECT_GT(bf16.flips, 0) << fp8.flips << " confident top-1 flips where a bf16 cache makes none";
    EXPECT_LE(fp8.flips * 100, fp8.confident * max_flip_percent) << fp8.flips << " confident top-1 flips";
  }
  RecordProperty("fp8_kv_max_abs_logit_delta", std::to_string(fp8.worst));
  std::cout << fmt::format(
      "[fp8 kv] {}: max |dlogit| {:.4f} (bound {}) over {} positions, {} of {} confident top-1 "
      "flipped\n",
      GetParam(), fp8.worst, bound, fp8.compared, fp8.flips, fp8.confident);
}

// MLA's up-projected prefill (PrefillForm::kExpanded): the context gathered from the latent cache, kv_b over it, and
// MHA per head, against the oracle: the four cases as whole prompts in one step, and in uneven chunks (later chunks
// read their cached prefix back through GatherContext; steps of one token per sequence keep the absorbed form).
class MlaPrefillGoldenTest : public GoldenTest {
 protected:
  void SetUp() override {
    GoldenTest::SetUp();
    SetPrefill(PrefillForm::kExpanded);
  }
  void SetPrefill(PrefillForm form) {
    ModelRunOptions o;
    o.prefill_form = form;
    model_->set_run_options(o);
  }
};

TEST_P(MlaPrefillGoldenTest, UpProjectedPrefillMatchesTheOracle) {
  ExpectMatchesOracle(RunChunked({0}), "up-projected, batched whole prompts");
  ExpectMatchesOracle(RunChunked({3, 1, 7, 2, 5, 11}), "up-projected, uneven chunks");
}

// The absorbed form forced on prefill steps too (the shape rule picks the up-projected one for long prompts).
TEST_P(MlaPrefillGoldenTest, AbsorbedPrefillMatchesTheOracle) {
  SetPrefill(PrefillForm::kCompact);
  ExpectMatchesOracle(RunChunked({0}), "absorbed, batched whole prompts");
  ExpectMatchesOracle(RunChunked({3, 1, 7, 2, 5, 11}), "absorbed, uneven chunks");
}

using testing::FixtureName;

// The delivered expected.safetensors of deepseek-v3-tiny and a re-run of transformers 5.17 / torch 2.11 (float32,
// CPU; the same on CUDA without TF32) agree on every logit of cases 0-2 and on case3 up to position 30. At case3
// position 31 layer 1's router has experts 13 and 11 within 3.4e-5 (0.573924303 vs 0.573889971 with the bias):
// transformers picks 13, as fathom does, while the file follows 11. Case2's greedy tokens part at step 7, where
// transformers' top-1 margin is 0.17. This test pins that finding: if a corrected oracle is delivered, it fails,
// and the override in SetUp should go.
TEST(OracleRerunTest, DeepseekV3TinyDisagreesWithTransformers) {
  const std::string dir = ModelDir("deepseek-v3-tiny");
  StatusOr<GoldenSet> delivered = testing::LoadGolden(dir);
  ASSERT_TRUE(delivered.ok());
  StatusOr<GoldenSet> case2 = testing::LoadGolden(dir, "oracle_rerun.safetensors", 2);
  StatusOr<GoldenSet> case3 = testing::LoadGolden(dir, "oracle_rerun.safetensors", 3);
  ASSERT_TRUE(case2.ok() && case3.ok());
  const auto& a3 = delivered->cases[3];
  const auto& b3 = case3->cases[0];
  ASSERT_EQ(a3.input_ids, b3.input_ids);
  for (int64_t t = 0; t < 31; ++t) EXPECT_LE(MaxAbsDiff(a3.row(t), b3.row(t), a3.vocab), 2e-5f) << t;
  EXPECT_GT(MaxAbsDiff(a3.row(31), b3.row(31), a3.vocab), 1.0f);
  EXPECT_NE(a3.greedy, b3.greedy);
  const auto& a2 = delivered->cases[2];
  const auto& b2 = case2->cases[0];
  EXPECT_LE(MaxAbsDiff(a2.logits.data(), b2.logits.data(), static_cast<int64_t>(a2.logits.size())), 2e-5f);
  EXPECT_EQ(std::vector<int32_t>(a2.greedy.begin(), a2.greedy.begin() + 7),
            std::vector<int32_t>(b2.greedy.begin(), b2.greedy.begin() + 7));
  EXPECT_NE(a2.greedy[7], b2.greedy[7]);
}

// Every fixture of tests/data/models/registry.json, by attention layout. The GQA ones (MHA included): Llama and
// Qwen2, llama3-distill-fp8-tiny among them (the Llama family in DeepSeek-V3's block-scaled FP8 format, the oracle
// run on the dequantized weights, through the same llama.cc).
INSTANTIATE_TEST_SUITE_P(DenseFixtures, GoldenTest, ::testing::ValuesIn(testing::FixtureNames({.attention = "gqa"})),
                         FixtureName);

// MLA over the latent paged cache, MoE routing (V2 softmax greedy, V3 sigmoid noaux_tc), and V3's FP8 weights
// (the oracle ran on the dequantized weights, so the float32 tolerance holds there too).
INSTANTIATE_TEST_SUITE_P(DeepseekFixtures, GoldenTest, ::testing::ValuesIn(testing::FixtureNames({.attention = "mla"})),
                         FixtureName);
INSTANTIATE_TEST_SUITE_P(DeepseekFixtures, MlaPrefillGoldenTest,
                         ::testing::ValuesIn(testing::FixtureNames({.attention = "mla"})), FixtureName);

}  // namespace
}  // namespace fathom
