#include "bench/stats.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <numeric>

namespace fathom::bench {

double Percentile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0.0;
  FATHOM_CHECK(q >= 0.0 && q <= 100.0, "percentile {} out of [0, 100]", q);
  const double pos = q / 100.0 * static_cast<double>(sorted.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, sorted.size() - 1);
  const double frac = pos - static_cast<double>(lo);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * frac;
}

Summary Summarize(std::vector<double> values) {
  Summary s;
  s.count = static_cast<int64_t>(values.size());
  if (values.empty()) return s;
  std::sort(values.begin(), values.end());
  const double n = static_cast<double>(values.size());
  s.mean = std::accumulate(values.begin(), values.end(), 0.0) / n;
  double sq = 0;
  for (double v : values) sq += (v - s.mean) * (v - s.mean);
  s.stddev = std::sqrt(sq / n);  // population, like numpy.std
  s.median = Percentile(values, 50);
  s.p90 = Percentile(values, 90);
  s.p95 = Percentile(values, 95);
  s.p99 = Percentile(values, 99);
  s.min = values.front();
  s.max = values.back();
  return s;
}

Summary Scale(Summary s, double factor) {
  for (double* v : {&s.mean, &s.median, &s.p90, &s.p95, &s.p99, &s.max, &s.min, &s.stddev}) *v *= factor;
  return s;
}

std::optional<double> Tpot(const RequestRecord& r) {
  if (!r.ok || r.output_tokens < 2) return std::nullopt;
  return (r.e2e_s - r.ttft_s) / static_cast<double>(r.output_tokens - 1);
}

std::vector<double> Itls(const RequestRecord& r) {
  std::vector<double> out;
  for (size_t i = 1; i < r.token_times_s.size(); ++i) out.push_back(r.token_times_s[i] - r.token_times_s[i - 1]);
  return out;
}

namespace {

std::string FormatSeconds(double s) {
  if (s < 1e-3) return fmt::format("{:g}us", s * 1e6);
  if (s < 1.0) return fmt::format("{:g}ms", s * 1e3);
  return fmt::format("{:g}s", s);
}

StatusOr<double> ParseDuration(std::string_view key, std::string_view text) {
  std::string t(text);
  size_t pos = 0;
  double v = 0;
  try {
    v = std::stod(t, &pos);
  } catch (...) {
    return InvalidArgumentError(fmt::format("--slo {}: '{}' is not a duration", key, text));
  }
  const std::string unit = t.substr(pos);
  double mult = 1e-3;
  if (unit == "" || unit == "ms") {
    mult = 1e-3;
  } else if (unit == "s") {
    mult = 1.0;
  } else if (unit == "us") {
    mult = 1e-6;
  } else {
    return InvalidArgumentError(fmt::format("--slo {}: unknown unit '{}' (use us, ms or s)", key, unit));
  }
  if (!(v > 0) || !std::isfinite(v)) return InvalidArgumentError(fmt::format("--slo {} must be positive", key));
  return v * mult;
}

}  // namespace

std::string Slo::ToString() const {
  std::vector<std::string> parts;
  if (ttft_s) parts.push_back("ttft<=" + FormatSeconds(*ttft_s));
  if (tpot_s) parts.push_back("tpot<=" + FormatSeconds(*tpot_s));
  if (e2e_s) parts.push_back("e2e<=" + FormatSeconds(*e2e_s));
  return fmt::format("{}", fmt::join(parts, ","));
}

StatusOr<Slo> ParseSlo(std::string_view text) {
  Slo slo;
  size_t i = 0;
  while (i < text.size()) {
    size_t j = text.find(',', i);
    if (j == std::string_view::npos) j = text.size();
    std::string_view item = text.substr(i, j - i);
    i = j + 1;
    while (!item.empty() && std::isspace(static_cast<unsigned char>(item.front()))) item.remove_prefix(1);
    while (!item.empty() && std::isspace(static_cast<unsigned char>(item.back()))) item.remove_suffix(1);
    if (item.empty()) continue;
    const size_t eq = item.find_first_of("=:");
    if (eq == std::string_view::npos) {
      return InvalidArgumentError(fmt::format("--slo expects KEY=DURATION items, got '{}'", item));
    }
    const std::string_view key = item.substr(0, eq);
    FATHOM_ASSIGN_OR_RETURN(double secs, ParseDuration(key, item.substr(eq + 1)));
    if (key == "ttft") {
      slo.ttft_s = secs;
    } else if (key == "tpot") {
      slo.tpot_s = secs;
    } else if (key == "e2e" || key == "e2el") {
      slo.e2e_s = secs;
    } else {
      return InvalidArgumentError(fmt::format("--slo: unknown key '{}' (use ttft, tpot or e2e)", key));
    }
  }
  if (slo.empty()) return InvalidArgumentError("--slo names no objective");
  return slo;
}

bool MeetsSlo(const RequestRecord& r, const Slo& slo) {
  if (!r.ok) return false;
  if (slo.ttft_s && r.ttft_s > *slo.ttft_s) return false;
  // A single-token output has no decode phase: its TPOT is 0, as vLLM counts it.
  if (slo.tpot_s && Tpot(r).value_or(0.0) > *slo.tpot_s) return false;
  if (slo.e2e_s && r.e2e_s > *slo.e2e_s) return false;
  return true;
}

namespace {

// About 30 bins, but no narrower than a tenth of the run or 1 s: a server emits tokens in steps, and bins much
// shorter than a step only show the steps.
double NiceBin(double duration_s) {
  const double raw = std::max({duration_s / 30.0, std::min(1.0, duration_s / 10.0), 1e-3});
  const double p = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0}) {
    if (raw <= m * p) return m * p;
  }
  return 10 * p;
}

}  // namespace

LevelMetrics ComputeMetrics(const std::vector<RequestRecord>& records, double duration_s, const Slo& slo,
                            double bin_s) {
  LevelMetrics m;
  m.num_requests = static_cast<int64_t>(records.size());
  m.duration_s = duration_s;
  m.slo = slo;
  std::vector<double> ttft, tpot, itl, e2e;
  int64_t from_usage = 0, from_chunks = 0;
  double sum_e2e = 0;
  ServerTimingSummary server;
  std::map<std::string, double> server_sums;
  for (const RequestRecord& r : records) {
    if (!r.ok) {
      ++m.failed;
      FailureClass& f = m.failures[r.error_class.empty() ? "unknown" : r.error_class];
      if (f.count++ == 0) f.example = r.error_message;
      continue;
    }
    ++m.completed;
    m.total_input_tokens += r.prompt_tokens;
    m.total_output_tokens += r.output_tokens;
    if (r.cached_tokens) {
      ++m.cached_reported;
      m.cached_input_tokens += *r.cached_tokens;
      m.cached_reported_input_tokens += r.prompt_tokens;
    }
    (r.output_tokens_from_usage ? from_usage : from_chunks) += 1;
    ttft.push_back(r.ttft_s);
    e2e.push_back(r.e2e_s);
    sum_e2e += r.e2e_s;
    if (auto t = Tpot(r)) tpot.push_back(*t);
    for (double g : Itls(r)) itl.push_back(g);
    if (!slo.empty() && MeetsSlo(r, slo)) ++m.good_requests;
    if (r.server_timing) {
      const ServerTiming& t = *r.server_timing;
      ++server.count;
      server_sums["queue"] += t.queue;
      server_sums["tokenize"] += t.tokenize;
      server_sums["prefill"] += t.prefill;
      server_sums["decode"] += t.decode;
      server_sums["detokenize"] += t.detokenize;
      server_sums["serialize"] += t.serialize;
      server_sums["total"] += t.total;
    }
  }
  m.output_token_source = from_usage > 0 && from_chunks > 0 ? "mixed" : (from_chunks > 0 ? "chunks" : "usage");
  m.ttft_s = Summarize(std::move(ttft));
  m.tpot_s = Summarize(std::move(tpot));
  m.itl_s = Summarize(std::move(itl));
  m.e2e_s = Summarize(std::move(e2e));
  if (duration_s > 0) {
    m.request_throughput = static_cast<double>(m.completed) / duration_s;
    m.output_throughput = static_cast<double>(m.total_output_tokens) / duration_s;
    m.total_token_throughput = static_cast<double>(m.total_input_tokens + m.total_output_tokens) / duration_s;
    m.mean_concurrency = sum_e2e / duration_s;
    m.goodput = static_cast<double>(m.good_requests) / duration_s;
  }
  if (server.count > 0) {
    const double total = server_sums["total"];
    double parts = 0;
    for (const auto& [name, sum] : server_sums) {
      server.mean_s[name] = sum / static_cast<double>(server.count);
      if (name == "total") continue;
      parts += sum;
      server.share[name] = total > 0 ? sum / total : 0.0;
    }
    server.share["other"] = total > 0 ? std::max(0.0, total - parts) / total : 0.0;
    m.server = std::move(server);
  }

  // Throughput over time.
  double end = duration_s;
  for (const RequestRecord& r : records) {
    if (r.ok && !r.token_times_s.empty()) end = std::max(end, r.send_s + r.token_times_s.back());
  }
  if (end > 0 && m.completed > 0) {
    m.timeline_bin_s = bin_s > 0 ? bin_s : NiceBin(end);
    const size_t bins = static_cast<size_t>(std::ceil(end / m.timeline_bin_s - 1e-9));
    std::vector<double> tokens(std::max<size_t>(bins, 1), 0.0);
    for (const RequestRecord& r : records) {
      if (!r.ok || r.token_times_s.empty()) continue;
      const double weight = static_cast<double>(r.output_tokens) / static_cast<double>(r.token_times_s.size());
      for (double t : r.token_times_s) {
        const size_t b = std::min(tokens.size() - 1, static_cast<size_t>((r.send_s + t) / m.timeline_bin_s));
        tokens[b] += weight;
      }
    }
    for (size_t b = 0; b < tokens.size(); ++b) {
      m.output_timeline.emplace_back(static_cast<double>(b) * m.timeline_bin_s, tokens[b] / m.timeline_bin_s);
    }
  }
  return m;
}

}  // namespace fathom::bench
