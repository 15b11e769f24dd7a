// Per-request records of a serving benchmark and the statistics over them, with the definitions of `vllm bench serve`:
// TTFT (send -> first token-bearing chunk), TPOT per request ((E2E - TTFT) / (output tokens - 1)), ITL (every gap
// between token-bearing chunks) and E2E (send -> end of the stream).
//
//   Summary s = Summarize({12.0, 15.5, 9.1});   // mean, median, p90, p95, p99, max; numpy's linear percentiles
//   std::optional<double> tpot = Tpot(record);  // nullopt for failed requests and single-token outputs
//   FATHOM_ASSIGN_OR_RETURN(Slo slo, ParseSlo("ttft=200ms,tpot=50ms"));
//   LevelMetrics m = ComputeMetrics(records, /*duration_s=*/12.5, slo);
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace fathom::bench {

// fathom's per-request server-side breakdown (seconds): the `fathom_timing` object of the final SSE chunk, or the
// `x-fathom-timing` header of a non-streamed response.
struct ServerTiming {
  double queue = 0, tokenize = 0, prefill = 0, decode = 0, detokenize = 0, serialize = 0, total = 0;
};

// One request of a benchmark run. Times are seconds; `token_times_s` and the latencies count from the send.
struct RequestRecord {
  int64_t index = 0;
  bool ok = false;
  std::string error_class;    // "" when ok; "http_429", "connection_refused", "timeout", "malformed_sse", ...
  std::string error_message;  // the first part of the server's message or the transport error
  int http_status = 0;        // 0: no response
  double send_s = 0;          // when the request was sent, since the level began
  double ttft_s = 0;
  double e2e_s = 0;
  std::vector<double> token_times_s;  // arrival of each token-bearing chunk
  int32_t prompt_tokens = 0;          // usage.prompt_tokens, else the planned prompt length
  int32_t output_tokens = 0;          // usage.completion_tokens, else the number of token-bearing chunks
  bool output_tokens_from_usage = false;
  std::optional<int32_t> cached_tokens;  // of prompt_tokens, those the server's prefix cache served, where reported
  std::optional<ServerTiming> server_timing;
};

struct Summary {
  int64_t count = 0;
  double mean = 0, median = 0, p90 = 0, p95 = 0, p99 = 0, max = 0, min = 0, stddev = 0;
};

// The q-th percentile (0..100) of ascending `sorted`, interpolating linearly between the closest ranks like
// numpy.percentile's default. 0 for an empty input.
double Percentile(const std::vector<double>& sorted, double q);
Summary Summarize(std::vector<double> values);
Summary Scale(Summary s, double factor);  // every value times `factor` (seconds -> milliseconds)

// (E2E - TTFT) / (output_tokens - 1); nullopt for failed requests and outputs of fewer than two tokens.
std::optional<double> Tpot(const RequestRecord& r);
// The gaps between consecutive token-bearing chunks.
std::vector<double> Itls(const RequestRecord& r);

// Service-level objectives for goodput: a successful request is good when it meets every objective given.
struct Slo {
  std::optional<double> ttft_s;
  std::optional<double> tpot_s;
  std::optional<double> e2e_s;
  bool empty() const { return !ttft_s && !tpot_s && !e2e_s; }
  std::string ToString() const;  // "ttft<=200ms,tpot<=50ms"
};
// "ttft=200ms,tpot=50ms,e2e=2s": keys ttft, tpot, e2e (or e2el); units us, ms (the default) or s.
StatusOr<Slo> ParseSlo(std::string_view text);
bool MeetsSlo(const RequestRecord& r, const Slo& slo);

struct FailureClass {
  int64_t count = 0;
  std::string example;  // one message of this class
};

struct ServerTimingSummary {
  int64_t count = 0;                     // requests that carried a breakdown
  std::map<std::string, double> mean_s;  // per component, and "total"
  std::map<std::string, double> share;   // sum of a component / sum of totals; "other" = the rest
};

struct LevelMetrics {
  int64_t num_requests = 0;
  int64_t completed = 0;
  int64_t failed = 0;
  std::map<std::string, FailureClass> failures;  // by error class
  double duration_s = 0;
  int64_t total_input_tokens = 0;
  int64_t total_output_tokens = 0;
  std::string output_token_source;  // "usage", "chunks" or "mixed": where output token counts came from
  // Prompt tokens the server's prefix cache served, over the completed requests whose usage reported them (vLLM's
  // and fathom's prompt_tokens_details.cached_tokens): repeated prompts skip their prefill, so a high rate makes
  // TTFT and throughput read better than fresh prompts would.
  int64_t cached_reported = 0;  // completed requests whose usage gave cached tokens
  int64_t cached_input_tokens = 0;
  int64_t cached_reported_input_tokens = 0;  // those requests' prompt tokens
  std::optional<double> prefix_cache_hit_rate() const {
    if (cached_reported == 0 || cached_reported_input_tokens == 0) return std::nullopt;
    return static_cast<double>(cached_input_tokens) / static_cast<double>(cached_reported_input_tokens);
  }
  double request_throughput = 0;    // completed requests / duration
  double output_throughput = 0;     // output tokens / duration
  double total_token_throughput = 0;
  double mean_concurrency = 0;  // sum of E2E / duration
  Summary ttft_s, tpot_s, itl_s, e2e_s;
  Slo slo;
  int64_t good_requests = 0;  // meaningful when !slo.empty()
  double goodput = 0;         // good requests / duration
  std::optional<ServerTimingSummary> server;
  // Output tokens per second over time since the level began: (bin start, tokens/s). Each token-bearing chunk
  // counts output_tokens / chunks of its request.
  double timeline_bin_s = 0;
  std::vector<std::pair<double, double>> output_timeline;
};

// `bin_s` <= 0 picks a bin width: about 30 bins, at least min(1 s, duration / 10).
LevelMetrics ComputeMetrics(const std::vector<RequestRecord>& records, double duration_s, const Slo& slo,
                            double bin_s = 0);

}  // namespace fathom::bench
