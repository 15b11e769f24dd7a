// Weight formats as objects: which method a config gets (and what it refuses), the tensors each method declares, its
// checks when binding, and the tensor-parallel shards a spec asks for, sliced from the checkpoint.
#include "format/linear_method.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <random>

#include "backend/cpu/cpu_backend.h"
#include "format/fp8_block.h"
#include "format/int4.h"
#include "format/mxfp4.h"
#include "io/model_config.h"
#include "io/safetensors.h"
#include "model/registry.h"
#include "model/weights.h"
#include "testing/golden.h"

namespace fathom {
namespace {

ModelConfig TinyConfig(const std::string& fixture) {
  auto cfg = LoadModelConfig(testing::ModelDir(fixture));
  FATHOM_CHECK(cfg.ok(), "{}", cfg.status().ToString());
  return *cfg;
}

StatusOr<std::vector<WeightSpec>> Specs(const ModelConfig& cfg, ParallelConfig par = {}) {
  FATHOM_ASSIGN_OR_RETURN(const Architecture* arch, FindArchitecture(cfg.architecture));
  return arch->weight_specs(cfg, par);
}

const WeightSpec& Find(const std::vector<WeightSpec>& specs, const std::string& name) {
  for (const WeightSpec& s : specs) {
    if (s.name == name) return s;
  }
  FATHOM_CHECK(false, "no spec {}", name);
  return specs.front();
}

bool Has(const std::vector<WeightSpec>& specs, const std::string& name) {
  for (const WeightSpec& s : specs) {
    if (s.name == name) return true;
  }
  return false;
}

// The real 4-bit configs are sized as 4-bit: every linear inside the layers as qweight/qzeros/scales (and GPTQ's
// g_idx), packed eight to an int32, while embeddings, lm_head and DeepSeek's router stay float.
TEST(LinearMethodTest, Int4ConfigsDeclarePackedTensorsForEveryFamily) {
  for (const auto& [config, method] :
       std::vector<std::pair<std::string, std::string>>{{"deepseek-r1-distill-qwen-7b-awq", "awq"},
                                                        {"deepseek-coder-6.7b-instruct-awq", "awq"},
                                                        {"deepseek-r1-distill-llama-8b-gptq", "gptq"},
                                                        {"deepseek-v2-lite-awq", "awq"}}) {
    auto cfg = LoadModelConfig(testing::DataDir() + "/configs/" + config + ".json");
    ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
    auto specs = Specs(*cfg);
    ASSERT_TRUE(specs.ok()) << config << ": " << specs.status().ToString();
    const int64_t h = cfg->hidden_size, g = cfg->quant.group_size;
    const std::string o = "model.layers.0.self_attn.o_proj";
    const WeightSpec& qw = Find(*specs, o + ".qweight");
    EXPECT_EQ(qw.dtype, DType::kI32);
    // o_proj: [hidden, heads * head_dim] = [out, in].
    ASSERT_EQ(qw.shape.size(), 2u);
    // o_proj is [hidden, in]: AWQ packs the outputs ([in, hidden / 8]), GPTQ the inputs ([in / 8, hidden]).
    const int64_t in = method == "awq" ? qw.shape[0] : qw.shape[0] * 8;
    EXPECT_EQ(qw.shape[1], method == "awq" ? h / 8 : h) << config;
    EXPECT_GT(in, 0);
    EXPECT_EQ(Find(*specs, o + ".qzeros").shape, (std::vector<int64_t>{(in + g - 1) / g, h / 8}));
    EXPECT_EQ(Find(*specs, o + ".scales").dtype, DType::kF16);
    EXPECT_EQ(Has(*specs, o + ".g_idx"), method == "gptq");
    EXPECT_FALSE(Has(*specs, o + ".weight"));
    EXPECT_TRUE(Has(*specs, "lm_head.weight") || cfg->tie_word_embeddings);
    EXPECT_TRUE(Has(*specs, "model.embed_tokens.weight"));
    if (config == "deepseek-v2-lite-awq") {
      // 10944 inputs in groups of 128: 86 groups, the last one partial.
      EXPECT_EQ(Find(*specs, "model.layers.0.mlp.down_proj.scales").shape, (std::vector<int64_t>{86, h}));
      EXPECT_TRUE(Has(*specs, "model.layers.1.mlp.gate.weight"));  // the router stays float
      EXPECT_TRUE(Has(*specs, "model.layers.1.mlp.experts.0.down_proj.qweight"));
      EXPECT_TRUE(Has(*specs, "model.layers.1.mlp.shared_experts.up_proj.qweight"));
      EXPECT_TRUE(Has(*specs, "model.layers.0.self_attn.kv_b_proj.qweight"));
    }
  }
}

// `fathom inspect` and the roofline count 4-bit weights exactly: the same parameters as the float model (eight to an
// int32; scales and zeros are not parameters), and the bytes as stored: R1-Distill-Qwen-7B reads 4.48 GB per decoded
// token in AWQ against 14.14 GB in bf16.
TEST(LinearMethodTest, Int4WeightsAreCountedAsStored) {
  auto stats = [](const std::string& config) {
    auto cfg = LoadModelConfig(testing::DataDir() + "/configs/" + config + ".json");
    FATHOM_CHECK(cfg.ok());
    auto specs = Specs(*cfg);
    FATHOM_CHECK(specs.ok(), "{}", specs.status().ToString());
    return ComputeWeightStats(*specs, nullptr);
  };
  const WeightStats awq = stats("deepseek-r1-distill-qwen-7b-awq"), bf16 = stats("deepseek-r1-distill-qwen-7b");
  EXPECT_EQ(awq.total_params, bf16.total_params);
  EXPECT_EQ(awq.total_params, 7615616512);
  EXPECT_EQ(static_cast<int64_t>(awq.bytes_read_per_token), 4480759808);
  EXPECT_EQ(static_cast<int64_t>(bf16.bytes_read_per_token), 14141245440);
  EXPECT_EQ(awq.bytes_by_dtype.at(DType::kI32), 3288133632);  // 4-bit weights and zeros
}

// Every family refuses a method or setting it cannot run, naming it; nothing is sized as f16 instead.
TEST(LinearMethodTest, UnsupportedMethodsAreRefusedByNameForEveryFamily) {
  auto awq = LoadModelConfig(testing::DataDir() + "/configs/deepseek-r1-distill-qwen-7b-awq.json");
  ASSERT_TRUE(awq.ok());
  ModelConfig c = *awq;
  c.quant.bits = 3;
  EXPECT_EQ(Specs(c).status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(Specs(c).status().message().find("3-bit awq"), std::string::npos) << Specs(c).status().message();
  c = *awq;
  c.quant.version = "gemv";
  EXPECT_NE(Specs(c).status().message().find("AWQ version 'gemv'"), std::string::npos);
  c = *awq;
  c.quant.zero_point = false;
  EXPECT_NE(Specs(c).status().message().find("zero_point: false"), std::string::npos);
  auto gptq = LoadModelConfig(testing::DataDir() + "/configs/deepseek-r1-distill-llama-8b-gptq.json");
  ASSERT_TRUE(gptq.ok());
  c = *gptq;
  c.quant.bits = 8;
  EXPECT_EQ(Specs(c).status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(Specs(c).status().message().find("8-bit gptq"), std::string::npos);
  c = *gptq;
  c.quant.checkpoint_format = "marlin";
  EXPECT_NE(Specs(c).status().message().find("checkpoint_format 'marlin'"), std::string::npos);
  c = *gptq;
  c.quant.group_size = 0;
  EXPECT_EQ(Specs(c).status().code(), StatusCode::kInvalidArgument);
  // Tensor parallelism of 4-bit layers (this test refused it before it was built): a column-parallel layer's shard
  // holds whole packed words of outputs, a row-parallel GPTQ layer's whole words of inputs with every scale group
  // (g_idx, split with the inputs, indexes them); a layer that does not split into whole words is refused by name.
  c = *gptq;
  auto split = Specs(c, ParallelConfig{.tp_size = 2, .tp_rank = 1});
  ASSERT_TRUE(split.ok()) << split.status().ToString();
  const WeightSpec& q = Find(*split, "model.layers.0.self_attn.q_proj.qweight");
  EXPECT_EQ(q.shape, (std::vector<int64_t>{4096 / 8, 4096 / 2}));
  EXPECT_EQ(q.shard.dim, 1);
  const WeightSpec& down = Find(*split, "model.layers.0.mlp.down_proj.qweight");
  EXPECT_EQ(down.shape, (std::vector<int64_t>{14336 / 2 / 8, 4096}));
  EXPECT_EQ(down.shard.dim, 0);
  EXPECT_EQ(Find(*split, "model.layers.0.mlp.down_proj.scales").shape, (std::vector<int64_t>{14336 / 128, 4096}));
  EXPECT_FALSE(Find(*split, "model.layers.0.mlp.down_proj.scales").shard.sharded());
  EXPECT_EQ(Find(*split, "model.layers.0.mlp.down_proj.g_idx").shape, (std::vector<int64_t>{14336 / 2}));
  c.intermediate_size = 14336 + 8;  // 1793 words of outputs: no whole half
  auto refused = Specs(c, ParallelConfig{.tp_size = 2, .tp_rank = 0});
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("do not split into 2 tensor-parallel parts"), std::string::npos)
      << refused.status().ToString();
  ModelConfig cfg = TinyConfig("llama3-distill-tiny");
  for (const char* method : {"compressed-tensors", "bitsandbytes", "exl2"}) {
    cfg.quant = QuantConfig{};
    cfg.quant.method = method;
    cfg.quant.source = "config.json 'quantization_config'";
    auto specs = Specs(cfg);
    EXPECT_EQ(specs.status().code(), StatusCode::kUnimplemented);
    EXPECT_NE(specs.status().message().find(method), std::string::npos) << specs.status().message();
  }
  cfg.quant = QuantConfig{};
  cfg.quant.method = "fp8";
  cfg.quant.fmt = "e5m2";
  EXPECT_NE(Specs(cfg).status().message().find("'e5m2'"), std::string::npos);
  cfg.quant.fmt = "e4m3";
  cfg.quant.activation_scheme = "static";
  EXPECT_NE(Specs(cfg).status().message().find("'static'"), std::string::npos);
}

// FP8 block scaling is a format, not a DeepSeek feature: a Llama config with it gets f8 weights and their scales,
// and the layers that never quantize (lm_head, norms, embeddings) stay float.
TEST(LinearMethodTest, Fp8SpecsForADenseFamily) {
  ModelConfig cfg = TinyConfig("llama3-distill-tiny");
  cfg.quant.method = "fp8";
  auto specs = Specs(cfg);
  ASSERT_TRUE(specs.ok()) << specs.status().ToString();
  const WeightSpec& q = Find(*specs, "model.layers.0.self_attn.q_proj.weight");
  EXPECT_EQ(q.dtype, DType::kF8E4M3);
  ASSERT_NE(q.linear, nullptr);
  EXPECT_EQ(q.linear->method->format(), LinearFormat::kFp8Block);
  const WeightSpec& ks = Find(*specs, "model.layers.0.self_attn.k_proj.weight_scale_inv");  // [32, 128]: one block
  EXPECT_EQ(ks.shape, (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(ks.dtype, DType::kF32);
  EXPECT_EQ(Find(*specs, "model.layers.1.mlp.down_proj.weight_scale_inv").shape, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(Find(*specs, "lm_head.weight").dtype, DType::kBF16);
  EXPECT_EQ(Find(*specs, "model.layers.0.input_layernorm.weight").dtype, DType::kBF16);
  EXPECT_FALSE(Has(*specs, "lm_head.weight_scale_inv"));
  // modules_to_not_convert keeps the named layers float.
  cfg.quant.modules_to_not_convert = {"mlp.down_proj"};
  specs = Specs(cfg);
  ASSERT_TRUE(specs.ok());
  EXPECT_EQ(Find(*specs, "model.layers.1.mlp.down_proj.weight").dtype, DType::kBF16);
  EXPECT_FALSE(Has(*specs, "model.layers.1.mlp.down_proj.weight_scale_inv"));
  EXPECT_EQ(Find(*specs, "model.layers.1.mlp.up_proj.weight").dtype, DType::kF8E4M3);
}

// Each method checks the dtypes its layout needs when it binds a layer.
TEST(LinearMethodTest, BindChecksTheStoredDtypes) {
  Tensor f8 = Tensor::Empty(DType::kF8E4M3, {4, 8}), bf16 = Tensor::Empty(DType::kBF16, {4, 8});
  Tensor scale = Tensor::Empty(DType::kF32, {1, 1});
  std::map<std::string, TensorView> loaded;
  const TensorLookup find = [&](const std::string& n) -> const TensorView* {
    auto it = loaded.find(n);
    return it == loaded.end() ? nullptr : &it->second;
  };
  LinearSpec l;
  l.prefix = "x";
  l.out = 4;
  l.in = 8;
  QuantConfig none, fp8;
  fp8.method = "fp8";
  auto dense = LinearMethodFor(none, "x");
  auto block = LinearMethodFor(fp8, "x");
  ASSERT_TRUE(dense.ok() && block.ok());
  loaded["x.weight"] = f8.view();
  auto w = (*dense)->Bind(l, find);
  EXPECT_EQ(w.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(w.status().message().find("no fp8 quantization_config"), std::string::npos) << w.status().message();
  loaded["x.weight"] = bf16.view();
  loaded["x.weight_scale_inv"] = scale.view();
  w = (*block)->Bind(l, find);
  EXPECT_NE(w.status().message().find("needs F8_E4M3"), std::string::npos) << w.status().message();
  loaded["x.weight"] = f8.view();
  w = (*block)->Bind(l, find);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_EQ(w->format, LinearFormat::kFp8Block);
  EXPECT_EQ(w->payload<Fp8BlockPayload>().scale_inv.raw(), scale.view().raw());
}

// The CPU reference dequantization of a block-scaled row: value times its block's scale.
TEST(LinearMethodTest, Fp8DequantizeRowAppliesBlockScales) {
  Tensor w = Tensor::Empty(DType::kF8E4M3, {3, 5});
  for (int64_t i = 0; i < 15; ++i) w.data<uint8_t>()[i] = F32ToF8E4M3(static_cast<float>(i % 7) - 3.0f);
  Tensor s = Tensor::Empty(DType::kF32, {2, 3});  // blocks of 2 rows x 2 columns
  for (int64_t i = 0; i < 6; ++i) s.data<float>()[i] = 0.5f * static_cast<float>(i + 1);
  LinearWeight lw = Fp8BlockWeight(w, s, 2, 2);
  std::vector<float> row(5);
  DequantizeRow(lw, 2, row.data());
  for (int64_t c = 0; c < 5; ++c) {
    const float want = (static_cast<float>((2 * 5 + c) % 7) - 3.0f) * s.data<float>()[1 * 3 + c / 2];
    EXPECT_EQ(row[static_cast<size_t>(c)], want) << c;
  }
  EXPECT_EQ(MethodOf(LinearFormat::kFp8Block).ExactFloatDType(lw), DType::kF32);
}

// MXFP4 (DeepSeek-V4's routed experts): two e2m1 codes a byte, the low nibble first, times 2^(e8m0 - 127) per 32
// inputs. Every code is checked against e2m1's table, with its sign, under scales from 2^-127 to 2^8.
TEST(LinearMethodTest, Mxfp4DequantizeRowDecodesCodesAndScales) {
  constexpr float kE2m1[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  Tensor codes = Tensor::Empty(DType::kI8, {3, 32});     // [out 3, in 64 / 2]
  Tensor scale = Tensor::Empty(DType::kF8E8M0, {3, 2});  // [out 3, in 64 / 32]
  for (int64_t i = 0; i < codes.numel(); ++i) codes.data<uint8_t>()[i] = static_cast<uint8_t>(i * 37 + 11);
  const uint8_t scale_codes[6] = {127, 128, 0, 135, 120, 126};
  std::memcpy(scale.view().raw(), scale_codes, 6);
  LinearWeight w = Mxfp4Weight(codes, scale, 64);
  EXPECT_EQ(w.out_features(), 3);
  EXPECT_EQ(w.in_features(), 64);
  std::vector<float> row(64);
  for (int64_t r = 0; r < 3; ++r) {
    DequantizeRow(w, r, row.data());
    for (int64_t c = 0; c < 64; ++c) {
      const uint8_t byte = codes.data<uint8_t>()[r * 32 + c / 2];
      const uint8_t code = c % 2 == 0 ? byte & 0xf : byte >> 4;
      const float magnitude = kE2m1[code & 7] * std::ldexp(1.0f, scale_codes[r * 2 + c / 32] - 127);
      EXPECT_EQ(row[static_cast<size_t>(c)], (code & 8) ? -magnitude : magnitude) << r << ", " << c;
    }
  }
  EXPECT_EQ(MethodOf(LinearFormat::kMxfp4).ExactFloatDType(w), DType::kBF16);
  EXPECT_TRUE(std::isnan(F8E8M0ToF32(0xff)));
}

// Only a routed expert's layer takes MXFP4, and only under expert_dtype fp4; its specs are the hub's `.weight` (I8)
// and `.scale` (F8_E8M0), counted as two parameters a byte.
TEST(LinearMethodTest, Mxfp4IsForRoutedExpertsUnderExpertDtypeFp4) {
  QuantConfig q;
  q.method = "fp8";
  q.source = "config.json";
  q.expert_dtype = "fp4";
  auto expert = LinearMethodFor(q, "layers.3.ffn.experts.0.w1", true, /*routed_expert=*/true);
  ASSERT_TRUE(expert.ok()) << expert.status().ToString();
  EXPECT_EQ((*expert)->format(), LinearFormat::kMxfp4);
  auto shared = LinearMethodFor(q, "layers.3.ffn.shared_experts.w1", true, false);
  ASSERT_TRUE(shared.ok());
  EXPECT_EQ((*shared)->format(), LinearFormat::kFp8Block);
  q.expert_dtype.clear();
  auto plain = LinearMethodFor(q, "layers.3.ffn.experts.0.w1", true, true);
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ((*plain)->format(), LinearFormat::kFp8Block);

  LinearSpec l;
  l.prefix = "e.w1";
  l.out = 4;
  l.in = 64;
  std::vector<WeightSpec> specs;
  ASSERT_TRUE(AddLinearSpecs(*expert, l, &specs).ok());
  ASSERT_EQ(specs.size(), 2u);
  EXPECT_EQ(specs[0].name, "e.w1.weight");
  EXPECT_EQ(specs[0].dtype, DType::kI8);
  EXPECT_EQ(specs[0].shape, (std::vector<int64_t>{4, 32}));
  EXPECT_EQ(specs[0].params_per_element, 2);
  EXPECT_EQ(specs[1].name, "e.w1.scale");
  EXPECT_EQ(specs[1].dtype, DType::kF8E8M0);
  EXPECT_EQ(specs[1].shape, (std::vector<int64_t>{4, 2}));
  EXPECT_EQ(specs[1].params_per_element, 0);
  l.prefix = "e.w2";
  l.in = 48;  // not whole groups of 32
  std::vector<WeightSpec> odd;
  EXPECT_FALSE(AddLinearSpecs(*expert, l, &odd).ok());
}

// The hooks for tensor parallelism: a rank's specs hold its shapes and shards; loading slices them from the mmap.
// MapTensors reaches every tensor of a weight, its format's payload included (MLA's host copy of kv_b_proj dequantizes
// from it), and the copy dequantizes to the same rows; the backend's state of the old tensors is not carried over.
TEST(LinearMethodTest, MapTensorsCopiesEveryTensorOfEachFormat) {
  std::mt19937 rng(7);
  const auto random = [&](DType dt, std::vector<int64_t> shape) {
    Tensor t = Tensor::Empty(dt, shape);
    for (size_t i = 0; i < t.nbytes(); ++i) static_cast<uint8_t*>(t.view().raw())[i] = static_cast<uint8_t>(rng());
    return t;
  };
  Tensor f8 = Tensor::Empty(DType::kF8E4M3, {4, 6});
  for (int64_t i = 0; i < f8.numel(); ++i) f8.data<uint8_t>()[i] = F32ToF8E4M3(0.25f * static_cast<float>(i % 9 - 4));
  Tensor scale = Tensor::Empty(DType::kF32, {2, 3});
  for (int64_t i = 0; i < 6; ++i) scale.data<float>()[i] = 0.5f + static_cast<float>(i);
  Tensor bias = Tensor::Empty(DType::kF32, {4});
  LinearWeight fp8 = Fp8BlockWeight(f8, scale, 2, 2);
  fp8.bias = bias;
  fp8.device_state = std::make_shared<int>(1);
  // GPTQ [out 16, in 32] in groups of 8, with g_idx; scales f32 so that every bit pattern is some number.
  Tensor qweight = random(DType::kI32, {4, 16}), qzeros = random(DType::kI32, {4, 2});
  Tensor scales = Tensor::Empty(DType::kF32, {4, 16}), g_idx = Tensor::Empty(DType::kI32, {32});
  for (int64_t i = 0; i < 64; ++i) scales.data<float>()[i] = 0.01f * static_cast<float>(i + 1);
  for (int64_t k = 0; k < 32; ++k) g_idx.data<int32_t>()[k] = static_cast<int32_t>(k / 8);
  Int4Payload p;
  p.qzeros = qzeros;
  p.scales = scales;
  p.g_idx = g_idx;
  p.group_size = 8;
  p.zero_offset = 1;
  LinearWeight gptq = Int4Weight(LinearFormat::kGptq, qweight, 16, 32, p);

  for (const LinearWeight* w : {&fp8, &gptq}) {
    std::vector<Tensor> copies;
    std::vector<const void*> seen;
    StatusOr<LinearWeight> c = MapTensors(*w, [&](const TensorView& t) -> StatusOr<TensorView> {
      seen.push_back(t.raw());
      Tensor copy = Tensor::Empty(t.dtype(), t.shape());
      std::memcpy(copy.view().raw(), t.raw(), t.nbytes());
      copies.push_back(std::move(copy));
      return copies.back().view();
    });
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    EXPECT_EQ(c->device_state, nullptr);
    EXPECT_EQ(c->format, w->format);
    EXPECT_EQ(c->out_features(), w->out_features());
    EXPECT_EQ(c->in_features(), w->in_features());
    if (w == &fp8) {
      EXPECT_EQ(seen, (std::vector<const void*>{f8.view().raw(), bias.view().raw(), scale.view().raw()}));
      EXPECT_NE(c->payload<Fp8BlockPayload>().scale_inv.raw(), scale.view().raw());
      EXPECT_EQ(c->payload<Fp8BlockPayload>().block_k, 2);
    } else {
      EXPECT_EQ(seen, (std::vector<const void*>{qweight.view().raw(), qzeros.view().raw(), scales.view().raw(),
                                                g_idx.view().raw()}));
      const Int4Payload& q = c->payload<Int4Payload>();
      EXPECT_NE(q.g_idx.raw(), g_idx.view().raw());
      EXPECT_EQ(q.group_size, 8);
      EXPECT_EQ(q.zero_offset, 1);
    }
    std::vector<float> a(static_cast<size_t>(w->in_features())), b(a.size());
    for (int64_t r = 0; r < w->out_features(); ++r) {
      DequantizeRow(*w, r, a.data());
      DequantizeRow(*c, r, b.data());
      EXPECT_EQ(a, b) << "row " << r;
    }
  }
}

TEST(ShardTest, ColumnAndRowShardsSliceTheCheckpoint) {
  const std::string dir = testing::ModelDir("llama3-distill-tiny");
  const ModelConfig cfg = TinyConfig("llama3-distill-tiny");
  auto specs = Specs(cfg, {.tp_size = 2, .tp_rank = 1});
  ASSERT_TRUE(specs.ok()) << specs.status().ToString();
  const WeightSpec& q = Find(*specs, "model.layers.0.self_attn.q_proj.weight");
  EXPECT_EQ(q.shape, (std::vector<int64_t>{64, 128}));
  EXPECT_EQ(q.full_shape(), (std::vector<int64_t>{128, 128}));
  EXPECT_EQ(Find(*specs, "model.layers.0.self_attn.o_proj.weight").shape, (std::vector<int64_t>{128, 64}));
  EXPECT_EQ(Find(*specs, "model.layers.0.mlp.down_proj.weight").shape, (std::vector<int64_t>{128, 128}));
  EXPECT_EQ(Find(*specs, "model.embed_tokens.weight").shape, (std::vector<int64_t>{512, 128}));  // replicated
  auto arch = FindArchitecture(cfg.architecture);
  EXPECT_EQ((*arch)->kv_cache_spec(cfg, {.tp_size = 2, .tp_rank = 1}).num_kv_heads, 1);

  CpuBackend cpu;
  LoadOptions o;
  o.show_progress = false;
  auto store = LoadWeights(dir, *specs, o, cpu);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  auto ckpt = Checkpoint::Open(dir);
  ASSERT_TRUE(ckpt.ok());
  // Rows 64..127 of q_proj; columns 64..127 of o_proj.
  const TensorView full_q = *(*ckpt)->Get("model.layers.0.self_attn.q_proj.weight");
  const TensorView& got_q = (*store)->Get("model.layers.0.self_attn.q_proj.weight");
  EXPECT_EQ(std::memcmp(got_q.raw(), static_cast<const uint16_t*>(full_q.raw()) + 64 * 128, 64 * 128 * 2), 0);
  const TensorView full_o = *(*ckpt)->Get("model.layers.0.self_attn.o_proj.weight");
  const TensorView& got_o = (*store)->Get("model.layers.0.self_attn.o_proj.weight");
  ASSERT_TRUE(got_o.is_contiguous());
  for (int64_t r = 0; r < 128; ++r) {
    ASSERT_EQ(std::memcmp(static_cast<const uint16_t*>(got_o.raw()) + r * 64,
                          static_cast<const uint16_t*>(full_o.raw()) + r * 128 + 64, 64 * 2),
              0)
        << r;
  }
  auto lw = (*store)->Linear("model.layers.0.self_attn.o_proj", cpu);
  ASSERT_TRUE(lw.ok()) << lw.status().ToString();
  EXPECT_EQ(lw->in_features(), 64);
}

// Fewer KV heads than ranks (2 heads, tp = 4): each rank loads the one head its query heads read, whole (ranks 0
// and 1 head 0, ranks 2 and 3 head 1), and its KV cache holds that one head.
TEST(ShardTest, KvHeadsFewerThanTheRanksAreSharedByThem) {
  const ModelConfig cfg = TinyConfig("llama3-distill-tiny");  // 8 heads of 16, 2 KV heads: k_proj [32, 128]
  auto arch = FindArchitecture(cfg.architecture);
  ASSERT_TRUE(arch.ok());
  for (int64_t rank = 0; rank < 4; ++rank) {
    auto specs = Specs(cfg, {.tp_size = 4, .tp_rank = rank});
    ASSERT_TRUE(specs.ok()) << specs.status().ToString();
    EXPECT_EQ(Find(*specs, "model.layers.0.self_attn.q_proj.weight").shape[0], cfg.num_heads * cfg.head_dim / 4);
    for (const char* name : {"model.layers.0.self_attn.k_proj.weight", "model.layers.0.self_attn.v_proj.weight"}) {
      const WeightSpec& kv = Find(*specs, name);
      EXPECT_EQ(kv.shape[0], cfg.head_dim) << name;
      EXPECT_EQ(kv.shard.parts, 2) << name;
      EXPECT_EQ(kv.shard.index, rank / 2) << name;
    }
    EXPECT_EQ((*arch)->kv_cache_spec(cfg, {.tp_size = 4, .tp_rank = rank}).num_kv_heads, 1);
  }
}

TEST(ShardTest, ShapesThatDoNotSplitAreRefusedByName) {
  auto specs = Specs(TinyConfig("llama3-distill-tiny"), {.tp_size = 3, .tp_rank = 0});
  EXPECT_EQ(specs.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(specs.status().message().find("num_attention_heads (8) does not split into 3"), std::string::npos)
      << specs.status().message();
  // KV heads that neither divide into the ranks nor are shared by them evenly (3 heads, 4 ranks).
  ModelConfig three_kv = TinyConfig("llama3-distill-tiny");
  three_kv.num_kv_heads = 3;
  specs = Specs(three_kv, {.tp_size = 4, .tp_rank = 0});
  EXPECT_EQ(specs.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(specs.status().message().find("num_key_value_heads (3) does not split into 4"), std::string::npos)
      << specs.status().message();
  // FP8's 128 x 128 blocks are never cut: V3-tiny's q_b_proj has 192 rows, 96 a rank at tp = 2.
  specs = Specs(TinyConfig("deepseek-v3-fp8-tiny"), {.tp_size = 2, .tp_rank = 0});
  EXPECT_EQ(specs.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(specs.status().message().find("q_b_proj: its output rows (192) do not split into 2 tensor-parallel parts "
                                          "of whole 128-wide blocks"),
            std::string::npos)
      << specs.status().message();
  EXPECT_TRUE(Specs(TinyConfig("deepseek-v3-tiny"), {.tp_size = 2, .tp_rank = 1}).ok());
}

// Dummy weights of a shard are that shard's part of the whole tensor's dummy values, for either split.
TEST(ShardTest, DummyShardsHoldTheirPartOfTheWhole) {
  for (int dim : {0, 1}) {
    WeightSpec whole;
    whole.name = "model.layers.0.mlp.up_proj.weight";
    whole.shape = {6, 8};
    Tensor all = Tensor::Empty(DType::kBF16, {6, 8});
    FillDummy(whole, 3, all);
    WeightSpec part = whole;
    part.shape[static_cast<size_t>(dim)] /= 2;
    part.shard = {.dim = dim, .parts = 2, .index = 1};
    Tensor mine = Tensor::Empty(DType::kBF16, part.shape);
    FillDummy(part, 3, mine);
    for (int64_t r = 0; r < part.shape[0]; ++r) {
      for (int64_t c = 0; c < part.shape[1]; ++c) {
        const int64_t fr = dim == 0 ? r + 3 : r, fc = dim == 1 ? c + 4 : c;
        EXPECT_EQ(mine.data<uint16_t>()[r * part.shape[1] + c], all.data<uint16_t>()[fr * 8 + fc]) << dim;
      }
    }
  }
}

// A row-parallel layer's ranks hold partial sums: its bias is added once, by rank 0.
TEST(ShardTest, RowParallelBiasIsBoundOnRankZeroOnly) {
  Tensor w = Tensor::Empty(DType::kBF16, {4, 4}), b = Tensor::Empty(DType::kBF16, {4});
  std::map<std::string, TensorView> loaded = {{"o.weight", w.view()}, {"o.bias", b.view()}};
  const TensorLookup find = [&](const std::string& n) -> const TensorView* {
    auto it = loaded.find(n);
    return it == loaded.end() ? nullptr : &it->second;
  };
  auto dense = LinearMethodFor(QuantConfig{}, "o");
  ASSERT_TRUE(dense.ok());
  LinearSpec l;
  l.prefix = "o";
  l.out = 4;
  l.in = 8;
  l.bias = true;
  l.split = LinearSplit::kRows;
  for (int64_t rank : {0, 1}) {
    l.parallel = {.tp_size = 2, .tp_rank = rank};
    std::vector<WeightSpec> specs;
    ASSERT_TRUE((*dense)->AddSpecs(l, &specs).ok());
    ASSERT_EQ(specs.size(), 2u);
    EXPECT_EQ(specs[0].shape, (std::vector<int64_t>{4, 4}));
    EXPECT_EQ(specs[1].shape, (std::vector<int64_t>{4}));
    EXPECT_FALSE(specs[1].shard.sharded());
    auto bound = (*dense)->Bind(l, find);
    ASSERT_TRUE(bound.ok());
    EXPECT_EQ(bound->bias.empty(), rank != 0) << rank;
  }
}

// Dummy GPTQ weights get the g_idx of a checkpoint without act-order (input k in group k / group), the layout the
// CUDA backend's tile kernels take, not all zeros.
TEST(Int4DummyTest, DummyGptqGroupIndexIsInputOverGroup) {
  QuantConfig q;
  q.method = "gptq";
  q.source = "test";
  q.bits = 4;
  q.group_size = 32;
  auto m = LinearMethodFor(q, "model.layers.0.mlp.up_proj");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  LinearSpec l;
  l.prefix = "model.layers.0.mlp.up_proj";
  l.out = 64;
  l.in = 96;
  std::vector<WeightSpec> specs;
  ASSERT_TRUE((*m)->AddSpecs(l, &specs).ok());
  const auto g =
      std::find_if(specs.begin(), specs.end(), [](const WeightSpec& s) { return s.name.ends_with("g_idx"); });
  ASSERT_NE(g, specs.end());
  Tensor t = Tensor::Empty(DType::kI32, {96});
  FillDummy(*g, 1, t);
  for (int64_t k = 0; k < 96; ++k) EXPECT_EQ(t.data<int32_t>()[k], k / 32) << k;
}

}  // namespace
}  // namespace fathom
