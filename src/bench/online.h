// The online benchmark: sends prompts to an OpenAI-compatible server as streamed requests under a load shape (closed
// loop of N in flight, or open-loop Poisson/gamma arrivals with an optional concurrency cap) and records each
// request's chunk timestamps, token counts, server timing and failure class.
//
//   OnlineOptions o{.target = *ParseBaseUrl("http://127.0.0.1:8000"), .endpoint = "/v1/completions"};
//   o.body.model = "deepseek-r1";
//   FATHOM_ASSIGN_OR_RETURN(LevelResult r, RunLevel(o, LoadShape{.concurrency = 32}, prompts, slo));
//   r.metrics.ttft_s.p99, r.metrics.failures["http_429"].count, ...
//
//   auto tok = MakeRemoteTokenCounter(o.target, "deepseek-r1", {});    // the server's /tokenize and /detokenize
//   FATHOM_ASSIGN_OR_RETURN(std::string model, FetchFirstModel(o.target, {}));   // GET /v1/models
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "bench/client.h"
#include "bench/openai.h"
#include "bench/sse.h"
#include "bench/stats.h"
#include "bench/workload.h"
#include "core/status.h"

namespace fathom::bench {

struct LoadShape {
  int32_t concurrency = 0;                                        // > 0: closed loop, this many requests in flight
  double request_rate = std::numeric_limits<double>::infinity();  // open loop (concurrency 0); inf: all at once
  double burstiness = 1.0;                                        // gamma shape; 1: Poisson
  int32_t max_concurrency = 0;                                    // open-loop cap; 0: none
  bool closed() const { return concurrency > 0; }
  std::string Label() const;  // "concurrency 32", "rate 8/s", "rate inf, max concurrency 64"
};

struct OnlineOptions {
  HttpTarget target;
  std::string endpoint = "/v1/completions";
  RequestBodyOptions body;
  std::vector<HttpHeader> headers;  // e.g. Authorization
  double timeout_s = 600;           // per request, connect to last byte
  uint64_t seed = 0;                // arrival times
  bool show_progress = true;        // a progress bar on stderr
  std::string progress_label = "bench";
};

struct LevelResult {
  LoadShape shape;
  std::vector<RequestRecord> records;
  double duration_s = 0;  // first send to last completion
  LevelMetrics metrics;
  int64_t connections_opened = 0;
};

// Runs every prompt once under `shape`. Request failures are recorded, not returned; errors are for runs that
// cannot start (bad options, unresolvable host).
StatusOr<LevelResult> RunLevel(const OnlineOptions& o, const LoadShape& shape, const std::vector<BenchPrompt>& prompts,
                               const Slo& slo);

// Records one streamed request from its pieces; exposed for tests. Feed every body piece to OnBody, then Finish.
class StreamRecorder {
 public:
  StreamRecorder(ApiKind api, Clock::time_point send) : api_(api), send_(send) {}
  // False once the stream is known to have failed (stop reading).
  bool OnBody(std::string_view bytes, Clock::time_point at);
  RequestRecord Finish(const HttpResult& http, Clock::time_point end, int32_t planned_prompt_len);

 private:
  ApiKind api_;
  Clock::time_point send_;
  SseParser parser_;
  std::vector<SseEvent> events_;
  RequestRecord r_;
  bool done_ = false;
  bool any_event_ = false;
  double done_s_ = 0;
  std::string error_class_, error_message_;
  std::optional<int32_t> usage_prompt_, usage_completion_, usage_cached_;
  std::string first_bytes_;  // of the body, for messages
};

std::unique_ptr<TokenCounter> MakeRemoteTokenCounter(const HttpTarget& target, const std::string& model,
                                                     std::vector<HttpHeader> headers);
// The id of the first model that GET /v1/models lists.
StatusOr<std::string> FetchFirstModel(const HttpTarget& target, std::vector<HttpHeader> headers);

}  // namespace fathom::bench
