#include "model/weights.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "backend/cpu/cpu_backend.h"
#include "io/model_config.h"
#include "model/registry.h"
#include "testing/golden.h"

namespace fathom {
namespace {

namespace fs = std::filesystem;

TEST(WeightsTest, DummyWeightsAreDeterministicAndShaped) {
  WeightSpec s;
  s.name = "model.layers.0.mlp.up_proj.weight";
  s.shape = {64, 32};
  Tensor a = Tensor::Empty(DType::kBF16, {64, 32}), b = Tensor::Empty(DType::kBF16, {64, 32});
  FillDummy(s, 0, a);
  FillDummy(s, 0, b);
  EXPECT_EQ(std::memcmp(a.data<void>(), b.data<void>(), a.nbytes()), 0);
  double sum = 0, sq = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const float v = Bf16ToF32(a.data<uint16_t>()[i]);
    EXPECT_LE(std::fabs(v), 0.035f);
    sum += v;
    sq += double(v) * v;
  }
  EXPECT_NEAR(std::sqrt(sq / a.numel()), 0.02, 0.002);
  FillDummy(s, 1, b);  // another seed differs
  EXPECT_NE(std::memcmp(a.data<void>(), b.data<void>(), a.nbytes()), 0);
  s.init = WeightInit::kOnes;
  FillDummy(s, 0, a);
  EXPECT_EQ(Bf16ToF32(a.data<uint16_t>()[17]), 1.0f);
}

TEST(WeightsTest, DummyModelRunsWithoutCheckpoint) {
  auto cfg = LoadModelConfig(testing::ModelDir("qwen2-tied-tiny"));
  ASSERT_TRUE(cfg.ok());
  CpuBackend cpu;
  LoadOptions o;
  o.format = LoadFormat::kDummy;
  o.show_progress = false;
  auto m = LoadModel("/nonexistent", *cfg, o, cpu);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  auto kv = KvCache::Allocate(cpu, (*m)->kv_cache_spec(), DType::kF32, 4, 16);
  ASSERT_TRUE(kv.ok());
  ForwardBatch b(16);
  std::vector<int32_t> toks = {1, 2, 3}, table = {0};
  b.AddSequence(toks, 0, table, LogitsMode::kLast);
  Tensor logits;
  ASSERT_TRUE((*m)->Forward(b, *kv, &logits).ok());
  EXPECT_EQ(logits.dim(0), 1);
  EXPECT_TRUE(std::isfinite(logits.data<float>()[5]));
}

TEST(WeightsTest, StatsForRealConfig) {
  auto cfg = LoadModelConfig(testing::DataDir() + "/configs/deepseek-r1-distill-qwen-7b.json");
  ASSERT_TRUE(cfg.ok());
  auto arch = FindArchitecture(cfg->architecture);
  ASSERT_TRUE(arch.ok());
  WeightStats st = ComputeWeightStats(*(*arch)->weight_specs(*cfg), nullptr);
  EXPECT_EQ(st.total_params, 7615616512);  // Qwen2.5-7B: 7.62 B with the untied lm_head
  EXPECT_EQ(st.bytes_by_dtype.at(DType::kBF16), 2 * 7615616512);
  // Decode reads everything but the embedding table (one row of it).
  EXPECT_NEAR(st.bytes_read_per_token, 2.0 * (7615616512 - 152064 * 3584 + 3584), 1.0);
  EXPECT_NEAR(st.active_params, 7615616512.0 - 152064 * 3584 + 3584, 1.0);
}

TEST(WeightsTest, DeepseekTotalAndActiveParameters) {
  struct Want {
    const char* config;
    double total_b, active_b;
  };
  for (const Want& w : {Want{"deepseek-v3", 671.07, 36.63}, Want{"deepseek-v2-lite", 15.71, 2.45}}) {
    auto cfg = LoadModelConfig(testing::DataDir() + "/configs/" + w.config + ".json");
    ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
    auto arch = FindArchitecture(cfg->architecture);
    ASSERT_TRUE(arch.ok());
    WeightStats st = ComputeWeightStats(*(*arch)->weight_specs(*cfg), nullptr);
    EXPECT_NEAR(st.total_params / 1e9, w.total_b, 0.01) << w.config;
    EXPECT_NEAR(st.active_params / 1e9, w.active_b, 0.01) << w.config;
    EXPECT_EQ((*arch)->kv_cache_spec(*cfg).values_per_token() * 2,
              cfg->num_layers * (cfg->mla.kv_lora_rank + cfg->mla.qk_rope_head_dim) * 2);
  }
}

TEST(WeightsTest, MissingExpertAndScaleTensorsAreClearErrors) {
  for (const auto& [fixture, drop] : std::vector<std::pair<std::string, std::string>>{
           {"deepseek-v3-tiny", "model.layers.1.mlp.experts.3.up_proj.weight"},
           {"deepseek-v3-fp8-tiny", "model.layers.0.self_attn.o_proj.weight_scale_inv"}}) {
    const fs::path dir = fs::temp_directory_path() / ("fathom_drop_" + std::to_string(::getpid()));
    fs::remove_all(dir);
    fs::create_directories(dir);
    fs::copy_file(testing::ModelDir(fixture) + "/config.json", dir / "config.json");
    auto src = Checkpoint::Open(testing::ModelDir(fixture));
    ASSERT_TRUE(src.ok());
    std::vector<SafetensorsWriteItem> items;
    for (const std::string& name : (*src)->names()) {
      if (name == drop) continue;
      const SafetensorsEntry* e = *(*src)->Entry(name);
      TensorView v = *(*src)->Get(name);
      items.push_back({name, e->dtype, e->shape, {static_cast<const uint8_t*>(v.raw()), v.nbytes()}});
    }
    ASSERT_TRUE(WriteSafetensors((dir / "model.safetensors").string(), items).ok());
    auto cfg = LoadModelConfig(dir.string());
    ASSERT_TRUE(cfg.ok());
    CpuBackend cpu;
    LoadOptions o;
    o.show_progress = false;
    Status s = LoadModel(dir.string(), *cfg, o, cpu).status();
    EXPECT_EQ(s.code(), StatusCode::kNotFound) << fixture;
    EXPECT_NE(s.message().find(drop), std::string::npos) << s.message();
    fs::remove_all(dir);
  }
}

// Multi-token-prediction layers sit past num_hidden_layers in real V3 and V3.2 checkpoints (V3.2's with its own
// indexer); plain decoding skips them.
TEST(WeightsTest, MtpLayersAreSkippedWithoutError) {
  for (const std::string fixture : {"deepseek-v3-tiny", "deepseek-v32-tiny"}) {
    const fs::path dir = fs::temp_directory_path() / ("fathom_mtp_" + std::to_string(::getpid()));
    fs::remove_all(dir);
    fs::create_directories(dir);
    {
      std::ifstream in(testing::ModelDir(fixture) + "/config.json");
      std::string text((std::istreambuf_iterator<char>(in)), {});
      const std::string key = "\"num_nextn_predict_layers\": 0";
      ASSERT_NE(text.find(key), std::string::npos) << fixture;
      text.replace(text.find(key), key.size(), "\"num_nextn_predict_layers\": 1");
      std::ofstream(dir / "config.json") << text;
    }
    auto src = Checkpoint::Open(testing::ModelDir(fixture));
    ASSERT_TRUE(src.ok());
    std::vector<SafetensorsWriteItem> items;
    for (const std::string& name : (*src)->names()) {
      const SafetensorsEntry* e = *(*src)->Entry(name);
      TensorView v = *(*src)->Get(name);
      items.push_back({name, e->dtype, e->shape, {static_cast<const uint8_t*>(v.raw()), v.nbytes()}});
    }
    auto cfg = LoadModelConfig(dir.string());
    ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
    const std::string mtp = fmt::format("model.layers.{}.", cfg->num_layers);
    std::vector<uint16_t> extra(128 * 256);
    for (const std::string name : {"eh_proj.weight", "self_attn.indexer.wk.weight"}) {
      items.push_back(
          {mtp + name, DType::kBF16, {128, 256}, {reinterpret_cast<const uint8_t*>(extra.data()), extra.size() * 2}});
    }
    ASSERT_TRUE(WriteSafetensors((dir / "model.safetensors").string(), items).ok());
    EXPECT_EQ(cfg->num_nextn_predict_layers, 1);
    CpuBackend cpu;
    LoadOptions o;
    o.show_progress = false;
    auto m = LoadModel(dir.string(), *cfg, o, cpu);
    EXPECT_TRUE(m.ok()) << fixture << ": " << m.status().ToString();
    fs::remove_all(dir);
  }
}

TEST(WeightsTest, TiedEmbeddingsCountOnce) {
  auto cfg = LoadModelConfig(testing::ModelDir("qwen2-tied-tiny"));
  ASSERT_TRUE(cfg.ok());
  auto arch = FindArchitecture(cfg->architecture);
  WeightStats st = ComputeWeightStats(*(*arch)->weight_specs(*cfg), nullptr);
  EXPECT_EQ(st.total_params, 119360);  // the oracle's parameter count (oracle_log.txt)
}

TEST(WeightsTest, ParameterCountsMatchTheOracle) {
  const std::vector<std::pair<std::string, int64_t>> expect = {
      {"llama-coder-tiny", 526976}, {"llama3-distill-tiny", 410240}, {"qwen2-distill-tiny", 459776}};
  for (const auto& [name, params] : expect) {
    auto cfg = LoadModelConfig(testing::ModelDir(name));
    ASSERT_TRUE(cfg.ok());
    auto arch = FindArchitecture(cfg->architecture);
    EXPECT_EQ(ComputeWeightStats(*(*arch)->weight_specs(*cfg), nullptr).total_params, params) << name;
  }
}

class BrokenCheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("fathom_broken_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    fs::copy_file(testing::ModelDir("qwen2-tied-tiny") + "/config.json", dir_ / "config.json");
  }
  void TearDown() override { fs::remove_all(dir_); }
  Status Load() {
    auto cfg = LoadModelConfig(dir_.string());
    if (!cfg.ok()) return cfg.status();
    CpuBackend cpu;
    LoadOptions o;
    o.show_progress = false;
    return LoadModel(dir_.string(), *cfg, o, cpu).status();
  }
  fs::path dir_;
};

TEST_F(BrokenCheckpointTest, MissingWrongShapeAndTruncated) {
  // Missing tensor: a checkpoint with only the embedding.
  std::vector<uint16_t> emb(512 * 64);
  ASSERT_TRUE(WriteSafetensors((dir_ / "model.safetensors").string(),
                               {{"model.embed_tokens.weight",
                                 DType::kBF16,
                                 {512, 64},
                                 {reinterpret_cast<uint8_t*>(emb.data()), emb.size() * 2}}})
                  .ok());
  Status s = Load();
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_NE(s.message().find("model.layers.0.input_layernorm.weight"), std::string::npos) << s.message();
  // Wrong shape.
  ASSERT_TRUE(WriteSafetensors((dir_ / "model.safetensors").string(),
                               {{"model.embed_tokens.weight",
                                 DType::kBF16,
                                 {256, 128},
                                 {reinterpret_cast<uint8_t*>(emb.data()), emb.size() * 2}}})
                  .ok());
  s = Load();
  EXPECT_NE(s.message().find("shape [256, 128], expected [512, 64]"), std::string::npos) << s.message();
  // Truncated copy of the real file.
  const auto src = testing::ModelDir("qwen2-tied-tiny") + "/model.safetensors";
  const auto size = fs::file_size(src);
  fs::copy_file(src, dir_ / "model.safetensors", fs::copy_options::overwrite_existing);
  fs::resize_file(dir_ / "model.safetensors", size / 2);
  s = Load();
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("model.safetensors"), std::string::npos);
  // Integer tensor where a weight belongs.
  std::vector<int32_t> ints(512 * 64);
  ASSERT_TRUE(WriteSafetensors((dir_ / "model.safetensors").string(),
                               {{"model.embed_tokens.weight",
                                 DType::kI32,
                                 {512, 64},
                                 {reinterpret_cast<uint8_t*>(ints.data()), ints.size() * 4}}})
                  .ok());
  s = Load();
  EXPECT_NE(s.message().find("has dtype I32"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace fathom
