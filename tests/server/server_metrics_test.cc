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
  EXPECT_TRUE(Has(text, "fathom_request_queue_length 0"));
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
  m.OnStep(s);
  s.last_step_kind = "prefill";
  s.prefix_cache_queried_tokens = 200;
  s.prefix_cache_hit_tokens = 120;
  m.OnStep(s);
  const std::string text = m.Expose();
  EXPECT_TRUE(Has(text, "fathom_step_duration_seconds_count{kind=\"decode\"} 1")) << text;
  EXPECT_TRUE(Has(text, "fathom_step_duration_seconds_count{kind=\"prefill\"} 1"));
  EXPECT_TRUE(Has(text, "fathom_preemptions_total 2"));
  EXPECT_TRUE(Has(text, "fathom_prefix_cache_hit_tokens_total 120"));
  EXPECT_TRUE(Has(text, "fathom_prefix_cache_queries_tokens_total 200"));
  EXPECT_TRUE(Has(text, "fathom_kv_cache_hit_ratio 0.8"));  // (120 - 40) / (200 - 100) over the window
}

}  // namespace
}  // namespace fathom::server
