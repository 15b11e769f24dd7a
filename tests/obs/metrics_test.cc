// Prometheus registry: exact exposition text, escaping, histogram buckets, concurrent updates, process and GPU
// collectors.
#include "obs/metrics.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <sstream>
#include <thread>
#include <vector>

namespace fathom::obs {
namespace {

// The value of the first sample line starting with `prefix` (name plus labels), or NaN.
double SampleValue(const std::string& text, const std::string& prefix) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.starts_with(prefix + " ")) return std::stod(line.substr(prefix.size() + 1));
  }
  return std::numeric_limits<double>::quiet_NaN();
}

TEST(FormatMetricValueTest, PrometheusNumberSyntax) {
  EXPECT_EQ(FormatMetricValue(0), "0");
  EXPECT_EQ(FormatMetricValue(-0.0), "0");
  EXPECT_EQ(FormatMetricValue(3), "3");
  EXPECT_EQ(FormatMetricValue(-2), "-2");
  EXPECT_EQ(FormatMetricValue(1234567890123.0), "1234567890123");
  EXPECT_EQ(FormatMetricValue(0.25), "0.25");
  EXPECT_EQ(FormatMetricValue(0.001), "0.001");
  EXPECT_EQ(FormatMetricValue(1.5e-7), "1.5e-07");
  EXPECT_EQ(FormatMetricValue(1e20), "1e+20");
  EXPECT_EQ(FormatMetricValue(std::numeric_limits<double>::infinity()), "+Inf");
  EXPECT_EQ(FormatMetricValue(-std::numeric_limits<double>::infinity()), "-Inf");
  EXPECT_EQ(FormatMetricValue(std::numeric_limits<double>::quiet_NaN()), "NaN");
  EXPECT_EQ(std::stod(FormatMetricValue(0.1 + 0.2)), 0.1 + 0.2);  // round-trips
}

TEST(MetricNameTest, Validation) {
  EXPECT_TRUE(IsValidMetricName("fathom_requests_total"));
  EXPECT_TRUE(IsValidMetricName("job:rate5m"));
  EXPECT_TRUE(IsValidMetricName("_x"));
  EXPECT_FALSE(IsValidMetricName(""));
  EXPECT_FALSE(IsValidMetricName("1abc"));
  EXPECT_FALSE(IsValidMetricName("a-b"));
  EXPECT_FALSE(IsValidMetricName("a b"));
  EXPECT_TRUE(IsValidLabelName("finish_reason"));
  EXPECT_FALSE(IsValidLabelName("__name__"));
  EXPECT_FALSE(IsValidLabelName("a:b"));
  EXPECT_FALSE(IsValidLabelName("9"));
}

TEST(RegistryTest, UnlabelledCounterAndGauge) {
  Registry r;
  Counter& c = r.AddCounter("fathom_prompt_tokens_total", "Prompt tokens processed").Get();
  Gauge& g = r.AddGauge("fathom_request_queue_length", "Waiting requests").Get();
  EXPECT_EQ(r.Expose(),
            "# HELP fathom_prompt_tokens_total Prompt tokens processed\n"
            "# TYPE fathom_prompt_tokens_total counter\n"
            "fathom_prompt_tokens_total 0\n"
            "# HELP fathom_request_queue_length Waiting requests\n"
            "# TYPE fathom_request_queue_length gauge\n"
            "fathom_request_queue_length 0\n");
  c.Inc();
  c.Inc(41);
  g.Set(7);
  g.Inc();
  g.Dec(3);
  g.Inc(0.5);
  EXPECT_EQ(c.Value(), 42);
  EXPECT_EQ(g.Value(), 5.5);
  EXPECT_EQ(r.Expose(),
            "# HELP fathom_prompt_tokens_total Prompt tokens processed\n"
            "# TYPE fathom_prompt_tokens_total counter\n"
            "fathom_prompt_tokens_total 42\n"
            "# HELP fathom_request_queue_length Waiting requests\n"
            "# TYPE fathom_request_queue_length gauge\n"
            "fathom_request_queue_length 5.5\n");
}

TEST(RegistryTest, CounterMixesIntegerAndFractionalIncrements) {
  Registry r;
  Counter& c = r.AddCounter("x_seconds_total", "h").Get();
  c.Inc(2);
  c.Inc(0.25);
  c.Inc(uint64_t{1});
  EXPECT_EQ(c.Value(), 3.25);
  EXPECT_EQ(SampleValue(r.Expose(), "x_seconds_total"), 3.25);
}

TEST(RegistryTest, LabelledFamilyOrderAndEscaping) {
  Registry r;
  auto& fam = r.AddCounter("fathom_requests_total", "Finished requests\nby \\reason", {"finish_reason", "status"});
  EXPECT_EQ(r.Expose(),
            "# HELP fathom_requests_total Finished requests\\nby \\\\reason\n"
            "# TYPE fathom_requests_total counter\n");
  Counter& stop_ok = fam.WithLabels({"stop", "200"});
  fam.WithLabels({"length", "200"}).Inc(2);
  stop_ok.Inc();
  stop_ok.Inc();
  fam.WithLabels({"a\"b\\c\nd", "500"}).Inc();
  EXPECT_EQ(&fam.WithLabels({"stop", "200"}), &stop_ok);  // stable child
  EXPECT_EQ(r.Expose(),
            "# HELP fathom_requests_total Finished requests\\nby \\\\reason\n"
            "# TYPE fathom_requests_total counter\n"
            "fathom_requests_total{finish_reason=\"a\\\"b\\\\c\\nd\",status=\"500\"} 1\n"
            "fathom_requests_total{finish_reason=\"length\",status=\"200\"} 2\n"
            "fathom_requests_total{finish_reason=\"stop\",status=\"200\"} 2\n");
}

TEST(RegistryTest, LabelsFollowTheOrderOfTheLabelNames) {
  Registry r;
  auto& fam = r.AddGauge("g", "h", {"zeta", "alpha"});
  fam.WithLabels({"1", "2"}).Set(-1.5);
  EXPECT_EQ(r.Expose(), "# HELP g h\n# TYPE g gauge\ng{zeta=\"1\",alpha=\"2\"} -1.5\n");
}

TEST(RegistryTest, FamiliesInRegistrationOrder) {
  Registry r;
  r.AddGauge("zzz", "last letter");
  r.AddGauge("aaa", "first letter");
  const std::string text = r.Expose();
  EXPECT_LT(text.find("zzz"), text.find("aaa"));
  EXPECT_TRUE(r.Has("zzz"));
  EXPECT_FALSE(r.Has("zz"));
}

TEST(RegistryTest, CallbackGauges) {
  Registry r;
  double v = 1;
  r.AddCallbackGauge("fathom_kv_cache_usage_ratio", "KV blocks in use", [&] { return v; });
  auto& fam = r.AddGauge("fathom_gpu_utilization_ratio", "u", {"gpu"});
  fam.SetCallback({"1"}, [] { return 0.75; });
  fam.SetCallback({"0"}, [] { return std::numeric_limits<double>::infinity(); });
  v = 0.5;
  EXPECT_EQ(r.Expose(),
            "# HELP fathom_kv_cache_usage_ratio KV blocks in use\n"
            "# TYPE fathom_kv_cache_usage_ratio gauge\n"
            "fathom_kv_cache_usage_ratio 0.5\n"
            "# HELP fathom_gpu_utilization_ratio u\n"
            "# TYPE fathom_gpu_utilization_ratio gauge\n"
            "fathom_gpu_utilization_ratio{gpu=\"0\"} +Inf\n"
            "fathom_gpu_utilization_ratio{gpu=\"1\"} 0.75\n");
  v = 0.25;
  EXPECT_EQ(SampleValue(r.Expose(), "fathom_kv_cache_usage_ratio"), 0.25);  // evaluated at every scrape
}

TEST(HistogramTest, CumulativeBucketsSumCountAndInclusiveBounds) {
  Registry r;
  const std::vector<double> bounds = {0.125, 0.5, 1};  // binary fractions: the sum below is exact
  Histogram& h = r.AddHistogram("fathom_time_to_first_token_seconds", "TTFT", bounds).Get();
  h.Observe(0.0625);
  h.Observe(0.125);  // exactly on a bound: counts in le="0.125"
  h.Observe(0.25);
  h.Observe(1);
  h.Observe(7);  // only +Inf
  EXPECT_EQ(r.Expose(),
            "# HELP fathom_time_to_first_token_seconds TTFT\n"
            "# TYPE fathom_time_to_first_token_seconds histogram\n"
            "fathom_time_to_first_token_seconds_bucket{le=\"0.125\"} 2\n"
            "fathom_time_to_first_token_seconds_bucket{le=\"0.5\"} 3\n"
            "fathom_time_to_first_token_seconds_bucket{le=\"1\"} 4\n"
            "fathom_time_to_first_token_seconds_bucket{le=\"+Inf\"} 5\n"
            "fathom_time_to_first_token_seconds_sum 8.4375\n"
            "fathom_time_to_first_token_seconds_count 5\n");
}

TEST(HistogramTest, LabelledHistogramPutsLeLast) {
  Registry r;
  const std::vector<double> bounds = {0.01};
  auto& fam = r.AddHistogram("fathom_step_duration_seconds", "Step", bounds, {"kind"});
  fam.WithLabels({"decode"}).Observe(0.002);
  fam.WithLabels({"prefill"}).Observe(0.5);
  EXPECT_EQ(r.Expose(),
            "# HELP fathom_step_duration_seconds Step\n"
            "# TYPE fathom_step_duration_seconds histogram\n"
            "fathom_step_duration_seconds_bucket{kind=\"decode\",le=\"0.01\"} 1\n"
            "fathom_step_duration_seconds_bucket{kind=\"decode\",le=\"+Inf\"} 1\n"
            "fathom_step_duration_seconds_sum{kind=\"decode\"} 0.002\n"
            "fathom_step_duration_seconds_count{kind=\"decode\"} 1\n"
            "fathom_step_duration_seconds_bucket{kind=\"prefill\",le=\"0.01\"} 0\n"
            "fathom_step_duration_seconds_bucket{kind=\"prefill\",le=\"+Inf\"} 1\n"
            "fathom_step_duration_seconds_sum{kind=\"prefill\"} 0.5\n"
            "fathom_step_duration_seconds_count{kind=\"prefill\"} 1\n");
}

TEST(HistogramTest, LlmBucketSets) {
  EXPECT_EQ(kLatencyBuckets.front(), 0.001);
  EXPECT_EQ(kLatencyBuckets.back(), 60);
  EXPECT_EQ(kInterTokenBuckets.front(), 0.001);
  EXPECT_EQ(kInterTokenBuckets.back(), 2);
  EXPECT_TRUE(std::is_sorted(kLatencyBuckets.begin(), kLatencyBuckets.end()));
  EXPECT_TRUE(std::is_sorted(kInterTokenBuckets.begin(), kInterTokenBuckets.end()));
  Registry r;
  Histogram& h = r.AddHistogram("lat_seconds", "h", kLatencyBuckets).Get();
  h.Observe(0.0025);
  h.Observe(std::numeric_limits<double>::quiet_NaN());  // goes to +Inf only
  const Histogram::Snapshot s = h.Read();
  ASSERT_EQ(s.cumulative.size(), kLatencyBuckets.size() + 1);
  EXPECT_EQ(s.cumulative[0], 0u);  // le 0.001
  EXPECT_EQ(s.cumulative[1], 1u);  // le 0.0025
  EXPECT_EQ(s.cumulative[kLatencyBuckets.size() - 1], 1u);
  EXPECT_EQ(s.cumulative.back(), 2u);
  EXPECT_EQ(s.count, 2u);
  const std::string text = r.Expose();
  EXPECT_NE(text.find("lat_seconds_bucket{le=\"0.0025\"} 1\n"), std::string::npos);
  EXPECT_NE(text.find("lat_seconds_bucket{le=\"60\"} 1\n"), std::string::npos);
  EXPECT_NE(text.find("lat_seconds_sum NaN\n"), std::string::npos);
}

TEST(RegistryTest, ConcurrentUpdatesSumExactly) {
  Registry r;
  auto& fam = r.AddCounter("c_total", "h", {"t"});
  Counter& shared = r.AddCounter("shared_total", "h").Get();
  Gauge& gauge = r.AddGauge("g", "h").Get();
  const std::vector<double> bounds = {0.5};
  Histogram& hist = r.AddHistogram("h_seconds", "h", bounds).Get();
  constexpr int kThreads = 8;
  constexpr int kIters = 100000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      Counter& mine = fam.WithLabels({std::to_string(t % 2)});
      for (int i = 0; i < kIters; ++i) {
        shared.Inc();
        mine.Inc();
        gauge.Inc(1.0);
        hist.Observe((i % 2) != 0 ? 1.0 : 0.25);
      }
    });
  }
  std::thread scraper([&] {
    for (int i = 0; i < 20; ++i) (void)r.Expose();
  });
  for (auto& th : threads) th.join();
  scraper.join();
  const double total = static_cast<double>(kThreads) * kIters;
  EXPECT_EQ(shared.Value(), total);
  EXPECT_EQ(fam.WithLabels({"0"}).Value() + fam.WithLabels({"1"}).Value(), total);
  EXPECT_EQ(gauge.Value(), total);
  const std::string text = r.Expose();
  EXPECT_EQ(SampleValue(text, "h_seconds_count"), total);
  EXPECT_EQ(SampleValue(text, "h_seconds_bucket{le=\"0.5\"}"), total / 2);
  EXPECT_EQ(SampleValue(text, "h_seconds_sum"), total / 2 * 1.25);
}

TEST(ProcessMetricsTest, PresentAndPlausible) {
  Registry r;
  ASSERT_TRUE(RegisterProcessMetrics(r).ok());
  const std::string text = r.Expose();
  EXPECT_NE(text.find("# TYPE process_resident_memory_bytes gauge\n"), std::string::npos);
  EXPECT_NE(text.find("# TYPE process_open_fds gauge\n"), std::string::npos);
  EXPECT_NE(text.find("# TYPE process_start_time_seconds gauge\n"), std::string::npos);
  const double rss = SampleValue(text, "process_resident_memory_bytes");
  EXPECT_GT(rss, 1 << 20);  // a gtest binary is larger than 1 MiB
  EXPECT_LT(rss, 64e9);
  const double fds = SampleValue(text, "process_open_fds");
  EXPECT_GE(fds, 3);  // stdin, stdout, stderr
  EXPECT_LT(fds, 100000);
  const double start = SampleValue(text, "process_start_time_seconds");
  const double now = static_cast<double>(std::time(nullptr));
  EXPECT_GT(start, now - 3600);  // this test process started within the hour
  EXPECT_LE(start, now + 1);
}

TEST(ProcessMetricsTest, OpenFdsFollowOpenFiles) {
  Registry r;
  ASSERT_TRUE(RegisterProcessMetrics(r).ok());
  const double before = SampleValue(r.Expose(), "process_open_fds");
  std::vector<FILE*> files;
  for (int i = 0; i < 5; ++i) files.push_back(std::fopen("/proc/self/stat", "r"));
  const double during = SampleValue(r.Expose(), "process_open_fds");
  for (FILE* f : files) std::fclose(f);
  EXPECT_EQ(during, before + 5);
}

TEST(GpuMetricsTest, MissingLibraryRegistersNothing) {
  Registry r;
  StatusOr<int> n = RegisterGpuMetrics(r, "libfathom-no-such-nvml.so.1");
  ASSERT_FALSE(n.ok());
  EXPECT_EQ(n.status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(r.Expose(), "");
  EXPECT_FALSE(r.Has("fathom_gpu_utilization_ratio"));
}

// With the real library: GPU families iff NVML loads (none on the CPU build machine, one per GPU elsewhere).
TEST(GpuMetricsTest, SystemNvml) {
  Registry r;
  StatusOr<int> n = RegisterGpuMetrics(r);
  const std::string text = r.Expose();
  if (!n.ok()) {
    EXPECT_EQ(n.status().code(), StatusCode::kUnavailable);
    EXPECT_EQ(text.find("fathom_gpu"), std::string::npos);
    GTEST_SKIP() << n.status().ToString();
  }
  ASSERT_GT(*n, 0);
  for (int i = 0; i < *n; ++i) {
    const std::string gpu = "{gpu=\"" + std::to_string(i) + "\"}";
    const double util = SampleValue(text, "fathom_gpu_utilization_ratio" + gpu);
    const double used = SampleValue(text, "fathom_gpu_memory_used_bytes" + gpu);
    const double total = SampleValue(text, "fathom_gpu_memory_total_bytes" + gpu);
    EXPECT_GE(util, 0);
    EXPECT_LE(util, 1);
    EXPECT_GT(total, 1e9);
    EXPECT_LE(used, total);
    std::printf("gpu %d: utilization %.2f, memory %.0f / %.0f bytes\n", i, util, used, total);
  }
}

TEST(RegistryDeathTest, ProgrammerErrors) {
  EXPECT_DEATH(
      {
        Registry r;
        r.AddCounter("bad-name", "h");
      },
      "invalid metric name");
  EXPECT_DEATH(
      {
        Registry r;
        r.AddCounter("x_total", "h", {"__reserved"});
      },
      "invalid label name");
  EXPECT_DEATH(
      {
        Registry r;
        r.AddGauge("x", "h");
        r.AddCounter("x", "h");
      },
      "clashes");
  EXPECT_DEATH(
      {
        Registry r;
        const std::vector<double> b = {1};
        r.AddHistogram("lat", "h", b);
        r.AddGauge("lat_count", "h");
      },
      "clashes");
  EXPECT_DEATH(
      {
        Registry r;
        r.AddCounter("x_total", "h", {"a", "b"}).WithLabels({"only one"});
      },
      "label values");
  EXPECT_DEATH(
      {
        Registry r;
        r.AddHistogram("lat", "h", std::vector<double>({1, 0.5}));
      },
      "increase");
  EXPECT_DEATH(
      {
        Registry r;
        const std::vector<double> b = {1};
        r.AddHistogram("lat", "h", b, {"le"});
      },
      "reserved");
  EXPECT_DEATH(
      {
        Registry r;
        r.AddCounter("x_total", "h").Get().Inc(-1);
      },
      "only go up");
}

}  // namespace
}  // namespace fathom::obs
