#include "obs/trace.h"

#include <fmt/format.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "core/json.h"

namespace fathom::obs {

namespace {

struct Event {
  char phase = 'X';
  std::string name;
  std::string category;
  int64_t ts_ns = 0;
  int64_t dur_ns = 0;  // 'X' only
  uint32_t tid = 0;
  uint64_t id = 0;  // flow events only
  nlohmann::json args;
};

struct State {
  std::mutex mu;
  bool on = false;  // == internal::g_tracing_on, but read under mu so that no event lands after StopTracing
  size_t max_events = 0;
  uint64_t dropped = 0;
  std::vector<Event> events;
  std::map<uint32_t, std::string> thread_names;
};

State& GetState() {
  static State* state = new State();  // never destroyed: threads may still record during static destruction
  return *state;
}

uint32_t CurrentTid() {
  thread_local const uint32_t tid = static_cast<uint32_t>(syscall(SYS_gettid));
  return tid;
}

void Record(Event event) {
  State& s = GetState();
  std::lock_guard lock(s.mu);
  if (!s.on) return;
  if (s.events.size() >= s.max_events) {
    ++s.dropped;
    return;
  }
  s.events.push_back(std::move(event));
}

void RecordSimple(char phase, std::string_view name, std::string_view category, uint64_t id, nlohmann::json args) {
  Event e;
  e.phase = phase;
  e.name = name;
  e.category = category;
  e.ts_ns = TraceNowNs();
  e.tid = CurrentTid();
  e.id = id;
  e.args = std::move(args);
  Record(std::move(e));
}

// JSON string literal; invalid UTF-8 becomes U+FFFD so that the output always parses.
std::string Quote(std::string_view s) {
  return JsonText(nlohmann::json(std::string(s)));
}

// Chrome's ts and dur are microseconds; keep nanosecond precision as three decimals.
std::string Micros(int64_t ns) {
  if (ns < 0) return "-" + Micros(-ns);
  return fmt::format("{}.{:03}", ns / 1000, ns % 1000);
}

std::string Render(const std::vector<Event>& events, const std::map<uint32_t, std::string>& thread_names,
                   uint64_t dropped) {
  const int pid = static_cast<int>(getpid());
  std::string out = "{\"traceEvents\":[\n";
  out += fmt::format(R"({{"name":"process_name","ph":"M","pid":{},"tid":0,"args":{{"name":"fathom"}}}})", pid);
  for (const auto& [tid, name] : thread_names) {
    out += fmt::format(",\n{{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":{},\"tid\":{},\"args\":{{\"name\":{}}}}}",
                       pid, tid, Quote(name));
  }
  for (const Event& e : events) {
    out += ",\n{\"name\":";
    out += Quote(e.name);
    out += ",\"cat\":";
    out += Quote(e.category);
    out += fmt::format(",\"ph\":\"{}\",\"ts\":{},\"pid\":{},\"tid\":{}", e.phase, Micros(e.ts_ns), pid, e.tid);
    switch (e.phase) {
      case 'X':
        out += ",\"dur\":";
        out += Micros(e.dur_ns);
        break;
      case 'i':
        out += ",\"s\":\"t\"";  // thread-scoped instant
        break;
      case 's':
        out += fmt::format(",\"id\":{}", e.id);
        break;
      case 't':
      case 'f':
        out += fmt::format(",\"id\":{},\"bp\":\"e\"", e.id);  // bind to the enclosing slice
        break;
      default:
        break;
    }
    if (!e.args.is_null()) {
      out += ",\"args\":";
      out += JsonText(e.args);
    }
    out += '}';
  }
  out += fmt::format("\n],\"displayTimeUnit\":\"ms\",\"otherData\":{{\"dropped_events\":{}}}}}\n", dropped);
  return out;
}

}  // namespace

int64_t TraceNowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

Status StartTracing(TraceOptions options) {
  FATHOM_CHECK(options.max_events > 0);
  State& s = GetState();
  std::lock_guard lock(s.mu);
  if (s.on) return FailedPreconditionError("tracing is already on");
  s.events.clear();
  s.events.reserve(std::min<size_t>(options.max_events, 1 << 16));
  s.max_events = options.max_events;
  s.dropped = 0;
  s.on = true;
  internal::g_tracing_on.store(true, std::memory_order_relaxed);
  return OkStatus();
}

std::string StopTracing() {
  State& s = GetState();
  std::vector<Event> events;
  std::map<uint32_t, std::string> names;
  uint64_t dropped = 0;
  {
    std::lock_guard lock(s.mu);
    internal::g_tracing_on.store(false, std::memory_order_relaxed);
    s.on = false;
    events.swap(s.events);
    names = s.thread_names;
    dropped = s.dropped;
  }
  // Spans are recorded when they end: sort by start so that the file reads in time order.
  std::stable_sort(events.begin(), events.end(), [](const Event& a, const Event& b) { return a.ts_ns < b.ts_ns; });
  return Render(events, names, dropped);
}

Status StopTracingToFile(const std::string& path) {
  const std::string json = StopTracing();
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out.good()) return InvalidArgumentError(fmt::format("cannot open trace file '{}' for writing", path));
  out << json;
  out.close();
  if (!out.good()) return DataLossError(fmt::format("writing trace file '{}' failed", path));
  return OkStatus();
}

TraceStats GetTraceStats() {
  State& s = GetState();
  std::lock_guard lock(s.mu);
  return TraceStats{.on = s.on, .recorded = s.events.size(), .dropped = s.dropped};
}

void SetTraceThreadName(std::string_view name) {
  State& s = GetState();
  std::lock_guard lock(s.mu);
  s.thread_names[CurrentTid()] = std::string(name);
}

uint64_t NewTraceFlowId() {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

void TraceComplete(std::string_view name, std::string_view category, int64_t start_ns, int64_t dur_ns,
                   nlohmann::json args) {
  if (!TracingEnabled()) return;
  Event e;
  e.phase = 'X';
  e.name = name;
  e.category = category;
  e.ts_ns = start_ns;
  e.dur_ns = std::max<int64_t>(dur_ns, 0);
  e.tid = CurrentTid();
  e.args = std::move(args);
  Record(std::move(e));
}

void TraceInstant(std::string_view name, std::string_view category, nlohmann::json args) {
  if (TracingEnabled()) RecordSimple('i', name, category, 0, std::move(args));
}

void TraceFlowStart(std::string_view name, std::string_view category, uint64_t id) {
  if (TracingEnabled()) RecordSimple('s', name, category, id, nullptr);
}

void TraceFlowStep(std::string_view name, std::string_view category, uint64_t id) {
  if (TracingEnabled()) RecordSimple('t', name, category, id, nullptr);
}

void TraceFlowEnd(std::string_view name, std::string_view category, uint64_t id) {
  if (TracingEnabled()) RecordSimple('f', name, category, id, nullptr);
}

void TraceCounter(std::string_view name, std::string_view category, double value) {
  if (TracingEnabled()) RecordSimple('C', name, category, 0, nlohmann::json{{"value", value}});
}

TraceSpan& TraceSpan::FlowOut(std::string_view flow_name, uint64_t id) {
  if (start_ns_ >= 0) TraceFlowStart(flow_name, "flow", id);
  return *this;
}

TraceSpan& TraceSpan::FlowIn(std::string_view flow_name, uint64_t id) {
  if (start_ns_ >= 0) TraceFlowEnd(flow_name, "flow", id);
  return *this;
}

void TraceSpan::End() {
  if (start_ns_ < 0) return;
  const int64_t end_ns = TraceNowNs();
  nlohmann::json args;
  if (args_ != nullptr) {
    args = std::move(*args_);
    delete args_;
    args_ = nullptr;
  }
  TraceComplete(name_, category_, start_ns_, end_ns - start_ns_, std::move(args));
  start_ns_ = -1;
}

}  // namespace fathom::obs
