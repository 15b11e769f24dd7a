// DecodeGraphs' buckets and its refusal on a backend without graphs. Replays against eager steps are tested on the
// GPU (tests/backend/cuda).
#include "engine/decode_graphs.h"

#include <gtest/gtest.h>

#include "backend/cpu/cpu_backend.h"
#include "io/model_config.h"
#include "model/registry.h"
#include "testing/golden.h"

namespace fathom {
namespace {

class DecodeGraphsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string dir = testing::ModelDir("qwen2-distill-tiny");
    auto cfg = LoadModelConfig(dir);
    ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
    LoadOptions opts;
    opts.show_progress = false;
    auto m = LoadModel(dir, *cfg, opts, cpu_);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    model_ = std::move(m).value();
    auto kv = KvCache::Allocate(cpu_, model_->kv_cache_spec(), DType::kF32, 8, 16);
    ASSERT_TRUE(kv.ok());
    kv_ = std::move(kv).value();
  }
  CpuBackend cpu_;
  std::unique_ptr<Model> model_;
  KvCache kv_;
};

TEST_F(DecodeGraphsTest, BucketsCoverEveryBatchAndContext) {
  DecodeGraphs g(*model_, cpu_, kv_, {.max_batch = 100, .max_model_len = 5000, .min_context = 1024});
  EXPECT_EQ(g.batch_buckets(), (std::vector<int32_t>{1, 2, 4, 8, 16, 32, 48, 64, 80, 96, 100}));
  EXPECT_EQ(g.context_buckets(), (std::vector<int32_t>{1024, 2048, 4096, 5000}));
  DecodeGraphs small(*model_, cpu_, kv_, {.max_batch = 3, .max_model_len = 512, .min_context = 1024});
  EXPECT_EQ(small.batch_buckets(), (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(small.context_buckets(), (std::vector<int32_t>{512}));
  DecodeGraphs exact(*model_, cpu_, kv_, {.max_batch = 16, .max_model_len = 2048, .min_context = 1024});
  EXPECT_EQ(exact.batch_buckets(), (std::vector<int32_t>{1, 2, 4, 8, 16}));
  EXPECT_EQ(exact.context_buckets(), (std::vector<int32_t>{1024, 2048}));
}

TEST_F(DecodeGraphsTest, TheCpuBackendHasNoGraphs) {
  ASSERT_TRUE(model_->SupportsForwardOnDevice());
  DecodeGraphs g(*model_, cpu_, kv_, {.max_batch = 8, .max_model_len = 128});
  EXPECT_FALSE(g.enabled());
  ForwardBatch b(16);
  b.AddSequence(std::vector<int32_t>{5}, 3, std::vector<int32_t>{1}, LogitsMode::kLast);
  EXPECT_FALSE(g.Accepts(b));  // a decode step, but nothing to replay it with
  EXPECT_FALSE(g.CaptureCommon(nullptr).ok());
}

}  // namespace
}  // namespace fathom
