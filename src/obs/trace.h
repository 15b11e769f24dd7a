// A process-wide Chrome/Perfetto trace recorder (JSON object format; open the file in ui.perfetto.dev or
// chrome://tracing). Off by default; switched on and off at run time.
//
//   SetTraceThreadName("engine");                        // any time, even while off; emitted as thread_name metadata
//   FATHOM_RETURN_IF_ERROR(StartTracing());               // --trace-file: at startup; /debug/trace: window start
//   {
//     TraceSpan span("step", "engine");                  // ph "X" from construction to destruction
//     span.Arg("batch", 12).Arg("kind", "decode");       // small args object
//     span.FlowIn("request", flow_id);                   // arrow from the request's previous span ends here
//   }
//   uint64_t flow_id = NewTraceFlowId();                  // one per request, carried with it across threads
//   { TraceSpan s("http", "server"); s.FlowOut("request", flow_id); }  // arrow starts in this span
//   TraceInstant("preempt", "sched", {{"seq", 7}});
//   std::string json = StopTracing();                     // {"traceEvents":[...],"displayTimeUnit":"ms",...}
//   FATHOM_RETURN_IF_ERROR(StopTracingToFile(path));      // or write it out
//
// While off, a TraceSpan costs one relaxed atomic load and a branch: no clock read, no allocation. While on, each
// event is copied into one buffer under a mutex; past TraceOptions::max_events further events are dropped and
// counted (TraceStats, and "otherData":{"dropped_events":N} in the JSON). Names and categories passed to TraceSpan
// must outlive the span (string literals); they are copied when the event is recorded.
#pragma once

#include <atomic>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "core/status.h"

namespace fathom::obs {

namespace internal {
inline std::atomic<bool> g_tracing_on{false};
}  // namespace internal

inline bool TracingEnabled() {
  return internal::g_tracing_on.load(std::memory_order_relaxed);
}

struct TraceOptions {
  // About 150 bytes an event (more with args): the default bounds a trace to some 150 MB.
  size_t max_events = 1'000'000;
};

struct TraceStats {
  bool on = false;
  size_t recorded = 0;   // events in the buffer
  uint64_t dropped = 0;  // events refused because the buffer was full, since StartTracing
};

// Clears the buffer and starts recording. FailedPrecondition when already on (e.g. a /debug/trace window while
// --trace-file records the whole run).
Status StartTracing(TraceOptions options = {});
// Stops recording and returns the trace as JSON (an empty trace when it was not on). The buffer is released.
std::string StopTracing();
// Stops recording and writes the JSON to `path`.
Status StopTracingToFile(const std::string& path);
TraceStats GetTraceStats();

// Names the calling thread in traces (thread_name metadata). Remembered while tracing is off.
void SetTraceThreadName(std::string_view name);
// A process-unique id for flow arrows (never 0).
uint64_t NewTraceFlowId();

// Nanoseconds on the trace clock (steady_clock; the origin is arbitrary, as Chrome's ts allows).
int64_t TraceNowNs();

// Low-level recorders; each is a no-op while tracing is off. `args` is a JSON object or null.
void TraceComplete(std::string_view name, std::string_view category, int64_t start_ns, int64_t dur_ns,
                   nlohmann::json args = nullptr);
void TraceInstant(std::string_view name, std::string_view category, nlohmann::json args = nullptr);
// Flow arrows: start ("s") in one span, optional steps ("t"), finish ("f", bound to the enclosing span, bp "e").
// Start and finish of one arrow use the same name, category and id. Call them inside a span on the same thread.
void TraceFlowStart(std::string_view name, std::string_view category, uint64_t id);
void TraceFlowStep(std::string_view name, std::string_view category, uint64_t id);
void TraceFlowEnd(std::string_view name, std::string_view category, uint64_t id);
// A counter track ("C"), e.g. queue length over time.
void TraceCounter(std::string_view name, std::string_view category, double value);

// RAII complete event ("X").
class TraceSpan {
 public:
  TraceSpan(std::string_view name, std::string_view category) : name_(name), category_(category) {
    if (TracingEnabled()) [[unlikely]]
      start_ns_ = TraceNowNs();
  }
  ~TraceSpan() {
    if (start_ns_ >= 0) [[unlikely]]
      End();
  }
  TraceSpan(const TraceSpan&) = delete;
  TraceSpan& operator=(const TraceSpan&) = delete;

  bool active() const { return start_ns_ >= 0; }
  // Adds an argument (shown in the span's details). No-op while inactive.
  template <typename V>
  TraceSpan& Arg(const char* key, V&& value) {
    if (start_ns_ >= 0) [[unlikely]] {
      if (args_ == nullptr) args_ = new nlohmann::json(nlohmann::json::object());
      (*args_)[key] = std::forward<V>(value);
    }
    return *this;
  }
  // An arrow leaving this span / arriving in this span (see TraceFlowStart / TraceFlowEnd). Category "flow".
  TraceSpan& FlowOut(std::string_view flow_name, uint64_t id);
  TraceSpan& FlowIn(std::string_view flow_name, uint64_t id);
  // Records the span now instead of at destruction.
  void End();

 private:
  std::string_view name_;
  std::string_view category_;
  int64_t start_ns_ = -1;  // -1: inactive (tracing was off at construction) or already ended
  // Owned; a raw pointer so that an inactive span has a trivial destructor path (unique_ptr would test it again).
  nlohmann::json* args_ = nullptr;
};

}  // namespace fathom::obs
