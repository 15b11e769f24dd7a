// fathom's Prometheus metrics: request latencies and token counters from each finished request, engine step
// durations and cache/queue gauges from the engine, process and GPU (NVML) metrics. Bucket boundaries are in
// docs/OBSERVABILITY.md.
//
//   ServerMetrics metrics;
//   metrics.AttachEngine(&engine);                              // gauges read engine.Stats() at scrape time
//   engine.SetStepObserver([&](const EngineStats& s) { metrics.OnStep(s); });
//   server.SetRecordHook([&](const RequestRecord& r) { metrics.OnRequest(r); });
//   server.SetMetricsHandler([&] { return metrics.Expose(); });
//   server.SetInternalErrorHook([&](std::string_view where) { metrics.OnInternalError(where); });
#pragma once

#include <atomic>
#include <chrono>
#include <deque>
#include <mutex>
#include <string>

#include "engine/engine.h"
#include "obs/metrics.h"
#include "server/server.h"

namespace fathom::server {

class ServerMetrics {
 public:
  ServerMetrics();
  // `engine` outlives the metrics' use of it; null detaches.
  void AttachEngine(const Engine* engine);
  void OnRequest(const RequestRecord& r);
  // The server's exception barrier caught something (OpenAiServer::SetInternalErrorHook).
  void OnInternalError(std::string_view where);
  // Engine thread, after each step.
  void OnStep(const EngineStats& s);
  std::string Expose() const { return registry_.Expose(); }
  obs::Registry& registry() { return registry_; }

 private:
  EngineStats Snapshot() const;
  double WindowHitRatio() const;

  obs::Registry registry_;
  std::atomic<const Engine*> engine_{nullptr};
  obs::Histogram* e2e_;
  obs::Histogram* ttft_;
  obs::Histogram* itl_;
  obs::Histogram* queue_;
  obs::Histogram* prefill_;
  obs::Histogram* decode_;
  obs::HistogramFamily* step_;
  obs::Counter* prompt_tokens_;
  obs::Counter* generation_tokens_;
  obs::Counter* prefix_hit_tokens_;
  obs::Counter* prefix_queried_tokens_;
  obs::CounterFamily* requests_;
  obs::Counter* preemptions_;
  obs::CounterFamily* rejected_;
  obs::Counter* oom_;
  obs::CounterFamily* internal_errors_;
  // Engine counters already exported (the engine's are cumulative; the counters get the increments).
  int64_t seen_preemptions_ = 0;
  int64_t seen_hit_tokens_ = 0;
  int64_t seen_queried_tokens_ = 0;
  // Prefix-cache lookups over the last kHitWindow: (time, queried, hit) samples.
  mutable std::mutex window_mu_;
  std::deque<std::tuple<std::chrono::steady_clock::time_point, int64_t, int64_t>> window_;
};

}  // namespace fathom::server
