#include "model/registry.h"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace fathom
