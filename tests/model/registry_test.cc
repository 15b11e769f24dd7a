#include "model/registry.h"

#include <gtest/gtest.h>

#include <map>

#include "io/model_config.h"
#include "testing/golden.h"

namespace fathom {
namespace {

TEST(RegistryTest, KnownAndUnknownArchitectures) {
  EXPECT_TRUE(FindArchitecture("LlamaForCausalLM").ok());
  EXPECT_TRUE(FindArchitecture("Qwen2ForCausalLM").ok());
  auto bad = FindArchitecture("GPT2LMHeadModel");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("supported: LlamaForCausalLM, Qwen2ForCausalLM"), std::string::npos)
      << bad.status().message();
}

TEST(RegistryTest, TiedLmHeadFallsBackToEmbedding) {
  ModelConfig c;
  c.vocab_size = 10;
  c.hidden_size = 4;
  c.intermediate_size = 8;
  c.num_layers = 1;
  c.num_heads = 2;
  c.num_kv_heads = 1;
  c.head_dim = 2;
  c.tie_word_embeddings = true;
  auto arch = FindArchitecture("Qwen2ForCausalLM");
  auto specs_or = (*arch)->weight_specs(c);
  ASSERT_TRUE(specs_or.ok()) << specs_or.status().ToString();
  const std::vector<WeightSpec>& specs = *specs_or;
  ASSERT_EQ(specs.back().name, "lm_head.weight");
  EXPECT_EQ(specs.back().fallback, "model.embed_tokens.weight");
  EXPECT_TRUE(specs.back().shares_storage);
  KvCacheSpec kv = (*arch)->kv_cache_spec(c);
  EXPECT_EQ(kv.values_per_token(), 1 * 1 * (2 + 2));
}

// Expert parallelism: rank r's specs hold only its share of the routed experts, each whole (the checkpoint's shape,
// no shard), while attention and the shared experts stay split; tensor-parallel experts instead split every expert.
TEST(RegistryTest, ExpertParallelRanksHoldTheirExpertsWhole) {
  StatusOr<ModelConfig> cfg = LoadModelConfig(testing::ModelDir("deepseek-v2-lite-tiny"));
  ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
  ASSERT_EQ(cfg->moe.n_routed_experts, 8);
  auto arch = FindArchitecture(cfg->architecture);
  ASSERT_TRUE(arch.ok());
  const auto specs_of = [&](int64_t rank, bool ep) {
    auto s = (*arch)->weight_specs(*cfg, ParallelConfig{.tp_size = 2, .tp_rank = rank, .expert_parallel = ep});
    FATHOM_CHECK(s.ok(), "{}", s.status().ToString());
    std::map<std::string, WeightSpec> by_name;
    for (const WeightSpec& w : *s) by_name[w.name] = w;
    return by_name;
  };
  const std::string layer = "model.layers.1.mlp.";
  const auto ep1 = specs_of(1, true);
  EXPECT_EQ(ep1.count(layer + "experts.3.gate_proj.weight"), 0u);
  ASSERT_EQ(ep1.count(layer + "experts.4.gate_proj.weight"), 1u);
  ASSERT_EQ(ep1.count(layer + "experts.7.down_proj.weight"), 1u);
  const WeightSpec& gate = ep1.at(layer + "experts.4.gate_proj.weight");
  EXPECT_FALSE(gate.shard.sharded());
  EXPECT_EQ(gate.shape, (std::vector<int64_t>{cfg->moe.moe_intermediate_size, cfg->hidden_size}));
  EXPECT_TRUE(ep1.at(layer + "shared_experts.gate_proj.weight").shard.sharded());
  EXPECT_TRUE(ep1.at("model.layers.1.self_attn.o_proj.weight").shard.sharded());
  const auto ep0 = specs_of(0, true);
  EXPECT_EQ(ep0.count(layer + "experts.3.up_proj.weight"), 1u);
  EXPECT_EQ(ep0.count(layer + "experts.4.up_proj.weight"), 0u);

  const auto tp1 = specs_of(1, false);  // every expert, each split
  ASSERT_EQ(tp1.count(layer + "experts.0.gate_proj.weight"), 1u);
  EXPECT_EQ(tp1.at(layer + "experts.0.gate_proj.weight").shape[0], cfg->moe.moe_intermediate_size / 2);
  EXPECT_EQ(tp1.at(layer + "experts.0.down_proj.weight").shape[1], cfg->moe.moe_intermediate_size / 2);

  // Experts that do not divide among the ranks are refused by name.
  ModelConfig odd = *cfg;
  odd.moe.n_routed_experts = 6;
  odd.num_heads = 4;
  auto refused = (*arch)->weight_specs(odd, ParallelConfig{.tp_size = 4, .tp_rank = 0, .expert_parallel = true});
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("n_routed_experts (6) does not split into 4"), std::string::npos)
      << refused.status().ToString();
}

// The lm_head is vocab-parallel where the vocabulary divides and the head is untied; tied heads stay whole.
TEST(RegistryTest, LmHeadIsSplitByVocabularyWhereItCanBe) {
  StatusOr<ModelConfig> cfg = LoadModelConfig(testing::ModelDir("llama3-distill-tiny"));
  ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
  ASSERT_FALSE(cfg->tie_word_embeddings);
  auto arch = FindArchitecture(cfg->architecture);
  ASSERT_TRUE(arch.ok());
  const auto head_of = [&](const ModelConfig& c, int64_t tp, int64_t rank) {
    auto specs = (*arch)->weight_specs(c, ParallelConfig{.tp_size = tp, .tp_rank = rank});
    FATHOM_CHECK(specs.ok(), "{}", specs.status().ToString());
    for (const WeightSpec& w : *specs) {
      if (w.name == "lm_head.weight") return w;
    }
    FATHOM_CHECK(false, "no lm_head");
    return WeightSpec{};
  };
  ASSERT_EQ(cfg->vocab_size % 2, 0);
  const WeightSpec split = head_of(*cfg, 2, 1);
  EXPECT_EQ(split.shape, (std::vector<int64_t>{cfg->vocab_size / 2, cfg->hidden_size}));
  EXPECT_EQ(split.shard.dim, 0);
  EXPECT_EQ(split.shard.index, 1);
  EXPECT_FALSE(head_of(*cfg, 1, 0).shard.sharded());
  ModelConfig tied = *cfg;
  tied.tie_word_embeddings = true;
  EXPECT_FALSE(head_of(tied, 2, 1).shard.sharded());
  ModelConfig odd = *cfg;
  odd.vocab_size += 1;
  EXPECT_EQ(head_of(odd, 2, 0).shape[0], odd.vocab_size);
}

}  // namespace
}  // namespace fathom
