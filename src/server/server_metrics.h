// fathom's Prometheus metrics: request latencies and token counters from each finished request, engine step
// durations and cache/queue gauges from the engine, process and GPU (NVML) metrics. Bucket boundaries are in
// docs/OBSERVABILITY.md. The engine's metrics carry the replica (`replica="0"`, and `device` on the gauges), also
// with a single engine, so that one dashboard serves both layouts.
//
//   ServerMetrics metrics;
//   metrics.AttachEngines(&group);                              // gauges read each replica's Stats() at scrape time
//   replica_i.SetStepObserver([&](const EngineStats& s) { metrics.OnStep(s, i); });
//   server.SetRecordHook([&](const RequestRecord& r) { metrics.OnRequest(r); });
//   server.SetMetricsHandler([&] { return metrics.Expose(); });
//   server.SetInternalErrorHook([&](std::string_view where) { metrics.OnInternalError(where); });
#pragma once

#include <atomic>
#include <chrono>
#include <deque>
#include <mutex>
#include <string>
#include <tuple>

#include "engine/engine.h"
#include "engine/engine_group.h"
#include "obs/metrics.h"
#include "server/server.h"

namespace fathom::server {

class ServerMetrics {
 public:
  ServerMetrics();
  // `engines` outlives the metrics' use of it; null detaches. The first attach registers each replica's gauges.
  void AttachEngines(const EngineGroup* engines);
  void OnRequest(const RequestRecord& r);
  // The server's exception barrier caught something (OpenAiServer::SetInternalErrorHook).
  void OnInternalError(std::string_view where);
  // A replica's engine thread, after each of its steps.
  void OnStep(const EngineStats& s, int32_t replica = 0);
  std::string Expose() const { return registry_.Expose(); }
  obs::Registry& registry() { return registry_; }

 private:
  // What the metrics keep of one replica; touched by its engine thread (OnStep) and the scraping thread.
  struct Replica {
    obs::Counter* preemptions = nullptr;
    obs::Counter* prefix_hit_tokens = nullptr;
    obs::Counter* prefix_queried_tokens = nullptr;
    obs::Counter* grammar_mask = nullptr;
    obs::Counter* grammar_wait = nullptr;
    obs::Counter* collective = nullptr;
    // Engine counters already exported (the engine's are cumulative; the counters get the increments).
    int64_t seen_preemptions = 0;
    int64_t seen_hit_tokens = 0;
    int64_t seen_queried_tokens = 0;
    double seen_grammar_mask_s = 0.0;
    double seen_grammar_wait_s = 0.0;
    double seen_collective_s = 0.0;
    // Prefix-cache lookups over the last kHitWindow: (time, queried, hit) samples.
    mutable std::mutex window_mu;
    std::deque<std::tuple<std::chrono::steady_clock::time_point, int64_t, int64_t>> window;
    double WindowHitRatio() const;
  };
  Replica& ReplicaState(int32_t replica);
  EngineStats Snapshot(int32_t replica) const;

  obs::Registry registry_;
  std::atomic<const EngineGroup*> engines_{nullptr};
  std::once_flag gauges_once_;
  obs::Histogram* e2e_;
  obs::Histogram* ttft_;
  obs::Histogram* itl_;
  obs::Histogram* queue_;
  obs::Histogram* prefill_;
  obs::Histogram* decode_;
  obs::HistogramFamily* step_;
  obs::Counter* prompt_tokens_;
  obs::Counter* generation_tokens_;
  obs::CounterFamily* prefix_hit_tokens_;
  obs::CounterFamily* prefix_queried_tokens_;
  obs::CounterFamily* requests_;
  obs::CounterFamily* replica_requests_;
  obs::CounterFamily* preemptions_;
  obs::CounterFamily* grammar_mask_;
  obs::CounterFamily* grammar_wait_;
  obs::CounterFamily* collective_;
  obs::GaugeFamily* queue_length_;
  obs::GaugeFamily* running_;
  obs::GaugeFamily* kv_usage_;
  obs::GaugeFamily* kv_blocks_used_;
  obs::GaugeFamily* hit_ratio_;
  obs::GaugeFamily* replica_info_;
  obs::GaugeFamily* engine_failed_;
  obs::CounterFamily* rejected_;
  obs::Counter* oom_;
  obs::CounterFamily* structured_;
  obs::Histogram* grammar_compile_;
  obs::Histogram* grammar_time_;
  obs::CounterFamily* internal_errors_;
  mutable std::mutex replicas_mu_;
  std::deque<Replica> replicas_;  // by replica index; a deque, so that references stay valid as it grows
};

}  // namespace fathom::server
