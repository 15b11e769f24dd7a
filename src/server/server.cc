#include "server/server.h"

#include <fmt/format.h>
#include <sys/random.h>

#include <algorithm>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <stdexcept>
#include <string_view>
#include <thread>
#include <utility>

#include "core/json.h"
#include "core/logging.h"
#include "obs/trace.h"
#include "server/api.h"

namespace fathom::server {

namespace asio = boost::asio;
using Json = nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

// DeepSeek's URL forms: its documented base URL has no /v1 (@ai-sdk/deepseek and LangChain's ChatDeepSeek default to
// it), and /beta serves prefix completion, FIM and strict tools, which the /v1 routes serve too. They are aliases:
// routing, auth, metrics and logs see the canonical /v1 path.
std::string_view CanonicalRoute(std::string_view path) {
  static constexpr std::pair<std::string_view, std::string_view> kAliases[] = {
      {"/chat/completions", "/v1/chat/completions"},
      {"/completions", "/v1/completions"},
      {"/models", "/v1/models"},
      {"/beta/chat/completions", "/v1/chat/completions"},
      {"/beta/completions", "/v1/completions"},
      {"/beta/models", "/v1/models"},
  };
  for (const auto& [alias, canonical] : kAliases) {
    if (path == alias) return canonical;
  }
  return path;
}

double SecondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

double EpochSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Model text may hold broken UTF-8 (a token that ends mid-character); JSON output replaces it with U+FFFD.
std::string Dump(const Json& j) {
  return JsonText(j);
}

// X-Request-Id from the client is kept when it is short and plain; otherwise the server's id is used.
bool PlainId(std::string_view id) {
  if (id.empty() || id.size() > 128) return false;
  for (char c : id) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.' && c != ':') return false;
  }
  return true;
}

std::string TimingHeader(const RequestRecord& r) {
  return fmt::format(
      "queue={:.6f};tokenize={:.6f};prefill={:.6f};decode={:.6f};detokenize={:.6f};grammar={:.6f};serialize={:.6f};"
      "total={:.6f}{}",
      r.queue, r.tokenize, r.prefill, r.decode, r.detokenize, r.grammar, r.serialize, r.total,
      r.replica >= 0 ? fmt::format(";replica={}", r.replica) : std::string());
}

Json TimingJson(const RequestRecord& r) {
  auto us = [](double s) { return std::round(s * 1e6) / 1e6; };  // microseconds are plenty
  Json j = {{"queue", us(r.queue)},           {"tokenize", us(r.tokenize)},
            {"prefill", us(r.prefill)},       {"decode", us(r.decode)},
            {"detokenize", us(r.detokenize)}, {"grammar", us(r.grammar)},
            {"serialize", us(r.serialize)},   {"total", us(r.total)}};
  if (r.replica >= 0) j["replica"] = r.replica;
  return j;
}

// Unicode code points in UTF-8 text (every byte that is not a continuation byte starts one; an invalid byte counts
// as the one U+FFFD it would print as).
int64_t CodePoints(std::string_view s) {
  int64_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

Json TokenBytes(const std::string& s) {
  Json bytes = Json::array();
  for (unsigned char c : s) bytes.push_back(static_cast<int>(c));
  return bytes;
}

std::string_view FinishName(const RequestOutput& out) {
  // A request cut short by the engine's error path reports "error"; OpenAI clients know stop/length/abort too.
  return FinishReasonName(out.finish_reason);
}

}  // namespace

StatusOr<ReasoningParser> ParseReasoningParser(const std::string& name, bool* automatic) {
  *automatic = false;
  if (name == "deepseek-r1" || name == "deepseek_r1") return ReasoningParser::kDeepSeekR1;
  if (name == "none" || name.empty()) return ReasoningParser::kNone;
  if (name == "auto") {
    *automatic = true;
    return ReasoningParser::kNone;
  }
  return InvalidArgumentError(fmt::format("--reasoning-parser: '{}' is not one of auto, deepseek-r1, none", name));
}

bool TemplateOpensThink(const ChatTemplate& chat, const nlohmann::ordered_json& extra) {
  ChatRequest probe;
  probe.messages.push_back({{"role", "user"}, {"content", "hi"}});
  probe.add_generation_prompt = true;
  if (extra.is_object()) probe.extra = extra;
  auto rendered = chat.Render(probe);
  if (!rendered.ok()) return false;
  std::string_view text = *rendered;
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.remove_suffix(1);
  return text.size() >= 7 && text.substr(text.size() - 7) == "<think>";
}

// Whether `name` is read as a variable inside one of the template's tags (literal text may say "thinking" without
// it being a variable), and not inside a string literal there.
bool TemplateReads(std::string_view src, std::string_view name) {
  const auto is_ident = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_'; };
  size_t pos = 0;
  while ((pos = src.find('{', pos)) != std::string_view::npos) {
    if (pos + 1 >= src.size() || (src[pos + 1] != '%' && src[pos + 1] != '{')) {
      ++pos;
      continue;
    }
    const std::string_view close = src[pos + 1] == '%' ? "%}" : "}}";
    const size_t end = src.find(close, pos + 2);
    const std::string_view tag = src.substr(pos + 2, (end == std::string_view::npos ? src.size() : end) - pos - 2);
    for (size_t at = tag.find(name); at != std::string_view::npos; at = tag.find(name, at + 1)) {
      const bool starts = at == 0 || !is_ident(tag[at - 1]);
      const bool ends = at + name.size() == tag.size() || !is_ident(tag[at + name.size()]);
      // Not inside a string literal: the quotes before it in the tag are balanced.
      const std::string_view before = tag.substr(0, at);
      const bool quoted = std::count(before.begin(), before.end(), '\'') % 2 == 1 ||
                          std::count(before.begin(), before.end(), '"') % 2 == 1;
      if (starts && ends && !quoted) return true;
    }
    if (end == std::string_view::npos) break;
    pos = end + 2;
  }
  return false;
}

std::string ThinkingSwitch(std::string_view src) {
  if (TemplateReads(src, "enable_thinking")) return "enable_thinking";
  return TemplateReads(src, "thinking") ? "thinking" : "";
}

bool ConstantTimeEquals(std::string_view a, std::string_view b) {
  // Every byte of the longer string is visited whatever matches, so the time tells only the lengths.
  const size_t n = std::max(a.size(), b.size());
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= static_cast<unsigned char>(x ^ y);
  }
  return diff == 0;
}

std::string_view BearerToken(std::string_view auth) {
  while (!auth.empty() && auth.front() == ' ') auth.remove_prefix(1);
  constexpr std::string_view kScheme = "bearer";
  if (auth.size() <= kScheme.size() || auth[kScheme.size()] != ' ') return {};
  for (size_t i = 0; i < kScheme.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(auth[i])) != kScheme[i]) return {};
  }
  auth.remove_prefix(kScheme.size());
  while (!auth.empty() && auth.front() == ' ') auth.remove_prefix(1);
  while (!auth.empty() && (auth.back() == ' ' || auth.back() == '\t')) auth.remove_suffix(1);
  return auth;
}

std::optional<uint64_t> ParseEventId(std::string_view text) {
  if (text.empty() || text.size() > 19) return std::nullopt;
  uint64_t v = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + static_cast<uint64_t>(c - '0');
  }
  if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
  return v;
}

// One generation request from submission to the last byte: drains its RequestStream on its own strand, formats
// chunks or the final body, keeps the resumable event log, and reports the record.
class OpenAiServer::Job : public std::enable_shared_from_this<OpenAiServer::Job> {
 public:
  struct Sample {
    std::string content;
    std::string reasoning;
    ReasoningSplitter split;
    int32_t tokens = 0;
    int32_t reasoning_tokens = 0;
    bool sent_role = false;
    bool finished = false;
    RequestOutput final_out;
    Json logprobs = Json::array();  // chat: content entries; completion: collected below
    std::vector<std::string> lp_tokens;
    std::vector<double> lp_values;
    std::vector<Json> lp_top;
    // Legacy completions' text_offset, as vLLM counts it: the characters (code points) of the tokens before this
    // one in the completion (its prompt is not echoed, so offsets start at 0).
    std::vector<int64_t> lp_offsets;
    int64_t lp_chars = 0;
    std::unique_ptr<ToolCallParser> tools;  // a chat request with tools (not tool_choice none)
  };

  Job(OpenAiServer* server, std::shared_ptr<HttpExchange> ex, ParsedRequest req, RequestRecord record,
      std::string response_id, std::string engine_id, Clock::time_point arrival)
      : server_(server),
        ex_(std::move(ex)),
        req_(std::move(req)),
        record_(std::move(record)),
        response_id_(std::move(response_id)),
        engine_id_(std::move(engine_id)),
        arrival_(arrival),
        strand_(asio::make_strand(server->http_.io_context())),
        grace_timer_(strand_),
        samples_(static_cast<size_t>(req_.sampling.n)) {
    // A constrained output (response_format, the guided fields, a forced tool call) follows its grammar from the first
    // token, so it has no reasoning to split off: all of it is content (else an R1 model's JSON would come back as
    // reasoning_content, with content null, since no "</think>" ever comes).
    // A prefix completion continues the last assistant message's content, so its text is content too.
    reasoning_ = req_.endpoint == Endpoint::kChat && server_->Reasons(req_) && !req_.constraint.has_value() &&
                 !req_.continue_final_message;
    created_ = static_cast<int64_t>(EpochSeconds());
    if (req_.tools && req_.tools->choice != ToolsSpec::Choice::kNone) {
      for (Sample& s : samples_) {
        s.tools = std::make_unique<ToolCallParser>(server_->tool_format_, [] { return NewSecretId("call_"); });
      }
    }
  }

  void set_trace_flow(uint64_t flow) { flow_ = flow; }
  void set_replica(int32_t replica, const char* placement) {
    record_.replica = replica;
    record_.placement = placement;
  }

  void Begin(std::shared_ptr<RequestStream> stream) {
    stream_ = std::move(stream);
    self_ = shared_from_this();  // the job owns itself until its response is complete
    if (req_.stream) log_ = server_->logs_.Create(response_id_);
    std::weak_ptr<Job> weak = shared_from_this();
    ex_->OnClose([weak] {
      if (auto self = weak.lock()) self->ClientGone();
    });
    stream_->SetListener([weak] {
      auto self = weak.lock();
      if (!self || self->drain_scheduled_.exchange(true)) return;
      asio::post(self->strand_, [self] {
        self->drain_scheduled_.store(false);
        self->server_->Guard("stream", self->ex_, [&] { self->Drain(); });
      });
    });
  }

 private:
  // The client went away (a reset or a failed write). A stream that opted into resuming keeps generating into its
  // log for the grace period, for a resume (GET /v1/streams/{id}) to pick up; anything else is aborted at once,
  // which frees its KV blocks.
  void ClientGone() {
    client_gone_.store(true);
    if (req_.stream && req_.resumable && log_ && server_->options_.stream_resume_grace_s > 0) {
      std::shared_ptr<Job> self = shared_from_this();
      asio::post(strand_, [self] { self->server_->Guard("stream", self->ex_, [&] { self->ArmGrace(); }); });
      return;
    }
    Abort("the client disconnected");
  }

  void Abort(const char* reason) {
    if (server_->model_.engines != nullptr) (void)server_->model_.engines->Abort(engine_id_, reason);
  }

  // Strand: after the grace period, a stream nobody resumed is aborted; one being read by a resume gets another
  // period (its reader may drop too).
  void ArmGrace() {
    if (done_) return;
    grace_timer_.expires_after(std::chrono::duration_cast<Clock::duration>(
        std::chrono::duration<double>(server_->options_.stream_resume_grace_s)));
    std::weak_ptr<Job> weak = shared_from_this();
    grace_timer_.async_wait([weak](const boost::system::error_code& ec) {
      auto self = weak.lock();
      if (ec || !self || self->done_) return;
      self->server_->Guard("stream", self->ex_, [&] {
        if (self->log_->live_subscribers() > 0) return self->ArmGrace();
        self->Abort("the client disconnected and did not resume within --stream-resume-grace-s");
      });
    });
  }

  void Drain() {
    while (!done_) {
      std::optional<RequestOutput> out = stream_->TryNext();
      if (!out) break;
      Process(std::move(*out));
    }
  }

  HttpHeaders ResponseHeaders() const {
    HttpHeaders h = {{"X-Request-Id", record_.request_id},
                     {"X-Server-Timestamp", fmt::format("{:.6f}", EpochSeconds())}};
    // The id to resume this stream with (GET /v1/streams/{id}); it is also the capability to read it.
    if (req_.stream) h.emplace_back("X-Fathom-Stream-Id", response_id_);
    return h;
  }

  Json ChunkBase() const {
    const bool chat = req_.endpoint == Endpoint::kChat;
    return {{"id", response_id_},
            {"object", chat ? "chat.completion.chunk" : "text_completion"},
            {"created", created_},
            {"model", record_.model}};
  }

  void Emit(const Json& chunk) {
    const auto t0 = Clock::now();
    const uint64_t seq = ++seq_;
    Send(seq, Dump(chunk));
    record_.serialize += SecondsSince(t0);
  }

  void EmitDone() { Send(++seq_, "[DONE]"); }

  // The log (replayed by GET /v1/streams/{id}) always holds ids; the live stream only when the client asked.
  void Send(uint64_t seq, std::string_view data) {
    std::string event = SseEvent(seq, data);
    if (log_) log_->Append(seq, event);
    ex_->SendEvent(req_.event_ids ? std::move(event) : SseData(data));
  }

  void AddLogprobs(Sample& s, const RequestOutput& out) {
    const Tokenizer* tok = server_->model_.tokenizer;
    auto piece = [&](int32_t id) {
      return tok != nullptr ? tok->Decode(std::span<const int32_t>(&id, 1)) : std::to_string(id);
    };
    for (const SampleResult& r : out.logprobs) {
      const std::string token = piece(r.token);
      if (req_.endpoint == Endpoint::kChat) {
        Json top = Json::array();
        for (const TokenLogprob& t : r.top) {
          const std::string tt = piece(t.token);
          top.push_back({{"token", tt}, {"logprob", t.logprob}, {"bytes", TokenBytes(tt)}});
        }
        s.logprobs.push_back(
            {{"token", token}, {"logprob", r.logprob}, {"bytes", TokenBytes(token)}, {"top_logprobs", top}});
      } else {
        s.lp_tokens.push_back(token);
        s.lp_offsets.push_back(s.lp_chars);
        s.lp_chars += CodePoints(token);
        s.lp_values.push_back(r.logprob);
        Json top = Json::object();
        for (const TokenLogprob& t : r.top) top[piece(t.token)] = t.logprob;
        s.lp_top.push_back(top);
      }
    }
  }

  // The logprobs object of a chunk (entries new in `out`) or of the final body (all entries).
  Json ChunkLogprobs(const Sample& s, size_t first_new) const {
    if (!req_.logprobs) return nullptr;
    if (req_.endpoint == Endpoint::kChat) {
      Json content = Json::array();
      for (size_t i = first_new; i < s.logprobs.size(); ++i) content.push_back(s.logprobs[i]);
      return {{"content", content}};
    }
    Json lp = {{"tokens", Json::array()},
               {"token_logprobs", Json::array()},
               {"top_logprobs", Json::array()},
               {"text_offset", Json::array()}};
    for (size_t i = first_new; i < s.lp_tokens.size(); ++i) {
      lp["tokens"].push_back(s.lp_tokens[i]);
      lp["token_logprobs"].push_back(s.lp_values[i]);
      lp["top_logprobs"].push_back(s.lp_top[i]);
      lp["text_offset"].push_back(s.lp_offsets[i]);
    }
    return lp;
  }

  // "tool_calls" when the sample ended by itself (stop) with tool calls in its message, as OpenAI reports it.
  std::string FinishFor(const Sample& s, const RequestOutput& out) const {
    if (out.finish_reason == FinishReason::kStop && s.tools && !s.tools->calls().empty()) return "tool_calls";
    return std::string(FinishName(out));
  }

  // The calls a sample returns: all of them, or the first without parallel_tool_calls.
  size_t NumCalls(const Sample& s) const {
    if (!s.tools) return 0;
    return req_.tools->parallel ? s.tools->calls().size() : std::min<size_t>(1, s.tools->calls().size());
  }

  void Process(RequestOutput out) {
    Sample& s = samples_.at(static_cast<size_t>(out.index));
    // Failed before anything was produced (queue timeout, model error): a proper HTTP error, if nothing was sent.
    if (!started_ && out.finished && !out.status.ok() && out.token_ids.empty() &&
        out.finish_reason != FinishReason::kAbort) {
      done_ = true;
      const bool timeout = out.status.code() == StatusCode::kDeadlineExceeded;
      ApiError err = ApiErrorFromStatus(out.status, "", timeout ? "queue_timeout" : "");
      if (err.http_status == 500) FATHOM_LOG_ERROR("request {}: {}", record_.request_id, out.status.ToString());
      record_.error_code = timeout ? "queue_timeout" : err.code;
      // Rejected on the engine thread because the queue filled up after Submit's check: the same queue_full answer
      // (429 with Retry-After, counted as such) as a rejection at Submit; other exhaustion is device memory.
      if (out.status.code() == StatusCode::kResourceExhausted) {
        record_.error_code = sched::IsQueueFull(out.status) ? "queue_full" : "resource_exhausted";
      }
      record_.finish_reason = std::string(FinishName(out));
      if (log_) {
        log_->Finish();
        server_->logs_.MarkFinished(response_id_);
      }
      server_->active_->fetch_sub(1);
      server_->ReplyError(
          ex_, err, record_,
          timeout ? HttpHeaders{{"Retry-After", std::to_string(server_->options_.retry_after_s)}} : HttpHeaders{});
      self_.reset();
      return;
    }
    if (req_.stream && !started_ && !client_gone_.load()) ex_->StartStream(ResponseHeaders());
    started_ = true;

    const auto now = Clock::now();
    if (!out.token_ids.empty()) {
      if (out.index == 0) {
        if (s.tokens == 0) {
          record_.ttft = std::chrono::duration<double>(now - arrival_).count();
        } else {
          record_.inter_token_gaps.push_back(std::chrono::duration<double>(now - last_token_).count());
        }
        last_token_ = now;
      }
      if (reasoning_ && s.split.in_reasoning()) s.reasoning_tokens += static_cast<int32_t>(out.token_ids.size());
      s.tokens += static_cast<int32_t>(out.token_ids.size());
    }
    const size_t first_new_lp = req_.endpoint == Endpoint::kChat ? s.logprobs.size() : s.lp_tokens.size();
    if (req_.logprobs) AddLogprobs(s, out);

    ReasoningDelta delta;
    if (reasoning_) {
      delta = s.split.Push(out.text);
      if (out.finished) {
        ReasoningDelta tail = s.split.Finish();
        delta.reasoning += tail.reasoning;
        delta.content += tail.content;
      }
    } else {
      delta.content = std::move(out.text);
    }
    std::vector<ToolCallDelta> call_deltas;
    if (s.tools) {
      ToolDelta td = s.tools->Push(delta.content);
      if (out.finished) {
        ToolDelta tail = s.tools->Finish();
        td.content += tail.content;
        for (ToolCallDelta& d : tail.calls) {
          if (!td.calls.empty() && td.calls.back().index == d.index && !d.first) {
            td.calls.back().arguments += d.arguments;
          } else {
            td.calls.push_back(std::move(d));
          }
        }
      }
      delta.content = std::move(td.content);
      for (ToolCallDelta& d : td.calls) {
        if (req_.tools->parallel || d.index == 0) call_deltas.push_back(std::move(d));
      }
    }
    s.content += delta.content;
    s.reasoning += delta.reasoning;
    if (out.finished) {
      s.finished = true;
      s.final_out = out;
      ++num_finished_;
    }

    if (req_.stream) {
      const auto t0 = Clock::now();
      const bool has_text = !delta.content.empty() || !delta.reasoning.empty() || !call_deltas.empty();
      const bool has_lp =
          req_.logprobs && (req_.endpoint == Endpoint::kChat ? s.logprobs.size() : s.lp_tokens.size()) > first_new_lp;
      if (has_text || has_lp || out.finished || !s.sent_role) {
        Json chunk = ChunkBase();
        Json choice = {{"index", out.index}};
        if (req_.endpoint == Endpoint::kChat) {
          Json d = Json::object();
          if (!s.sent_role) {
            d["role"] = "assistant";
            s.sent_role = true;
            if (!has_text) d["content"] = "";
          }
          if (!delta.reasoning.empty()) d["reasoning_content"] = delta.reasoning;
          if (!delta.content.empty()) d["content"] = delta.content;
          if (!call_deltas.empty()) {
            Json calls = Json::array();
            for (const ToolCallDelta& c : call_deltas) {
              Json call = {{"index", c.index}};
              if (c.first) {
                call["id"] = c.id;
                call["type"] = "function";
                call["function"] = {{"name", c.name}, {"arguments", c.arguments}};
              } else {
                call["function"] = {{"arguments", c.arguments}};
              }
              calls.push_back(std::move(call));
            }
            d["tool_calls"] = std::move(calls);
          }
          choice["delta"] = d;
        } else {
          choice["text"] = delta.content;
        }
        choice["logprobs"] = has_lp ? ChunkLogprobs(s, first_new_lp) : Json(nullptr);
        choice["finish_reason"] = out.finished ? Json(FinishFor(s, out)) : Json(nullptr);
        if (out.finished && !out.stop_reason.empty()) choice["stop_reason"] = out.stop_reason;
        chunk["choices"] = Json::array({choice});
        record_.serialize += SecondsSince(t0);
        Emit(chunk);
      }
    }
    if (num_finished_ == static_cast<int32_t>(samples_.size())) Complete();
  }

  bool failed_or_aborted() const {
    for (const Sample& s : samples_) {
      if (s.final_out.finish_reason == FinishReason::kAbort || s.final_out.finish_reason == FinishReason::kError) {
        return true;
      }
    }
    return false;
  }

  void FillRecord() {
    const RequestOutput& f0 = samples_[0].final_out;
    record_.prompt_tokens = f0.prompt_tokens;
    record_.cached_tokens = f0.prompt_cache_hit_tokens;
    record_.finish_reason = FinishFor(samples_[0], f0);
    record_.queue = f0.timings.queue_wait;
    record_.prefill = f0.timings.prefill;
    record_.decode = f0.timings.decode;
    record_.completion_tokens = 0;
    record_.reasoning_tokens = 0;
    record_.detokenize = 0;
    record_.grammar = 0;
    for (const Sample& s : samples_) {
      record_.completion_tokens += s.tokens;
      record_.reasoning_tokens += s.reasoning_tokens;
      record_.detokenize += s.final_out.timings.detokenize;
      record_.grammar += s.final_out.timings.grammar;
    }
    record_.total = SecondsSince(arrival_);
  }

  Json Usage() const {
    Json usage = {{"prompt_tokens", record_.prompt_tokens},
                  {"completion_tokens", record_.completion_tokens},
                  {"total_tokens", record_.prompt_tokens + record_.completion_tokens},
                  {"prompt_cache_hit_tokens", record_.cached_tokens},
                  {"prompt_cache_miss_tokens", record_.prompt_tokens - record_.cached_tokens},
                  {"prompt_tokens_details", {{"cached_tokens", record_.cached_tokens}}},
                  {"completion_tokens_details", {{"reasoning_tokens", record_.reasoning_tokens}}}};
    return usage;
  }

  void Complete() {
    done_ = true;
    FillRecord();
    obs::TraceSpan span("respond", "server");
    if (flow_ != 0 && span.active()) {
      span.FlowIn("request", flow_);
      const int64_t now_ns = obs::TraceNowNs();
      obs::TraceComplete("request", "request", now_ns - static_cast<int64_t>(record_.total * 1e9),
                         static_cast<int64_t>(record_.total * 1e9),
                         {{"request_id", record_.request_id},
                          {"prompt_tokens", record_.prompt_tokens},
                          {"completion_tokens", record_.completion_tokens},
                          {"queue_s", record_.queue},
                          {"ttft_s", record_.ttft}});
    }
    bool failed = false;
    Status failure;
    for (const Sample& s : samples_) {
      if (s.final_out.finish_reason == FinishReason::kError) {
        failed = true;
        failure = s.final_out.status;
      }
    }
    const bool resumed_away = client_gone_.load() && req_.stream && req_.resumable && log_ != nullptr;
    if (client_gone_.load() && !resumed_away) {
      record_.http_status = 499;
      // Its log still ends well-formed, for a resume: the abort chunk came above, [DONE] here.
      if (log_) {
        const uint64_t seq = ++seq_;
        log_->Append(seq, SseEvent(seq, "[DONE]"));
      }
      ex_->Abandon();  // nothing more will be written to a client that left
    } else if (req_.stream) {
      if (failed) FATHOM_LOG_ERROR("request {}: {}", record_.request_id, failure.ToString());
      const auto t0 = Clock::now();
      if (req_.include_usage) {
        Json chunk = ChunkBase();
        chunk["choices"] = Json::array();
        record_.total = SecondsSince(arrival_);
        chunk["usage"] = Usage();
        chunk["fathom_timing"] = TimingJson(record_);
        record_.serialize += SecondsSince(t0);
        Emit(chunk);
      }
      // A resumable stream whose client left still ends its log with [DONE]; it completed (200) unless the grace
      // period ran out (abort: 499).
      record_.http_status = resumed_away && failed_or_aborted() ? 499 : 200;
      record_.total = SecondsSince(arrival_);
      server_->Finish(record_);  // metrics before the last bytes leave
      finished_ = true;
      EmitDone();
      if (resumed_away) {
        ex_->Abandon();
      } else {
        ex_->EndStream();
      }
    } else if (failed) {
      if (failure.code() == StatusCode::kResourceExhausted) record_.error_code = "resource_exhausted";
      FATHOM_LOG_ERROR("request {}: {}", record_.request_id, failure.ToString());
      server_->active_->fetch_sub(1);
      server_->ReplyError(ex_, ApiErrorFromStatus(InternalError(failure.message())), record_);
      if (log_) log_->Finish();
      self_.reset();
      return;
    } else {
      const auto t0 = Clock::now();
      Json body = {{"id", response_id_},
                   {"object", req_.endpoint == Endpoint::kChat ? "chat.completion" : "text_completion"},
                   {"created", created_},
                   {"model", record_.model}};
      Json choices = Json::array();
      for (size_t i = 0; i < samples_.size(); ++i) {
        const Sample& s = samples_[i];
        Json choice = {{"index", i}};
        if (req_.endpoint == Endpoint::kChat) {
          Json message = {{"role", "assistant"}, {"content", s.content}};
          if (reasoning_) message["reasoning_content"] = s.reasoning;
          if (const size_t n = NumCalls(s); n > 0) {
            Json calls = Json::array();
            for (size_t c = 0; c < n; ++c) {
              const ToolCall& call = s.tools->calls()[c];
              calls.push_back({{"id", call.id},
                               {"type", "function"},
                               {"function", {{"name", call.name}, {"arguments", call.arguments}}}});
            }
            message["tool_calls"] = std::move(calls);
            if (s.content.empty()) message["content"] = nullptr;
          }
          choice["message"] = message;
        } else {
          choice["text"] = s.content;
        }
        choice["logprobs"] = ChunkLogprobs(s, 0);
        choice["finish_reason"] = FinishFor(s, s.final_out);
        if (!s.final_out.stop_reason.empty()) choice["stop_reason"] = s.final_out.stop_reason;
        choices.push_back(choice);
      }
      body["choices"] = choices;
      body["usage"] = Usage();
      std::string text = Dump(body);
      record_.serialize += SecondsSince(t0);
      record_.total = SecondsSince(arrival_);
      HttpHeaders headers = ResponseHeaders();
      headers.emplace_back("x-fathom-timing", TimingHeader(record_));
      record_.http_status = 200;
      server_->Finish(record_);  // metrics before the last bytes leave
      finished_ = true;
      ex_->Reply(200, "application/json", std::move(text), std::move(headers));
    }
    if (log_) {
      log_->Finish();
      server_->logs_.MarkFinished(response_id_);
    }
    if (!finished_) {
      record_.total = SecondsSince(arrival_);
      server_->Finish(record_);
    }
    server_->active_->fetch_sub(1);
    self_.reset();
  }

  OpenAiServer* server_;
  std::shared_ptr<HttpExchange> ex_;
  ParsedRequest req_;
  RequestRecord record_;
  std::string response_id_;
  std::string engine_id_;
  Clock::time_point arrival_;
  asio::strand<asio::io_context::executor_type> strand_;
  asio::steady_timer grace_timer_;  // resumable streams after their client left
  std::vector<Sample> samples_;
  std::shared_ptr<RequestStream> stream_;
  std::shared_ptr<StreamLog> log_;
  std::shared_ptr<Job> self_;
  std::atomic<bool> drain_scheduled_{false};
  std::atomic<bool> client_gone_{false};
  bool reasoning_ = false;
  bool started_ = false;
  bool done_ = false;
  bool finished_ = false;  // the record went to the metrics and the access log
  int32_t num_finished_ = 0;
  uint64_t seq_ = 0;
  int64_t created_ = 0;
  uint64_t flow_ = 0;
  Clock::time_point last_token_;
};

OpenAiServer::OpenAiServer(ServerOptions options)
    : options_(std::move(options)),
      http_(options_.http, [this](std::shared_ptr<HttpExchange> ex) { Handle(ex); }),
      logs_(options_.stream_logs) {
  if (options_.private_port != 0) {
    HttpOptions o = options_.http;
    o.port = options_.private_port;
    o.reuse_port = false;
    o.threads = 1;
    private_http_ = std::make_unique<HttpServer>(o, [this](std::shared_ptr<HttpExchange> ex) { Handle(ex); });
  }
  for (size_t start = 0; start < options_.api_key.size();) {
    const size_t comma = std::min(options_.api_key.find(',', start), options_.api_key.size());
    if (comma > start) api_keys_.push_back(options_.api_key.substr(start, comma - start));
    start = comma + 1;
  }
  if (options_.work_threads > 0) {
    work_ = std::make_unique<asio::thread_pool>(static_cast<size_t>(options_.work_threads));
  }
  std::random_device rd;
  id_salt_ = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  created_ = static_cast<int64_t>(EpochSeconds());
  if (options_.access_log == "-") {
    access_log_ = stdout;
  } else if (!options_.access_log.empty()) {
    access_log_ = std::fopen(options_.access_log.c_str(), "a");
    own_access_log_ = access_log_ != nullptr;
    if (access_log_ == nullptr) FATHOM_LOG_WARN("cannot open the access log '{}'", options_.access_log);
  }
}

OpenAiServer::~OpenAiServer() {
  Stop();
  if (own_access_log_) std::fclose(access_log_);
}

Status OpenAiServer::Start() {
  FATHOM_RETURN_IF_ERROR(http_.Start());
  if (private_http_) {
    if (Status s = private_http_->Start(); !s.ok()) return s.WithContext("--private-port");
  }
  return OkStatus();
}

void OpenAiServer::NoteIgnoredFields(const std::vector<std::string>& fields, const std::string& request_id) {
  std::string fresh;
  {
    std::lock_guard<std::mutex> lock(ignored_mu_);
    for (const std::string& f : fields) {
      if (ignored_logged_.size() >= 64 || !ignored_logged_.insert(f.substr(0, 64)).second) continue;
      fresh += (fresh.empty() ? "'" : ", '") + f.substr(0, 64) + "'";
    }
  }
  if (!fresh.empty()) {
    FATHOM_LOG_WARN("request {}: ignored the unknown field(s) {} (each name is logged once)", request_id, fresh);
  }
}

void OpenAiServer::Attach(ServedModel model) {
  model_ = model;
  constraints_ = std::make_unique<ConstraintCompiler>(
      model_.tokenizer, model_.engines != nullptr ? model_.engines->config().eos_token_ids : std::vector<int64_t>{});
  constraints_->SetCancelFlag(&cancel_work_);
  const bool opens_think = model_.chat != nullptr && TemplateOpensThink(*model_.chat);
  if (options_.reasoning_auto && opens_think) {
    options_.reasoning = ReasoningParser::kDeepSeekR1;
    FATHOM_LOG_INFO("the chat template opens a <think> block: reasoning parser deepseek-r1");
  }
  thinking_switch_ = model_.chat != nullptr ? ThinkingSwitch(model_.chat->source()) : "";
  reads_effort_ = model_.chat != nullptr && TemplateReads(model_.chat->source(), "reasoning_effort");
  always_thinks_ = thinking_switch_.empty() && opens_think;
  switch_opens_think_ = !thinking_switch_.empty() && !opens_think &&
                        TemplateOpensThink(*model_.chat, nlohmann::ordered_json{{thinking_switch_, true}});
  if (options_.tool_format) {
    tool_format_ = *options_.tool_format;
  } else if (model_.chat != nullptr) {
    tool_format_ = DetectToolFormat(model_.chat->source(), model_.tokenizer);
    if (tool_format_ != ToolFormat::kNone) {
      FATHOM_LOG_INFO("tool calls: format {} (from the chat template)", ToolFormatName(tool_format_));
    }
  }
  ready_.store(true);
}

bool OpenAiServer::Reasons(const ParsedRequest& req) const {
  if (options_.reasoning == ReasoningParser::kDeepSeekR1) return true;
  if (!options_.reasoning_auto || !switch_opens_think_) return false;
  if (const std::optional<bool> thinking = Thinking(req)) return *thinking;
  const auto it = req.chat_template_kwargs.find(thinking_switch_);
  return it != req.chat_template_kwargs.end() && it->is_boolean() && it->get<bool>();
}

std::optional<bool> OpenAiServer::Thinking(const ParsedRequest& req) const {
  // An effort asks for thinking where the template has a switch for it (DeepSeek-V4's), unless the request says.
  const auto& kwargs = req.chat_template_kwargs;
  const bool kwargs_say = kwargs.is_object() && kwargs.contains(thinking_switch_);
  if (!req.thinking && req.reasoning_effort && !thinking_switch_.empty() && !kwargs_say) return true;
  return req.thinking;
}

Status OpenAiServer::PrepareChat(const ParsedRequest& req, ChatRequest* cr, std::string* param) const {
  cr->messages = req.messages;
  cr->extra = req.chat_template_kwargs;
  *param = "reasoning_effort";
  if (req.reasoning_effort) {
    if (!reads_effort_) {
      return UnimplementedError(
          "'reasoning_effort' cannot be honoured: this model's chat template has no reasoning effort (DeepSeek-V4's "
          "encoding has)");
    }
    auto given = cr->extra.find("reasoning_effort");
    if (given != cr->extra.end() && !given->is_null() && *given != nlohmann::ordered_json(*req.reasoning_effort)) {
      return InvalidArgumentError(
          fmt::format("'reasoning_effort' ({}) and chat_template_kwargs.reasoning_effort ({}) "
                      "disagree",
                      *req.reasoning_effort, given->dump()));
    }
    cr->extra["reasoning_effort"] = *req.reasoning_effort;
  }
  *param = "thinking";
  if (const std::optional<bool> thinking = Thinking(req)) {
    const bool on = *thinking;
    if (!thinking_switch_.empty()) {
      // The template's switch: set from `thinking` unless chat_template_kwargs already says the same.
      auto given = cr->extra.find(thinking_switch_);
      if (given != cr->extra.end() && !given->is_null() && *given != nlohmann::ordered_json(on)) {
        return InvalidArgumentError(fmt::format("'thinking' ({}) and chat_template_kwargs.{} ({}) disagree",
                                                on ? "enabled" : "disabled", thinking_switch_, given->dump()));
      }
      cr->extra[thinking_switch_] = on;
    } else if (always_thinks_ && !on) {
      return InvalidArgumentError(
          "'thinking': {\"type\": \"disabled\"} cannot be honoured: this model always thinks (its chat template "
          "opens <think> and has no thinking switch)");
    } else if (!always_thinks_ && on) {
      return InvalidArgumentError(
          "'thinking': {\"type\": \"enabled\"} cannot be honoured: this model has no thinking mode (its chat "
          "template has no thinking switch and does not open <think>)");
    }
  }
  if (req.reasoning_effort && !thinking_switch_.empty()) {
    // A template with a thinking switch reads the effort only while thinking (DeepSeek-V4's encoding).
    const auto on = cr->extra.find(thinking_switch_);
    if (on == cr->extra.end() || *on != nlohmann::ordered_json(true)) {
      *param = "reasoning_effort";
      return InvalidArgumentError("'reasoning_effort' needs thinking, and thinking is disabled for this request");
    }
  }
  *param = "tools";
  cr->add_generation_prompt = req.add_generation_prompt;
  cr->continue_final_message = req.continue_final_message;
  ToolsSpec none;
  none.choice = ToolsSpec::Choice::kNone;
  return PrepareToolPrompt(tool_format_, model_.chat->source(), req.tools ? *req.tools : none, cr);
}

// The listener stays open while draining: a new connection is answered (503 for new generations, /health 503
// "draining") rather than refused, so that a load balancer sees why and a client gets an error body.
// Sharing the port (handoff_on_drain), the listener closes instead, taking what the kernel queued on it first: new
// connections then reach the other processes, and requests on this one's open connections are still served, each
// connection closing after its response.
void OpenAiServer::BeginDrain() {
  draining_.store(true);
  // Without a hand-off, no new generation is served from here on: work not yet submitted (a long compile, say) is
  // cut short and answered 503 "draining" rather than holding the shutdown.
  if (!options_.handoff_on_drain) cancel_work_.store(true);
  if (options_.handoff_on_drain) {
    http_.StopAccepting(/*take_backlog=*/true);
    http_.CloseConnectionsAfterResponses();
    // The private listener stays open (scrapes and /health see the drain) and closes its connections likewise.
    if (private_http_) private_http_->CloseConnectionsAfterResponses();
  }
}

bool OpenAiServer::WaitIdle(std::chrono::duration<double> timeout) const {
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(timeout);
  const bool handoff = options_.handoff_on_drain && draining_.load();
  while (active_->load() > 0 || (handoff && http_.open_connections() > 0)) {
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

void OpenAiServer::Stop() {
  // Work in flight ends early (compiles are cancelled) and queued work answers 503 before the I/O threads stop.
  cancel_work_.store(true);
  if (work_) work_->join();
  http_.Stop();
  if (private_http_) private_http_->Stop();
}

RequestRecord OpenAiServer::NewRecord(const HttpExchange& ex) {
  RequestRecord record;
  const std::string given = ex.header("X-Request-Id");
  record.request_id = PlainId(given) ? given : NewId("req-");
  record.method = std::string(ex.method());
  record.path = std::string(CanonicalRoute(ex.path()));
  record.client = ex.client();
  return record;
}

std::string OpenAiServer::NewId(std::string_view prefix) {
  const uint64_t n = next_id_.fetch_add(1);
  return fmt::format("{}{:08x}{:06x}", prefix, static_cast<uint32_t>(id_salt_ ^ (id_salt_ >> 32)), n);
}

std::string OpenAiServer::NewSecretId(std::string_view prefix) {
  uint8_t bytes[16];
  size_t got = 0;
  while (got < sizeof(bytes)) {  // getrandom blocks only before the kernel's pool is initialized, at boot
    const ssize_t n = getrandom(bytes + got, sizeof(bytes) - got, 0);
    if (n > 0) {
      got += static_cast<size_t>(n);
    } else if (errno != EINTR) {
      throw std::runtime_error("getrandom failed");  // the barrier answers 500
    }
  }
  std::string id(prefix);
  for (uint8_t b : bytes) id += fmt::format("{:02x}", b);
  return id;
}

bool OpenAiServer::Authorized(const HttpExchange& ex, int* key_index) const {
  if (key_index != nullptr) *key_index = -1;
  if (api_keys_.empty()) return true;
  const std::string auth = ex.header("Authorization");
  const std::string_view token = BearerToken(auth);
  if (token.empty()) return false;
  // Every key is compared, whichever matches: the time taken says nothing about which one did.
  int found = -1;
  for (size_t i = 0; i < api_keys_.size(); ++i) {
    if (ConstantTimeEquals(token, api_keys_[i]) && found < 0) found = static_cast<int>(i);
  }
  if (key_index != nullptr) *key_index = found;
  return found >= 0;
}

uint64_t OpenAiServer::CacheSalt(const HttpExchange& ex, const std::string& cache_salt) const {
  // FNV-1a over the namespace and the salt; 0 (no salt) only when neither is given.
  uint64_t h = 0;
  auto mix = [&h](std::string_view bytes, uint64_t tag) {
    uint64_t x = 1469598103934665603ULL ^ tag;
    for (unsigned char c : bytes) x = (x ^ c) * 1099511628211ULL;
    h = (h ^ x) * 0x9e3779b97f4a7c15ULL + tag;
  };
  if (options_.prefix_cache_isolation == ServerOptions::PrefixCacheIsolation::kPerKey && api_keys_.size() > 1) {
    int key = -1;
    Authorized(ex, &key);
    if (key >= 0) mix(api_keys_[static_cast<size_t>(key)], 1);
  }
  if (!cache_salt.empty()) mix(cache_salt, 2);
  return h;
}

void OpenAiServer::ReplyError(const std::shared_ptr<HttpExchange>& ex, const ApiError& error, RequestRecord record,
                              HttpHeaders headers) {
  record.http_status = error.http_status;
  if (record.error_code.empty()) record.error_code = error.code;
  // Every 429 says when to come back.
  const bool has_retry =
      std::any_of(headers.begin(), headers.end(), [](const auto& h) { return h.first == "Retry-After"; });
  if (error.http_status == 429 && !has_retry)
    headers.emplace_back("Retry-After", std::to_string(options_.retry_after_s));
  headers.emplace_back("X-Request-Id", record.request_id);
  Finish(record);  // metrics first: a client that reads /metrics right after its answer sees itself counted
  if (error.http_status != 499)
    ex->Reply(error.http_status, "application/json", error.BodyString(), std::move(headers));
}

void OpenAiServer::Finish(const RequestRecord& r) {
  if (record_hook_) record_hook_(r);
  if (access_log_ == nullptr) return;
  Json line = {{"ts", fmt::format("{:.3f}", EpochSeconds())},
               {"request_id", r.request_id},
               {"client", r.client},
               {"method", r.method},
               {"path", r.path},
               {"status", r.http_status}};
  if (!r.error_code.empty()) line["error"] = r.error_code;
  if (!r.model.empty()) line["model"] = r.model;
  if (!r.user.empty()) line["user"] = r.user;
  if (!r.finish_reason.empty() || r.prompt_tokens > 0) {
    line["stream"] = r.stream;
    line["finish_reason"] = r.finish_reason;
    line["prompt_tokens"] = r.prompt_tokens;
    line["completion_tokens"] = r.completion_tokens;
    line["cached_tokens"] = r.cached_tokens;
    line["timing"] = TimingJson(r);
  }
  const std::string text = Dump(line) + "\n";
  std::lock_guard<std::mutex> lock(log_mu_);
  std::fwrite(text.data(), 1, text.size(), access_log_);
  std::fflush(access_log_);
}

template <typename F>
void OpenAiServer::Guard(const char* where, const std::shared_ptr<HttpExchange>& ex, F&& f) noexcept {
  try {
    f();
  } catch (const std::exception& e) {
    CaughtException(where, ex, e.what());
  } catch (...) {
    CaughtException(where, ex, "an exception of unknown type");
  }
}

void OpenAiServer::CaughtException(const char* where, const std::shared_ptr<HttpExchange>& ex,
                                   const char* what) noexcept {
  internal_errors_.fetch_add(1);
  try {
    FATHOM_LOG_ERROR("internal error ({}, {} {}): {}", where, ex ? ex->method() : "", ex ? ex->path() : "", what);
    if (internal_error_hook_) internal_error_hook_(where);
    if (ex != nullptr && !ex->responded()) {
      ReplyError(ex,
                 ApiErrorFromStatus(InternalError("internal error: the server logged it; please report it"), "",
                                    "internal_error"),
                 NewRecord(*ex));
    }
  } catch (...) {  // out of memory while answering: the connection is dropped instead
    if (ex != nullptr) ex->Abandon();
  }
}

void OpenAiServer::Handle(const std::shared_ptr<HttpExchange>& ex) {
  Guard("handler", ex, [&] { Route(ex); });
}

void OpenAiServer::Offload(const std::shared_ptr<HttpExchange>& ex, const char* where, std::function<void()> f) {
  // Takes the exchange as an argument: the posted task outlives this call, and with it the caller's reference.
  auto refuse = [this](const std::shared_ptr<HttpExchange>& to, std::string_view code, const std::string& message,
                       bool retry) {
    RequestRecord record = NewRecord(*to);
    record.error_code = std::string(code);
    HttpHeaders headers;
    if (retry) headers.emplace_back("Retry-After", std::to_string(options_.retry_after_s));
    ReplyError(to, ApiErrorFromStatus(UnavailableError(message), "", std::string(code)), record, std::move(headers));
  };
  if (!work_) {
    Guard(where, ex, f);
    return;
  }
  if (work_queued_.fetch_add(1) >= options_.max_work_queue) {
    work_queued_.fetch_sub(1);
    return refuse(ex, "server_busy",
                  fmt::format("more than {} requests are waiting to be parsed; retry", options_.max_work_queue), true);
  }
  const Clock::time_point queued = Clock::now();
  asio::post(*work_, [this, ex, where, f = std::move(f), queued, refuse] {
    work_queued_.fetch_sub(1);
    Guard(where, ex, [&] {
      if (cancel_work_.load()) return refuse(ex, "draining", "the server is shutting down", false);
      if (SecondsSince(queued) > options_.max_work_wait_s) {
        return refuse(
            ex, "server_busy",
            fmt::format("the request waited more than {:.0f} s to be parsed; retry", options_.max_work_wait_s), true);
      }
      f();
    });
  });
}

void OpenAiServer::Route(const std::shared_ptr<HttpExchange>& ex) {
  const std::string path(CanonicalRoute(ex->path()));
  const std::string_view method = ex->method();
  auto json_reply = [&](int status, const Json& body) { ex->Reply(status, "application/json", Dump(body)); };
  if (path == "/health") {
    if (!ready_.load()) return json_reply(503, {{"status", "loading"}});
    if (draining_.load()) return json_reply(503, {{"status", "draining"}});
    // An engine whose model broke for good (a tensor-parallel rank failed or hung) serves nothing more: the probe
    // fails, so that the orchestrator restarts the process.
    if (const Status failed = model_.engines != nullptr ? model_.engines->failed() : OkStatus(); !failed.ok()) {
      return json_reply(503, {{"status", "failed"}, {"error", failed.message()}});
    }
    return json_reply(200, {{"status", "ok"}});
  }
  if (path == "/metrics" && metrics_handler_) {
    if (options_.metrics_require_key && !Authorized(*ex)) {
      RequestRecord record = NewRecord(*ex);
      record.error_code = "unauthorized";
      return ReplyError(
          ex, ApiErrorFromStatus(UnauthenticatedError("invalid or missing API key (Authorization: Bearer ...)")),
          record, {{"WWW-Authenticate", "Bearer"}});
    }
    return ex->Reply(200, "text/plain; version=0.0.4; charset=utf-8", metrics_handler_());
  }
  if (extra_route_ && extra_route_(ex)) return;

  RequestRecord record = NewRecord(*ex);

  struct Route {
    const char* path;
    const char* method;
  };
  static const Route kRoutes[] = {{"/v1/chat/completions", "POST"},
                                  {"/v1/completions", "POST"},
                                  {"/v1/models", "GET"},
                                  {"/tokenize", "POST"},
                                  {"/detokenize", "POST"}};
  bool known = false;
  bool method_ok = false;
  for (const Route& r : kRoutes) {
    if (path == r.path) {
      known = true;
      method_ok = method == r.method;
    }
  }
  const bool resume = path.rfind("/v1/streams/", 0) == 0;
  if (path == "/debug/trace") {
    known = true;
    method_ok = method == "POST";
  }
  if (resume) {
    known = true;
    method_ok = method == "GET";
  }
  if (!known) {
    return ReplyError(
        ex, ApiErrorFromStatus(NotFoundError(fmt::format("no route {} {}", method, ex->path())), "", "not_found"),
        record);
  }
  if (!method_ok) {
    ApiError e = ApiErrorFromStatus(InvalidArgumentError(fmt::format("{} does not accept {}", path, method)), "",
                                    "method_not_allowed");
    e.http_status = 405;
    return ReplyError(ex, e, record);
  }
  if (!Authorized(*ex)) {
    record.error_code = "unauthorized";
    return ReplyError(
        ex, ApiErrorFromStatus(UnauthenticatedError("invalid or missing API key (Authorization: Bearer ...)")), record,
        {{"WWW-Authenticate", "Bearer"}});
  }
  if (!ready_.load()) {
    return ReplyError(ex, ApiErrorFromStatus(UnavailableError("the model is still loading"), "", "loading"), record,
                      {{"Retry-After", "5"}});
  }
  if (path == "/v1/models") return HandleModels(ex);
  if (path == "/tokenize") return Offload(ex, "tokenize", [this, ex] { HandleTokenize(ex); });
  if (path == "/detokenize") return Offload(ex, "detokenize", [this, ex] { HandleDetokenize(ex); });
  if (resume) return HandleResume(ex, path.substr(std::string_view("/v1/streams/").size()));
  if (path == "/debug/trace") return HandleTrace(ex, record);
  if (draining_.load() && !options_.handoff_on_drain) {
    return ReplyError(ex, ApiErrorFromStatus(UnavailableError("the server is shutting down"), "", "draining"), record);
  }
  const bool chat = path == "/v1/chat/completions";
  Offload(ex, "generate", [this, ex, chat] { HandleGenerate(ex, chat); });
}

void OpenAiServer::HandleModels(const std::shared_ptr<HttpExchange>& ex) {
  Json data = Json::array();
  auto add = [&](const std::string& name) {
    data.push_back({{"id", name},
                    {"object", "model"},
                    {"created", created_},
                    {"owned_by", "fathom"},
                    {"root", options_.served_model_name},
                    {"max_model_len", model_.engines->config().scheduler.max_model_len}});
  };
  add(options_.served_model_name);
  for (const std::string& alias : options_.served_model_aliases) add(alias);
  ex->Reply(200, "application/json", Dump({{"object", "list"}, {"data", data}}));
}

void OpenAiServer::HandleTokenize(const std::shared_ptr<HttpExchange>& ex) {
  RequestRecord record = NewRecord(*ex);
  TokenizeRequest req;
  ApiError err;
  if (!ParseTokenizeRequest(ex->request().body(), {.vocab_size = model_.vocab_size}, &req, &err)) {
    return ReplyError(ex, err, record);
  }
  std::vector<int32_t> ids;
  if (req.chat) {
    if (model_.chat == nullptr) {
      return ReplyError(ex, ApiErrorFromStatus(InvalidArgumentError("this model has no chat template")), record);
    }
    ChatRequest cr;
    std::string param;
    if (Status st = PrepareChat(req.chat_request, &cr, &param); !st.ok()) {
      return ReplyError(ex, ApiErrorFromStatus(st, param), record);
    }
    auto text = model_.chat->Render(cr);
    if (!text.ok()) return ReplyError(ex, ApiErrorFromStatus(text.status(), "messages", "chat_template_error"), record);
    ids = model_.chat->EncodePrompt(*text);
  } else {
    ids = model_.tokenizer->Encode(req.prompt, {.add_special_tokens = req.add_special_tokens});
  }
  ex->Reply(
      200, "application/json",
      Dump({{"tokens", ids},
            {"count", ids.size()},
            {"max_model_len", model_.engines != nullptr ? model_.engines->config().scheduler.max_model_len : 0}}));
}

void OpenAiServer::HandleDetokenize(const std::shared_ptr<HttpExchange>& ex) {
  RequestRecord record = NewRecord(*ex);
  DetokenizeRequest req;
  ApiError err;
  if (!ParseDetokenizeRequest(ex->request().body(), {.vocab_size = model_.vocab_size}, &req, &err)) {
    return ReplyError(ex, err, record);
  }
  ex->Reply(200, "application/json",
            Dump({{"prompt", model_.tokenizer->Decode(req.tokens, /*skip_special_tokens=*/false)}}));
}

void OpenAiServer::HandleTrace(const std::shared_ptr<HttpExchange>& ex, RequestRecord record) {
  double seconds = 5;
  const std::string_view target = ex->target();
  if (const size_t q = target.find("seconds="); q != std::string_view::npos) {
    try {
      seconds = std::stod(std::string(target.substr(q + 8)));
    } catch (...) {
      seconds = -1;
    }
  }
  if (!(seconds > 0 && seconds <= 60)) {
    return ReplyError(ex, ApiErrorFromStatus(InvalidArgumentError("seconds must be in (0, 60]"), "seconds"), record);
  }
  if (Status s = obs::StartTracing(); !s.ok()) {
    ApiError e = ApiErrorFromStatus(s, "", "tracing_active");
    e.http_status = 409;
    return ReplyError(ex, e, record);
  }
  auto timer = std::make_shared<asio::steady_timer>(
      http_.io_context(), std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds)));
  timer->async_wait([this, ex, timer](const boost::system::error_code&) {
    Guard("trace", ex, [&] {
      ex->Reply(200, "application/json", obs::StopTracing(),
                {{"Content-Disposition", "attachment; filename=\"fathom-trace.json\""}});
    });
  });
  record.http_status = 200;
  Finish(record);
}

void OpenAiServer::HandleResume(const std::shared_ptr<HttpExchange>& ex, const std::string& response_id) {
  RequestRecord record = NewRecord(*ex);
  std::shared_ptr<StreamLog> log = logs_.Find(response_id);
  if (log == nullptr) {
    return ReplyError(ex,
                      ApiErrorFromStatus(
                          NotFoundError(fmt::format(
                              "no stream '{}': it never existed, or its retention window (--stream-retention-s) passed",
                              response_id)),
                          "", "stream_not_found"),
                      record);
  }
  uint64_t after = 0;
  const std::string last = ex->header("Last-Event-ID");
  if (!last.empty()) {
    const std::optional<uint64_t> id = ParseEventId(last);
    if (!id) {
      return ReplyError(ex,
                        ApiErrorFromStatus(InvalidArgumentError("Last-Event-ID must be an event id (decimal digits, "
                                                                "at most 2^63 - 1)"),
                                           "Last-Event-ID"),
                        record);
    }
    after = *id;
  }
  ex->StartStream({{"X-Request-Id", record.request_id}, {"X-Server-Timestamp", fmt::format("{:.6f}", EpochSeconds())}});
  std::weak_ptr<HttpExchange> weak = ex;
  log->Subscribe(after, [weak](const std::string& event, bool done) {
    auto e = weak.lock();
    if (!e || e->closed()) return false;  // the resuming client left too
    if (done) {
      e->EndStream();
    } else {
      e->SendEvent(event);
    }
    return true;
  });
  record.http_status = 200;
  Finish(record);
}

void OpenAiServer::HandleGenerate(const std::shared_ptr<HttpExchange>& ex, bool chat) {
  const Clock::time_point arrival = Clock::now();
  obs::TraceSpan span("parse+tokenize+submit", "server");
  const uint64_t flow = span.active() ? obs::NewTraceFlowId() : 0;
  if (flow != 0) span.FlowOut("request", flow);
  RequestRecord record = NewRecord(*ex);
  record.model = options_.served_model_name;

  ParsedRequest req;
  ApiError err;
  const RequestLimits limits{.vocab_size = model_.vocab_size};
  if (!ParseRequest(ex->request().body(), chat ? Endpoint::kChat : Endpoint::kCompletion, limits, &req, &err)) {
    record.error_code = "invalid";
    return ReplyError(ex, err, record);
  }
  if (!req.ignored_fields.empty()) NoteIgnoredFields(req.ignored_fields, record.request_id);
  record.stream = req.stream;
  record.user = req.user;
  if (!req.model.empty() && req.model != options_.served_model_name) {
    const auto& aliases = options_.served_model_aliases;
    if (std::find(aliases.begin(), aliases.end(), req.model) == aliases.end()) {
      std::string names = fmt::format("'{}'", options_.served_model_name);
      for (const std::string& a : aliases) names += fmt::format(", '{}'", a);
      record.error_code = "model_not_found";
      return ReplyError(
          ex,
          ApiErrorFromStatus(
              NotFoundError(fmt::format("the model '{}' does not exist; this server serves {}", req.model, names)),
              "model", "model_not_found"),
          record);
    }
    record.model = req.model;  // the response names the model as the client did
  }

  // tool_choice "required" or a named function: a grammar of calls in the model's format.
  if (req.tools &&
      (req.tools->choice == ToolsSpec::Choice::kRequired || req.tools->choice == ToolsSpec::Choice::kNamed)) {
    if (tool_format_ == ToolFormat::kNone) {
      record.error_code = "invalid";
      return ReplyError(ex,
                        ApiErrorFromStatus(InvalidArgumentError("this model has no known tool-call format: start the "
                                                                "server with --tool-call-parser"),
                                           "tool_choice"),
                        record);
    }
    const bool named = req.tools->choice == ToolsSpec::Choice::kNamed;
    nlohmann::ordered_json body = {{"format", ToolFormatName(tool_format_)},
                                   {"tools", req.tools->tools},
                                   {"choice", named ? "named" : "required"},
                                   {"name", req.tools->name},
                                   {"parallel", req.tools->parallel}};
    req.constraint = ConstraintSpec{ConstraintSpec::Kind::kTools, "tools", body.dump(), false};
  }

  // Structured output: compiled here, on this HTTP thread, and shared with every request of the same spec.
  if (req.constraint) {
    static constexpr const char* kKinds[] = {"json_object", "json_schema", "regex", "choice", "grammar", "tools"};
    record.constraint = kKinds[static_cast<int>(req.constraint->kind)];
    auto g = constraints_->Get(*req.constraint, &record.grammar_compile);
    if (!g.ok()) {
      // kUnavailable: the compile was cancelled by a shutdown.
      const bool draining = g.status().code() == StatusCode::kUnavailable;
      record.error_code = draining ? "draining" : "invalid";
      return ReplyError(ex, ApiErrorFromStatus(g.status(), req.constraint->param, draining ? "draining" : ""), record);
    }
    req.sampling.grammar = *g;
    // min_tokens past every choice cannot be met: the choice ends the output first (at run time the grammar's end
    // wins over min_tokens, and the output stops early). Refused up front, naming both.
    if (req.constraint->kind == ConstraintSpec::Kind::kChoice && req.sampling.min_tokens > 0 &&
        model_.tokenizer != nullptr) {
      const auto choices = nlohmann::json::parse(req.constraint->body, nullptr, /*allow_exceptions=*/false);
      size_t longest = 0;
      for (const auto& c : choices) {
        if (c.is_string()) {
          longest =
              std::max(longest, model_.tokenizer->Encode(c.get<std::string>(), {.add_special_tokens = false}).size());
        }
      }
      if (static_cast<size_t>(req.sampling.min_tokens) > longest) {
        record.error_code = "invalid";
        return ReplyError(ex,
                          ApiErrorFromStatus(InvalidArgumentError(fmt::format(
                                                 "'min_tokens' ({}) cannot be met: the longest of the choices is {} "
                                                 "token(s), and the output ends with the choice",
                                                 req.sampling.min_tokens, longest)),
                                             "min_tokens"),
                          record);
      }
    }
    // An R1 model thinks first: the constraint holds from its "</think>" on (when that is one token).
    if (chat && Reasons(req) && model_.tokenizer != nullptr) {
      if (auto think_end = model_.tokenizer->TokenToId("</think>")) req.sampling.grammar_after_token = *think_end;
    }
  }

  // Prompt tokens.
  const auto t_tok = Clock::now();
  std::vector<int32_t> prompt;
  if (chat) {
    if (model_.chat == nullptr) {
      record.error_code = "invalid";
      return ReplyError(
          ex, ApiErrorFromStatus(InvalidArgumentError("this model has no chat template; use /v1/completions")), record);
    }
    ChatRequest cr;
    std::string param;
    if (Status st = PrepareChat(req, &cr, &param); !st.ok()) {
      record.error_code = "invalid";
      return ReplyError(ex, ApiErrorFromStatus(st, param), record);
    }
    auto text = model_.chat->Render(cr);
    if (!text.ok()) {
      record.error_code = "invalid";
      return ReplyError(ex, ApiErrorFromStatus(text.status(), "messages", "chat_template_error"), record);
    }
    prompt = model_.chat->EncodePrompt(*text);
  } else if (req.prompt_is_ids) {
    prompt = std::move(req.prompt_ids);
  } else if (req.fim) {
    // deepseek-coder's fill-in-the-middle prompt, encoded as its model card does (tokenizer(text): BOS first).
    static constexpr const char* kFim[3] = {"<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"};
    for (const char* token : kFim) {
      if (!model_.tokenizer->TokenToId(token)) {
        record.error_code = "invalid";
        return ReplyError(ex,
                          ApiErrorFromStatus(InvalidArgumentError(fmt::format(
                                                 "'suffix' (fill in the middle) needs a model with FIM tokens, as "
                                                 "deepseek-coder and DeepSeek-V2/V3 have; this tokenizer has no '{}'",
                                                 token)),
                                             "suffix"),
                          record);
      }
    }
    prompt = model_.tokenizer->Encode(fmt::format("{}{}{}{}{}", kFim[0], req.prompt_text, kFim[1], req.suffix, kFim[2]),
                                      {.add_special_tokens = true});
  } else {
    prompt = model_.tokenizer->Encode(req.prompt_text, {.add_special_tokens = true});
  }
  record.tokenize = SecondsSince(t_tok);
  const char* prompt_param = chat ? "messages" : "prompt";
  if (prompt.empty()) {
    record.error_code = "invalid";
    return ReplyError(ex, ApiErrorFromStatus(InvalidArgumentError("the prompt encodes to no tokens"), prompt_param),
                      record);
  }
  const int64_t max_len = model_.engines->config().scheduler.max_model_len;
  const int64_t prompt_len = static_cast<int64_t>(prompt.size());
  if (prompt_len >= max_len || (req.max_tokens_given && prompt_len + req.sampling.max_tokens > max_len)) {
    record.error_code = "too_long";
    record.prompt_tokens = static_cast<int32_t>(prompt_len);
    const std::string message =
        req.max_tokens_given
            ? fmt::format(
                  "this model's maximum context length is {} tokens, but {} tokens were requested ({} in the "
                  "prompt + {} for the completion); shorten the prompt or lower max_tokens",
                  max_len, prompt_len + req.sampling.max_tokens, prompt_len, req.sampling.max_tokens)
            : fmt::format("this model's maximum context length is {} tokens, but the prompt has {} tokens", max_len,
                          prompt_len);
    return ReplyError(ex, ApiErrorFromStatus(InvalidArgumentError(message), prompt_param, "context_length_exceeded"),
                      record);
  }

  const std::string engine_id = NewId("e-");
  const std::string response_id = NewSecretId(chat ? "chatcmpl-" : "cmpl-");
  if (const std::string h = ex->header("X-Fathom-Resumable"); h == "1" || h == "true") req.resumable = true;
  if (const std::string h = ex->header("X-Fathom-Event-Ids"); h == "1" || h == "true") req.event_ids = true;
  if (req.resumable) req.event_ids = true;
  EngineRequest er;
  er.id = engine_id;
  er.prompt = std::move(prompt);
  er.sampling = req.sampling;
  er.priority = req.priority;
  er.cache_salt = CacheSalt(*ex, req.cache_salt);
  er.arrival = arrival;
  er.trace_flow_id = flow;
  span.Arg("request_id", record.request_id).Arg("prompt_tokens", er.prompt.size());
  auto job = std::make_shared<Job>(this, ex, std::move(req), record, response_id, engine_id, arrival);
  job->set_trace_flow(flow);
  active_->fetch_add(1);
  auto placed = model_.engines->Submit(std::move(er));
  if (!placed.ok()) {
    active_->fetch_sub(1);
    const Status& st = placed.status();
    HttpHeaders headers;
    if (st.code() == StatusCode::kResourceExhausted) {
      record.error_code = "queue_full";
      headers.emplace_back("Retry-After", std::to_string(options_.retry_after_s));
    } else if (st.code() == StatusCode::kInvalidArgument) {
      record.error_code = "invalid";
    }
    return ReplyError(ex, ApiErrorFromStatus(st), record, std::move(headers));
  }
  job->set_replica(placed->replica, placed->reason);
  job->Begin(std::move(placed->stream));
}

}  // namespace fathom::server
