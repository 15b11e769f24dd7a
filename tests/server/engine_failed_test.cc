// An engine whose model broke for good (a tensor-parallel rank failed or hung) makes /health answer 503 "failed" with
// the cause, and fathom_engine_failed 1 for its replica, so that a probe or an alert restarts the process; before,
// /health is 200 and the gauge 0.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "backend/cpu/cpu_backend.h"
#include "engine/engine.h"
#include "engine/engine_group.h"
#include "io/model_config.h"
#include "loopback.h"
#include "model/model.h"
#include "server/server.h"
#include "server/server_metrics.h"

namespace fathom::server {
namespace {

std::string Get(uint16_t port, const std::string& path) {
  return Exchange(port, "GET " + path + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
}

// A model without weights whose forward pass fails, once armed, and leaves it broken for good (as an aborted
// tensor-parallel group does).
class BreakingModel final : public Model {
 public:
  explicit BreakingModel(ModelConfig cfg) : cfg_(std::move(cfg)) {}
  const ModelConfig& config() const override { return cfg_; }
  KvCacheSpec kv_cache_spec() const override {
    return {.num_layers = 1, .num_kv_heads = 1, .k_dim = 4, .v_dim = 4, .v_in_k = false};
  }
  Status Forward(const ForwardBatch& /*batch*/, KvCache& /*kv*/, Tensor* /*logits*/) override {
    broken_ = DeadlineExceededError("a tensor-parallel step made no progress for 300 s (injected)");
    return broken_;
  }
  Status broken() const override { return broken_; }

 private:
  ModelConfig cfg_;
  Status broken_;
};

constexpr const char* kConfig = R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
  "vocab_size": 64, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1,
  "num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": 256, "rms_norm_eps": 1e-6,
  "rope_theta": 10000, "bos_token_id": 0, "eos_token_id": 1, "torch_dtype": "bfloat16"})";

TEST(EngineFailedTest, HealthAndTheGaugeReportAFailedEngine) {
  auto cfg = ParseModelConfigText(kConfig);
  ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
  CpuBackend backend;
  BreakingModel model(*cfg);
  EngineConfig ec;
  ec.num_blocks = 16;
  ec.block_size = 16;
  auto core = EngineCore::Create(model, backend, ec, nullptr);
  ASSERT_TRUE(core.ok()) << core.status().ToString();
  Engine engine(std::move(core).value());
  EngineGroup engines({&engine});

  ServerOptions o;
  o.http.port = 0;
  o.access_log = "";
  OpenAiServer srv(o);
  ServerMetrics metrics;
  metrics.AttachEngines(&engines);
  srv.Attach({.engines = &engines});
  ASSERT_TRUE(srv.Start().ok());
  const std::string gauge = "fathom_engine_failed{replica=\"0\",device=\"cpu\"} ";
  EXPECT_EQ(Get(srv.port(), "/health").rfind("HTTP/1.1 200 ", 0), 0u);
  EXPECT_NE(metrics.Expose().find(gauge + "0\n"), std::string::npos) << metrics.Expose();

  auto stream = engine.Submit({.prompt = {5, 6, 7}, .sampling = {.max_tokens = 2}});
  ASSERT_TRUE(stream.ok()) << stream.status().ToString();
  RequestOutput out;
  while ((*stream)->Next(&out)) {
  }
  EXPECT_EQ(out.finish_reason, FinishReason::kError);
  for (int i = 0; i < 500 && engines.failed().ok(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));

  const std::string health = Get(srv.port(), "/health");
  ASSERT_EQ(health.rfind("HTTP/1.1 503 ", 0), 0u) << health;
  const nlohmann::json body = nlohmann::json::parse(health.substr(health.find("\r\n\r\n") + 4));
  EXPECT_EQ(body["status"], "failed");
  EXPECT_NE(body["error"].get<std::string>().find("no progress for 300 s (injected)"), std::string::npos)
      << body.dump();
  EXPECT_NE(metrics.Expose().find(gauge + "1\n"), std::string::npos) << metrics.Expose();
  srv.Stop();
}

}  // namespace
}  // namespace fathom::server
