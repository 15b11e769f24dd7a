#include "server/server_metrics.h"

#include <gtest/gtest.h>

#include <string>

namespace fathom::server {
namespace {

bool Has(const std::string& text, const std::string& line) {
  return text.find(line + "\n") != std::string::npos;
}

TEST(ServerMetricsTest, RequestsFeedHistogramsAndCounters) {
  ServerMetrics m;
  RequestRecord r;
  r.path = "/v1/chat/completions";
  r.http_status = 200;
  r.finish_reason = "stop";
  r.prompt_tokens = 7;
  r.completion_tokens = 3;
  r.ttft = 0.02;
  r.total = 0.5;
  r.inter_token_gaps = {0.004, 0.006};
  m.OnRequest(r);
  RequestRecord rejected;
  rejected.path = "/v1/completions";
  rejected.http_status = 429;
  rejected.error_code = "queue_full";
  m.OnRequest(rejected);
  const std::string text = m.Expose();
  EXPECT_TRUE(Has(text, "fathom_prompt_tokens_total 7")) << text;
  EXPECT_TRUE(Has(text, "fathom_generation_tokens_total 3"));
  EXPECT_TRUE(Has(text, "fathom_time_to_first_token_seconds_count 1"));
  EXPECT_TRUE(Has(text, "fathom_time_to_first_token_seconds_bucket{le=\"0.025\"} 1"));
  EXPECT_TRUE(Has(text, "fathom_time_to_first_token_seconds_bucket{le=\"0.01\"} 0"));
  EXPECT_TRUE(Has(text, "fathom_inter_token_latency_seconds_count 2"));
  EXPECT_TRUE(Has(text, "fathom_requests_total{finish_reason=\"stop\",status=\"200\"} 1"));
  EXPECT_TRUE(Has(text, "fathom_requests_total{finish_reason=\"none\",status=\"429\"} 1"));
  EXPECT_TRUE(Has(text, "fathom_requests_rejected_total{reason=\"queue_full\"} 1"));
  EXPECT_TRUE(Has(text, "fathom_requests_rejected_total{reason=\"too_long\"} 0"));
  // No engine attached: the engine gauges are named (HELP and TYPE) and have no replica yet.
  EXPECT_TRUE(Has(text, "# TYPE fathom_request_queue_length gauge"));
  EXPECT_EQ(text.find("fathom_request_queue_length{"), std::string::npos);
  EXPECT_NE(text.find("process_resident_memory_bytes"), std::string::npos);
}

TEST(ServerMetricsTest, EngineStepsFeedStepHistogramAndCacheCounters) {
  ServerMetrics m;
  EngineStats s;
  s.last_step_kind = "decode";
  s.last_step_s = 0.012;
  s.num_preemptions = 2;
  s.prefix_cache_queried_tokens = 100;
  s.prefix_cache_hit_tokens = 40;
  s.total_grammar_mask_s = 0.25;
  s.total_grammar_wait_s = 0.125;
  s.total_collective_s = 0.5;
  m.OnStep(s);
  s.total_grammar_mask_s = 0.75;
  s.total_collective_s = 1.25;
  s.last_step_kind = "prefill";
  s.prefix_cache_queried_tokens = 200;
  s.prefix_cache_hit_tokens = 120;
  m.OnStep(s);
  const std::string text = m.Expose();
  EXPECT_TRUE(Has(text, "fathom_step_duration_seconds_count{kind=\"decode\",replica=\"0\"} 1")) << text;
  EXPECT_TRUE(Has(text, "fathom_step_duration_seconds_count{kind=\"prefill\",replica=\"0\"} 1"));
  EXPECT_TRUE(Has(text, "fathom_preemptions_total{replica=\"0\"} 2"));
  EXPECT_TRUE(Has(text, "fathom_prefix_cache_hit_tokens_total{replica=\"0\"} 120"));
  EXPECT_TRUE(Has(text, "fathom_prefix_cache_queries_tokens_total{replica=\"0\"} 200"));
  // Structured output's mask time and the engine's wait for it: the engine's totals, differenced.
  EXPECT_TRUE(Has(text, "fathom_grammar_mask_seconds_total{replica=\"0\"} 0.75")) << text;
  EXPECT_TRUE(Has(text, "fathom_grammar_mask_wait_seconds_total{replica=\"0\"} 0.125")) << text;
  // Tensor parallelism's collectives, likewise.
  EXPECT_TRUE(Has(text, "fathom_collective_seconds_total{replica=\"0\"} 1.25")) << text;
}

// Two replicas' steps land in their own series, and each replica's cumulative counters are differenced on their
// own (replica 1's smaller totals do not read as a reset of replica 0's).
TEST(ServerMetricsTest, ReplicasKeepTheirOwnSeries) {
  ServerMetrics m;
  EngineStats a;
  a.last_step_kind = "decode";
  a.last_step_s = 0.01;
  a.num_preemptions = 5;
  a.prefix_cache_queried_tokens = 300;
  a.prefix_cache_hit_tokens = 100;
  m.OnStep(a, 0);
  EngineStats b = a;
  b.num_preemptions = 1;
  b.prefix_cache_queried_tokens = 50;
  b.prefix_cache_hit_tokens = 10;
  m.OnStep(b, 1);
  a.num_preemptions = 7;
  m.OnStep(a, 0);
  RequestRecord r;
  r.path = "/v1/completions";
  r.http_status = 200;
  r.finish_reason = "length";
  r.replica = 1;
  r.placement = "prefix";
  m.OnRequest(r);
  const std::string text = m.Expose();
  EXPECT_TRUE(Has(text, "fathom_preemptions_total{replica=\"0\"} 7")) << text;
  EXPECT_TRUE(Has(text, "fathom_preemptions_total{replica=\"1\"} 1"));
  EXPECT_TRUE(Has(text, "fathom_prefix_cache_hit_tokens_total{replica=\"1\"} 10"));
  EXPECT_TRUE(Has(text, "fathom_step_duration_seconds_count{kind=\"decode\",replica=\"0\"} 2"));
  EXPECT_TRUE(Has(text, "fathom_step_duration_seconds_count{kind=\"decode\",replica=\"1\"} 1"));
  EXPECT_TRUE(Has(text, "fathom_replica_requests_total{replica=\"1\",placement=\"prefix\"} 1"));
}

}  // namespace
}  // namespace fathom::server
