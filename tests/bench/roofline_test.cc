// Roofline arithmetic: bytes per decode step (dense, embedding rows, experts), FLOPs, MBU/MFU, the bound.
#include "bench/roofline.h"

#include <gtest/gtest.h>

#include <cmath>
#include <optional>
#include <string>

#include "bench/workload.h"
#include "model/registry.h"

namespace fathom::bench {
namespace {

TEST(PeaksTest, KnownGpusByTheirDriversNames) {
  EXPECT_EQ(KnownGpuPeaks("NVIDIA H200")->bandwidth, 4.5e12);  // measured here
  const std::optional<Peaks> h100 = KnownGpuPeaks("NVIDIA H100 80GB HBM3");
  ASSERT_TRUE(h100.has_value());
  EXPECT_EQ(h100->bandwidth, 3.35e12);
  EXPECT_EQ(h100->flops, 989e12);
  EXPECT_NE(h100->bandwidth_source.find("NVIDIA H100 80GB HBM3"), std::string::npos);
  EXPECT_EQ(KnownGpuPeaks("NVIDIA H100 PCIe")->bandwidth, 2.0e12);    // not the SXM part's
  EXPECT_EQ(KnownGpuPeaks("NVIDIA GH200 480GB")->bandwidth, 4.0e12);  // not the H200's
  EXPECT_EQ(KnownGpuPeaks("NVIDIA A100-SXM4-80GB")->flops, 312e12);
  EXPECT_FALSE(KnownGpuPeaks("NVIDIA GeForce RTX 3050").has_value());
  EXPECT_FALSE(KnownGpuPeaks("").has_value());
}

TEST(PeaksTest, CudaTakesTheDevicesPeaksAndFlagsWin) {
  const Peaks h100 = ResolvePeaks("cuda", std::nullopt, std::nullopt, "NVIDIA H100 80GB HBM3").value();
  EXPECT_EQ(h100.bandwidth, 3.35e12);
  const Peaks flagged = ResolvePeaks("cuda:1", 2.9e12, std::nullopt, "NVIDIA H100 80GB HBM3").value();
  EXPECT_EQ(flagged.bandwidth, 2.9e12);
  EXPECT_EQ(flagged.bandwidth_source, "--peak-bandwidth");
  EXPECT_EQ(flagged.flops, 989e12);
  // A GPU not in the table: the H200's figures, and the sources say so.
  const Peaks other = ResolvePeaks("cuda", std::nullopt, std::nullopt, "NVIDIA GeForce RTX 3050").value();
  EXPECT_EQ(other.bandwidth, 4.5e12);
  EXPECT_NE(other.bandwidth_source.find("RTX 3050 is not in the table"), std::string::npos);
  EXPECT_FALSE(ResolvePeaks("cuda", -1.0, std::nullopt, "NVIDIA H200").ok());
}

TEST(RooflineTest, WeightBytesPerStep) {
  ModelCosts c;
  c.tensors = {{.bytes = 1000, .read_fraction = 1.0},   // dense: read once whatever the batch
               {.bytes = 800, .read_fraction = 0.25},   // an expert group, top-2 of 8
               {.bytes = 100, .read_fraction = 0.01}};  // an embedding table of 100 rows
  EXPECT_DOUBLE_EQ(c.WeightBytesPerStep(1), 1000 + 200 + 1);
  EXPECT_NEAR(c.WeightBytesPerStep(2), 1000 + 800 * (1 - 0.75 * 0.75) + 100 * (1 - 0.99 * 0.99), 1e-9);
  EXPECT_NEAR(c.WeightBytesPerStep(1000), 1000 + 800 + 100, 0.01);  // 100 * 0.99^1000 = 0.004 rows short
  c.kv_bytes_per_token = 10;
  EXPECT_DOUBLE_EQ(c.KvBytesPerStep(4, 100.5), 4020);
}

TEST(RooflineTest, DecodeRoofline) {
  ModelCosts c;
  c.tensors = {{.bytes = 1e9, .read_fraction = 1.0}};
  c.matmul_params = 5e8;
  c.kv_bytes_per_token = 1000;
  c.attention_flops_per_context_token = 100;
  const Peaks p{.bandwidth = 1e11, .flops = 1e13};
  const Roofline r = DecodeRoofline(c, p, /*batch=*/4, /*context=*/100, /*measured_step_s=*/0.02);
  EXPECT_DOUBLE_EQ(r.weight_bytes, 1e9);
  EXPECT_DOUBLE_EQ(r.kv_bytes, 4 * 100 * 1000);
  EXPECT_DOUBLE_EQ(r.flops, 4 * (2 * 5e8 + 100 * 100));
  EXPECT_NEAR(r.achieved_bandwidth, r.bytes / 0.02, 1e-3);
  EXPECT_NEAR(r.mbu, r.bytes / 0.02 / 1e11, 1e-12);
  EXPECT_NEAR(r.mfu, r.flops / 0.02 / 1e13, 1e-12);
  EXPECT_NEAR(r.bandwidth_bound_tokens_per_s, 4 * 1e11 / r.bytes, 1e-9);
  EXPECT_NEAR(r.compute_bound_tokens_per_s, 4 * 1e13 / r.flops, 1e-9);
  EXPECT_EQ(r.bound, "memory");
  EXPECT_DOUBLE_EQ(r.theoretical_tokens_per_s, r.bandwidth_bound_tokens_per_s);
  EXPECT_DOUBLE_EQ(r.measured_tokens_per_s, 200);
}

TEST(RooflineTest, Qwen15BCosts) {
  auto cfg = LoadModelConfig(std::string(FATHOM_TEST_DATA_DIR) + "/configs/deepseek-r1-distill-qwen-1.5b.json");
  ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
  auto arch = FindArchitecture(cfg->architecture);
  ASSERT_TRUE(arch.ok());
  const auto specs = *(*arch)->weight_specs(*cfg);
  const ModelCosts c = ComputeModelCosts(*cfg, specs, {}, (*arch)->kv_cache_spec(*cfg), DType::kBF16);
  // 1.78 B parameters in bf16; decode reads all but the embedding table (one row) at batch 1.
  EXPECT_NEAR(c.weight_bytes / 2, 1.777e9, 0.01e9);
  const double embed = 151936.0 * 1536;
  EXPECT_NEAR(c.weight_bytes_b1, c.weight_bytes - 2 * embed + 2 * 1536, 1e3);
  EXPECT_NEAR(c.WeightBytesPerStep(1), c.weight_bytes_b1, 1.0);
  // Matmul parameters: everything but the embedding table and the 1-D norms/biases.
  EXPECT_GT(c.matmul_params, 1.5e9);
  EXPECT_LT(c.matmul_params, c.weight_bytes / 2 - embed);
  EXPECT_DOUBLE_EQ(c.lm_head_params, embed);
  // KV: 28 layers x 2 KV heads x (128 + 128) values x 2 bytes.
  EXPECT_DOUBLE_EQ(c.kv_bytes_per_token, 28 * 2 * 256 * 2);
  EXPECT_DOUBLE_EQ(c.attention_flops_per_context_token, 2.0 * 28 * 12 * 256);
  EXPECT_NEAR(c.PrefillFlops(1, 1), c.DecodeFlopsPerToken(1), 1e-3);
}

// DeepSeek-V3.2: a decoded token reads every context token's indexer key (128 values a layer) but the latent rows of
// only the 2,048 it keeps, and spends the attention FLOPs on those; below 2,048 tokens of context that is all of them.
TEST(RooflineTest, DeepseekV32ReadsTheIndexerKeysOfEveryTokenAndTheLatentOfTheTopK) {
  auto cfg = LoadModelConfig(std::string(FATHOM_TEST_DATA_DIR) + "/configs/deepseek-v3.2.json");
  ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
  auto arch = FindArchitecture(cfg->architecture);
  ASSERT_TRUE(arch.ok());
  const auto specs = *(*arch)->weight_specs(*cfg);
  const ModelCosts c = ComputeModelCosts(*cfg, specs, {}, (*arch)->kv_cache_spec(*cfg), DType::kBF16);
  EXPECT_DOUBLE_EQ(c.kv_bytes_per_token, 61.0 * (576 + 128) * 2);
  EXPECT_DOUBLE_EQ(c.scan_bytes_per_token, 61.0 * 128 * 2);
  EXPECT_DOUBLE_EQ(c.KvBytesPerStep(1, 1000), 1000 * c.kv_bytes_per_token);
  // 128k of context: 2,048 latent rows and 131,072 indexer keys a layer.
  EXPECT_DOUBLE_EQ(c.KvBytesPerStep(2, 131072), 2 * (2048.0 * 61 * 576 * 2 + 131072.0 * 61 * 128 * 2));
  EXPECT_DOUBLE_EQ(c.DecodeFlopsPerToken(131072) - c.DecodeFlopsPerToken(65536),
                   65536.0 * 2 * 61 * 64 * 128);  // past 2,048 only the indexer grows
}

// A 4-bit checkpoint does the same matmuls as its bf16 original: a packed qweight counts its eight weights an int32,
// zeros and scales none; its bytes are the packed ones.
TEST(RooflineTest, Int4CostsCountUnpackedParams) {
  const auto costs = [](const std::string& name) {
    auto cfg = LoadModelConfig(std::string(FATHOM_TEST_DATA_DIR) + "/configs/" + name);
    EXPECT_TRUE(cfg.ok()) << cfg.status().ToString();
    auto arch = FindArchitecture(cfg->architecture);
    EXPECT_TRUE(arch.ok());
    const auto specs = *(*arch)->weight_specs(*cfg);
    return ComputeModelCosts(*cfg, specs, {}, (*arch)->kv_cache_spec(*cfg), DType::kBF16);
  };
  const ModelCosts bf16 = costs("deepseek-r1-distill-qwen-7b.json");
  const ModelCosts awq = costs("deepseek-r1-distill-qwen-7b-awq.json");
  EXPECT_DOUBLE_EQ(awq.matmul_params, bf16.matmul_params);
  EXPECT_GT(bf16.matmul_params, 7.0e9);
  EXPECT_LT(awq.weight_bytes_b1, 0.35 * bf16.weight_bytes_b1);
}

TEST(ArrivalTest, PoissonAndGamma) {
  const auto all_at_once = ArrivalTimes(5, std::numeric_limits<double>::infinity(), 1.0, 0);
  for (double t : all_at_once) EXPECT_EQ(t, 0.0);
  const auto a = ArrivalTimes(20000, 10.0, 1.0, 42);
  EXPECT_EQ(a.front(), 0.0);
  EXPECT_TRUE(std::is_sorted(a.begin(), a.end()));
  const double mean_gap = a.back() / 19999;
  EXPECT_NEAR(mean_gap, 0.1, 0.005);
  EXPECT_EQ(a, ArrivalTimes(20000, 10.0, 1.0, 42));  // seeded
  EXPECT_NE(a, ArrivalTimes(20000, 10.0, 1.0, 43));
  // Gamma: same mean, variance mean^2 / shape. Burstier (shape 0.25) spreads gaps four times as much as Poisson.
  auto var = [](const std::vector<double>& t) {
    double m = 0, v = 0;
    for (size_t i = 1; i < t.size(); ++i) m += t[i] - t[i - 1];
    m /= static_cast<double>(t.size() - 1);
    for (size_t i = 1; i < t.size(); ++i) v += (t[i] - t[i - 1] - m) * (t[i] - t[i - 1] - m);
    return v / static_cast<double>(t.size() - 1);
  };
  const auto bursty = ArrivalTimes(20000, 10.0, 0.25, 42);
  EXPECT_NEAR(bursty.back() / 19999, 0.1, 0.01);
  EXPECT_NEAR(var(a), 0.01, 0.002);
  EXPECT_NEAR(var(bursty), 0.04, 0.008);
}

TEST(WorkloadTest, SampleLengths) {
  std::mt19937_64 rng(1);
  auto fixed = SampleLengths(100, 0.0, 10, rng);
  for (int32_t v : fixed) EXPECT_EQ(v, 100);
  auto ranged = SampleLengths(100, 0.5, 2000, rng);
  EXPECT_EQ(*std::min_element(ranged.begin(), ranged.end()), 50);
  EXPECT_EQ(*std::max_element(ranged.begin(), ranged.end()), 150);
  auto tiny = SampleLengths(1, 0.9, 10, rng);
  for (int32_t v : tiny) EXPECT_GE(v, 1);
}

}  // namespace
}  // namespace fathom::bench
