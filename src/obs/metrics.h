// Prometheus metrics: counters, gauges and histograms in a registry, rendered as text exposition format 0.0.4.
// Hand-written because Debian 12 packages no Prometheus client library (no prometheus-cpp).
//
//   Registry registry;
//   auto& requests = registry.AddCounter("fathom_requests_total", "Finished requests", {"finish_reason", "status"});
//   Counter& ok_stop = requests.WithLabels({"stop", "200"});      // look up once, keep the reference
//   ok_stop.Inc();                                                // hot path: one relaxed atomic add
//   Gauge& queue = registry.AddGauge("fathom_request_queue_length", "Waiting requests").Get();  // unlabelled
//   queue.Set(3);
//   registry.AddCallbackGauge("fathom_kv_cache_usage_ratio", "KV blocks in use", [&] { return kv.usage(); });
//   auto& ttft = registry.AddHistogram("fathom_time_to_first_token_seconds", "TTFT", kLatencyBuckets);
//   ttft.Get().Observe(0.042);
//   std::string body = registry.Expose();                         // GET /metrics, Content-Type kExpositionContentType
//
//   FATHOM_RETURN_IF_ERROR(RegisterProcessMetrics(registry));     // process_resident_memory_bytes, ...
//   StatusOr<int> gpus = RegisterGpuMetrics(registry);            // NVML through dlopen; Unavailable without it
//
// Children (one per label-value tuple) live as long as the registry and never move: cache references to them.
// Updates are lock-free; registration and WithLabels take a mutex. Bad names, a wrong number of label values and
// duplicate registration are programmer errors (FATHOM_CHECK). Expose() lists families in registration order and
// children in lexicographic order of their label values; a labelled family without children still gets its
// HELP and TYPE lines, so that a scrape names every family.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "core/check.h"
#include "core/status.h"

namespace fathom::obs {

inline constexpr std::string_view kExpositionContentType = "text/plain; version=0.0.4; charset=utf-8";

// Bucket upper bounds (seconds) for LLM serving; `le="+Inf"` is always added.
// kLatencyBuckets, 1 ms .. 60 s: time to first token, end-to-end latency, queue time, prefill and decode time.
inline constexpr std::array<double, 24> kLatencyBuckets = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1,
                                                           0.15,  0.2,    0.3,   0.4,  0.5,   0.75, 1,     1.5,
                                                           2,     2.5,    5,     7.5,  10,    20,   30,    60};
// kInterTokenBuckets, 1 ms .. 2 s: inter-token latency and engine step duration.
inline constexpr std::array<double, 20> kInterTokenBuckets = {0.001, 0.0025, 0.005, 0.0075, 0.01,  0.015, 0.02,
                                                              0.025, 0.03,   0.04,  0.05,   0.075, 0.1,   0.15,
                                                              0.2,   0.3,    0.5,   0.75,   1,     2};
inline constexpr std::span<const double> kStepDurationBuckets = kInterTokenBuckets;

using LabelValues = std::vector<std::string>;

// Monotonic. Integer increments are exact (an integer atomic); fractional ones go to a separate double.
class Counter {
 public:
  template <typename T = int64_t>
  requires std::is_arithmetic_v<T>
  void Inc(T v = 1) {
    if constexpr (std::is_signed_v<T>) FATHOM_CHECK(v >= 0, "counters only go up");
    if constexpr (std::is_integral_v<T>) {
      int_part_.fetch_add(static_cast<uint64_t>(v), std::memory_order_relaxed);
    } else {
      double_part_.fetch_add(static_cast<double>(v), std::memory_order_relaxed);
    }
  }
  double Value() const;

 private:
  std::atomic<uint64_t> int_part_{0};
  std::atomic<double> double_part_{0.0};
};

// Goes up and down; or, with a callback (GaugeFamily::SetCallback), computed at scrape time.
class Gauge {
 public:
  Gauge() = default;
  ~Gauge();
  Gauge(const Gauge&) = delete;
  Gauge& operator=(const Gauge&) = delete;

  void Set(double v) { value_.store(v, std::memory_order_relaxed); }
  void Inc(double v = 1.0) { value_.fetch_add(v, std::memory_order_relaxed); }
  void Dec(double v = 1.0) { value_.fetch_sub(v, std::memory_order_relaxed); }
  // The callback's result when one is set, else the stored value.
  double Value() const;

 private:
  template <typename T>
  friend class Family;
  std::atomic<double> value_{0.0};
  std::atomic<const std::function<double()>*> callback_{nullptr};  // set at most once, owned
};

// Fixed upper bounds; an observation equal to a bound counts in that bound's bucket (le is "<=").
class Histogram {
 public:
  explicit Histogram(std::span<const double> bounds);
  void Observe(double v);

  struct Snapshot {
    std::vector<double> bounds;        // without +Inf
    std::vector<uint64_t> cumulative;  // bounds.size() + 1 entries; the last is the +Inf bucket == count
    double sum = 0;
    uint64_t count = 0;
  };
  // Buckets are read one by one while writers may run: count is the sum of the buckets read, so that
  // `le="+Inf"` always equals `_count`; `sum` may lag the buckets by in-flight observations.
  Snapshot Read() const;

 private:
  std::vector<double> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> buckets_;  // per-bucket (not cumulative) counts, +Inf last
  std::atomic<double> sum_{0.0};
};

enum class MetricType { kCounter, kGauge, kHistogram };

class FamilyBase {
 public:
  FamilyBase(std::string name, std::string help, MetricType type, std::vector<std::string> label_names)
      : name_(std::move(name)), help_(std::move(help)), type_(type), label_names_(std::move(label_names)) {}
  virtual ~FamilyBase() = default;
  const std::string& name() const { return name_; }
  MetricType type() const { return type_; }
  const std::vector<std::string>& label_names() const { return label_names_; }
  // Appends this family's HELP, TYPE and sample lines.
  virtual void Render(std::string& out) const = 0;

 protected:
  void RenderHeader(std::string& out) const;
  std::string name_;
  std::string help_;
  MetricType type_;
  std::vector<std::string> label_names_;
};

// All children of one metric name, one per tuple of label values (in the order of the label names).
template <typename T>
class Family final : public FamilyBase {
 public:
  Family(std::string name, std::string help, MetricType type, std::vector<std::string> label_names,
         std::vector<double> bounds = {});

  // Creates the child on first use; the reference stays valid as long as the registry.
  T& WithLabels(const LabelValues& values);
  // The single child of a family without labels.
  T& Get();
  // Gauges only: the child's value becomes fn() at scrape time. At most one callback per child; fn runs on the
  // scraping thread, must be thread-safe, and must not touch the registry.
  T& SetCallback(const LabelValues& values, std::function<double()> fn) requires std::is_same_v<T, Gauge>;

  void Render(std::string& out) const override;

 private:
  T& GetOrCreate(const LabelValues& values);
  std::vector<double> bounds_;  // histograms
  mutable std::mutex mu_;
  std::map<LabelValues, std::unique_ptr<T>> children_;  // lexicographic order: deterministic exposition
};

using CounterFamily = Family<Counter>;
using GaugeFamily = Family<Gauge>;
using HistogramFamily = Family<Histogram>;

class Registry {
 public:
  Registry() = default;
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // Names match [a-zA-Z_:][a-zA-Z0-9_:]*, label names [a-zA-Z_][a-zA-Z0-9_]* without a "__" prefix.
  CounterFamily& AddCounter(std::string name, std::string help, std::vector<std::string> label_names = {});
  GaugeFamily& AddGauge(std::string name, std::string help, std::vector<std::string> label_names = {});
  // Bounds strictly increasing and finite; "le" is not a valid label name here.
  HistogramFamily& AddHistogram(std::string name, std::string help, std::span<const double> bounds,
                                std::vector<std::string> label_names = {});
  // An unlabelled gauge whose value is fn() at scrape time.
  Gauge& AddCallbackGauge(std::string name, std::string help, std::function<double()> fn);

  bool Has(std::string_view name) const;
  std::string Expose() const;

 private:
  void CheckNewFamily(const std::string& name, MetricType type, const std::vector<std::string>& label_names) const;
  mutable std::mutex mu_;
  std::vector<std::unique_ptr<FamilyBase>> families_;  // registration order
};

// Prometheus number syntax: integral values without exponent or fraction, +Inf, -Inf, NaN, else shortest round-trip.
std::string FormatMetricValue(double v);
std::string EscapeLabelValue(std::string_view s);  // \ " and newline
std::string EscapeHelp(std::string_view s);        // \ and newline
bool IsValidMetricName(std::string_view name);
bool IsValidLabelName(std::string_view name);

// Callback gauges process_resident_memory_bytes and process_open_fds (read at scrape time from /proc/self/statm and
// /proc/self/fd) and process_start_time_seconds (from /proc/self/stat and the boot time in /proc/stat), the names
// of Prometheus's process collector. FailedPrecondition, with nothing registered, when /proc cannot be read.
Status RegisterProcessMetrics(Registry& registry);

// Callback gauges fathom_gpu_utilization_ratio, fathom_gpu_memory_used_bytes and fathom_gpu_memory_total_bytes,
// labelled gpu="<index>", read through NVML at scrape time. NVML is loaded with dlopen (no link-time dependency on
// the driver); returns the number of GPUs, or Unavailable with nothing registered when the library cannot be loaded
// or initialised or reports no GPU. `library` is for tests. Memory "used" is nvmlMemory_t v1's, which counts the
// driver's reservation (about 0.6 GB on an idle H200) that nvidia-smi leaves out.
StatusOr<int> RegisterGpuMetrics(Registry& registry, const char* library = "libnvidia-ml.so.1");

}  // namespace fathom::obs
