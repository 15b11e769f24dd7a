// DecodeGraphs' buckets, its refusal on a backend without graphs, and an engine whose graph capture fails serving
// eagerly. Replays against eager steps are tested on the GPU (tests/backend/cuda).
#include "engine/decode_graphs.h"

#include <gtest/gtest.h>

#include "backend/cpu/cpu_backend.h"
#include "engine/engine_core.h"
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

// A backend that offers graphs but cannot record one, as the GPU cannot when a forward reads results back on the host
// (DeepSeek-V3's FP8 experts take the host-sorted path). On the CPU the capture already fails in its padding rows'
// KV write; either way the engine must start and serve eagerly.
class CaptureFailsBackend : public CpuBackend {
 public:
  bool SupportsGraphs() const override { return true; }
  Status BeginCapture() override { return OkStatus(); }
  StatusOr<int64_t> EndCapture() override { return FailedPreconditionError("this forward cannot be recorded"); }
};

TEST(DecodeGraphsEngineTest, AFailedCaptureLeavesTheEngineServingEagerly) {
  const std::string dir = testing::ModelDir("qwen2-distill-tiny");
  auto cfg = LoadModelConfig(dir);
  ASSERT_TRUE(cfg.ok());
  LoadOptions opts;
  opts.show_progress = false;
  auto golden = testing::LoadGolden(dir);
  ASSERT_TRUE(golden.ok());
  const auto& c = golden->cases[1];
  std::vector<std::vector<int32_t>> outputs;
  for (bool failing : {false, true}) {
    CpuBackend plain;
    CaptureFailsBackend fails;
    Backend& be = failing ? static_cast<Backend&>(fails) : static_cast<Backend&>(plain);
    auto model = LoadModel(dir, *cfg, opts, be);
    ASSERT_TRUE(model.ok());
    EngineConfig ec;
    ec.num_blocks = 64;
    ec.block_size = 16;
    auto core = EngineCore::Create(**model, be, ec, nullptr);
    ASSERT_TRUE(core.ok()) << core.status().ToString();  // before: the failed capture failed the engine's start
    SamplingParams p;
    p.temperature = 0.0f;
    p.max_tokens = 8;
    p.ignore_eos = true;
    auto stream = std::make_shared<RequestStream>("r", 1);
    ASSERT_TRUE((*core)->AddRequest({.id = "r", .prompt = c.input_ids, .sampling = p}, stream).ok());
    while ((*core)->HasUnfinished()) ASSERT_TRUE((*core)->Step().ok());
    std::vector<int32_t> tokens;
    while (std::optional<RequestOutput> o = stream->TryNext()) {
      tokens.insert(tokens.end(), o->token_ids.begin(), o->token_ids.end());
    }
    ASSERT_EQ(tokens.size(), 8u);
    outputs.push_back(tokens);
  }
  EXPECT_EQ(outputs[0], outputs[1]);
}

}  // namespace
}  // namespace fathom
