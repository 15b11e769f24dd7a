#include "bench/report.h"

#include <fmt/format.h>

#include <cmath>
#include <fstream>

#include "bench/openai.h"
#include "bench/svg.h"

namespace fathom::bench {

using nlohmann::json;

namespace {

std::string Bytes(double v) {
  if (v >= 1e12) return fmt::format("{:.2f} TB", v / 1e12);
  if (v >= 1e9) return fmt::format("{:.2f} GB", v / 1e9);
  if (v >= 1e6) return fmt::format("{:.2f} MB", v / 1e6);
  if (v >= 1e3) return fmt::format("{:.2f} KB", v / 1e3);
  return fmt::format("{:.0f} B", v);
}

std::string Si(double v, const char* unit) {
  if (v >= 1e15) return fmt::format("{:.2f} P{}", v / 1e15, unit);
  if (v >= 1e12) return fmt::format("{:.2f} T{}", v / 1e12, unit);
  if (v >= 1e9) return fmt::format("{:.2f} G{}", v / 1e9, unit);
  if (v >= 1e6) return fmt::format("{:.2f} M{}", v / 1e6, unit);
  if (v >= 1e3) return fmt::format("{:.2f} K{}", v / 1e3, unit);
  return fmt::format("{:.2f} {}", v, unit);
}

std::string Pct(double f) {
  return fmt::format("{:.1f}%", 100 * f);
}

std::string Line(const std::string& label, const std::string& value) {
  return fmt::format("{:<40} {}\n", label + ":", value);
}

std::string Ms(double s) {
  return fmt::format("{:.2f}", s * 1e3);
}

json Number(double v) {
  if (std::isinf(v)) return v > 0 ? json("inf") : json("-inf");
  if (std::isnan(v)) return json(nullptr);
  return json(v);
}

std::string FailureLine(const LevelMetrics& m) {
  std::string s;
  for (const auto& [cls, f] : m.failures) {
    if (!s.empty()) s += "; ";
    s += fmt::format("{} x{}", cls, f.count);
    if (!f.example.empty()) s += fmt::format(" (\"{}\")", f.example.substr(0, 100));
  }
  return s;
}

}  // namespace

json SummaryJson(const Summary& s, double scale) {
  if (s.count == 0) return json{{"count", 0}};
  const Summary v = Scale(s, scale);
  return json{{"count", v.count}, {"mean", v.mean}, {"median", v.median}, {"p90", v.p90},   {"p95", v.p95},
              {"p99", v.p99},     {"max", v.max},   {"min", v.min},       {"std", v.stddev}};
}

Status WriteTextFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  if (!out) return InternalError(fmt::format("cannot write '{}'", path));
  out << text;
  out.close();
  if (!out) return InternalError(fmt::format("short write to '{}'", path));
  return OkStatus();
}

// ---------------------------------------------------------------------------------------------------------------
// Online.

std::string FormatOnlineTable(const OnlineRunInfo& info, const std::vector<LevelResult>& levels) {
  std::string out;
  const std::string rule(78, '-');
  out += fmt::format("{:=^78}\n", " fathom bench: serving ");
  out += Line("Endpoint", info.url);
  out += Line("Model", info.model);
  out += Line("Workload", info.workload);
  if (info.warmup > 0) {
    out += Line(
        "Warm-up requests (not counted)",
        fmt::format("{}{}", info.warmup, info.warmup_failed ? fmt::format(" ({} failed)", info.warmup_failed) : ""));
  }
  if (levels.size() == 1) {
    const LevelResult& l = levels[0];
    const LevelMetrics& m = l.metrics;
    out += Line("Load", l.shape.Label());
    out += Line("Successful requests", fmt::format("{}", m.completed));
    out += Line("Failed requests", fmt::format("{}", m.failed));
    if (m.failed > 0) out += Line("Failures", FailureLine(m));
    out += Line("Benchmark duration (s)", fmt::format("{:.2f}", m.duration_s));
    out += Line("Total input tokens", fmt::format("{}", m.total_input_tokens));
    out += Line("Total generated tokens",
                fmt::format("{} (counted from {})", m.total_output_tokens,
                            m.output_token_source == "usage"    ? "usage"
                            : m.output_token_source == "chunks" ? "token-bearing chunks: no usage"
                                                                : "usage where sent, else chunks"));
    if (const std::optional<double> hit = m.prefix_cache_hit_rate()) {
      out += Line("Input tokens from the prefix cache",
                  fmt::format("{} ({}{})", m.cached_input_tokens, Pct(*hit),
                              *hit >= 0.5 ? ": repeated prompts, whose prefill the server skipped" : ""));
    }
    out += Line("Request throughput (req/s)", fmt::format("{:.2f}", m.request_throughput));
    out += Line("Output token throughput (tok/s)", fmt::format("{:.2f}", m.output_throughput));
    out += Line("Total token throughput (tok/s)", fmt::format("{:.2f}", m.total_token_throughput));
    out += Line("Mean concurrency", fmt::format("{:.2f}", m.mean_concurrency));
    if (!m.slo.empty()) {
      out += Line(fmt::format("Goodput (req/s) [{}]", m.slo.ToString()),
                  fmt::format("{:.2f} ({} of {} requests, {})", m.goodput, m.good_requests, m.num_requests,
                              Pct(m.num_requests ? static_cast<double>(m.good_requests) / m.num_requests : 0)));
    }
    out += rule + "\n";
    out += fmt::format("{:<12}{:>11}{:>11}{:>11}{:>11}{:>11}{:>11}\n", "Latency (ms)", "mean", "median", "p90", "p95",
                       "p99", "max");
    auto row = [&](const char* name, const Summary& s) {
      if (s.count == 0) {
        out += fmt::format("{:<12}{:>11}\n", name, "n/a");
        return;
      }
      out += fmt::format("{:<12}{:>11}{:>11}{:>11}{:>11}{:>11}{:>11}\n", name, Ms(s.mean), Ms(s.median), Ms(s.p90),
                         Ms(s.p95), Ms(s.p99), Ms(s.max));
    };
    row("TTFT", m.ttft_s);
    row("TPOT", m.tpot_s);
    row("ITL", m.itl_s);
    row("E2E", m.e2e_s);
    if (m.server) {
      out += rule + "\n";
      const ServerTimingSummary& st = *m.server;
      std::string shares;
      for (const char* k : {"queue", "tokenize", "prefill", "decode", "detokenize", "serialize", "other"}) {
        auto it = st.share.find(k);
        if (it == st.share.end()) continue;
        shares += fmt::format("{}{} {}", shares.empty() ? "" : "  ", k, Pct(it->second));
      }
      out += fmt::format("Server timing (fathom, {} requests, mean total {} ms): {}\n", st.count,
                         Ms(st.mean_s.at("total")), shares);
      out += fmt::format("  mean ms: queue {}  prefill {}  decode {}\n", Ms(st.mean_s.at("queue")),
                         Ms(st.mean_s.at("prefill")), Ms(st.mean_s.at("decode")));
    }
    out += std::string(78, '=') + "\n";
    return out;
  }

  // A sweep: one row per level.
  const bool goodput = !levels.empty() && !levels[0].metrics.slo.empty();
  if (goodput) out += Line("Goodput SLO", levels[0].metrics.slo.ToString());
  std::string header = fmt::format("{:<24}{:>6}{:>6}{:>9}{:>11}{:>11}{:>10}{:>10}{:>10}{:>10}{:>10}{:>10}", "load",
                                   "ok", "fail", "req/s", "out tok/s", "tot tok/s", "TTFT p50", "TTFT p99", "TPOT p50",
                                   "TPOT p99", "ITL p99", "E2E p50");
  if (goodput) header += fmt::format("{:>10}", "goodput");
  out += std::string(header.size(), '-') + "\n" + header + "\n";
  for (const LevelResult& l : levels) {
    const LevelMetrics& m = l.metrics;
    auto ms = [](const Summary& s, double v) { return s.count ? Ms(v) : std::string("n/a"); };
    std::string row =
        fmt::format("{:<24}{:>6}{:>6}{:>9.2f}{:>11.1f}{:>11.1f}{:>10}{:>10}{:>10}{:>10}{:>10}{:>10}", l.shape.Label(),
                    m.completed, m.failed, m.request_throughput, m.output_throughput, m.total_token_throughput,
                    ms(m.ttft_s, m.ttft_s.median), ms(m.ttft_s, m.ttft_s.p99), ms(m.tpot_s, m.tpot_s.median),
                    ms(m.tpot_s, m.tpot_s.p99), ms(m.itl_s, m.itl_s.p99), ms(m.e2e_s, m.e2e_s.median));
    if (goodput) row += fmt::format("{:>10.2f}", m.goodput);
    out += row + "\n";
  }
  out += "(latencies in ms; goodput in req/s)\n";
  for (const LevelResult& l : levels) {
    if (l.metrics.failed > 0) out += fmt::format("failures at {}: {}\n", l.shape.Label(), FailureLine(l.metrics));
    if (const std::optional<double> hit = l.metrics.prefix_cache_hit_rate(); hit && *hit > 0) {
      out += fmt::format("prefix cache at {}: {} of the input tokens ({})\n", l.shape.Label(), Pct(*hit),
                         l.metrics.cached_input_tokens);
    }
    if (l.metrics.server) {
      const ServerTimingSummary& st = *l.metrics.server;
      out += fmt::format("server timing at {}: queue {}  prefill {}  decode {}  (of mean total {} ms)\n",
                         l.shape.Label(), Pct(st.share.at("queue")), Pct(st.share.at("prefill")),
                         Pct(st.share.at("decode")), Ms(st.mean_s.at("total")));
    }
  }
  out += std::string(header.size(), '=') + "\n";
  return out;
}

json OnlineJson(const OnlineRunInfo& info, const std::vector<LevelResult>& levels, bool detailed) {
  json j;
  j["mode"] = "online";
  j["config"] = {{"url", info.url},
                 {"model", info.model},
                 {"endpoint", info.endpoint},
                 {"workload", info.workload},
                 {"tokenizer", info.tokenizer},
                 {"num_requests", info.num_requests},
                 {"input_len", info.input_len},
                 {"output_len", info.output_len},
                 {"range_ratio", info.range_ratio},
                 {"shared_prefix_len", info.shared_prefix_len},
                 {"ignore_eos", info.ignore_eos},
                 {"prompt_format", info.prompt_format},
                 {"warmup", info.warmup},
                 {"warmup_failed", info.warmup_failed},
                 {"seed", info.seed},
                 {"timeout_s", info.timeout_s},
                 {"slo", info.slo}};
  json arr = json::array();
  for (const LevelResult& l : levels) {
    const LevelMetrics& m = l.metrics;
    json lj;
    lj["label"] = l.shape.Label();
    lj["load"] = {{"kind", l.shape.closed() ? "closed" : "open"},
                  {"concurrency", l.shape.closed() ? json(l.shape.concurrency) : json(nullptr)},
                  {"request_rate", l.shape.closed() ? json(nullptr) : Number(l.shape.request_rate)},
                  {"burstiness", l.shape.burstiness},
                  {"max_concurrency", l.shape.max_concurrency > 0 ? json(l.shape.max_concurrency) : json(nullptr)}};
    lj["num_requests"] = m.num_requests;
    lj["completed"] = m.completed;
    lj["failed"] = m.failed;
    json failures = json::object();
    for (const auto& [cls, f] : m.failures) failures[cls] = {{"count", f.count}, {"example", f.example}};
    lj["failures"] = failures;
    lj["duration_s"] = m.duration_s;
    lj["total_input_tokens"] = m.total_input_tokens;
    lj["total_output_tokens"] = m.total_output_tokens;
    lj["output_token_source"] = m.output_token_source;
    const std::optional<double> hit = m.prefix_cache_hit_rate();
    lj["cached_input_tokens"] = hit ? json(m.cached_input_tokens) : json(nullptr);
    lj["prefix_cache_hit_rate"] = hit ? json(*hit) : json(nullptr);
    lj["request_throughput"] = m.request_throughput;
    lj["output_throughput"] = m.output_throughput;
    lj["total_token_throughput"] = m.total_token_throughput;
    lj["mean_concurrency"] = m.mean_concurrency;
    lj["connections_opened"] = l.connections_opened;
    lj["ttft_ms"] = SummaryJson(m.ttft_s, 1e3);
    lj["tpot_ms"] = SummaryJson(m.tpot_s, 1e3);
    lj["itl_ms"] = SummaryJson(m.itl_s, 1e3);
    lj["e2e_ms"] = SummaryJson(m.e2e_s, 1e3);
    if (!m.slo.empty()) {
      lj["goodput"] = {{"slo", m.slo.ToString()},
                       {"good_requests", m.good_requests},
                       {"request_goodput", m.goodput},
                       {"fraction", m.num_requests ? static_cast<double>(m.good_requests) / m.num_requests : 0.0}};
    } else {
      lj["goodput"] = nullptr;
    }
    if (m.server) {
      json mean_ms = json::object();
      for (const auto& [k, v] : m.server->mean_s) mean_ms[k] = v * 1e3;
      lj["server_timing"] = {{"requests", m.server->count}, {"mean_ms", mean_ms}, {"share", m.server->share}};
    } else {
      lj["server_timing"] = nullptr;
    }
    json tl = json::array();
    for (const auto& [t, v] : m.output_timeline) tl.push_back({t, v});
    lj["timeline"] = {{"bin_s", m.timeline_bin_s}, {"output_tokens_per_s", tl}};
    if (detailed) {
      json reqs = json::array();
      for (const RequestRecord& r : l.records) {
        json rj = {{"index", r.index},
                   {"ok", r.ok},
                   {"send_s", r.send_s},
                   {"http_status", r.http_status},
                   {"prompt_tokens", r.prompt_tokens},
                   {"cached_tokens", r.cached_tokens ? json(*r.cached_tokens) : json(nullptr)},
                   {"output_tokens", r.output_tokens}};
        if (r.ok) {
          rj["ttft_ms"] = r.ttft_s * 1e3;
          rj["e2e_ms"] = r.e2e_s * 1e3;
          if (auto t = Tpot(r)) rj["tpot_ms"] = *t * 1e3;
          json itl = json::array();
          for (double g : Itls(r)) itl.push_back(g * 1e3);
          rj["itl_ms"] = itl;
        } else {
          rj["error_class"] = r.error_class;
          rj["error"] = r.error_message;
        }
        reqs.push_back(std::move(rj));
      }
      lj["requests"] = std::move(reqs);
    }
    arr.push_back(std::move(lj));
  }
  j["levels"] = std::move(arr);
  return j;
}

std::string OnlineSvg(const OnlineRunInfo& info, const std::vector<LevelResult>& levels) {
  Chart ttft{.title = "TTFT", .x_label = "ms", .y_label = "fraction of requests <= x"};
  Chart tpot{.title = "TPOT", .x_label = "ms", .y_label = "fraction of requests <= x"};
  Chart itl{.title = "ITL", .x_label = "ms", .y_label = "fraction of gaps <= x"};
  Chart e2e{.title = "E2E latency", .x_label = "ms", .y_label = "fraction of requests <= x"};
  Chart tput{.title = "Output throughput over time",
             .x_label = "seconds since the level began",
             .y_label = "tokens/s",
             .headroom = 0.1 + 0.08 * static_cast<double>(levels.size())};
  for (const LevelResult& l : levels) {
    std::vector<double> a, b, c, d;
    for (const RequestRecord& r : l.records) {
      if (!r.ok) continue;
      a.push_back(r.ttft_s * 1e3);
      if (auto t = Tpot(r)) b.push_back(*t * 1e3);
      for (double g : Itls(r)) c.push_back(g * 1e3);
      d.push_back(r.e2e_s * 1e3);
    }
    const std::string name = l.shape.Label();
    ttft.series.push_back({.name = name, .points = CdfPoints(std::move(a))});
    tpot.series.push_back({.name = name, .points = CdfPoints(std::move(b))});
    itl.series.push_back({.name = name, .points = CdfPoints(std::move(c))});
    e2e.series.push_back({.name = name, .points = CdfPoints(std::move(d))});
    Series s{.name = name};
    for (const auto& [t, v] : l.metrics.output_timeline) {
      s.points.emplace_back(t, v);
      s.points.emplace_back(t + l.metrics.timeline_bin_s, v);  // steps
    }
    tput.series.push_back(std::move(s));
  }
  std::vector<Chart> charts = {ttft, tpot, itl, e2e, tput};
  if (levels.size() > 1) {
    Chart sweep{.title = "Throughput vs latency (one point per level)", .x_label = "output tokens/s", .y_label = "ms"};
    Series p50{.name = "TPOT median", .markers = true}, p99{.name = "TTFT p99", .markers = true, .dashed = true};
    for (const LevelResult& l : levels) {
      if (l.metrics.tpot_s.count) p50.points.emplace_back(l.metrics.output_throughput, l.metrics.tpot_s.median * 1e3);
      if (l.metrics.ttft_s.count) p99.points.emplace_back(l.metrics.output_throughput, l.metrics.ttft_s.p99 * 1e3);
    }
    sweep.series = {p50, p99};
    charts.push_back(std::move(sweep));
  }
  return RenderSvg(fmt::format("fathom bench: {} ({})", info.model, info.url), charts, 2);
}

// ---------------------------------------------------------------------------------------------------------------
// Offline.

std::string FormatOfflineTable(const OfflineRunInfo& info, const std::vector<OfflineLevel>& levels) {
  std::string out;
  const ModelCosts& c = info.costs;
  const std::string head1 =
      fmt::format("{:>5}{:>12}{:>10}{:>10}{:>10}{:>10}{:>11}{:>12}{:>9}{:>8}{:>8}{:>8}", "batch", "prefill", "TTFT",
                  "step", "step", "step", "decode", "roofline", "bound", "MBU", "MFU", "prefill");
  const std::string head2 =
      fmt::format("{:>5}{:>12}{:>10}{:>10}{:>10}{:>10}{:>11}{:>12}{:>9}{:>8}{:>8}{:>8}", "", "tok/s", "mean ms",
                  "mean ms", "p50 ms", "p99 ms", "tok/s", "tok/s", "", "", "", "MFU");
  const size_t width = head1.size();
  out += fmt::format("{:=^{}}\n", " fathom bench: offline ", width);
  out += Line("Model", fmt::format("{} ({}, {} weights)", info.model, info.architecture, info.load_format));
  out += Line("Device", info.device + (info.device == "cpu" ? fmt::format(" ({} threads)", info.threads) : ""));
  out += Line("Shape per request",
              fmt::format("input {} tokens, output {} tokens (ignore_eos)", info.input_len, info.output_len));
  out += Line("Weights", fmt::format("{} stored; {} read per decoded token at batch 1", Bytes(c.weight_bytes),
                                     Bytes(c.weight_bytes_b1)));
  out += Line("KV cache", fmt::format("{} per token ({})", Bytes(c.kv_bytes_per_token), c.kv_dtype));
  out += Line("FLOPs per token",
              fmt::format("{} (2 x {} matmul params) + {} per context token", Si(2 * c.matmul_params, "FLOP"),
                          Si(c.matmul_params, ""), Si(c.attention_flops_per_context_token, "FLOP")));
  out += Line("Peak bandwidth", fmt::format("{}/s  [{}]", Bytes(info.peaks.bandwidth), info.peaks.bandwidth_source));
  out += Line("Peak compute", fmt::format("{}/s  [{}]", Si(info.peaks.flops, "FLOP"), info.peaks.flops_source));
  out += std::string(width, '-') + "\n" + head1 + "\n" + head2 + "\n";
  for (const OfflineLevel& l : levels) {
    const Roofline& r = l.roofline;
    out += fmt::format("{:>5}{:>12.1f}{:>10.2f}{:>10.2f}{:>10.2f}{:>10.2f}{:>11.2f}{:>12.2f}{:>9}{:>8}{:>8}{:>8}\n",
                       l.batch_size, l.prefill_tokens_per_s, l.ttft_s.mean * 1e3, l.decode_step_s.mean * 1e3,
                       l.decode_step_s.median * 1e3, l.decode_step_s.p99 * 1e3, l.decode_tokens_per_s,
                       r.theoretical_tokens_per_s, r.bound, Pct(r.mbu), Pct(r.mfu), Pct(l.prefill_mfu));
  }
  out += std::string(width, '-') + "\n";
  for (const OfflineLevel& l : levels) {
    const Roofline& r = l.roofline;
    out += fmt::format("batch {}: a decode step reads {} ({} weights + {} KV at mean context {:.1f}), does {}\n",
                       l.batch_size, Bytes(r.bytes), Bytes(r.weight_bytes), Bytes(r.kv_bytes), r.context,
                       Si(r.flops, "FLOP"));
    out += fmt::format("  achieved {}/s (MBU {}) and {}/s (MFU {}); prefill MFU {}\n", Bytes(r.achieved_bandwidth),
                       Pct(r.mbu), Si(r.achieved_flops, "FLOP"), Pct(r.mfu), Pct(l.prefill_mfu));
    out += fmt::format(
        "  roofline {:.2f} tok/s = min(bandwidth-bound {:.2f}, compute-bound {:.2f}); measured {:.2f} tok/s ({} of "
        "it)\n",
        r.theoretical_tokens_per_s, r.bandwidth_bound_tokens_per_s, r.compute_bound_tokens_per_s,
        r.measured_tokens_per_s,
        Pct(r.theoretical_tokens_per_s > 0 ? r.measured_tokens_per_s / r.theoretical_tokens_per_s : 0));
    out += fmt::format(
        "  per decode step: {:.2f} ms model forward{} + {:.2f} ms engine CPU{}\n", l.forward_s_per_step * 1e3,
        l.collective_s_per_step > 0 ? fmt::format(" (collectives {:.2f} ms)", l.collective_s_per_step * 1e3)
                                    : std::string(),
        l.cpu_s_per_step * 1e3, l.preemptions ? fmt::format("; {} preemptions", l.preemptions) : std::string());
    if (l.synthetic_prefill) {
      out +=
          "  note: synthetic prefill: the prompts were never computed (the cache held random rows), so there are no "
          "prefill figures and the decode figures are of the kernels alone\n";
    }
    if (l.decode_batch_mean > 0 && l.decode_batch_mean < l.batch_size - 0.5) {
      out += fmt::format(
          "  note: the decode steps held {:.1f} of the {} sequences on average: their prefills ended at different "
          "steps (the token budget chunks them), so the decode figures are of that smaller batch; raise "
          "--output-len or --max-num-batched-tokens for a whole one\n",
          l.decode_batch_mean, l.batch_size);
    }
  }
  out += std::string(width, '=') + "\n";
  return out;
}

json OfflineJson(const OfflineRunInfo& info, const std::vector<OfflineLevel>& levels) {
  const ModelCosts& c = info.costs;
  json j;
  j["mode"] = "offline";
  j["config"] = {{"model", info.model},           {"architecture", info.architecture},
                 {"device", info.device},         {"load_format", info.load_format},
                 {"threads", info.threads},       {"input_len", info.input_len},
                 {"output_len", info.output_len}, {"warmup", info.warmup}};
  j["peaks"] = {{"bandwidth_bytes_per_s", info.peaks.bandwidth},
                {"bandwidth_source", info.peaks.bandwidth_source},
                {"flops_per_s", info.peaks.flops},
                {"flops_source", info.peaks.flops_source}};
  j["model_costs"] = {{"weight_bytes", c.weight_bytes},
                      {"weight_bytes_read_per_token_batch1", c.weight_bytes_b1},
                      {"active_params", c.active_params},
                      {"matmul_params", c.matmul_params},
                      {"flops_per_token_without_attention", 2 * c.matmul_params},
                      {"attention_flops_per_context_token", c.attention_flops_per_context_token},
                      {"kv_bytes_per_token", c.kv_bytes_per_token},
                      {"kv_dtype", c.kv_dtype}};
  json arr = json::array();
  for (const OfflineLevel& l : levels) {
    const Roofline& r = l.roofline;
    arr.push_back({{"batch_size", l.batch_size},
                   {"input_len", l.input_len},
                   {"output_len", l.output_len},
                   {"prefill_s", l.prefill_s},
                   {"prefill_steps", l.prefill_steps},
                   {"prefill_tokens_per_s", l.prefill_tokens_per_s},
                   {"prefill_mfu", l.prefill_mfu},
                   {"ttft_ms", SummaryJson(l.ttft_s, 1e3)},
                   {"decode_step_ms", SummaryJson(l.decode_step_s, 1e3)},
                   {"decode_tokens_per_s", l.decode_tokens_per_s},
                   {"decode_batch_mean", l.decode_batch_mean},
                   {"synthetic_prefill", l.synthetic_prefill},
                   {"decode_forward_ms_per_step", l.forward_s_per_step * 1e3},
                   {"decode_engine_cpu_ms_per_step", l.cpu_s_per_step * 1e3},
                   {"decode_collective_ms_per_step", l.collective_s_per_step * 1e3},
                   {"preemptions", l.preemptions},
                   {"total_s", l.total_s},
                   {"roofline",
                    {{"mean_context", r.context},
                     {"weight_bytes_per_step", r.weight_bytes},
                     {"kv_bytes_per_step", r.kv_bytes},
                     {"bytes_per_step", r.bytes},
                     {"flops_per_step", r.flops},
                     {"arithmetic_intensity", r.arithmetic_intensity},
                     {"achieved_bandwidth_bytes_per_s", r.achieved_bandwidth},
                     {"achieved_flops_per_s", r.achieved_flops},
                     {"mbu", r.mbu},
                     {"mfu", r.mfu},
                     {"bandwidth_bound_tokens_per_s", r.bandwidth_bound_tokens_per_s},
                     {"compute_bound_tokens_per_s", r.compute_bound_tokens_per_s},
                     {"theoretical_tokens_per_s", r.theoretical_tokens_per_s},
                     {"measured_tokens_per_s", r.measured_tokens_per_s},
                     {"bound", r.bound}}}});
  }
  j["levels"] = std::move(arr);
  return j;
}

std::string OfflineSvg(const OfflineRunInfo& info, const std::vector<OfflineLevel>& levels) {
  const bool log_x = levels.size() > 2;
  Chart tput{
      .title = "Decode throughput by batch size", .x_label = "batch size", .y_label = "tokens/s", .log_x = log_x};
  Series measured{.name = "measured", .markers = true}, theory{.name = "roofline min(bw, compute)", .markers = true},
      bw{.name = "bandwidth-bound", .markers = true, .dashed = true},
      compute{.name = "compute-bound", .markers = true, .dashed = true};
  Chart step{.title = "Decode step latency", .x_label = "batch size", .y_label = "ms", .log_x = log_x};
  Series mean{.name = "mean", .markers = true}, p99{.name = "p99", .markers = true, .dashed = true};
  Chart util{.title = "Utilization", .x_label = "batch size", .y_label = "% of peak", .log_x = log_x};
  Series mbu{.name = "MBU", .markers = true}, mfu{.name = "MFU (decode)", .markers = true},
      pmfu{.name = "MFU (prefill)", .markers = true, .dashed = true};
  for (const OfflineLevel& l : levels) {
    const double b = l.batch_size;
    measured.points.emplace_back(b, l.decode_tokens_per_s);
    theory.points.emplace_back(b, l.roofline.theoretical_tokens_per_s);
    bw.points.emplace_back(b, l.roofline.bandwidth_bound_tokens_per_s);
    compute.points.emplace_back(b, l.roofline.compute_bound_tokens_per_s);
    mean.points.emplace_back(b, l.decode_step_s.mean * 1e3);
    p99.points.emplace_back(b, l.decode_step_s.p99 * 1e3);
    mbu.points.emplace_back(b, 100 * l.roofline.mbu);
    mfu.points.emplace_back(b, 100 * l.roofline.mfu);
    pmfu.points.emplace_back(b, 100 * l.prefill_mfu);
  }
  tput.series = {measured, theory, bw, compute};
  step.series = {mean, p99};
  util.series = {mbu, mfu, pmfu};
  // The compute-bound line can dwarf the rest: a panel of its own keeps the measured numbers readable.
  Chart measured_only{.title = "Measured vs roofline", .x_label = "batch size", .y_label = "tokens/s", .log_x = log_x};
  measured_only.series = {measured, theory};
  return RenderSvg(fmt::format("fathom bench --offline: {} on {}", info.model, info.device),
                   {measured_only, step, util, tput}, 2);
}

}  // namespace fathom::bench
