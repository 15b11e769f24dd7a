// The OpenAI- and DeepSeek-compatible API over the engine: routes, validation, auth, chat templates, SSE streaming
// with resumable event logs, reasoning_content, usage and timing, overload answers, disconnect aborts and draining.
//
//   OpenAiServer server(options);                    // listens at once; /health says 503 "loading"
//   FATHOM_RETURN_IF_ERROR(server.Start());
//   ... load the model, build the engine ...
//   EngineGroup engines({&engine});                 // or several replicas (--data-parallel-size)
//   server.Attach({.engines = &engines, .tokenizer = tok.get(), .chat = chat.get(), .vocab_size = V});  // 200 "ok"
//   server.BeginDrain();                             // stop accepting; /health 503 "draining"
//   server.WaitIdle(grace);  engine.Shutdown(kAbort);  server.WaitIdle(2s);  server.Stop();
//
// Threads: the HTTP I/O threads parse, validate, render templates, tokenize and serialize; the engine thread (owned
// by Engine) does everything that touches model state. Outputs come back through each request's RequestStream,
// whose listener posts a drain onto the request's strand.
#pragma once

#include <atomic>
#include <boost/asio/thread_pool.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>

#include "engine/engine.h"
#include "engine/engine_group.h"
#include "server/api_error.h"
#include "server/constraints.h"
#include "server/http_server.h"
#include "server/reasoning.h"
#include "server/stream_log.h"
#include "server/tools.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace fathom::server {

struct ServerOptions {
  HttpOptions http;
  std::string served_model_name = "fathom";
  // More names the model answers to (vLLM's several --served-model-name); a response names the one asked for.
  std::vector<std::string> served_model_aliases;
  // Accepted API keys, comma-separated (--api-key a,b); empty: no authentication.
  std::string api_key;
  // Whether clients of different API keys may share prefix-cache blocks. kPerKey (the default) gives each key its
  // own namespace, so that one tenant cannot tell from cached_tokens (or latency) what another's prompts began with.
  enum class PrefixCacheIsolation { kPerKey, kShared };
  PrefixCacheIsolation prefix_cache_isolation = PrefixCacheIsolation::kPerKey;
  // kNone, or kDeepSeekR1; `reasoning_auto` picks R1 when the chat template opens a <think> block.
  ReasoningParser reasoning = ReasoningParser::kNone;
  bool reasoning_auto = true;
  // --tool-call-parser: the format of tool calls; unset: the one the chat template (or the tokenizer) shows.
  std::optional<ToolFormat> tool_format;
  StreamLogOptions stream_logs;
  // A resumable stream (the client opted in) whose client drops keeps generating this long for a resume to pick it
  // up; without a resume by then it is aborted. Streams that did not opt in are aborted at once.
  double stream_resume_grace_s = 30;
  std::string access_log = "-";      // a file, "-" for stdout, or "" for none
  int retry_after_s = 1;             // Retry-After of 429 answers
  bool metrics_require_key = false;  // GET /metrics needs the API key too (default: open, as Prometheus expects)
  // The port is shared with other processes (--reuse-port): a drain closes the listener (new connections go to
  // the others), serves what arrives on its open connections, and closes each after its response.
  bool handoff_on_drain = false;
  // A second listener on this port of the same host, for this process alone (not shared: --private-port), serving
  // the same routes: a scrape or a resume that must reach this process when the main port is shared. 0: none.
  uint16_t private_port = 0;
  // Threads that parse generation requests, render chat templates, tokenize, detokenize and compile grammars, so
  // that an I/O thread only moves bytes (one client's 8 MiB /tokenize or 60k-rule grammar stalls nobody's stream
  // or /health). 0: that work runs on the I/O thread (tests and fuzz targets that drive Dispatch synchronously).
  int work_threads = 0;
  // Requests waiting for a work thread; past it, 503 (server_busy) with Retry-After.
  int64_t max_work_queue = 1024;
  // A request that waited this long for a work thread is answered 503 instead of being started late.
  double max_work_wait_s = 30;
};

// What the server needs of the loaded model. Pointers outlive the server's use of them (until Stop()).
struct ServedModel {
  EngineGroup* engines = nullptr;  // one replica, or --data-parallel-size of them
  const Tokenizer* tokenizer = nullptr;
  const ChatTemplate* chat = nullptr;  // null: chat completions answer 400
  int64_t vocab_size = 0;
};

// Per-request observations, for the metrics and the access log.
struct RequestRecord {
  std::string request_id;
  std::string method;
  std::string path;
  std::string client;
  std::string model;
  std::string user;
  int http_status = 0;
  std::string error_code;     // set when rejected: queue_full, queue_timeout, too_long, invalid, unauthorized, ...
  std::string finish_reason;  // of the first sample
  bool stream = false;
  int32_t replica = -1;   // the engine replica that ran it (-1: none)
  std::string placement;  // why that replica (EngineGroup::Placed::reason)
  int32_t prompt_tokens = 0;
  int32_t completion_tokens = 0;
  int32_t cached_tokens = 0;
  int32_t reasoning_tokens = 0;
  // Seconds.
  double queue = 0, tokenize = 0, prefill = 0, decode = 0, detokenize = 0, grammar = 0, serialize = 0, total = 0,
         ttft = 0;
  std::string constraint;                // structured output: json_schema, json_object, regex, choice; empty: none
  double grammar_compile = 0;            // seconds compiling it for this request (0: it was cached)
  std::vector<double> inter_token_gaps;  // between token-bearing outputs, sample 0
};

class OpenAiServer {
 public:
  explicit OpenAiServer(ServerOptions options);
  ~OpenAiServer();
  OpenAiServer(const OpenAiServer&) = delete;
  OpenAiServer& operator=(const OpenAiServer&) = delete;

  Status Start();
  uint16_t port() const { return http_.port(); }
  uint16_t private_port() const { return private_http_ ? private_http_->port() : 0; }
  void Attach(ServedModel model);
  // Called for every finished request (any I/O thread).
  void SetRecordHook(std::function<void(const RequestRecord&)> hook) { record_hook_ = std::move(hook); }
  // The body of GET /metrics (Prometheus text format); unset: 404.
  void SetMetricsHandler(std::function<std::string()> handler) { metrics_handler_ = std::move(handler); }
  // Extra routes (e.g. POST /debug/trace): return false to fall through to 404.
  void SetExtraRoute(std::function<bool(const std::shared_ptr<HttpExchange>&)> route) {
    extra_route_ = std::move(route);
  }
  // Called (any thread) each time the exception barrier catches something, with where it was caught: a bug.
  void SetInternalErrorHook(std::function<void(std::string_view where)> hook) {
    internal_error_hook_ = std::move(hook);
  }
  // Exceptions the barrier caught since the start (each answered as a 500 and logged).
  int64_t internal_errors() const { return internal_errors_.load(); }

  // Handles one exchange as an HTTP thread does (the server registers this as its handler); tests and fuzz targets
  // call it with an HttpExchange over their own HttpSink.
  void Dispatch(const std::shared_ptr<HttpExchange>& ex) { Handle(ex); }

  void BeginDrain();
  bool draining() const { return draining_.load(); }
  int64_t active_requests() const { return active_->load(); }
  // Waits until no generation request is active or `timeout` passes; true when idle. Draining with a shared port
  // (handoff_on_drain), idle also needs every public connection closed: one taken from the backlog, or a keep-alive
  // one, can still bring a request that this process must serve, so its engines stay up until then.
  bool WaitIdle(std::chrono::duration<double> timeout) const;
  void Stop();
  int64_t open_connections() const {
    return http_.open_connections() + (private_http_ ? private_http_->open_connections() : 0);
  }

  class Job;

 private:
  // The exception barrier: runs `f`, and turns anything it throws into a logged, counted 500 (when the exchange has
  // not answered yet). Every entry from the I/O threads (handler, strand work, timers) goes through it.
  template <typename F>
  void Guard(const char* where, const std::shared_ptr<HttpExchange>& ex, F&& f) noexcept;
  void CaughtException(const char* where, const std::shared_ptr<HttpExchange>& ex, const char* what) noexcept;
  void Handle(const std::shared_ptr<HttpExchange>& ex);
  void Route(const std::shared_ptr<HttpExchange>& ex);
  // Runs `f` on a work thread (inline when there are none), through the exception barrier; refuses with 503 when
  // the queue is full, when the request waited past max_work_wait_s, or once the server shuts down.
  void Offload(const std::shared_ptr<HttpExchange>& ex, const char* where, std::function<void()> f);
  void HandleGenerate(const std::shared_ptr<HttpExchange>& ex, bool chat);
  void HandleTokenize(const std::shared_ptr<HttpExchange>& ex);
  void HandleDetokenize(const std::shared_ptr<HttpExchange>& ex);
  void HandleModels(const std::shared_ptr<HttpExchange>& ex);
  void HandleResume(const std::shared_ptr<HttpExchange>& ex, const std::string& response_id);
  void HandleTrace(const std::shared_ptr<HttpExchange>& ex, RequestRecord record);
  // Whether the request carries an accepted key (always, without --api-key); `key_index` gets which one (-1: none).
  bool Authorized(const HttpExchange& ex, int* key_index = nullptr) const;
  // The prefix-cache salt of a request: its API key's namespace (per-key isolation) and its cache_salt.
  uint64_t CacheSalt(const HttpExchange& ex, const std::string& cache_salt) const;
  void ReplyError(const std::shared_ptr<HttpExchange>& ex, const ApiError& error, RequestRecord record,
                  HttpHeaders headers = {});
  void Finish(const RequestRecord& record);
  // An internal id: prefix + a per-process counter.
  std::string NewId(std::string_view prefix);
  // A response id, which is also the capability to resume its stream: prefix + 128 random bits (getrandom).
  static std::string NewSecretId(std::string_view prefix);
  // The record of a request as it arrives: id (the client's X-Request-Id when plain), method, path, client.
  RequestRecord NewRecord(const HttpExchange& ex);

  ServerOptions options_;
  HttpServer http_;
  std::unique_ptr<HttpServer> private_http_;  // --private-port
  ServedModel model_;
  std::vector<std::string> api_keys_;                // options_.api_key split at commas
  std::unique_ptr<ConstraintCompiler> constraints_;  // structured output, at the model's vocabulary
  ToolFormat tool_format_ = ToolFormat::kNone;       // resolved at Attach
  // What a request's `thinking` maps to (resolved at Attach): the chat template's switch variable (ThinkingSwitch;
  // empty: none), else whether the template always opens <think> (R1 and its distills).
  std::string thinking_switch_;
  bool always_thinks_ = false;
  // Whether setting the switch makes the template open <think> (DeepSeek-V3.1's and V3.2's): such a request's output
  // starts inside the block, so its reasoning is split off (Reasons) even though the startup probe, rendered without
  // the switch, did not open it.
  bool switch_opens_think_ = false;
  // Whether the template reads `reasoning_effort` (DeepSeek-V4's encoding): a request's effort goes there, and is
  // refused where it does not.
  bool reads_effort_ = false;
  // A request's `thinking`, where `reasoning_effort` without `thinking` asks for it on a template with a thinking
  // switch (as DeepSeek-V4's API has it).
  std::optional<bool> Thinking(const ParsedRequest& req) const;
  // Whether a request's output is split into reasoning_content and content (ReasoningSplitter): the deepseek-r1
  // parser (given, or chosen at Attach because the template always opens <think>), or, with the parser on auto, a
  // request that turns on a switch that opens <think>.
  bool Reasons(const ParsedRequest& req) const;
  // Fills `cr` from a chat request: messages, tools (server/tools.h), `thinking`, `reasoning_effort` and the
  // template switches. An error
  // names its field in *param.
  Status PrepareChat(const ParsedRequest& req, ChatRequest* cr, std::string* param) const;
  // Logs a request's unknown fields (ParsedRequest::ignored_fields), each name once per process (64 names at most).
  void NoteIgnoredFields(const std::vector<std::string>& fields, const std::string& request_id);
  std::mutex ignored_mu_;
  std::set<std::string> ignored_logged_;
  std::atomic<bool> ready_{false};
  std::atomic<bool> draining_{false};
  // Set when a shutdown begins (without hand-off) or at Stop: queued work answers 503 and compiles stop.
  std::atomic<bool> cancel_work_{false};
  std::unique_ptr<boost::asio::thread_pool> work_;  // ServerOptions::work_threads; null: inline
  std::atomic<int64_t> work_queued_{0};
  std::shared_ptr<std::atomic<int64_t>> active_ = std::make_shared<std::atomic<int64_t>>(0);
  StreamLogs logs_;
  std::function<void(const RequestRecord&)> record_hook_;
  std::function<std::string()> metrics_handler_;
  std::function<bool(const std::shared_ptr<HttpExchange>&)> extra_route_;
  std::function<void(std::string_view)> internal_error_hook_;
  std::atomic<int64_t> internal_errors_{0};
  std::mutex log_mu_;
  std::FILE* access_log_ = nullptr;
  bool own_access_log_ = false;
  std::atomic<uint64_t> next_id_{0};
  uint64_t id_salt_ = 0;
  int64_t created_ = 0;
};

// "deepseek-r1" / "none" / "auto".
StatusOr<ReasoningParser> ParseReasoningParser(const std::string& name, bool* automatic);
// Whether a chat template's generation prompt ends inside an opened <think> block (R1 distills; with `extra`, the
// template variables set, e.g. {"thinking": true} for DeepSeek-V3.1's and V3.2's switch).
bool TemplateOpensThink(const ChatTemplate& chat,
                        const nlohmann::ordered_json& extra = nlohmann::ordered_json::object());
// The chat template's thinking switch: "thinking" (DeepSeek-V3.1) or "enable_thinking" (Qwen3) where one of them is
// an identifier inside the template's {% %} or {{ }} tags; empty when neither is.
std::string ThinkingSwitch(std::string_view template_source);
// Whether `name` is a variable the template reads: an identifier inside its {% %} or {{ }} tags, outside their string
// literals (e.g. "reasoning_effort" in DeepSeek-V4's encoding).
bool TemplateReads(std::string_view template_source, std::string_view name);
// Constant-time comparison of secrets (the time depends on the lengths only).
bool ConstantTimeEquals(std::string_view a, std::string_view b);
// The token of an `Authorization: Bearer <token>` header: the scheme is case-insensitive (RFC 7235) and spaces
// around the token are dropped. Empty when the header holds no bearer token.
std::string_view BearerToken(std::string_view authorization);
// Last-Event-ID as an event sequence number: plain decimal digits only (no sign, no spaces), at most 2^63 - 1.
std::optional<uint64_t> ParseEventId(std::string_view text);

}  // namespace fathom::server
