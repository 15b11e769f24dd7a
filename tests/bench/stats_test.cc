// Statistics of `fathom bench`: numpy-style percentiles, TPOT/ITL on synthetic timestamps, goodput, aggregation.
#include "bench/stats.h"

#include <gtest/gtest.h>

#include <cmath>

#include "bench/svg.h"

namespace fathom::bench {
namespace {

TEST(PercentileTest, MatchesNumpyLinearInterpolation) {
  // numpy.percentile([1, 2, 3, 4], q) for q = 0, 25, 50, 90, 99, 100.
  const std::vector<double> v = {1, 2, 3, 4};
  EXPECT_DOUBLE_EQ(Percentile(v, 0), 1.0);
  EXPECT_DOUBLE_EQ(Percentile(v, 25), 1.75);
  EXPECT_DOUBLE_EQ(Percentile(v, 50), 2.5);
  EXPECT_DOUBLE_EQ(Percentile(v, 90), 3.7);
  EXPECT_NEAR(Percentile(v, 99), 3.97, 1e-12);
  EXPECT_DOUBLE_EQ(Percentile(v, 100), 4.0);
  // numpy.percentile(range(1, 101), [90, 95, 99]) = 90.1, 95.05, 99.01.
  std::vector<double> h;
  for (int i = 1; i <= 100; ++i) h.push_back(i);
  EXPECT_NEAR(Percentile(h, 90), 90.1, 1e-9);
  EXPECT_NEAR(Percentile(h, 95), 95.05, 1e-9);
  EXPECT_NEAR(Percentile(h, 99), 99.01, 1e-9);
  EXPECT_DOUBLE_EQ(Percentile({7.0}, 99), 7.0);
  EXPECT_DOUBLE_EQ(Percentile({}, 50), 0.0);
}

TEST(SummarizeTest, UnsortedInput) {
  const Summary s = Summarize({5, 1, 4, 2, 3});
  EXPECT_EQ(s.count, 5);
  EXPECT_DOUBLE_EQ(s.mean, 3.0);
  EXPECT_DOUBLE_EQ(s.median, 3.0);
  EXPECT_DOUBLE_EQ(s.p90, 4.6);
  EXPECT_DOUBLE_EQ(s.p95, 4.8);
  EXPECT_NEAR(s.p99, 4.96, 1e-12);
  EXPECT_DOUBLE_EQ(s.max, 5.0);
  EXPECT_DOUBLE_EQ(s.min, 1.0);
  EXPECT_NEAR(s.stddev, std::sqrt(2.0), 1e-12);
  EXPECT_EQ(Summarize({}).count, 0);
  EXPECT_DOUBLE_EQ(Scale(s, 1e3).p90, 4600.0);
}

RequestRecord Synthetic(std::vector<double> token_times, double e2e, int32_t output_tokens) {
  RequestRecord r;
  r.ok = true;
  r.token_times_s = std::move(token_times);
  r.ttft_s = r.token_times_s.front();
  r.e2e_s = e2e;
  r.output_tokens = output_tokens;
  r.prompt_tokens = 10;
  return r;
}

TEST(TpotItlTest, SyntheticTimestamps) {
  // First token at 100 ms, then 4 more 20 ms apart, stream ends at 190 ms.
  RequestRecord r = Synthetic({0.100, 0.120, 0.140, 0.160, 0.180}, 0.190, 5);
  ASSERT_TRUE(Tpot(r).has_value());
  EXPECT_NEAR(*Tpot(r), (0.190 - 0.100) / 4, 1e-12);
  const std::vector<double> itl = Itls(r);
  ASSERT_EQ(itl.size(), 4u);
  for (double g : itl) EXPECT_NEAR(g, 0.020, 1e-12);
  // TPOT counts tokens, ITL chunks: 10 tokens in the same 5 chunks.
  r.output_tokens = 10;
  EXPECT_NEAR(*Tpot(r), 0.090 / 9, 1e-12);
  EXPECT_EQ(Itls(r).size(), 4u);
  // A single token has no TPOT; a failed request neither.
  EXPECT_FALSE(Tpot(Synthetic({0.05}, 0.05, 1)).has_value());
  r.ok = false;
  EXPECT_FALSE(Tpot(r).has_value());
}

TEST(SloTest, Parse) {
  auto slo = ParseSlo("ttft=200ms,tpot=50ms");
  ASSERT_TRUE(slo.ok()) << slo.status().ToString();
  EXPECT_DOUBLE_EQ(*slo->ttft_s, 0.2);
  EXPECT_DOUBLE_EQ(*slo->tpot_s, 0.05);
  EXPECT_FALSE(slo->e2e_s.has_value());
  EXPECT_EQ(slo->ToString(), "ttft<=200ms,tpot<=50ms");
  auto s2 = ParseSlo("e2el=2s, ttft=150");
  ASSERT_TRUE(s2.ok());
  EXPECT_DOUBLE_EQ(*s2->e2e_s, 2.0);
  EXPECT_DOUBLE_EQ(*s2->ttft_s, 0.15);
  EXPECT_FALSE(ParseSlo("ttft").ok());
  EXPECT_FALSE(ParseSlo("latency=1s").ok());
  EXPECT_FALSE(ParseSlo("ttft=-1ms").ok());
  EXPECT_FALSE(ParseSlo("ttft=1h").ok());
  EXPECT_FALSE(ParseSlo("").ok());
}

TEST(GoodputTest, CountsRequestsMeetingEveryObjective) {
  Slo slo;
  slo.ttft_s = 0.2;
  slo.tpot_s = 0.05;
  std::vector<RequestRecord> rs;
  rs.push_back(Synthetic({0.1, 0.14, 0.18}, 0.18, 3));  // ttft 100 ms, tpot 40 ms: good
  rs.push_back(Synthetic({0.3, 0.31, 0.32}, 0.32, 3));  // ttft 300 ms: bad
  rs.push_back(Synthetic({0.1, 0.2, 0.3}, 0.3, 3));     // tpot 100 ms: bad
  rs.push_back(Synthetic({0.15}, 0.15, 1));             // one token: tpot 0, good
  RequestRecord failed;
  failed.error_class = "http_429";
  rs.push_back(failed);  // failed: never good
  EXPECT_TRUE(MeetsSlo(rs[0], slo));
  EXPECT_FALSE(MeetsSlo(rs[1], slo));
  EXPECT_FALSE(MeetsSlo(rs[2], slo));
  EXPECT_TRUE(MeetsSlo(rs[3], slo));
  EXPECT_FALSE(MeetsSlo(rs[4], slo));
  const LevelMetrics m = ComputeMetrics(rs, /*duration_s=*/2.0, slo);
  EXPECT_EQ(m.good_requests, 2);
  EXPECT_DOUBLE_EQ(m.goodput, 1.0);
}

TEST(ComputeMetricsTest, Aggregates) {
  std::vector<RequestRecord> rs;
  rs.push_back(Synthetic({0.1, 0.12, 0.14}, 0.15, 3));
  rs.back().output_tokens_from_usage = true;
  rs.back().cached_tokens = 4;  // of its 10 prompt tokens; the other request reports none
  rs.push_back(Synthetic({0.2, 0.25}, 0.25, 2));
  rs.back().send_s = 1.0;
  rs.back().server_timing = ServerTiming{.queue = 0.01, .prefill = 0.04, .decode = 0.05, .total = 0.1};
  RequestRecord f1, f2, f3;
  f1.error_class = f2.error_class = "http_429";
  f1.error_message = "rate limited";
  f3.error_class = "connection_refused";
  rs.push_back(f1);
  rs.push_back(f2);
  rs.push_back(f3);
  const LevelMetrics m = ComputeMetrics(rs, 2.0, Slo{}, /*bin_s=*/0.5);
  EXPECT_EQ(m.num_requests, 5);
  EXPECT_EQ(m.completed, 2);
  EXPECT_EQ(m.failed, 3);
  ASSERT_EQ(m.failures.size(), 2u);
  EXPECT_EQ(m.failures.at("http_429").count, 2);
  EXPECT_EQ(m.failures.at("http_429").example, "rate limited");
  EXPECT_EQ(m.failures.at("connection_refused").count, 1);
  EXPECT_EQ(m.total_input_tokens, 20);
  EXPECT_EQ(m.total_output_tokens, 5);
  EXPECT_EQ(m.cached_reported, 1);
  EXPECT_EQ(m.cached_input_tokens, 4);
  ASSERT_TRUE(m.prefix_cache_hit_rate().has_value());
  EXPECT_DOUBLE_EQ(*m.prefix_cache_hit_rate(), 0.4);  // over the reporting request's prompt only
  EXPECT_EQ(m.output_token_source, "mixed");
  EXPECT_DOUBLE_EQ(m.request_throughput, 1.0);
  EXPECT_DOUBLE_EQ(m.output_throughput, 2.5);
  EXPECT_DOUBLE_EQ(m.total_token_throughput, 12.5);
  EXPECT_NEAR(m.mean_concurrency, 0.2, 1e-12);
  EXPECT_EQ(m.ttft_s.count, 2);
  EXPECT_NEAR(m.ttft_s.mean, 0.15, 1e-12);
  EXPECT_EQ(m.itl_s.count, 3);  // 2 gaps + 1 gap
  EXPECT_EQ(m.tpot_s.count, 2);
  EXPECT_NEAR(m.tpot_s.max, 0.05, 1e-12);
  ASSERT_TRUE(m.server.has_value());
  EXPECT_EQ(m.server->count, 1);
  EXPECT_NEAR(m.server->share.at("queue"), 0.1, 1e-12);
  EXPECT_NEAR(m.server->share.at("prefill"), 0.4, 1e-12);
  EXPECT_NEAR(m.server->share.at("decode"), 0.5, 1e-12);
  EXPECT_NEAR(m.server->share.at("other"), 0.0, 1e-12);
  // Timeline: 0.5 s bins; request 0's tokens in bin 0, request 1's (sent at 1.0 s) in bin 2.
  ASSERT_GE(m.output_timeline.size(), 3u);
  EXPECT_DOUBLE_EQ(m.output_timeline[0].second, 3 / 0.5);
  EXPECT_DOUBLE_EQ(m.output_timeline[1].second, 0.0);
  EXPECT_DOUBLE_EQ(m.output_timeline[2].second, 2 / 0.5);
}

TEST(ComputeMetricsTest, AllFailed) {
  RequestRecord f;
  f.error_class = "timeout";
  const LevelMetrics m = ComputeMetrics({f, f}, 1.0, Slo{});
  EXPECT_EQ(m.completed, 0);
  EXPECT_EQ(m.failed, 2);
  EXPECT_EQ(m.ttft_s.count, 0);
  EXPECT_TRUE(m.output_timeline.empty());
}

TEST(SvgTest, CdfStepsAndEscaping) {
  const auto pts = CdfPoints({3.0, 1.0, 2.0});
  ASSERT_EQ(pts.size(), 6u);  // up-steps at 1, 2, 3
  EXPECT_EQ(pts[0], std::make_pair(1.0, 0.0));
  EXPECT_EQ(pts[1], std::make_pair(1.0, 1.0 / 3));
  EXPECT_EQ(pts[5], std::make_pair(3.0, 1.0));
  EXPECT_TRUE(CdfPoints({}).empty());
  EXPECT_LE(CdfPoints(std::vector<double>(100000, 1.0), 400).size(), 2 * 402u);
  Chart c{.title = "a < b & c", .x_label = "ms", .y_label = "y"};
  c.series.push_back({.name = "s", .points = pts});
  Chart empty{.title = "nothing"};
  const std::string svg = RenderSvg("t", {c, empty}, 2);
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_NE(svg.find("a &lt; b &amp; c"), std::string::npos);
  EXPECT_NE(svg.find("<polyline"), std::string::npos);
  EXPECT_NE(svg.find("no data"), std::string::npos);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
}

}  // namespace
}  // namespace fathom::bench
