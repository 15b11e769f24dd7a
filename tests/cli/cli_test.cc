// End-to-end tests of the `fathom` executable: output formats, oracle agreement, and clean failures.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "testing/golden.h"
#include "testing/temp_dir.h"

namespace fathom {
namespace {

namespace fs = std::filesystem;

struct RunResult {
  int exit_code = -1;
  std::string out;  // stdout
  std::string err;  // stderr
};

RunResult RunFathom(const std::string& args) {
  static int counter = 0;
  const std::string err_path =
      (fs::temp_directory_path() / ("fathom_cli_err_" + std::to_string(::getpid()) + "_" + std::to_string(counter++)))
          .string();
  const std::string cmd = std::string(FATHOM_CLI_PATH) + " " + args + " 2>" + err_path;
  RunResult r;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  std::array<char, 65536> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  std::ifstream e(err_path);
  r.err.assign(std::istreambuf_iterator<char>(e), {});
  fs::remove(err_path);
  return r;
}

std::string Join(const std::vector<int32_t>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s;
}

// The largest |logit - oracle| over case `c`'s positions, from `fathom logits <args> --tokens <c's ids>` (infinity,
// with a test failure, when the command fails or its JSON has the wrong shape).
// The largest |difference| between two `fathom logits` outputs (JSON), or infinity when their shapes differ.
float LogitsDiff(const std::string& a_json, const std::string& b_json) {
  auto a = nlohmann::json::parse(a_json)["logits"], b = nlohmann::json::parse(b_json)["logits"];
  if (a.size() != b.size() || a.empty()) return INFINITY;
  float worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    auto x = a[i].get<std::vector<float>>(), y = b[i].get<std::vector<float>>();
    if (x.size() != y.size()) return INFINITY;
    worst = std::max(worst, testing::MaxAbsDiff(x.data(), y.data(), static_cast<int64_t>(x.size())));
  }
  return worst;
}

float OracleDiff(const std::string& args, const testing::GoldenCase& c) {
  RunResult r = RunFathom("logits " + args + " --tokens " + Join(c.input_ids));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  if (r.exit_code != 0) return INFINITY;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["tokens"].get<std::vector<int32_t>>(), c.input_ids);
  if (j["logits"].size() != c.input_ids.size()) {
    ADD_FAILURE() << j["logits"].size() << " rows of logits for " << c.input_ids.size() << " tokens";
    return INFINITY;
  }
  float worst = 0;
  for (size_t t = 0; t < c.input_ids.size(); ++t) {
    auto row = j["logits"][t].get<std::vector<float>>();
    if (static_cast<int64_t>(row.size()) != c.vocab) {
      ADD_FAILURE() << "a row of " << row.size() << " logits, vocab " << c.vocab;
      return INFINITY;
    }
    worst = std::max(worst, testing::MaxAbsDiff(row.data(), c.row(static_cast<int64_t>(t)), c.vocab));
  }
  return worst;
}

TEST(CliTest, LogitsMatchTheOracle) {
  const std::string dir = testing::ModelDir("qwen2-distill-tiny");
  auto golden = testing::LoadGolden(dir);
  ASSERT_TRUE(golden.ok());
  EXPECT_LE(OracleDiff("--model " + dir, golden->cases[2]), 2e-3f);
}

// `fathom logits -tp 2` (and with --enable-expert-parallel on a MoE model) gives the oracle's logits too; a layout
// that does not split is an error naming the dimension.
TEST(CliTest, TensorParallelLogitsMatchTheOracle) {
  for (const char* name : {"qwen2-distill-tiny", "deepseek-v2-lite-tiny"}) {
    const std::string dir = testing::ModelDir(name);
    auto golden = testing::LoadGolden(dir);
    ASSERT_TRUE(golden.ok());
    const std::string ep = std::string(name).starts_with("deepseek") ? " --enable-expert-parallel" : "";
    EXPECT_LE(OracleDiff("-tp 2" + ep + " --model " + dir, golden->cases[1]), 2e-3f) << name;
  }
  RunResult bad =
      RunFathom("logits --tensor-parallel-size 3 --model " + testing::ModelDir("qwen2-distill-tiny") + " --tokens 1,2");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("does not split into 3 tensor-parallel"), std::string::npos) << bad.err;
}

// 6 query heads and 3 KV heads on 2 ranks: the heads split, the KV heads neither split nor share evenly. The split of
// the KV projections divided by zero (2 / 3 ranks per head) before the check's error came back: SIGFPE.
TEST(CliTest, KvHeadsThatDoNotSplitAreRefusedNotACrash) {
  const fs::path dir = fs::temp_directory_path() / ("fathom_tp_kv_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  {
    std::ofstream(dir / "config.json")
        << R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 64, "hidden_size": 48,
              "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 6, "num_key_value_heads": 3,
              "max_position_embeddings": 64, "rms_norm_eps": 1e-6, "rope_theta": 10000, "torch_dtype": "bfloat16"})";
  }
  RunResult two =
      RunFathom("logits --load-format dummy --tensor-parallel-size 2 --model " + dir.string() + " --tokens 1,2");
  EXPECT_EQ(two.exit_code, 1) << two.err;  // an error, not a signal (SIGFPE was 136)
  EXPECT_NE(two.err.find("num_key_value_heads (3) does not split into 2"), std::string::npos) << two.err;
  RunResult four =
      RunFathom("logits --load-format dummy --tensor-parallel-size 4 --model " + dir.string() + " --tokens 1,2");
  EXPECT_EQ(four.exit_code, 1) << four.err;
  EXPECT_NE(four.err.find("num_attention_heads (6) does not split into 4"), std::string::npos) << four.err;
  RunResult one = RunFathom("logits --load-format dummy --model " + dir.string() + " --tokens 1,2");
  fs::remove_all(dir);
  EXPECT_EQ(one.exit_code, 0) << one.err;
}

// A GPTQ checkpoint (act-order, v1 zeros) through the CLI's loader gives its float32 twin's logits.
TEST(CliTest, LogitsOfAGptqCheckpointMatchItsTwin) {
  const std::string dir = std::string(FATHOM_QUANT_TEST_DATA) + "/qwen2-distill-tiny-gptq-actorder";
  RunResult q = RunFathom("logits --model " + dir + "/quant --tokens 5,17,300,42,7");
  RunResult t = RunFathom("logits --model " + dir + "/twin --tokens 5,17,300,42,7");
  ASSERT_EQ(q.exit_code, 0) << q.err;
  ASSERT_EQ(t.exit_code, 0) << t.err;
  ASSERT_EQ(nlohmann::json::parse(q.out)["logits"].size(), 5u);
  EXPECT_LE(LogitsDiff(q.out, t.out), 1e-4f);
}

// An FP8 KV cache under tensor parallelism: each rank quantizes its own KV heads (MLA: the replicated latent row)
// with the scales one rank would pick, so `logits -tp 2 --kv-cache-dtype fp8` gives one rank's FP8 logits.
TEST(CliTest, Fp8KvCacheSplitsAcrossRanks) {
  const std::string tokens = " --tokens 5,17,300,42,7,9,11,400,3,2 --kv-cache-dtype fp8";
  for (const char* name : {"llama3-distill-tiny", "qwen2-distill-tiny", "deepseek-v2-lite-tiny"}) {
    const std::string dir = testing::ModelDir(name);
    RunResult one = RunFathom("logits --model " + dir + tokens);
    RunResult two = RunFathom("logits -tp 2 --model " + dir + tokens);
    ASSERT_EQ(one.exit_code, 0) << name << ": " << one.err;
    ASSERT_EQ(two.exit_code, 0) << name << ": " << two.err;
    EXPECT_LE(LogitsDiff(one.out, two.out), 1e-4f) << name;
  }
}

// 4-bit checkpoints split too: every INT4 fixture at tp = 2 (the DeepSeek ones with their experts divided) gives the
// logits of one rank, or is refused naming the layer and the dimension that does not split into whole packed words
// or scale groups. Most of them split.
TEST(CliTest, FourBitCheckpointsSplitOrAreRefusedByName) {
  const std::string tokens = " --tokens 5,17,300,42,7";
  int split = 0;
  for (const char* name :
       {"llama3-distill-tiny-awq", "qwen2-distill-tiny-gptq-actorder", "qwen2-tied-tiny-awq-legacy",
        "llama-coder-tiny-gptq-perchannel", "deepseek-v2-lite-tiny-awq", "deepseek-v3-tiny-gptq-v2"}) {
    const std::string dir = std::string(FATHOM_QUANT_TEST_DATA) + "/" + name + "/quant";
    const std::string ep = std::string(name).starts_with("deepseek") ? " --enable-expert-parallel" : "";
    RunResult one = RunFathom("logits --model " + dir + tokens);
    RunResult two = RunFathom("logits -tp 2" + ep + " --model " + dir + tokens);
    ASSERT_EQ(one.exit_code, 0) << name << ": " << one.err;
    if (two.exit_code != 0) {
      EXPECT_NE(two.err.find("do not split into 2 tensor-parallel parts"), std::string::npos)
          << name << ": " << two.err;
      continue;
    }
    ++split;
    EXPECT_LE(LogitsDiff(one.out, two.out), 2e-4f) << name;
  }
  EXPECT_GE(split, 4);
}

TEST(CliTest, LogitsToFile) {
  const std::string out =
      (fs::temp_directory_path() / ("fathom_logits_" + std::to_string(::getpid()) + ".json")).string();
  RunResult r =
      RunFathom("logits --model " + testing::ModelDir("llama-coder-tiny") + " --tokens 1,2,3 --output " + out);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::ifstream in(out);
  auto j = nlohmann::json::parse(in);
  EXPECT_EQ(j["logits"].size(), 3u);
  fs::remove(out);
}

TEST(CliTest, RunPrintsTheOracleGreedyTokens) {
  const std::string dir = testing::ModelDir("llama3-distill-tiny");
  auto golden = testing::LoadGolden(dir);
  ASSERT_TRUE(golden.ok());
  const auto& c = golden->cases[3];
  RunResult r = RunFathom("run --model " + dir + " --ignore-eos --max-tokens 16 --tokens " + Join(c.input_ids));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::string expect;
  for (size_t i = 0; i < c.greedy.size(); ++i) expect += (i ? " " : "") + std::to_string(c.greedy[i]);
  EXPECT_EQ(r.out, expect + "\n");
}

// `fathom inspect --load-format dummy ARGS` on a folder holding tests/data/configs/CONFIG as its config.json.
RunResult InspectConfig(const std::string& config, const std::string& args = "") {
  testing::TempDir dir("fathom_inspect");
  fs::copy_file(testing::DataDir() + "/configs/" + config, dir.file("config.json"));
  return RunFathom("inspect --model " + dir.path() + " --load-format dummy" + args);
}

TEST(CliTest, InspectDummy7B) {
  RunResult r = InspectConfig("deepseek-r1-distill-qwen-7b.json");
  // An FP8 cache: 28 layers x 4 kv heads x 2 x (128 e4m3 values + one 4-byte scale)
  RunResult fp8 = InspectConfig("deepseek-r1-distill-qwen-7b.json", " --kv-cache-dtype fp8");
  ASSERT_EQ(fp8.exit_code, 0) << fp8.err;
  EXPECT_NE(fp8.out.find("kv cache:          29568 bytes per token (f8_e4m3, 28672 values per token and a float32 "
                         "scale per 128 values)"),
            std::string::npos)
      << fp8.out;
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("Qwen2ForCausalLM"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("parameters:        7.62 B (7615616512)"), std::string::npos) << r.out;
  // 28 layers x 4 kv heads x (128 + 128) x 2 bytes
  EXPECT_NE(r.out.find("kv cache:          57344 bytes per token (bf16"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("decode reads:"), std::string::npos);
}

TEST(CliTest, InspectDummyDeepseekV3) {
  RunResult r = InspectConfig("deepseek-v3.json");
  // MLA's latent row in FP8: 61 layers x (576 e4m3 values + 9 scales of 64 values)
  RunResult fp8 = InspectConfig("deepseek-v3.json", " --kv-cache-dtype fp8");
  ASSERT_EQ(fp8.exit_code, 0) << fp8.err;
  EXPECT_NE(fp8.out.find("kv cache:          37332 bytes per token (f8_e4m3"), std::string::npos) << fp8.out;
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("parameters:        671.07 B"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("active parameters: 36.63 B per token"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("kv cache:          70272 bytes per token (bf16"), std::string::npos) << r.out;
}

// DeepSeek-V3.2's real config (FP8, ue8m0 scales, the MTP layer past the 61): the indexer's key is a side row of
// each layer's cache, 128 values beside MLA's 576.
TEST(CliTest, InspectDummyDeepseekV32CountsTheIndexerKeys) {
  RunResult r = InspectConfig("deepseek-v3.2.json");
  RunResult fp8 = InspectConfig("deepseek-v3.2.json", " --kv-cache-dtype fp8");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("DeepseekV32ForCausalLM"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("sparse attention:  a lightning indexer of 64 heads x 128 keeps the top 2048"),
            std::string::npos)
      << r.out;
  // 61 layers x (576 + 128) x 2 bytes
  EXPECT_NE(r.out.find("kv cache:          85888 bytes per token (bf16"), std::string::npos) << r.out;
  // 61 layers x (576 + 9 scales of 4 bytes + 128 + 1 scale)
  ASSERT_EQ(fp8.exit_code, 0) << fp8.err;
  EXPECT_NE(fp8.out.find("kv cache:          45384 bytes per token (f8_e4m3"), std::string::npos) << fp8.out;
}

// DeepSeek-V4-Flash's real config (FP8 weights, MXFP4 experts, the MTP layer past the 43): about 284 B parameters
// without the MTP layer, what the MTP layer adds, the layer kinds, and the cache: each layer's row as wide as its
// kind's (2 sliding x 512 + 21 CSA x 3712 + 20 HCA x 2048 values a token) beside what the compressed form would hold.
TEST(CliTest, InspectDummyDeepseekV4Flash) {
  RunResult r = InspectConfig("deepseek-v4-flash.json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("parameters:        284.33 B"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("active parameters: 13.27 B per token"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("mtp layers:        6.61 B more parameters"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("v4 attention:      2 sliding, 21 compressed sparse (an entry per 4 tokens, the indexer's top "
                       "512 of 64 heads x 128), 20 heavily compressed (an entry per 128 tokens); window 128"),
            std::string::npos)
      << r.out;
  // Window rows (bf16): 2 x 512 + 21 x 3072 (key 512, compressor 2 x 1024, indexer compressor 2 x 256) + 20 x 1536
  // (key, compressor 2 x 512) = 96,256 values a token, kept for the newest 128 tokens. Entry rows: 21 x 640 a 4 tokens
  // and 20 x 512 a 128 tokens, 160 x 21 + 4 x 20 = 3,440 values a token.
  EXPECT_NE(r.out.find("kv cache rows:     window rows of 512 / 3072 / 1536 values a token (sliding / compressed "
                       "sparse / heavily compressed: the key and the compressors' inputs), kept for the newest 128 "
                       "tokens; entry rows of 640 values a 4 tokens (compressed sparse: the entry and the indexer's "
                       "key) and 512 a 128 tokens (heavily compressed)"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("kv cache:          6880 bytes per token (bf16, 3440 values per token"), std::string::npos)
      << r.out;
  // A sequence in blocks of 16 tokens: a layer keeps the window rows of 144 tokens (the window of 128 and a block)
  // and its entries, 4 slots of 640 values a block (CSA) or one of 512 (HCA). At 8k: sliding 2 x 144 x 512 x 2 bytes;
  // CSA 21 x (144 x 3072 + 512 x 4 x 640) x 2; HCA 20 x (144 x 1536 + 512 x 512) x 2. At 128k the entries are 16
  // times as many (the rows a token kept in every layer took 31.44 GB).
  EXPECT_NE(r.out.find("kv at    8192 tokens: 93.26 MB a sequence: 294.91 KB sliding, 73.63 MB compressed sparse, "
                       "19.33 MB heavily compressed (65.54 MB of entries, 27.72 MB of window rows)"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("kv at  131072 tokens: 1.08 GB a sequence: 294.91 KB sliding, 899.38 MB compressed sparse, "
                       "176.62 MB heavily compressed (1.05 GB of entries, 27.72 MB of window rows)"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("kv at 1048576 tokens: 8.42 GB a sequence: 294.91 KB sliding, 7.07 GB compressed sparse, "
                       "1.35 GB heavily compressed (8.39 GB of entries, 27.72 MB of window rows)"),
            std::string::npos)
      << r.out;
}

// A 4-bit config is sized as 4-bit weights, scales and zeros (never as f16); a method fathom cannot run is refused by
// name.
TEST(CliTest, InspectSizesAnAwqConfigAs4BitAndRefusesUnknownMethodsByName) {
  RunResult r = RunFathom("inspect --model " + testing::DataDir() + "/configs/deepseek-r1-distill-qwen-7b-awq.json" +
                          " --load-format dummy");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("quantization:      awq (4-bit, group 128)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("parameters:        7.62 B (7615616512)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("bytes i32:         3.29 GB (3288133632)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("decode reads:      4.48 GB"), std::string::npos) << r.out;
  // A method fathom cannot run is refused by name, before anything is sized.
  const fs::path dir = fs::temp_directory_path() / ("fathom_ct_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ifstream in(testing::DataDir() + "/configs/deepseek-r1-distill-qwen-7b-awq.json");
  nlohmann::json j = nlohmann::json::parse(in);
  j["quantization_config"] = {{"quant_method", "compressed-tensors"}};
  std::ofstream(dir / "config.json") << j.dump();
  r = RunFathom("inspect --model " + dir.string() + " --load-format dummy");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.out.find("parameters:"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("quantization method 'compressed-tensors"), std::string::npos) << r.err;
  fs::remove_all(dir);
}

// Hostile configs end in an error naming the problem, exit 1, never an abort (rc 134) or NaN logits.
TEST(CliTest, AbsurdConfigsAreErrorsNotCrashes) {
  const fs::path dir = fs::temp_directory_path() / ("fathom_absurd_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  struct Case {
    std::string key, value, expect;
  };
  for (const Case& c : std::vector<Case>{{"num_hidden_layers", "1000000000", "'num_hidden_layers' is 1000000000"},
                                         {"rope_theta", "0", "'rope_theta' is 0"},
                                         {"rope_theta", "-1", "'rope_theta' is -1"},
                                         {"rope_theta", "1e-320", "'rope_theta'"}}) {
    std::ifstream in(testing::ModelDir("qwen2-distill-tiny") + "/config.json");
    nlohmann::json j = nlohmann::json::parse(in);
    j[c.key] = nlohmann::json::parse(c.value);
    std::ofstream(dir / "config.json") << j.dump();
    RunResult r = RunFathom("logits --model " + dir.string() + " --load-format dummy --tokens 1,2");
    EXPECT_EQ(r.exit_code, 1) << c.key << "=" << c.value << ": " << r.err;
    EXPECT_NE(r.err.find(c.expect), std::string::npos) << r.err;
  }
  // A real config too large for this host's memory as dummy weights: refused before allocating (DeepSeek-V3: 627 GiB).
  fs::copy_file(testing::DataDir() + "/configs/deepseek-v3.json", dir / "config.json",
                fs::copy_options::overwrite_existing);
  RunResult big = RunFathom("logits --model " + dir.string() + " --load-format dummy --tokens 1,2");
  EXPECT_EQ(big.exit_code, 1) << big.err;
  EXPECT_NE(big.err.find("RESOURCE_EXHAUSTED: dummy weights of this config need"), std::string::npos) << big.err;
  fs::remove_all(dir);
}

TEST(CliTest, DeepseekLogitsMatchTheOracle) {
  for (const char* name : {"deepseek-v2-lite-tiny", "deepseek-v3-fp8-tiny"}) {
    const std::string dir = testing::ModelDir(name);
    auto golden = testing::LoadGolden(dir);
    ASSERT_TRUE(golden.ok());
    EXPECT_LE(OracleDiff("--model " + dir, golden->cases[2]), 2e-3f) << name;
  }
}

TEST(CliTest, InspectCheckpoint) {
  RunResult r = RunFathom("inspect --model " + testing::ModelDir("qwen2-tied-tiny"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("(119360)"), std::string::npos) << r.out;
}

class BrokenModelDir : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("fathom_cli_broken_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    fs::copy(testing::ModelDir("qwen2-tied-tiny"), dir_, fs::copy_options::recursive);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(BrokenModelDir, TruncatedSafetensorsFailsCleanly) {
  fs::resize_file(dir_ / "model.safetensors", 1000);
  for (const char* cmd : {"logits", "run", "inspect"}) {
    std::string args = std::string(cmd) + " --model " + dir_.string();
    if (std::string(cmd) != "inspect") args += " --tokens 1,2";
    RunResult r = RunFathom(args);
    EXPECT_EQ(r.exit_code, 1) << cmd << ": " << r.err;
    EXPECT_NE(r.err.find("error: DATA_LOSS: safetensors file"), std::string::npos) << cmd << ": " << r.err;
    EXPECT_NE(r.err.find("model.safetensors"), std::string::npos) << r.err;
  }
}

TEST_F(BrokenModelDir, CorruptHeaderFailsCleanly) {
  {
    std::fstream f(dir_ / "model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(20);
    f << "\x01\x02garbage}}}";
  }
  RunResult r = RunFathom("logits --model " + dir_.string() + " --tokens 1");
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("error:"), std::string::npos) << r.err;
}

TEST_F(BrokenModelDir, BrokenConfigFailsCleanly) {
  std::ofstream(dir_ / "config.json") << R"({"model_type": "qwen2", "vocab_size": 512)";
  RunResult r = RunFathom("logits --model " + dir_.string() + " --tokens 1");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("not valid JSON"), std::string::npos) << r.err;
  std::ofstream(dir_ / "config.json") << R"({"model_type": "gpt2", "vocab_size": 512})";
  r = RunFathom("inspect --model " + dir_.string());
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("supported: LlamaForCausalLM"), std::string::npos) << r.err;
}

TEST(CliTest, BadArgumentsFailCleanly) {
  const std::string dir = testing::ModelDir("qwen2-tied-tiny");
  RunResult r = RunFathom("logits --model " + dir + " --tokens 1,x,3");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("bad token id 'x'"), std::string::npos) << r.err;
  r = RunFathom("logits --model " + dir + " --tokens 1,99999");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("outside the vocabulary"), std::string::npos) << r.err;
  r = RunFathom("logits --model /no/such/dir --tokens 1");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("/no/such/dir"), std::string::npos) << r.err;
  r = RunFathom("frobnicate");
  EXPECT_EQ(r.exit_code, 2);
}

// Usage errors: exit status 2, one line naming what was typed, in the order typed, and the help to read.
TEST(CliTest, UsageErrorsExitTwoAndSayWhatWasWrong) {
  RunResult r = RunFathom("frobnicate");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("unknown command 'frobnicate' (commands: "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("serve"), std::string::npos) << r.err;
  r = RunFathom("serve --max-tokens 5");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("error: unknown option '--max-tokens'"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("Run 'fathom serve --help'"), std::string::npos) << r.err;
  r = RunFathom("serve --port x");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  r = RunFathom("logits");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--model is required"), std::string::npos) << r.err;
  r = RunFathom("--version");
  EXPECT_EQ(r.exit_code, 0);
  r = RunFathom("serve --help");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.out.find("--no-enable-prefix-caching  Turn prefix caching off"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("{false}"), std::string::npos) << r.out;
}

// `fathom run` with no --model runs the demo, as `serve` does; a folder with a config and no weights names the
// dummy load format.
TEST(CliTest, RunDefaultsToTheDemoAndAFolderWithoutWeightsSuggestsDummy) {
  RunResult r = RunFathom("run --tokens 1,2,3 --max-tokens 4 --ignore-eos");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("no --model: using the built-in demo"), std::string::npos) << r.err;
  int numbers = 0;
  for (size_t i = 0; i < r.out.size(); ++i)
    numbers += r.out[i] != ' ' && r.out[i] != '\n' && (i == 0 || r.out[i - 1] == ' ');
  EXPECT_EQ(numbers, 4) << r.out;
  const fs::path dir = fs::temp_directory_path() / ("fathom_noweights_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  fs::copy_file(testing::DataDir() + "/configs/deepseek-r1-distill-qwen-7b.json", dir / "config.json",
                fs::copy_options::overwrite_existing);
  r = RunFathom("run --model " + dir.string() + " --tokens 1,2");
  fs::remove_all(dir);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--load-format dummy runs it with random weights"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace fathom
