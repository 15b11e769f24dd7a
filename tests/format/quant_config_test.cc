// quantization_config and the older quant_config.json / quantize_config.json, read into one QuantConfig.
#include "io/quant_config.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "io/model_config.h"
#include "testing/golden.h"

namespace fathom {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

TEST(QuantConfigTest, Fp8BlockScaled) {
  auto q = ParseQuantizationConfig(json::parse(R"({"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                      "weight_block_size": [128, 64]})"),
                                   "config.json");
  ASSERT_TRUE(q.ok()) << q.status().ToString();
  EXPECT_EQ(q->method, "fp8");
  EXPECT_EQ(q->bits, 8);
  EXPECT_EQ(q->block_n, 128);
  EXPECT_EQ(q->block_k, 64);
  EXPECT_EQ(q->Describe(), "fp8 (8-bit, e4m3, 128x64 blocks)");
  // The block size is what the format rests on: required, positive.
  auto bad =
      ParseQuantizationConfig(json::parse(R"({"quant_method": "fp8", "weight_block_size": [0, 128]})"), "config.json");
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("weight_block_size"), std::string::npos) << bad.status().message();
}

TEST(QuantConfigTest, AwqAndGptqAsTheRealConfigsWriteThem) {
  auto cfg = LoadModelConfig(testing::DataDir() + "/configs/deepseek-r1-distill-qwen-7b-awq.json");
  ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
  EXPECT_EQ(cfg->quant.method, "awq");
  EXPECT_EQ(cfg->quant.bits, 4);
  EXPECT_EQ(cfg->quant.group_size, 128);
  EXPECT_TRUE(cfg->quant.zero_point);
  EXPECT_EQ(cfg->quant.version, "gemm");
  EXPECT_EQ(cfg->quant.Describe(), "awq (4-bit, group 128)");
  auto gptq = LoadModelConfig(testing::DataDir() + "/configs/deepseek-r1-distill-llama-8b-gptq.json");
  ASSERT_TRUE(gptq.ok()) << gptq.status().ToString();
  EXPECT_EQ(gptq->quant.method, "gptq");
  EXPECT_TRUE(gptq->quant.sym);
  EXPECT_FALSE(gptq->quant.desc_act);
  EXPECT_EQ(gptq->quant.checkpoint_format, "gptq");
  // A key of the wrong type is an error naming it, never a default.
  auto wrong = ParseQuantizationConfig(json::parse(R"({"quant_method": "gptq", "bits": "four"})"), "config.json");
  EXPECT_EQ(wrong.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(wrong.status().message().find("'bits'"), std::string::npos) << wrong.status().message();
}

class LegacyQuantFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("fathom_legacy_quant_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    fs::copy_file(testing::ModelDir("qwen2-tied-tiny") + "/config.json", dir_ / "config.json");
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

// AutoAWQ's quant_config.json (w_bit, q_group_size, zero_point, version), as qwen2-tied-tiny-awq-legacy has it.
TEST_F(LegacyQuantFileTest, AutoAwqQuantConfigJson) {
  std::ofstream(dir_ / "quant_config.json") << R"({"zero_point": true, "q_group_size": 32, "w_bit": 4,
                                                   "version": "GEMM"})";
  auto cfg = LoadModelConfig(dir_.string());
  ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
  EXPECT_EQ(cfg->quant.method, "awq");
  EXPECT_EQ(cfg->quant.bits, 4);
  EXPECT_EQ(cfg->quant.group_size, 32);
  EXPECT_EQ(cfg->quant.version, "gemm");
  EXPECT_NE(cfg->quant.source.find("quant_config.json"), std::string::npos);
}

// AutoGPTQ's quantize_config.json (bits, group_size -1, desc_act, sym), as llama-coder-tiny-gptq-perchannel has it.
TEST_F(LegacyQuantFileTest, AutoGptqQuantizeConfigJson) {
  std::ofstream(dir_ / "quantize_config.json") << R"({"bits": 4, "group_size": -1, "desc_act": false, "sym": true,
                                                      "damp_percent": 0.01, "checkpoint_format": "gptq"})";
  auto cfg = LoadModelConfig(dir_.string());
  ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
  EXPECT_EQ(cfg->quant.method, "gptq");
  EXPECT_EQ(cfg->quant.group_size, -1);
  EXPECT_EQ(cfg->quant.Describe(), "gptq (4-bit, one group per column)");
}

TEST_F(LegacyQuantFileTest, BrokenLegacyFileIsAnError) {
  std::ofstream(dir_ / "quantize_config.json") << "{not json";
  auto cfg = LoadModelConfig(dir_.string());
  EXPECT_EQ(cfg.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(cfg.status().message().find("quantize_config.json"), std::string::npos) << cfg.status().message();
}

}  // namespace
}  // namespace fathom
