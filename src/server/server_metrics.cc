#include "server/server_metrics.h"

#include <algorithm>

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
                                  obs::kStepDurationBuckets, {"kind", "replica"});
  const std::vector<std::string> replica_device = {"replica", "device"};
  queue_length_ =
      &registry_.AddGauge("fathom_request_queue_length", "Requests waiting to be scheduled", replica_device);
  running_ = &registry_.AddGauge("fathom_requests_running", "Requests being computed", replica_device);
  kv_usage_ =
      &registry_.AddGauge("fathom_kv_cache_usage_ratio", "KV-cache blocks in use over all blocks", replica_device);
  kv_blocks_used_ = &registry_.AddGauge("fathom_kv_cache_blocks_used", "KV-cache blocks in use", replica_device);
  hit_ratio_ = &registry_.AddGauge("fathom_kv_cache_hit_ratio",
                                   "Prefix-cache hit tokens over looked-up tokens, last 60 s", replica_device);
  replica_info_ = &registry_.AddGauge("fathom_replica_info", "1 per engine replica: its device and placement policy",
                                      {"replica", "device", "policy"});
  engine_failed_ = &registry_.AddGauge(
      "fathom_engine_failed", "1 when the replica's model broke for good (a tensor-parallel rank failed or hung)",
      replica_device);
  prompt_tokens_ = &registry_.AddCounter("fathom_prompt_tokens_total", "Prompt tokens of finished requests").Get();
  generation_tokens_ =
      &registry_.AddCounter("fathom_generation_tokens_total", "Generated tokens of finished requests").Get();
  prefix_hit_tokens_ = &registry_.AddCounter("fathom_prefix_cache_hit_tokens_total",
                                             "Prompt tokens found in the prefix cache", {"replica"});
  prefix_queried_tokens_ = &registry_.AddCounter("fathom_prefix_cache_queries_tokens_total",
                                                 "Prompt tokens looked up in the prefix cache", {"replica"});
  requests_ =
      &registry_.AddCounter("fathom_requests_total", "Finished generation requests", {"finish_reason", "status"});
  replica_requests_ = &registry_.AddCounter("fathom_replica_requests_total",
                                            "Finished generation requests by the replica that ran them and why it "
                                            "was chosen (prefix, least_loaded, round_robin, overflow, single)",
                                            {"replica", "placement"});
  preemptions_ =
      &registry_.AddCounter("fathom_preemptions_total", "Sequences preempted for KV-cache space", {"replica"});
  grammar_mask_ = &registry_.AddCounter(
      "fathom_grammar_mask_seconds_total",
      "Computing structured output's token masks (on a GPU while the forward pass runs)", {"replica"});
  grammar_wait_ = &registry_.AddCounter(
      "fathom_grammar_mask_wait_seconds_total",
      "Engine thread waiting for token masks after the forward pass (what the overlap did not hide)", {"replica"});
  collective_ = &registry_.AddCounter(
      "fathom_collective_seconds_total",
      "Tensor parallelism: rank 0's host time in collectives (all-reduce, all-gather), inside the forward pass; on "
      "the CPU it includes waiting for the other ranks, on GPUs only enqueueing NCCL's kernels",
      {"replica"});
  rejected_ = &registry_.AddCounter("fathom_requests_rejected_total", "Requests refused before generation", {"reason"});
  for (const char* reason : {"queue_full", "queue_timeout", "too_long", "invalid", "unauthorized"}) {
    rejected_->WithLabels({reason});
  }
  structured_ = &registry_.AddCounter("fathom_structured_requests_total",
                                      "Generation requests with a structured-output constraint", {"kind"});
  grammar_compile_ = &registry_
                          .AddHistogram("fathom_grammar_compile_seconds",
                                        "Compiling a structured-output constraint (cache misses)", kLatencyBuckets)
                          .Get();
  grammar_time_ = &registry_
                       .AddHistogram("fathom_request_grammar_seconds",
                                     "Token masks and grammar advances of a constrained request", kLatencyBuckets)
                       .Get();
  oom_ = &registry_.AddCounter("fathom_oom_events_total", "Steps that failed for lack of device memory").Get();
  internal_errors_ =
      &registry_.AddCounter("fathom_internal_errors_total",
                            "Exceptions the request barrier caught (answered 500; each one is a bug)", {"where"});
  for (const char* where : {"handler", "stream", "trace"}) internal_errors_->WithLabels({where});
  if (Status s = obs::RegisterProcessMetrics(registry_); !s.ok()) FATHOM_LOG_WARN("process metrics: {}", s.message());
  if (auto gpus = obs::RegisterGpuMetrics(registry_); gpus.ok()) {
    FATHOM_LOG_INFO("GPU metrics: {} device(s) through NVML", *gpus);
  }
}

void ServerMetrics::OnInternalError(std::string_view where) {
  internal_errors_->WithLabels({std::string(where)}).Inc();
}

ServerMetrics::Replica& ServerMetrics::ReplicaState(int32_t replica) {
  std::lock_guard<std::mutex> lock(replicas_mu_);
  while (replicas_.size() <= static_cast<size_t>(replica)) {
    const std::string label = std::to_string(replicas_.size());
    Replica& r = replicas_.emplace_back();
    r.preemptions = &preemptions_->WithLabels({label});
    r.prefix_hit_tokens = &prefix_hit_tokens_->WithLabels({label});
    r.prefix_queried_tokens = &prefix_queried_tokens_->WithLabels({label});
    r.grammar_mask = &grammar_mask_->WithLabels({label});
    r.grammar_wait = &grammar_wait_->WithLabels({label});
    r.collective = &collective_->WithLabels({label});
  }
  return replicas_[static_cast<size_t>(replica)];
}

void ServerMetrics::AttachEngines(const EngineGroup* engines) {
  engines_.store(engines);
  if (engines == nullptr) return;
  std::call_once(gauges_once_, [&] {
    for (int32_t i = 0; i < engines->size(); ++i) {
      const obs::LabelValues labels = {std::to_string(i), engines->device(i)};
      Replica* r = &ReplicaState(i);
      queue_length_->SetCallback(labels, [this, i] { return Snapshot(i).num_waiting; });
      running_->SetCallback(labels, [this, i] { return Snapshot(i).num_running; });
      kv_usage_->SetCallback(labels, [this, i] { return Snapshot(i).kv_usage; });
      kv_blocks_used_->SetCallback(labels, [this, i] {
        const EngineStats s = Snapshot(i);
        return static_cast<double>(s.num_blocks - s.num_free_blocks);
      });
      hit_ratio_->SetCallback(labels, [r] { return r->WindowHitRatio(); });
      engine_failed_->SetCallback(labels, [this, i] {
        const EngineGroup* g = engines_.load();
        return g != nullptr && i < g->size() && !g->replica(i).failed().ok() ? 1.0 : 0.0;
      });
      replica_info_
          ->WithLabels({std::to_string(i), engines->device(i), std::string(PlacementPolicyName(engines->policy()))})
          .Set(1);
    }
  });
}

EngineStats ServerMetrics::Snapshot(int32_t replica) const {
  const EngineGroup* g = engines_.load();
  return g == nullptr || replica >= g->size() ? EngineStats() : g->replica(replica).Stats();
}

double ServerMetrics::Replica::WindowHitRatio() const {
  std::lock_guard<std::mutex> lock(window_mu);
  if (window.size() < 2) return 0.0;
  const auto& [t0, q0, h0] = window.front();
  const auto& [t1, q1, h1] = window.back();
  const int64_t queried = q1 - q0;
  return queried > 0 ? static_cast<double>(h1 - h0) / static_cast<double>(queried) : 0.0;
}

void ServerMetrics::OnStep(const EngineStats& s, int32_t replica) {
  Replica& r = ReplicaState(replica);
  if (s.last_step_kind != nullptr && *s.last_step_kind != '\0')
    step_->WithLabels({s.last_step_kind, std::to_string(replica)}).Observe(s.last_step_s);
  if (s.num_preemptions > r.seen_preemptions) r.preemptions->Inc(s.num_preemptions - r.seen_preemptions);
  if (s.prefix_cache_hit_tokens > r.seen_hit_tokens)
    r.prefix_hit_tokens->Inc(s.prefix_cache_hit_tokens - r.seen_hit_tokens);
  if (s.prefix_cache_queried_tokens > r.seen_queried_tokens) {
    r.prefix_queried_tokens->Inc(s.prefix_cache_queried_tokens - r.seen_queried_tokens);
  }
  if (s.total_grammar_mask_s > r.seen_grammar_mask_s)
    r.grammar_mask->Inc(s.total_grammar_mask_s - r.seen_grammar_mask_s);
  if (s.total_grammar_wait_s > r.seen_grammar_wait_s)
    r.grammar_wait->Inc(s.total_grammar_wait_s - r.seen_grammar_wait_s);
  if (s.total_collective_s > r.seen_collective_s) r.collective->Inc(s.total_collective_s - r.seen_collective_s);
  r.seen_collective_s = std::max(r.seen_collective_s, s.total_collective_s);
  r.seen_grammar_mask_s = std::max(r.seen_grammar_mask_s, s.total_grammar_mask_s);
  r.seen_grammar_wait_s = std::max(r.seen_grammar_wait_s, s.total_grammar_wait_s);
  r.seen_preemptions = s.num_preemptions;
  r.seen_hit_tokens = s.prefix_cache_hit_tokens;
  r.seen_queried_tokens = s.prefix_cache_queried_tokens;
  const auto now = std::chrono::steady_clock::now();
  std::lock_guard<std::mutex> lock(r.window_mu);
  r.window.emplace_back(now, s.prefix_cache_queried_tokens, s.prefix_cache_hit_tokens);
  while (r.window.size() > 2 && now - std::get<0>(r.window[1]) >= kHitWindow) r.window.pop_front();
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
  if (!r.constraint.empty()) structured_->WithLabels({r.constraint}).Inc();
  if (r.grammar_compile > 0) grammar_compile_->Observe(r.grammar_compile);
  requests_->WithLabels({r.finish_reason.empty() ? "none" : r.finish_reason, std::to_string(r.http_status)}).Inc();
  if (r.replica >= 0) {
    replica_requests_->WithLabels({std::to_string(r.replica), r.placement.empty() ? "single" : r.placement}).Inc();
  }
  if (r.error_code == "resource_exhausted") oom_->Inc();
  if (r.http_status != 200 && r.http_status != 499) return;
  e2e_->Observe(r.total);
  if (r.completion_tokens > 0) ttft_->Observe(r.ttft);
  for (double gap : r.inter_token_gaps) itl_->Observe(gap);
  queue_->Observe(r.queue);
  prefill_->Observe(r.prefill);
  decode_->Observe(r.decode);
  if (!r.constraint.empty()) grammar_time_->Observe(r.grammar);
  prompt_tokens_->Inc(r.prompt_tokens);
  generation_tokens_->Inc(r.completion_tokens);
}

}  // namespace fathom::server
