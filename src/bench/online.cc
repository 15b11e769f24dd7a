#include "bench/online.h"

#include <fmt/format.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <cmath>
#include <exception>
#include <nlohmann/json.hpp>
#include <optional>
#include <unordered_set>

#include "core/logging.h"

namespace fathom::bench {

namespace asio = boost::asio;
using boost::system::error_code;

namespace {

double Seconds(Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

std::string FormatRate(double r) {
  return std::isinf(r) ? "inf" : fmt::format("{:g}/s", r);
}

}  // namespace

std::string LoadShape::Label() const {
  if (closed()) return fmt::format("concurrency {}", concurrency);
  std::string s = "rate " + FormatRate(request_rate);
  if (!std::isinf(request_rate) && burstiness != 1.0) s += fmt::format(" (burstiness {:g})", burstiness);
  if (max_concurrency > 0) s += fmt::format(", max concurrency {}", max_concurrency);
  return s;
}

bool StreamRecorder::OnBody(std::string_view bytes, Clock::time_point at) {
  if (!error_class_.empty()) return false;
  if (first_bytes_.size() < 200) first_bytes_.append(bytes.substr(0, 200 - first_bytes_.size()));
  events_.clear();
  parser_.Feed(bytes, events_);
  const double t = Seconds(at - send_);
  for (const SseEvent& e : events_) {
    any_event_ = true;
    if (done_) continue;  // nothing counts after [DONE]
    StatusOr<StreamChunk> chunk = ParseStreamChunk(e.data, api_);
    if (!chunk.ok()) {
      error_class_ = "malformed_sse";
      error_message_ = chunk.status().message();
      return false;
    }
    if (chunk->error) {
      error_class_ = "server_error_event";
      error_message_ = *chunk->error;
      return false;
    }
    if (chunk->done) {
      done_ = true;
      done_s_ = t;
      continue;
    }
    if (!chunk->text.empty()) r_.token_times_s.push_back(t);
    if (chunk->prompt_tokens) usage_prompt_ = chunk->prompt_tokens;
    if (chunk->completion_tokens) usage_completion_ = chunk->completion_tokens;
    if (chunk->cached_tokens) usage_cached_ = chunk->cached_tokens;
    if (chunk->timing) r_.server_timing = chunk->timing;
  }
  return true;
}

RequestRecord StreamRecorder::Finish(const HttpResult& http, Clock::time_point end, int32_t planned_prompt_len) {
  RequestRecord r = std::move(r_);
  r.http_status = http.status;
  const bool http_ok = http.status >= 200 && http.status < 300;
  auto fail = [&](std::string cls, std::string msg) {
    r.ok = false;
    r.error_class = std::move(cls);
    r.error_message = std::move(msg);
  };
  if (!http.error_class.empty() && !(done_ && error_class_.empty())) {
    const bool cut =
        http.status != 0 && (http.error_class == "connection_closed" || http.error_class == "connection_reset");
    if (cut) {
      fail("incomplete_stream", "the connection closed in the middle of the response: " + http.error_message);
    } else {
      fail(http.error_class, http.error_message);
    }
  } else if (!http_ok) {
    fail(fmt::format("http_{}", http.status), ErrorMessageOfBody(http.body));
  } else if (!error_class_.empty()) {
    fail(error_class_, error_message_);
  } else if (!done_) {
    if (!any_event_ && http.content_type.find("text/event-stream") == std::string::npos) {
      fail("not_event_stream",
           fmt::format("a {} response instead of an event stream: '{}'",
                       http.content_type.empty() ? "untyped" : http.content_type, first_bytes_.substr(0, 120)));
    } else {
      fail("incomplete_stream", parser_.HasPartialEvent() ? "the stream ended inside an event, before [DONE]"
                                                          : "the stream ended before data: [DONE]");
    }
  } else if (r.token_times_s.empty()) {
    fail("no_tokens", "the stream carried no token-bearing chunk");
  } else {
    r.ok = true;
  }
  r.e2e_s = done_ ? done_s_ : Seconds(end - send_);
  if (!r.token_times_s.empty()) r.ttft_s = r.token_times_s.front();
  r.prompt_tokens = usage_prompt_.value_or(planned_prompt_len);
  r.output_tokens_from_usage = usage_completion_.has_value();
  r.output_tokens = usage_completion_.value_or(static_cast<int32_t>(r.token_times_s.size()));
  r.cached_tokens = usage_cached_;
  if (!r.server_timing && !http.timing_header.empty()) {
    if (auto t = ParseTimingHeader(http.timing_header); t.ok()) r.server_timing = *t;
  }
  if (!r.ok) r.token_times_s.clear();
  return r;
}

namespace {

struct LevelState {
  const OnlineOptions* o = nullptr;
  const std::vector<BenchPrompt>* prompts = nullptr;
  std::vector<std::string> bodies;
  std::vector<double> arrivals;
  ApiKind api = ApiKind::kCompletions;
  StreamingClient* client = nullptr;
  std::vector<RequestRecord> records;
  Clock::time_point start;
  Clock::time_point last_end;
  size_t next = 0;
  int64_t in_flight = 0;
  std::optional<asio::steady_timer> slot;  // woken when a request finishes (open loop with a cap)
  std::optional<Progress> progress;
};

asio::awaitable<void> RunOne(LevelState& st, size_t i) {
  const Clock::time_point send = Clock::now();
  StreamRecorder rec(st.api, send);
  HttpResult http =
      co_await st.client->Send("POST", st.o->endpoint, st.bodies[i], st.o->headers, st.o->timeout_s,
                               [&rec](std::string_view bytes, Clock::time_point at) { return rec.OnBody(bytes, at); });
  const Clock::time_point end = Clock::now();
  RequestRecord r = rec.Finish(http, end, (*st.prompts)[i].prompt_len);
  r.index = static_cast<int64_t>(i);
  r.send_s = Seconds(send - st.start);
  st.records[i] = std::move(r);
  st.last_end = std::max(st.last_end, end);
  if (st.progress) st.progress->Advance(1);
}

asio::awaitable<void> ClosedLoopWorker(LevelState& st) {
  while (st.next < st.bodies.size()) {
    const size_t i = st.next++;
    co_await RunOne(st, i);
  }
}

asio::awaitable<void> CountedRun(LevelState& st, size_t i) {
  co_await RunOne(st, i);
  --st.in_flight;
  if (st.slot) st.slot->cancel();
}

asio::awaitable<void> OpenLoopDispatcher(LevelState& st, int32_t cap) {
  auto executor = co_await asio::this_coro::executor;
  asio::steady_timer timer(executor);
  error_code ec;
  for (size_t i = 0; i < st.bodies.size(); ++i) {
    const Clock::time_point due =
        st.start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(st.arrivals[i]));
    if (due > Clock::now()) {
      timer.expires_at(due);
      co_await timer.async_wait(asio::redirect_error(asio::use_awaitable, ec));
    }
    while (cap > 0 && st.in_flight >= cap) {
      st.slot->expires_at(Clock::time_point::max());
      co_await st.slot->async_wait(asio::redirect_error(asio::use_awaitable, ec));
    }
    ++st.in_flight;
    asio::co_spawn(executor, CountedRun(st, i), [](std::exception_ptr e) {
      if (e) std::rethrow_exception(e);
    });
  }
}

}  // namespace

StatusOr<LevelResult> RunLevel(const OnlineOptions& o, const LoadShape& shape, const std::vector<BenchPrompt>& prompts,
                               const Slo& slo) {
  if (shape.closed() && shape.concurrency <= 0) return InvalidArgumentError("concurrency must be positive");
  if (!shape.closed() && !(shape.request_rate > 0)) return InvalidArgumentError("--request-rate must be positive");
  if (!(shape.burstiness > 0)) return InvalidArgumentError("--burstiness must be positive");
  asio::io_context io(1);  // first: the timers and sockets below must go before it
  LevelState st;
  st.o = &o;
  st.prompts = &prompts;
  st.api = ApiKindOfPath(o.endpoint);
  RequestBodyOptions body_options = o.body;
  body_options.api = st.api;
  for (const BenchPrompt& p : prompts) {
    FATHOM_ASSIGN_OR_RETURN(std::string body, BuildRequestBody(body_options, p));
    st.bodies.push_back(std::move(body));
  }
  st.records.resize(prompts.size());
  if (!shape.closed())
    st.arrivals = ArrivalTimes(static_cast<int64_t>(prompts.size()), shape.request_rate, shape.burstiness, o.seed);

  FATHOM_ASSIGN_OR_RETURN(std::unique_ptr<StreamingClient> client, StreamingClient::Create(io, o.target));
  st.client = client.get();
  if (o.show_progress)
    st.progress.emplace(fmt::format("{} [{}]", o.progress_label, shape.Label()), static_cast<int64_t>(prompts.size()));
  std::exception_ptr failure;
  auto on_done = [&failure](std::exception_ptr e) {
    if (e && !failure) failure = e;
  };
  st.start = Clock::now();
  st.last_end = st.start;
  if (shape.closed()) {
    const size_t workers = std::min<size_t>(static_cast<size_t>(shape.concurrency), prompts.size());
    for (size_t w = 0; w < workers; ++w) asio::co_spawn(io, ClosedLoopWorker(st), on_done);
  } else {
    st.slot.emplace(io);
    asio::co_spawn(io, OpenLoopDispatcher(st, shape.max_concurrency), on_done);
  }
  try {
    io.run();
  } catch (const std::exception& e) {
    return InternalError(fmt::format("the benchmark client failed: {}", e.what()));
  }
  if (failure) {
    try {
      std::rethrow_exception(failure);
    } catch (const std::exception& e) {
      return InternalError(fmt::format("the benchmark client failed: {}", e.what()));
    }
  }
  if (st.progress) st.progress->Finish();
  client->CloseIdle();

  LevelResult result;
  result.shape = shape;
  result.duration_s = Seconds(st.last_end - st.start);
  result.records = std::move(st.records);
  result.metrics = ComputeMetrics(result.records, result.duration_s, slo);
  result.connections_opened = client->connections_opened();
  return result;
}

namespace {

// Words to learn token ids from when only the server's tokenizer is at hand.
constexpr std::string_view kSeedText =
    "The history of computing is a story of abstraction, measurement and patience. Engineers built machines that "
    "could add numbers, then store programs, then share time among many users. Networks connected laboratories "
    "across continents; protocols carried mail, files and eventually pages of hypertext. Compilers translated "
    "languages into instructions, operating systems scheduled processes, and databases kept records consistent "
    "when power failed. Later, graphics processors turned out to multiply matrices quickly, and researchers "
    "trained language models on large collections of books, code, articles and conversations. Serving such a model "
    "means batching requests, caching keys and values, streaming tokens back to clients and watching latency "
    "percentiles closely, because every user notices a slow first word. Mountains, rivers, forests, cities, "
    "bridges, markets, gardens, libraries, music, painting, mathematics, chemistry, biology, astronomy, weather, "
    "ocean, harvest, winter, summer, morning, evening, journey, question, answer, number, letter, window, garden.";

class RemoteTokenCounter : public TokenCounter {
 public:
  RemoteTokenCounter(HttpTarget target, std::string model, std::vector<HttpHeader> headers)
      : target_(std::move(target)), model_(std::move(model)), headers_(std::move(headers)) {}

  StatusOr<std::vector<int32_t>> Encode(const std::string& text) override {
    FATHOM_RETURN_IF_ERROR(Init());
    FATHOM_ASSIGN_OR_RETURN(std::vector<int32_t> ids, Tokenize(text));
    // The server may add BOS whatever add_special_tokens says: drop what an empty prompt gets.
    if (special_prefix_ > 0 && ids.size() >= special_prefix_) ids.erase(ids.begin(), ids.begin() + special_prefix_);
    return ids;
  }

  StatusOr<std::string> Decode(const std::vector<int32_t>& ids) override {
    FATHOM_RETURN_IF_ERROR(Init());
    nlohmann::json req = {{"model", model_}, {"tokens", ids}};
    FATHOM_ASSIGN_OR_RETURN(nlohmann::json j, Call("/detokenize", req));
    if (!j.contains("prompt") || !j["prompt"].is_string()) {
      return DataLossError("/detokenize answered without a \"prompt\" string");
    }
    return j["prompt"].get<std::string>();
  }

  StatusOr<std::vector<int32_t>> CandidateIds() override {
    FATHOM_RETURN_IF_ERROR(Init());
    if (!candidates_.empty()) return candidates_;
    FATHOM_ASSIGN_OR_RETURN(std::vector<int32_t> ids, Encode(std::string(kSeedText)));
    std::unordered_set<int32_t> seen;
    for (int32_t id : ids) {
      if (seen.insert(id).second) candidates_.push_back(id);
    }
    if (candidates_.empty()) return DataLossError("/tokenize returned no tokens for the seed text");
    return candidates_;
  }

 private:
  Status Init() {
    if (client_) return OkStatus();
    FATHOM_ASSIGN_OR_RETURN(client_, BlockingHttpClient::Create(target_, headers_));
    // What an empty prompt tokenizes to is what the server adds (BOS); subtract it from every count.
    StatusOr<std::vector<int32_t>> empty = Tokenize("");
    if (!empty.ok()) {
      if (empty.status().code() != StatusCode::kInvalidArgument) {
        const Status s = empty.status();
        client_.reset();
        return s;
      }
      special_prefix_ = 0;  // a server that refuses empty prompts
    } else {
      special_prefix_ = empty->size();
    }
    return OkStatus();
  }

  StatusOr<std::vector<int32_t>> Tokenize(const std::string& text) {
    nlohmann::json req = {{"model", model_}, {"prompt", text}, {"add_special_tokens", false}};
    FATHOM_ASSIGN_OR_RETURN(nlohmann::json j, Call("/tokenize", req));
    if (!j.contains("tokens") || !j["tokens"].is_array()) {
      return DataLossError("/tokenize answered without a \"tokens\" array");
    }
    return j["tokens"].get<std::vector<int32_t>>();
  }

  StatusOr<nlohmann::json> Call(const std::string& path, const nlohmann::json& req) {
    FATHOM_ASSIGN_OR_RETURN(HttpResponse r, client_->Request("POST", path, DumpJson(req)));
    if (r.status == 404) {
      return NotFoundError(fmt::format("{} answered 404: the server has no {} (pass --tokenizer DIR or --dataset)",
                                       target_.Url(path), path));
    }
    if (r.status >= 400 && r.status < 500) {
      return InvalidArgumentError(
          fmt::format("{} answered {}: {}", target_.Url(path), r.status, ErrorMessageOfBody(r.body)));
    }
    if (r.status < 200 || r.status >= 300) {
      return UnavailableError(
          fmt::format("{} answered {}: {}", target_.Url(path), r.status, ErrorMessageOfBody(r.body)));
    }
    nlohmann::json j = nlohmann::json::parse(r.body, nullptr, false);
    if (j.is_discarded() || !j.is_object())
      return DataLossError(fmt::format("{}: the answer is not a JSON object", path));
    return j;
  }

  HttpTarget target_;
  std::string model_;
  std::vector<HttpHeader> headers_;
  std::unique_ptr<BlockingHttpClient> client_;
  size_t special_prefix_ = 0;
  std::vector<int32_t> candidates_;
};

}  // namespace

std::unique_ptr<TokenCounter> MakeRemoteTokenCounter(const HttpTarget& target, const std::string& model,
                                                     std::vector<HttpHeader> headers) {
  return std::make_unique<RemoteTokenCounter>(target, model, std::move(headers));
}

StatusOr<std::string> FetchFirstModel(const HttpTarget& target, std::vector<HttpHeader> headers) {
  FATHOM_ASSIGN_OR_RETURN(auto client, BlockingHttpClient::Create(target, std::move(headers)));
  FATHOM_ASSIGN_OR_RETURN(HttpResponse r, client->Request("GET", "/v1/models", ""));
  if (r.status != 200) {
    return UnavailableError(fmt::format("GET {} answered {}: {} (pass --model NAME)", target.Url("/v1/models"),
                                        r.status, ErrorMessageOfBody(r.body)));
  }
  nlohmann::json j = nlohmann::json::parse(r.body, nullptr, false);
  if (j.is_discarded() || !j.contains("data") || !j["data"].is_array() || j["data"].empty() ||
      !j["data"][0].contains("id") || !j["data"][0]["id"].is_string()) {
    return DataLossError(fmt::format("GET {} lists no model (pass --model NAME)", target.Url("/v1/models")));
  }
  return j["data"][0]["id"].get<std::string>();
}

}  // namespace fathom::bench
