#include "server/server_metrics.h"

#include "core/logging.h"

namespace fathom::server {

namespace {

constexpr auto kHitWindow = std::chrono::seconds(60);

}  // namespace

ServerMetrics::ServerMetrics() {
  using obs::kInterTokenBuckets;
  using obs::kLatencyBuckets;
  e2e_ = &registry_.AddHistogram("fathom_request_latency_seconds", "End-to-end request latency", kLatencyBuckets).Get();
  ttft_ =
      &registry_
           .AddHistogram("fathom_time_to_first_token_seconds", "Time from arrival to the first token", kLatencyBuckets)
           .Get();
  itl_ = &registry_
              .AddHistogram("fathom_inter_token_latency_seconds", "Gaps between streamed token outputs",
                            kInterTokenBuckets)
              .Get();
  queue_ =
      &registry_
           .AddHistogram("fathom_request_queue_time_seconds", "Time waiting before the first schedule", kLatencyBuckets)
           .Get();
  prefill_ =
      &registry_.AddHistogram("fathom_request_prefill_time_seconds", "First schedule to first token", kLatencyBuckets)
           .Get();
  decode_ =
      &registry_.AddHistogram("fathom_request_decode_time_seconds", "First token to finish", kLatencyBuckets).Get();
  step_ = &registry_.AddHistogram("fathom_step_duration_seconds", "Engine step (schedule + forward + sample)",
                                  obs::kStepDurationBuckets, {"kind"});
  registry_.AddCallbackGauge("fathom_request_queue_length", "Requests waiting to be scheduled",
                             [this] { return Snapshot().num_waiting; });
  registry_.AddCallbackGauge("fathom_requests_running", "Requests being computed",
                             [this] { return Snapshot().num_running; });
  registry_.AddCallbackGauge("fathom_kv_cache_usage_ratio", "KV-cache blocks in use over all blocks",
                             [this] { return Snapshot().kv_usage; });
  registry_.AddCallbackGauge("fathom_kv_cache_blocks_used", "KV-cache blocks in use", [this] {
    const EngineStats s = Snapshot();
    return static_cast<double>(s.num_blocks - s.num_free_blocks);
  });
  registry_.AddCallbackGauge("fathom_kv_cache_hit_ratio", "Prefix-cache hit tokens over looked-up tokens, last 60 s",
                             [this] { return WindowHitRatio(); });
  prompt_tokens_ = &registry_.AddCounter("fathom_prompt_tokens_total", "Prompt tokens of finished requests").Get();
  generation_tokens_ =
      &registry_.AddCounter("fathom_generation_tokens_total", "Generated tokens of finished requests").Get();
  prefix_hit_tokens_ =
      &registry_.AddCounter("fathom_prefix_cache_hit_tokens_total", "Prompt tokens found in the prefix cache").Get();
  prefix_queried_tokens_ =
      &registry_.AddCounter("fathom_prefix_cache_queries_tokens_total", "Prompt tokens looked up in the prefix cache")
           .Get();
  requests_ =
      &registry_.AddCounter("fathom_requests_total", "Finished generation requests", {"finish_reason", "status"});
  preemptions_ = &registry_.AddCounter("fathom_preemptions_total", "Sequences preempted for KV-cache space").Get();
  rejected_ = &registry_.AddCounter("fathom_requests_rejected_total", "Requests refused before generation", {"reason"});
  for (const char* reason : {"queue_full", "queue_timeout", "too_long", "invalid", "unauthorized"}) {
    rejected_->WithLabels({reason});
  }
  oom_ = &registry_.AddCounter("fathom_oom_events_total", "Steps that failed for lack of device memory").Get();
  internal_errors_ = &registry_.AddCounter("fathom_internal_errors_total",
                                           "Exceptions the request barrier caught (answered 500; each one is a bug)",
                                           {"where"});
  for (const char* where : {"handler", "stream", "trace"}) internal_errors_->WithLabels({where});
  if (Status s = obs::RegisterProcessMetrics(registry_); !s.ok()) FATHOM_LOG_WARN("process metrics: {}", s.message());
  if (auto gpus = obs::RegisterGpuMetrics(registry_); gpus.ok()) {
    FATHOM_LOG_INFO("GPU metrics: {} device(s) through NVML", *gpus);
  }
}

void ServerMetrics::OnInternalError(std::string_view where) {
  internal_errors_->WithLabels({std::string(where)}).Inc();
}

void ServerMetrics::AttachEngine(const Engine* engine) {
  engine_.store(engine);
}

EngineStats ServerMetrics::Snapshot() const {
  const Engine* e = engine_.load();
  return e == nullptr ? EngineStats() : e->Stats();
}

double ServerMetrics::WindowHitRatio() const {
  std::lock_guard<std::mutex> lock(window_mu_);
  if (window_.size() < 2) return 0.0;
  const auto& [t0, q0, h0] = window_.front();
  const auto& [t1, q1, h1] = window_.back();
  const int64_t queried = q1 - q0;
  return queried > 0 ? static_cast<double>(h1 - h0) / static_cast<double>(queried) : 0.0;
}

void ServerMetrics::OnStep(const EngineStats& s) {
  if (s.last_step_kind != nullptr && *s.last_step_kind != '\0')
    step_->WithLabels({s.last_step_kind}).Observe(s.last_step_s);
  if (s.num_preemptions > seen_preemptions_) preemptions_->Inc(s.num_preemptions - seen_preemptions_);
  if (s.prefix_cache_hit_tokens > seen_hit_tokens_)
    prefix_hit_tokens_->Inc(s.prefix_cache_hit_tokens - seen_hit_tokens_);
  if (s.prefix_cache_queried_tokens > seen_queried_tokens_) {
    prefix_queried_tokens_->Inc(s.prefix_cache_queried_tokens - seen_queried_tokens_);
  }
  seen_preemptions_ = s.num_preemptions;
  seen_hit_tokens_ = s.prefix_cache_hit_tokens;
  seen_queried_tokens_ = s.prefix_cache_queried_tokens;
  const auto now = std::chrono::steady_clock::now();
  std::lock_guard<std::mutex> lock(window_mu_);
  window_.emplace_back(now, s.prefix_cache_queried_tokens, s.prefix_cache_hit_tokens);
  while (window_.size() > 2 && now - std::get<0>(window_[1]) >= kHitWindow) window_.pop_front();
}

void ServerMetrics::OnRequest(const RequestRecord& r) {
  const bool generation = r.path == "/v1/chat/completions" || r.path == "/v1/completions";
  if (!r.error_code.empty()) {
    static const char* kReasons[] = {"queue_full", "queue_timeout", "too_long", "invalid", "unauthorized"};
    for (const char* reason : kReasons) {
      if (r.error_code == reason) rejected_->WithLabels({reason}).Inc();
    }
    if (r.error_code == "model_not_found") rejected_->WithLabels({"invalid"}).Inc();
  }
  if (!generation) return;
  requests_->WithLabels({r.finish_reason.empty() ? "none" : r.finish_reason, std::to_string(r.http_status)}).Inc();
  if (r.error_code == "resource_exhausted") oom_->Inc();
  if (r.http_status != 200 && r.http_status != 499) return;
  e2e_->Observe(r.total);
  if (r.completion_tokens > 0) ttft_->Observe(r.ttft);
  for (double gap : r.inter_token_gaps) itl_->Observe(gap);
  queue_->Observe(r.queue);
  prefill_->Observe(r.prefill);
  decode_->Observe(r.decode);
  prompt_tokens_->Inc(r.prompt_tokens);
  generation_tokens_->Inc(r.completion_tokens);
}

}  // namespace fathom::server
