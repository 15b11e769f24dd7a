#include "io/model_config.h"

#include <gtest/gtest.h>

#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "testing/golden.h"

namespace fathom {
namespace {

using json = nlohmann::json;

json Base() {
  return json::parse(R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 512,
    "hidden_size": 128, "intermediate_size": 344, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 4, "rms_norm_eps": 1e-6, "rope_theta": 100000, "torch_dtype": "bfloat16",
    "eos_token_id": 2, "bos_token_id": 1})");
}

TEST(ModelConfigTest, ReferenceFixtures) {
  auto c = LoadModelConfig(testing::ModelDir("llama-coder-tiny"));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->architecture, "LlamaForCausalLM");
  EXPECT_EQ(c->head_dim, 32);
  EXPECT_EQ(c->rope.type, RopeType::kLinear);
  EXPECT_EQ(c->rope.factor, 4.0);
  EXPECT_EQ(c->rope.theta, 100000.0);
  EXPECT_FALSE(c->qkv_bias);

  c = LoadModelConfig(testing::ModelDir("llama3-distill-tiny") + "/config.json");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->rope.type, RopeType::kLlama3);
  EXPECT_EQ(c->rope.original_max_position_embeddings, 64);
  EXPECT_EQ(c->num_kv_heads, 2);

  c = LoadModelConfig(testing::ModelDir("qwen2-tied-tiny"));
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(c->qkv_bias);
  EXPECT_FALSE(c->o_bias);
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_EQ(c->rope.theta, 1e6);
  EXPECT_EQ(c->eos_token_ids, std::vector<int64_t>{2});
}

TEST(ModelConfigTest, RealConfigs) {
  for (const char* name :
       {"deepseek-coder-1.3b-instruct", "deepseek-coder-6.7b-instruct", "deepseek-r1-distill-llama-8b",
        "deepseek-r1-distill-llama-70b", "deepseek-r1-distill-qwen-1.5b", "deepseek-r1-distill-qwen-7b",
        "deepseek-v2-lite", "deepseek-v3"}) {
    auto c = LoadModelConfig(testing::DataDir() + "/configs/" + name + ".json");
    EXPECT_TRUE(c.ok()) << name << ": " << c.status().ToString();
  }
  auto v3 = LoadModelConfig(testing::DataDir() + "/configs/deepseek-v3.json");
  ASSERT_TRUE(v3.ok());
  EXPECT_TRUE(v3->is_mla);
  EXPECT_EQ(v3->mla.kv_lora_rank, 512);
  EXPECT_EQ(v3->moe.n_routed_experts, 256);
  EXPECT_EQ(v3->moe.topk_method, "noaux_tc");
  EXPECT_EQ(v3->quant.method, "fp8");
  EXPECT_EQ(v3->quant.block_n, 128);
  EXPECT_EQ(v3->rope.type, RopeType::kYarn);
  auto r1 = LoadModelConfig(testing::DataDir() + "/configs/deepseek-r1-distill-llama-8b.json");
  ASSERT_TRUE(r1.ok());
  EXPECT_EQ(r1->rope.type, RopeType::kLlama3);
  // The 70B distill's shape (the multi-GPU runs' dense model): its public config's sizes on the 8B's file.
  auto r70 = LoadModelConfig(testing::DataDir() + "/configs/deepseek-r1-distill-llama-70b.json");
  ASSERT_TRUE(r70.ok());
  EXPECT_EQ(r70->hidden_size, 8192);
  EXPECT_EQ(r70->num_layers, 80);
  EXPECT_EQ(r70->num_heads, 64);
  EXPECT_EQ(r70->num_kv_heads, 8);
  EXPECT_EQ(r70->intermediate_size, 28672);
  EXPECT_EQ(r70->vocab_size, 128256);
}

// DeepSeek-V3.2: V3's keys plus the indexer's, as shipped (FP8 with ue8m0 scales, one MTP layer).
TEST(ModelConfigTest, DeepseekV32) {
  auto c = LoadModelConfig(testing::DataDir() + "/configs/deepseek-v3.2.json");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->architecture, "DeepseekV32ForCausalLM");
  EXPECT_TRUE(c->is_mla);
  EXPECT_TRUE(c->mla.sparse());
  EXPECT_EQ(c->mla.index_n_heads, 64);
  EXPECT_EQ(c->mla.index_head_dim, 128);
  EXPECT_EQ(c->mla.index_topk, 2048);
  EXPECT_EQ(c->moe.topk_method, "noaux_tc");
  EXPECT_EQ(c->quant.method, "fp8");
  EXPECT_EQ(c->num_nextn_predict_layers, 1);
  auto v3 = LoadModelConfig(testing::DataDir() + "/configs/deepseek-v3.json");
  ASSERT_TRUE(v3.ok());
  EXPECT_FALSE(v3->mla.sparse());  // V3 (and V3.1) keep dense MLA
  // An indexer that cannot be sized or rotated is refused by name.
  std::ifstream in(testing::ModelDir("deepseek-v32-tiny") + "/config.json");
  const json base = json::parse(in);
  const std::vector<std::pair<std::function<void(json&)>, std::string>> bad = {
      {[](json& j) { j["index_topk"] = 0; }, "index_topk 0"},
      {[](json& j) { j["index_topk"] = 1 << 20; }, "'index_topk' is 1048576"},
      {[](json& j) { j["index_n_heads"] = -4; }, "index_n_heads -4"},
      {[](json& j) { j["index_head_dim"] = 4; }, "index_head_dim 4 at least qk_rope_head_dim 8"},
      {[](json& j) { j["index_head_dim"] = "wide"; }, "index_head_dim"},
  };
  for (const auto& [edit, expect] : bad) {
    json j = base;
    edit(j);
    auto r = ParseModelConfig(j);
    ASSERT_FALSE(r.ok()) << expect;
    EXPECT_NE(r.status().message().find(expect), std::string::npos) << r.status().message();
  }
}

TEST(ModelConfigTest, RopeParametersV5Form) {
  json j = Base();
  j.erase("rope_theta");
  j["rope_parameters"] = {{"rope_type", "yarn"},
                          {"rope_theta", 5e5},
                          {"factor", 4.0},
                          {"original_max_position_embeddings", 1024},
                          {"beta_fast", 16}};
  auto c = ParseModelConfig(j);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->rope.type, RopeType::kYarn);
  EXPECT_EQ(c->rope.theta, 5e5);
  EXPECT_EQ(c->rope.beta_fast, 16);
  EXPECT_EQ(c->rope.original_max_position_embeddings, 1024);
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1234.0}};
  c = ParseModelConfig(j);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->rope.type, RopeType::kDefault);
  EXPECT_EQ(c->rope.theta, 1234.0);
}

struct BadConfig {
  const char* name;
  std::function<void(json&)> edit;
  const char* expect;
};

TEST(ModelConfigTest, BrokenConfigsAreRejectedClearly) {
  const std::vector<BadConfig> cases = {
      {"unknown_arch",
       [](json& j) {
         j["model_type"] = "mamba";
         j["architectures"] = {"MambaForCausalLM"};
       },
       "supported: LlamaForCausalLM (llama), Qwen2ForCausalLM (qwen2), DeepseekV2ForCausalLM"},
      {"arch_mismatch", [](json& j) { j["architectures"] = {"Qwen2ForCausalLM"}; }, "does not match"},
      {"heads_not_multiple", [](json& j) { j["num_key_value_heads"] = 3; }, "multiple of num_key_value_heads"},
      {"hidden_not_divisible",
       [](json& j) {
         j["num_attention_heads"] = 3;
         j["num_key_value_heads"] = 3;
       },
       "not a multiple of num_attention_heads"},
      {"missing_vocab", [](json& j) { j.erase("vocab_size"); }, "'vocab_size' is missing"},
      {"string_hidden", [](json& j) { j["hidden_size"] = "128"; }, "'hidden_size' must be an integer"},
      {"zero_layers", [](json& j) { j["num_hidden_layers"] = 0; }, "must all be positive"},
      {"bad_rope",
       [](json& j) {
         j["rope_scaling"] = {{"type", "longrope"}, {"factor", 2.0}};
       },
       "unsupported rope scaling type 'longrope'"},
      {"dynamic_rope",
       [](json& j) {
         j["rope_scaling"] = {{"type", "dynamic"}, {"factor", 2.0}};
       },
       "dynamic"},
      {"rope_no_factor",
       [](json& j) {
         j["rope_scaling"] = {{"type", "linear"}};
       },
       "'factor' is missing"},
      {"llama3_no_orig",
       [](json& j) {
         j["rope_scaling"] = {
             {"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0}};
       },
       "original_max_position_embeddings"},
      {"bad_act", [](json& j) { j["hidden_act"] = "gelu"; }, "hidden_act 'gelu'"},
      {"bad_dtype", [](json& j) { j["torch_dtype"] = "int4"; }, "unsupported dtype 'int4'"},
      {"not_object", [](json& j) { j = json::array(); }, "not a JSON object"},
  };
  for (const auto& c : cases) {
    json j = Base();
    c.edit(j);
    auto r = ParseModelConfig(j);
    ASSERT_FALSE(r.ok()) << c.name;
    EXPECT_NE(r.status().message().find(c.expect), std::string::npos) << c.name << ": " << r.status().message();
  }
  EXPECT_NE(ParseModelConfigText("{oops", "x/config.json").status().message().find("not valid JSON"),
            std::string::npos);
  EXPECT_EQ(LoadModelConfig("/no/such/dir").status().code(), StatusCode::kNotFound);
}

// Numbers no real model has are refused, naming the key, before anything is sized by them (a billion layers once
// became a 3.8 GB allocation and bad_alloc; a rope_theta of 0 made every logit NaN).
TEST(ModelConfigTest, AbsurdNumbersAreRefusedBeforeAnythingIsSized) {
  const std::vector<BadConfig> cases = {
      {"layers", [](json& j) { j["num_hidden_layers"] = 1000000000; }, "'num_hidden_layers' is 1000000000, outside"},
      {"vocab", [](json& j) { j["vocab_size"] = int64_t{1} << 40; }, "'vocab_size'"},
      {"hidden", [](json& j) { j["hidden_size"] = 1 << 20; }, "'hidden_size'"},
      {"theta_zero", [](json& j) { j["rope_theta"] = 0.0; }, "'rope_theta' is 0"},
      {"theta_negative", [](json& j) { j["rope_theta"] = -1.0; }, "'rope_theta' is -1"},
      {"theta_denormal", [](json& j) { j["rope_theta"] = 1e-320; }, "'rope_theta'"},
      {"eps_huge", [](json& j) { j["rms_norm_eps"] = 10.0; }, "'rms_norm_eps' is 10"},
      {"positions", [](json& j) { j["max_position_embeddings"] = int64_t{1} << 40; }, "'max_position_embeddings'"},
      // An integer written as a float far outside int64's range: casting it would be undefined (fuzz_model_files).
      {"layers_float_huge", [](json& j) { j["num_hidden_layers"] = 7.77778e+108; },
       "'num_hidden_layers' must be an integer"},
      {"heads_float_huge", [](json& j) { j["num_attention_heads"] = -1e300; },
       "'num_attention_heads' must be an integer"},
      {"vocab_uint64", [](json& j) { j["vocab_size"] = UINT64_MAX; }, "'vocab_size' must be an integer below 2^63"},
      {"layers_fraction", [](json& j) { j["num_hidden_layers"] = 2.5; }, "'num_hidden_layers' must be an integer"},
      {"yarn_beta",
       [](json& j) {
         j["rope_scaling"] = {{"type", "yarn"}, {"factor", 4.0}, {"beta_fast", -1.0}};
       },
       "'rope_scaling.beta_fast'"},
  };
  for (const auto& c : cases) {
    json j = Base();
    c.edit(j);
    auto r = ParseModelConfig(j);
    ASSERT_FALSE(r.ok()) << c.name;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << c.name;
    EXPECT_NE(r.status().message().find(c.expect), std::string::npos) << c.name << ": " << r.status().message();
  }
}

TEST(ModelConfigTest, MalformedMoeConfigs) {
  auto base = LoadModelConfig(testing::ModelDir("deepseek-v3-tiny"));
  ASSERT_TRUE(base.ok()) << base.status().ToString();
  std::ifstream in(testing::ModelDir("deepseek-v3-tiny") + "/config.json");
  const json orig = json::parse(in);
  const std::vector<std::pair<std::function<void(json&)>, const char*>> cases = {
      {[](json& j) { j["topk_group"] = j["n_group"].get<int>() + 1; }, "topk_group"},
      {[](json& j) { j["num_experts_per_tok"] = j["n_routed_experts"].get<int>() + 1; }, "num_experts_per_tok"},
      {[](json& j) { j["n_group"] = 3; }, "multiple of n_group"},
      {[](json& j) { j["topk_method"] = "random"; }, "topk_method 'random'"},
      {[](json& j) { j["scoring_func"] = "relu"; }, "scoring_func 'relu'"},
      {[](json& j) { j["qk_rope_head_dim"] = 7; }, "MLA dims"},
      {[](json& j) { j["n_routed_experts"] = 1024; }, "exceeds what fathom routes"},
      {[](json& j) {
         j["n_routed_experts"] = 64;
         j["num_experts_per_tok"] = 33;
       },
       "exceeds what fathom routes"},
  };
  for (const auto& [edit, expect] : cases) {
    json j = orig;
    edit(j);
    auto r = ParseModelConfig(j);
    ASSERT_FALSE(r.ok()) << expect;
    EXPECT_NE(r.status().message().find(expect), std::string::npos) << r.status().message();
  }
}

}  // namespace
}  // namespace fathom

namespace fathom {
namespace {

// DeepSeek-V4-Flash's config as the hub ships it: the legacy spellings transformers folds (compress_ratios with the
// MTP layer's entry, num_hash_layers, qk_rope_head_dim, a flat YaRN rope_scaling).
TEST(ModelConfigTest, DeepseekV4Flash) {
  auto c = LoadModelConfig(testing::DataDir() + "/configs/deepseek-v4-flash.json");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_TRUE(c->is_v4);
  EXPECT_FALSE(c->is_mla);
  EXPECT_EQ(c->architecture, "DeepseekV4ForCausalLM");
  const V4Config& v = c->v4;
  ASSERT_EQ(v.attention.size(), 43u);
  EXPECT_EQ(v.attention[0], V4Attention::kSliding);
  EXPECT_EQ(v.attention[1], V4Attention::kSliding);
  EXPECT_EQ(v.attention[2], V4Attention::kCsa);
  EXPECT_EQ(v.attention[3], V4Attention::kHca);
  EXPECT_EQ(v.attention[42], V4Attention::kCsa);
  ASSERT_EQ(v.mtp_attention.size(), 1u);  // compress_ratios' 44th entry
  EXPECT_EQ(v.mtp_attention[0], V4Attention::kSliding);
  ASSERT_EQ(v.hash_moe.size(), 43u);
  EXPECT_TRUE(v.hash_moe[2]);
  EXPECT_FALSE(v.hash_moe[3]);
  EXPECT_EQ(v.csa_rate, 4);
  EXPECT_EQ(v.hca_rate, 128);
  EXPECT_EQ(v.sliding_window, 128);
  EXPECT_EQ(v.rope_dim, 64);
  EXPECT_EQ(c->head_dim, 512);
  EXPECT_EQ(c->num_kv_heads, 1);
  EXPECT_EQ(c->intermediate_size, 2048);
  EXPECT_EQ(v.o_groups, 8);
  EXPECT_EQ(v.hc_mult, 4);
  EXPECT_EQ(v.hc_sinkhorn_iters, 20);
  EXPECT_EQ(v.swiglu_limit, 10.0);
  EXPECT_EQ(v.index_topk, 512);
  // Sliding layers: rope_theta unscaled; compressed ones: compress_rope_theta with YaRN, attention factor 1.
  EXPECT_EQ(c->rope.type, RopeType::kDefault);
  EXPECT_EQ(c->rope.theta, 10000.0);
  EXPECT_TRUE(c->rope.interleaved);
  EXPECT_EQ(v.compress_rope.type, RopeType::kYarn);
  EXPECT_EQ(v.compress_rope.theta, 160000.0);
  EXPECT_EQ(v.compress_rope.factor, 16.0);
  EXPECT_EQ(v.compress_rope.original_max_position_embeddings, 65536);
  ASSERT_TRUE(v.compress_rope.attention_factor.has_value());
  EXPECT_EQ(*v.compress_rope.attention_factor, 1.0);
  EXPECT_EQ(c->moe.scoring_func, "sqrtsoftplus");
  EXPECT_EQ(c->moe.n_routed_experts, 256);
  EXPECT_EQ(c->moe.num_experts_per_tok, 6);
  EXPECT_EQ(c->quant.method, "fp8");
  EXPECT_EQ(c->quant.scale_fmt, "ue8m0");
  EXPECT_EQ(c->quant.expert_dtype, "fp4");
  EXPECT_EQ(c->num_nextn_predict_layers, 1);
}

// transformers' own spellings read the same: layer_types, mlp_layer_types, compress_rates, partial_rotary_factor and
// a nested rope_parameters {main, compress}.
TEST(ModelConfigTest, DeepseekV4ModernSpellings) {
  json j = json::parse(std::ifstream(testing::ModelDir("deepseek-v4-alt-tiny") + "/config.json"));
  auto legacy = ParseModelConfig(j);
  ASSERT_TRUE(legacy.ok()) << legacy.status().ToString();
  for (const char* key : {"compress_ratios", "num_hash_layers", "qk_rope_head_dim", "rope_scaling", "rope_theta",
                          "compress_rope_theta"}) {
    j.erase(key);
  }
  j["layer_types"] = {"compressed_sparse_attention", "heavily_compressed_attention", "sliding_attention"};
  j["mlp_layer_types"] = {"hash_moe", "moe", "moe"};
  j["compress_rates"] = {{"compressed_sparse_attention", 4}, {"heavily_compressed_attention", 128}};
  j["partial_rotary_factor"] = 0.25;
  j["rope_parameters"] = {{"main", {{"rope_type", "default"}, {"rope_theta", 50000}, {"partial_rotary_factor", 0.25}}},
                          {"compress",
                           {{"rope_type", "yarn"},
                            {"rope_theta", 40000},
                            {"factor", 4},
                            {"original_max_position_embeddings", 4096},
                            {"beta_fast", 32},
                            {"beta_slow", 1},
                            {"attention_factor", 1.0},
                            {"partial_rotary_factor", 0.25}}}};
  auto modern = ParseModelConfig(j);
  ASSERT_TRUE(modern.ok()) << modern.status().ToString();
  EXPECT_EQ(modern->v4.attention, legacy->v4.attention);
  EXPECT_EQ(modern->v4.hash_moe, legacy->v4.hash_moe);
  EXPECT_EQ(modern->v4.rope_dim, legacy->v4.rope_dim);
  EXPECT_EQ(modern->rope.theta, 50000.0);
  EXPECT_EQ(modern->rope.type, RopeType::kDefault);
  EXPECT_EQ(modern->v4.compress_rope.theta, legacy->v4.compress_rope.theta);
  EXPECT_EQ(modern->v4.compress_rope.type, RopeType::kYarn);
  EXPECT_EQ(modern->v4.compress_rope.factor, legacy->v4.compress_rope.factor);
}

TEST(ModelConfigTest, DeepseekV4RefusalsNameTheKey) {
  const json base = json::parse(std::ifstream(testing::ModelDir("deepseek-v4-tiny") + "/config.json"));
  const std::vector<BadConfig> cases = {
      {"ratio", [](json& j) { j["compress_ratios"][2] = 16; }, "compress_ratios[2] is 16"},
      {"short_ratios",
       [](json& j) {
         j["compress_ratios"] = {0, 4};
       },
       "'compress_ratios' must list a ratio"},
      {"layer_type",
       [](json& j) {
         j["layer_types"] = {"sliding_attention", "full", "sliding_attention", "sliding_attention"};
       },
       "layer_types[1] is full"},
      {"kv_heads", [](json& j) { j["num_key_value_heads"] = 4; }, "shares one key-value head"},
      {"o_groups", [](json& j) { j["o_groups"] = 3; }, "multiple of o_groups"},
      {"rope_dim", [](json& j) { j["qk_rope_head_dim"] = 15; }, "qk_rope_head_dim (15) must be even"},
      {"scoring", [](json& j) { j["scoring_func"] = "tanh"; }, "scoring_func 'tanh'"},
      {"shared", [](json& j) { j["n_shared_experts"] = 2; }, "n_shared_experts is 2"},
      {"expert_dtype", [](json& j) { j["expert_dtype"] = "int3"; }, "expert_dtype 'int3'"},
      {"hc_mult", [](json& j) { j["hc_mult"] = 0; }, "'hc_mult' is 0"},
      {"window", [](json& j) { j["sliding_window"] = 0; }, "'sliding_window' is 0"},
      {"mlp_type",
       [](json& j) {
         j["mlp_layer_types"] = {"moe", "dense", "moe", "moe"};
       },
       "mlp_layer_types[1]"},
  };
  for (const auto& c : cases) {
    json j = base;
    c.edit(j);
    auto r = ParseModelConfig(j);
    ASSERT_FALSE(r.ok()) << c.name;
    EXPECT_NE(r.status().message().find(c.expect), std::string::npos) << c.name << ": " << r.status().message();
  }
}

}  // namespace
}  // namespace fathom
