// The device memory plan on hand-made numbers: the split, whole blocks only, and the errors with their shortfalls.
#include "engine/memory_plan.h"

#include <gtest/gtest.h>

namespace fathom {
namespace {

constexpr int64_t kGiB = 1ll << 30, kMiB = 1ll << 20;

MemoryPlanInput H200Like() {
  MemoryPlanInput in;
  in.total_bytes = 140 * kGiB;
  in.free_bytes = 124 * kGiB;  // 16 GiB of weights and runtime
  in.utilization = 0.9;
  in.activation_bytes = 2 * kGiB;
  in.max_batched_tokens = 2048;
  in.kv_bytes_per_token = 114688;  // R1-Distill-Qwen-7B, float32 KV
  in.block_size = 16;
  in.max_model_len = 131072;
  return in;
}

TEST(MemoryPlanTest, KvCacheTakesWhatTheBudgetLeavesInWholeBlocks) {
  auto plan = PlanDeviceMemory(H200Like());
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_EQ(plan->budget_bytes, 126 * kGiB);
  EXPECT_EQ(plan->in_use_bytes, 16 * kGiB);
  const int64_t left = 126 * kGiB - 16 * kGiB - 2 * kGiB;  // 108 GiB
  const int64_t block = 114688 * 16;
  EXPECT_EQ(plan->kv_bytes, left / block * block);
  EXPECT_EQ(plan->kv_tokens, left / block * 16);
  EXPECT_EQ(plan->kv_tokens, 1011120);
  const std::string d = plan->Describe();
  EXPECT_NE(d.find("1011120 tokens"), std::string::npos) << d;
  EXPECT_NE(d.find("weights and runtime 16.00 GiB"), std::string::npos) << d;
}

TEST(MemoryPlanTest, WeightsAndActivationsOverTheBudgetSayByHowMuch) {
  MemoryPlanInput in = H200Like();
  in.max_model_len = 4096;
  in.free_bytes = 20 * kGiB;  // 120 GiB in use: 126 - 120 - 2 = 4 GiB left: still fits
  ASSERT_TRUE(PlanDeviceMemory(in).ok());
  in.free_bytes = 15 * kGiB;  // 125 GiB in use: 126 - 125 - 2 = -1 GiB
  auto plan = PlanDeviceMemory(in);
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), StatusCode::kResourceExhausted);
  const std::string m = plan.status().message();
  EXPECT_NE(m.find("already use 125.00 GiB"), std::string::npos) << m;
  EXPECT_NE(m.find("leaves 0 B for the KV cache"), std::string::npos) << m;
  EXPECT_NE(m.find("1.00 GiB short of a single block"), std::string::npos) << m;  // 1 GiB + 1.75 MiB, rounded
  EXPECT_NE(m.find("--gpu-memory-utilization"), std::string::npos) << m;
}

// --gpu-memory-utilization is per instance (as in vLLM): memory other processes held at startup does not count
// against the budget, but the budget must have been free then.
TEST(MemoryPlanTest, OtherProcessesDoNotCountAgainstThisInstancesBudget) {
  MemoryPlanInput in = H200Like();
  in.utilization = 0.5;              // 70 GiB
  in.start_free_bytes = 100 * kGiB;  // 40 GiB held by another server
  in.free_bytes = 84 * kGiB;         // 16 GiB of our weights since
  in.max_model_len = 4096;
  auto plan = PlanDeviceMemory(in);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_EQ(plan->in_use_bytes, 16 * kGiB);
  const int64_t block = 114688 * 16;
  EXPECT_EQ(plan->kv_bytes, (52 * kGiB) / block * block);  // 70 - 16 - 2
  EXPECT_LE(plan->kv_bytes + plan->activation_bytes, in.free_bytes);

  in.start_free_bytes = 60 * kGiB;  // less than the 70 GiB asked for
  in.free_bytes = 44 * kGiB;
  plan = PlanDeviceMemory(in);
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), StatusCode::kResourceExhausted);
  const std::string m = plan.status().message();
  EXPECT_NE(m.find("asks for 70.00 GiB"), std::string::npos) << m;
  EXPECT_NE(m.find("only 60.00 GiB was free at startup"), std::string::npos) << m;
  EXPECT_NE(m.find("10.00 GiB short"), std::string::npos) << m;
}

TEST(MemoryPlanTest, CheckBudgetFitsTheWeightsBeforeLoading) {
  // 140 GiB GPU, 0.5 of it: 70 GiB; 40 GiB held by others at startup.
  EXPECT_TRUE(CheckBudgetFits(140 * kGiB, 100 * kGiB, 100 * kGiB, 0.5, 69 * kGiB).ok());
  Status st = CheckBudgetFits(140 * kGiB, 100 * kGiB, 100 * kGiB, 0.5, 71 * kGiB);
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(st.message().find("1.00 GiB short"), std::string::npos) << st.message();
  st = CheckBudgetFits(140 * kGiB, 60 * kGiB, 60 * kGiB, 0.5, 1 * kGiB);
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(st.message().find("was free at startup"), std::string::npos) << st.message();
  // Unknown start: everything in use counts (the old rule).
  EXPECT_FALSE(CheckBudgetFits(140 * kGiB, 100 * kGiB, -1, 0.5, 31 * kGiB).ok());
  EXPECT_EQ(CheckBudgetFits(140 * kGiB, 100 * kGiB, -1, 1.5, 1).code(), StatusCode::kInvalidArgument);
}

TEST(MemoryPlanTest, ContextThatDoesNotFitTheKvCacheIsRefused) {
  MemoryPlanInput in = H200Like();
  in.utilization = 0.2;  // 28 GiB budget: 28 - 16 - 2 = 10 GiB = 93,616 tokens < 131,072
  auto plan = PlanDeviceMemory(in);
  ASSERT_FALSE(plan.ok());
  const std::string m = plan.status().message();
  EXPECT_NE(m.find("fewer than one request of --max-model-len 131072"), std::string::npos) << m;
  in.max_model_len = 32768;
  ASSERT_TRUE(PlanDeviceMemory(in).ok());
}

TEST(MemoryPlanTest, UtilizationOutsideZeroToOneIsAnError) {
  MemoryPlanInput in = H200Like();
  for (double u : {0.0, -0.5, 1.01}) {
    in.utilization = u;
    auto plan = PlanDeviceMemory(in);
    ASSERT_FALSE(plan.ok());
    EXPECT_EQ(plan.status().code(), StatusCode::kInvalidArgument);
  }
}

TEST(MemoryPlanTest, ActivationReserveGrowsWithTheBatchedTokens) {
  ModelConfig cfg;
  cfg.hidden_size = 3584;
  cfg.intermediate_size = 18944;
  cfg.num_heads = 28;
  cfg.num_kv_heads = 4;
  cfg.head_dim = 128;
  cfg.vocab_size = 152064;
  const int64_t small = ActivationReserveBytes(cfg, 256, 256), large = ActivationReserveBytes(cfg, 8192, 256);
  EXPECT_GT(large, small);
  // 8192 tokens x (4 x (4 x 3584 + 2 x 3584 + 2 x 1024 + 2 x 18944) + 2 x 18944) B, plus 256 logits rows, + 25%,
  // + 288 MiB.
  const int64_t per_token = 4 * (4 * 3584 + 2 * 3584 + 2 * 1024 + 2 * 18944) + 2 * 18944;
  const int64_t reserve = 8192 * per_token + 256 * 152064 * 4;
  EXPECT_EQ(large, reserve + reserve / 4 + 288 * kMiB);
}

// DeepSeek-V3: MLA's attention per head (both forms), and room to dequantize the widest f8 weight (the dense MLP's
// 18432 x 7168 gate) to bf16 next to its input.
TEST(MemoryPlanTest, ActivationReserveCoversMlaAndFp8Dequantization) {
  ModelConfig cfg;
  cfg.hidden_size = 7168;
  cfg.intermediate_size = 18432;
  cfg.num_heads = 128;
  cfg.num_kv_heads = 128;
  cfg.head_dim = 128;
  cfg.vocab_size = 129280;
  cfg.mla = MlaConfig{1536, 512, 128, 64, 128};
  cfg.moe.n_routed_experts = 256;
  cfg.moe.n_shared_experts = 1;
  cfg.moe.num_experts_per_tok = 8;
  cfg.moe.moe_intermediate_size = 2048;
  const int64_t plain = ActivationReserveBytes(cfg, 2048, 256);
  cfg.quant.method = "fp8";
  const int64_t with_fp8 = ActivationReserveBytes(cfg, 2048, 256);
  // The input staged as bf16: 2048 tokens of the widest input (the routed experts' 8 + 1 shared x 2048 columns).
  const int64_t dequant = int64_t{2} * 18432 * 7168 + int64_t{2} * 2048 * 18432;
  EXPECT_NEAR(static_cast<double>(with_fp8 - plain), static_cast<double>(dequant + dequant / 4), 1.0);
  // 2048 tokens x 4 B x (128 heads x (2 x 512 + 64) of the absorbed form, and per context row of the up-projected
  // prefill the latent row (576) and 128 heads x (k_nope 128 + v 128)), with the 25% margin.
  EXPECT_GT(plain, int64_t{2048} * 4 * (128 * (2 * 512 + 64) + 128 * 256 + 576) * 5 / 4);
}

// Tensor parallelism: every rank holds the same blocks, so the rank with the least room sets the cache; the plan
// says so, and a rank that does not fit is named.
TEST(MemoryPlanTest, TheRankWithTheLeastRoomSetsEveryRanksCache) {
  MemoryPlanInput a = H200Like(), b = H200Like();
  b.free_bytes = 120 * kGiB;  // rank 1 holds 4 GiB more
  b.start_free_bytes = -1;
  auto plan = PlanDeviceMemoryPerRank({a, b});
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  auto one = PlanDeviceMemory(b);
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(plan->kv_bytes, one->kv_bytes);
  EXPECT_LT(plan->kv_bytes, PlanDeviceMemory(a)->kv_bytes);
  EXPECT_EQ(plan->ranks, 2);
  EXPECT_EQ(plan->binding_rank, 1);
  EXPECT_NE(plan->Describe().find("per rank (2 tensor-parallel ranks; rank 1 has the least room)"), std::string::npos)
      << plan->Describe();
  b.free_bytes = 10 * kGiB;  // rank 1's weights leave no room
  auto refused = PlanDeviceMemoryPerRank({a, b});
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(refused.status().message().find("tensor-parallel rank 1"), std::string::npos)
      << refused.status().ToString();
  EXPECT_EQ(PlanDeviceMemoryPerRank({a})->Describe().find("per rank"), std::string::npos);
}

}  // namespace
}  // namespace fathom
