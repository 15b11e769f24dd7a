// `fathom bench` end to end through the built binary: the exit code when every request fails, a sweep against a fake
// streaming server with JSON and SVG output, and the offline mode on a tiny model.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "fake_server.h"

namespace fathom::bench {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct RunResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};

fs::path TempPath(const std::string& name) {
  return fs::temp_directory_path() / ("fathom_bench_cli_" + std::to_string(::getpid()) + "_" + name);
}

RunResult RunFathom(const std::string& args) {
  static int counter = 0;
  const fs::path err_path = TempPath("err" + std::to_string(counter++));
  const std::string cmd = std::string(FATHOM_CLI_PATH) + " " + args + " 2>" + err_path.string();
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

json ReadJson(const fs::path& path) {
  std::ifstream in(path);
  return json::parse(in);
}

TEST(BenchCliTest, EveryRequestFailingExitsNonZero) {
  const fs::path dataset = TempPath("ds.jsonl");
  const fs::path out = TempPath("fail.json");
  {
    std::ofstream f(dataset);
    f << R"({"prompt": "hello"})"
      << "\n";
  }
  const uint16_t port = testing::ClosedPort();
  RunResult r =
      RunFathom(fmt::format("bench --base-url http://127.0.0.1:{} --model m --dataset {} --num-requests 4 "
                            "--concurrency 2 --warmup 0 --output {}",
                            port, dataset.string(), out.string()));
  EXPECT_NE(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("Failed requests:"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("connection_refused x4"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("every request failed"), std::string::npos) << r.err;
  const json j = ReadJson(out);
  EXPECT_EQ(j["mode"], "online");
  EXPECT_EQ(j["levels"][0]["completed"], 0);
  EXPECT_EQ(j["levels"][0]["failed"], 4);
  EXPECT_EQ(j["levels"][0]["failures"]["connection_refused"]["count"], 4);
  EXPECT_TRUE(j["levels"][0]["prefix_cache_hit_rate"].is_null());  // no usage came back
  fs::remove(dataset);
  fs::remove(out);
}

TEST(BenchCliTest, SweepAgainstAFakeServer) {
  testing::FakeServer server([](int64_t) { return testing::Reply::kStream; }, {.chunks = 4, .gap_ms = 5});
  const fs::path out = TempPath("sweep.json");
  const fs::path svg = TempPath("sweep.svg");
  // No --model (from /v1/models) and no --tokenizer (the server's /tokenize).
  RunResult r =
      RunFathom(fmt::format("bench --base-url {} --num-requests 6 --input-len 16 --output-len 4 "
                            "--concurrency 1,3 --warmup 1 --slo ttft=10s,tpot=10s --output {} --plot {} "
                            "--save-detailed",
                            server.url(), out.string(), svg.string()));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("concurrency 3"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("prefix cache at concurrency 3: 75.0% of the input tokens (36)"), std::string::npos) << r.out;
  const json j = ReadJson(out);
  ASSERT_EQ(j["levels"].size(), 2u);
  EXPECT_EQ(j["config"]["model"], "fake-model");
  for (const json& l : j["levels"]) {
    EXPECT_EQ(l["completed"], 6);
    EXPECT_EQ(l["failed"], 0);
    EXPECT_EQ(l["total_output_tokens"], 24);
    EXPECT_EQ(l["cached_input_tokens"], 36);  // the fake server's usage: 6 of each 8 prompt tokens cached
    EXPECT_EQ(l["prefix_cache_hit_rate"], 0.75);
    EXPECT_GT(l["ttft_ms"]["p99"].get<double>(), 0);
    EXPECT_GT(l["itl_ms"]["median"].get<double>(), 0);
    EXPECT_EQ(l["goodput"]["good_requests"], 6);
    EXPECT_GT(l["server_timing"]["share"]["decode"].get<double>(), 0.5);
    EXPECT_EQ(l["requests"].size(), 6u);
  }
  EXPECT_EQ(j["levels"][1]["load"]["concurrency"], 3);
  std::ifstream in(svg);
  const std::string text((std::istreambuf_iterator<char>(in)), {});
  EXPECT_EQ(text.rfind("<svg", 0), 0u);
  EXPECT_NE(text.find("TTFT"), std::string::npos);
  EXPECT_NE(text.find("Output throughput over time"), std::string::npos);
  EXPECT_EQ(server.requests(), 13);  // 1 warm-up + 2 x 6
  fs::remove(out);
  fs::remove(svg);
}

// A token budget of one prompt (40 tokens) a step staggers four prefills: the first sequences decode beside the later
// prefills and finish early, so the decode steps hold fewer than four. The bench says so, and its roofline is of that
// batch.
TEST(BenchCliTest, OfflineStaggeredPrefillsAreReported) {
  const fs::path out = TempPath("offline_staggered.json");
  const std::string model = std::string(FATHOM_TEST_DATA_DIR) + "/models/qwen2-distill-tiny";
  RunResult r = RunFathom(
      fmt::format("bench --offline --model {} --batch-size 4 --input-len 40 --output-len 6 --max-num-batched-tokens 40 "
                  "--threads 2 --output {}",
                  model, out.string()));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const json j = ReadJson(out);
  ASSERT_EQ(j["levels"].size(), 1u);
  const double held = j["levels"][0]["decode_batch_mean"].get<double>();
  EXPECT_GT(held, 0.0);
  EXPECT_LT(held, 3.5);
  EXPECT_NE(r.out.find("note: the decode steps held"), std::string::npos) << r.out;
  // --prefill-first: the prompts are prefilled in a pass of their own and their two full blocks of 16 found in the
  // prefix cache by the measured one, whose 4 x 8 tail tokens take one step: every decode step holds the whole batch.
  r = RunFathom(
      fmt::format("bench --offline --model {} --batch-size 4 --input-len 40 --output-len 6 --max-num-batched-tokens 40 "
                  "--prefill-first --threads 2 --output {}",
                  model, out.string()));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const json whole = ReadJson(out);
  EXPECT_DOUBLE_EQ(whole["levels"][0]["decode_batch_mean"].get<double>(), 4.0);
  EXPECT_EQ(whole["levels"][0]["decode_step_ms"]["count"], 5);
  EXPECT_GE(whole["levels"][0]["prefill_steps"].get<int>(), 4);  // the first pass's: one prompt a step
  EXPECT_EQ(r.out.find("note: the decode steps held"), std::string::npos) << r.out;
  r =
      RunFathom(fmt::format("bench --offline --model {} --batch-size 2 --input-len 8 --output-len 4 --prefill-first "
                            "--no-enable-prefix-caching --threads 2",
                            model));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--prefill-first needs prefix caching"), std::string::npos) << r.err;
  // --synthetic-prefill: no prompt is computed (the prefill steps run no forward pass), yet the measured pass decodes
  // the whole batch over the same rows, and the level says it has no prefill figures.
  r = RunFathom(
      fmt::format("bench --offline --model {} --batch-size 4 --input-len 40 --output-len 6 --max-num-batched-tokens 40 "
                  "--synthetic-prefill --threads 2 --output {}",
                  model, out.string()));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const json synthetic = ReadJson(out);
  const json& level = synthetic["levels"][0];
  EXPECT_DOUBLE_EQ(level["decode_batch_mean"].get<double>(), 4.0);
  EXPECT_EQ(level["decode_step_ms"]["count"], 5);
  EXPECT_EQ(level["synthetic_prefill"], true);
  EXPECT_EQ(level["prefill_steps"], 0);
  EXPECT_EQ(level["prefill_s"], 0.0);
  EXPECT_GT(level["decode_tokens_per_s"].get<double>(), 0.0);
  EXPECT_NE(r.out.find("note: synthetic prefill"), std::string::npos) << r.out;
  EXPECT_EQ(whole["levels"][0]["synthetic_prefill"], false);
}

TEST(BenchCliTest, OfflineTinyModel) {
  const fs::path out = TempPath("offline.json");
  const std::string model = std::string(FATHOM_TEST_DATA_DIR) + "/models/qwen2-distill-tiny";
  RunResult r = RunFathom(
      fmt::format("bench --offline --model {} --batch-size 1,2 --input-len 8 --output-len 4 --threads 2 --output {}",
                  model, out.string()));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("MBU"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("MFU"), std::string::npos) << r.out;
  const json j = ReadJson(out);
  EXPECT_EQ(j["mode"], "offline");
  EXPECT_GT(j["peaks"]["bandwidth_bytes_per_s"].get<double>(), 0);
  EXPECT_GT(j["peaks"]["flops_per_s"].get<double>(), 0);
  EXPECT_NE(j["peaks"]["flops_source"].get<std::string>().find("measured"), std::string::npos);
  EXPECT_GT(j["model_costs"]["weight_bytes"].get<double>(), 0);
  EXPECT_GT(j["model_costs"]["kv_bytes_per_token"].get<double>(), 0);
  ASSERT_EQ(j["levels"].size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    const json& l = j["levels"][i];
    EXPECT_EQ(l["batch_size"], static_cast<int>(i + 1));
    for (const char* key : {"prefill_tokens_per_s", "decode_tokens_per_s", "prefill_mfu"}) {
      EXPECT_GT(l[key].get<double>(), 0) << key;
    }
    EXPECT_GT(l["ttft_ms"]["mean"].get<double>(), 0);
    EXPECT_EQ(l["decode_step_ms"]["count"], 3);
    EXPECT_GT(l["decode_step_ms"]["mean"].get<double>(), 0);
    for (const char* key : {"weight_bytes_per_step", "kv_bytes_per_step", "bytes_per_step", "flops_per_step", "mbu",
                            "mfu", "theoretical_tokens_per_s", "bandwidth_bound_tokens_per_s",
                            "compute_bound_tokens_per_s", "measured_tokens_per_s", "mean_context"}) {
      EXPECT_GT(l["roofline"][key].get<double>(), 0) << key;
    }
    EXPECT_DOUBLE_EQ(l["roofline"]["mean_context"].get<double>(), 8 + 4 / 2.0);
    EXPECT_DOUBLE_EQ(l["decode_batch_mean"].get<double>(), static_cast<double>(i + 1));  // the whole batch
  }
  fs::remove(out);
}

TEST(BenchCliTest, FlagsOfTheOtherMode) {
  RunResult r = RunFathom("bench --offline --model x --concurrency 4");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--concurrency applies to online mode only"), std::string::npos) << r.err;
  r = RunFathom("bench --base-url http://127.0.0.1:1 --batch-size 4");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--batch-size applies to --offline mode only"), std::string::npos) << r.err;
  r = RunFathom("bench --base-url https://x --model m");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("https is not supported"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace fathom::bench
